//! An admin's erasure of one person's data from the console (`/privacy`, its API twin), on the
//! real binary and services: an operator is refused; an admin's dry run counts and changes
//! nothing; the erasure removes the address from the outbound mail that was sent to it, and
//! both are audit entries that name the address only by its keyed hash.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use reqwest::StatusCode;
use support::SERIAL;
use support::console::{Setup, World, http};
use support::edit::failed_mail;

const SHOW_LOG: &str = "CONSOLE_PRIVACY_SHOW_LOG";
const PASSWORD: &str = "a-long-enough-password";

async fn erase(world: &World, token: &str, address: &str, confirm: &str) -> (StatusCode, String) {
    let answer = http()
        .post(world.host.url("/api/privacy/erase"))
        .bearer_auth(token)
        .form(&[("address", address), ("confirm", confirm)])
        .send()
        .await
        .unwrap();
    (answer.status(), answer.text().await.unwrap())
}

async fn mails_to(world: &World, address: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbound_emails WHERE $1 = ANY (to_addresses)")
        .bind(address)
        .fetch_one(&world.db.pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_admin_erases_a_persons_data_after_a_dry_run_and_an_operator_cannot() {
    let _serial = SERIAL.lock().await;
    let world = World::start(SHOW_LOG, Setup::signed_reading())
        .await
        .unwrap();
    failed_mail(&world).await.unwrap();
    let customer = world.refused.clone();
    world.add_account("ada", "admin", PASSWORD).unwrap();
    world.add_account("olga", "operator", PASSWORD).unwrap();
    let admin = world.add_token("ada").unwrap();
    let operator = world.add_token("olga").unwrap();
    assert_eq!(mails_to(&world, &customer).await, 1);

    let page = http()
        .get(world.host.url("/privacy"))
        .bearer_auth(&operator)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::FORBIDDEN);
    let (status, text) = erase(&world, &operator, &customer, "yes").await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "an operator's erasure: {text}"
    );
    assert_eq!(mails_to(&world, &customer).await, 1);

    let page = http()
        .get(world.host.url("/privacy"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    assert!(page.text().await.unwrap().contains("id=\"erase-form\""));

    let shown = http()
        .post(world.host.url("/privacy/erase"))
        .bearer_auth(&admin)
        .form(&[("address", customer.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(shown.status(), StatusCode::OK);
    let shown = shown.text().await.unwrap();
    assert!(
        shown.contains("A dry run would erase") && shown.contains("id=\"confirm-erase\""),
        "{shown}"
    );

    let (status, text) = erase(&world, &admin, &customer, "").await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let dry: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(dry["dry_run"], true);
    let outbound = dry["tables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["table"] == "outbound_emails")
        .expect("the dry run counts outbound_emails");
    assert!(outbound["rows"].as_u64().unwrap() >= 1, "{text}");
    assert_eq!(mails_to(&world, &customer).await, 1, "a dry run erased");

    let (status, text) = erase(&world, &admin, &customer, "yes").await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(
        mails_to(&world, &customer).await,
        0,
        "the erasure left the address"
    );

    let audited: Vec<(bool, String)> = sqlx::query_as(
        "SELECT dry_run, filter::text FROM dead_letter_actions \
         WHERE action = 'privacy-erase' ORDER BY id",
    )
    .fetch_all(&world.db.pool)
    .await
    .unwrap();
    assert_eq!(
        audited.iter().map(|(dry, _)| *dry).collect::<Vec<_>>(),
        vec![true, true, false]
    );
    let local = customer.split('@').next().unwrap();
    for (_, target) in &audited {
        assert!(
            !target.contains(local),
            "the audit names the address: {target}"
        );
    }
}
