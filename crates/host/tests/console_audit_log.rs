//! The console's `/audit-log`, on the real binary and database: other teams' audit entries
//! searched and paged newest first without repeating or skipping one, their `data` escaped
//! on the page, the retention and the queue shown, and the actor masked for a viewer.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use chrono::{Duration, Utc};
use reqwest::StatusCode;
use support::SERIAL;
use support::console::{Setup, World, http};
use worker_messages::AuditEntry;

const SHOW_LOG: &str = "CONSOLE_AUDIT_LOG_SHOW_LOG";
const PASSWORD: &str = "a-long-enough-password";

/// `count` entries by `actor` on shipments `S-0`…, one a minute, the newest a minute ago.
async fn entries(world: &World, actor: &str, count: i64) -> Vec<AuditEntry> {
    let now = Utc::now();
    let mut stored = Vec::new();
    for n in 0..count {
        let entry = AuditEntry {
            id: uuid::Uuid::new_v4(),
            occurred_at: now - Duration::minutes(count - n),
            actor: actor.to_string(),
            action: "shipment.rerouted".into(),
            entity_type: "shipment".into(),
            entity_id: format!("S-{n}"),
            data: serde_json::json!({ "note": format!("<script>alert({n})</script>") })
                .as_object()
                .cloned()
                .unwrap(),
        };
        assert!(
            job_audit_log::store::append(&world.db.pool, &entry)
                .await
                .unwrap()
        );
        stored.push(entry);
    }
    stored
}

async fn api(world: &World, token: &str, query: &str) -> serde_json::Value {
    let answer = http()
        .get(world.host.url(&format!("/api/audit-log?{query}")))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    answer.json().await.unwrap()
}

fn ids(page: &serde_json::Value) -> Vec<String> {
    page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_search_pages_newest_first_without_repeating_or_skipping_an_entry() {
    let _serial = SERIAL.lock().await;
    let world = World::start(SHOW_LOG, Setup::signed_reading())
        .await
        .unwrap();
    world.add_account("olga", "operator", PASSWORD).unwrap();
    let token = world.add_token("olga").unwrap();
    let stored = entries(&world, "dispatch-7", 60).await;
    entries(&world, "someone-else", 3).await;

    let first = api(&world, &token, "actor=dispatch-7").await;
    let older = first["older"].as_str().expect("a full page links the next");
    let second = api(&world, &token, older).await;
    assert!(second["older"].is_null(), "{second}");

    let mut newest_first: Vec<String> = stored.iter().rev().map(|e| e.id.to_string()).collect();
    let shown: Vec<String> = ids(&first).into_iter().chain(ids(&second)).collect();
    assert_eq!(shown.len(), 60);
    assert_eq!(shown, std::mem::take(&mut newest_first));

    let one = api(&world, &token, "entity_type=shipment&entity_id=S-59").await;
    assert_eq!(ids(&one), vec![stored[59].id.to_string()]);
    assert_eq!(one["entries"][0]["actor"], "dispatch-7");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_page_escapes_data_and_names_the_retention_and_a_viewer_sees_no_actor() {
    let _serial = SERIAL.lock().await;
    let setup = Setup {
        sections: "[jobs.retention]\naudit_log = \"90d\"\n".into(),
        ..Setup::signed_reading()
    };
    let world = World::start(SHOW_LOG, setup).await.unwrap();
    world.add_account("olga", "operator", PASSWORD).unwrap();
    world.add_account("vera", "viewer", PASSWORD).unwrap();
    let operator = world.add_token("olga").unwrap();
    let viewer = world.add_token("vera").unwrap();
    entries(&world, "dispatcher.dana", 2).await;

    // The queue's line waits for the sampler's first round (every 500 ms here).
    let page = world
        .host
        .wait_for("the audit log's page with its queue", || async {
            let page = http()
                .get(world.host.url("/audit-log"))
                .bearer_auth(&operator)
                .send()
                .await?
                .text()
                .await?;
            Ok(page.contains("<code>audit.log</code>").then_some(page))
        })
        .await;
    assert!(page.contains("&lt;script&gt;alert(1)"), "{page}");
    assert!(!page.contains("<script>alert"), "unescaped data: {page}");
    assert!(page.contains("id=\"audit-retention\""), "{page}");
    assert!(page.contains("jobs.retention.audit_log"), "{page}");
    assert!(page.contains("more than 90 days ago"), "{page}");
    assert!(page.contains("dispatcher.dana"), "{page}");

    let seen = api(&world, &viewer, "").await;
    assert_eq!(seen["entries"].as_array().unwrap().len(), 2);
    assert_eq!(seen["entries"][0]["actor"], "d***", "{seen}");
    let viewer_page = http()
        .get(world.host.url("/audit-log"))
        .bearer_auth(&viewer)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!viewer_page.contains("dispatcher.dana"), "{viewer_page}");
}
