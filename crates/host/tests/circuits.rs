//! A dependency's open circuit as the operator meets it, on the real binary, database and
//! broker: opened through the store as a replica's own failure opens it, it is on `/status`,
//! on the page of the job it stops, on the overview and on `/metrics`; closed through the API
//! or the command line, it is gone and the close is in the audit trail with who and why.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use reqwest::StatusCode;
use support::circuits::{REFUSED, RELAY, on_status, open_relay_circuit};
use support::console::{Operator, Setup, TOKEN, World, http};
use support::{Installation, SERIAL, host_command};

/// The audit rows of kind `circuit-close`: (account, via, actor, dependency, reason, note).
type CloseRow = (
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
);

async fn closes(pool: &sqlx::PgPool) -> anyhow::Result<Vec<CloseRow>> {
    Ok(sqlx::query_as(
        "SELECT account, via, actor, filter->>'dependency', filter->>'reason', note \
         FROM dead_letter_actions WHERE action = 'circuit-close' ORDER BY id",
    )
    .fetch_all(pool)
    .await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_circuit_is_on_status_the_job_page_the_overview_and_the_metrics()
-> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::start("CIRCUITS_SHOW_LOG", Setup::with_token()).await?;
    open_relay_circuit(&world.db.pool).await?;

    let open = on_status(&world.host, 1).await;
    let relay = &open[0];
    assert_eq!(relay["dependency"], RELAY, "{relay}");
    assert_eq!(relay["reason"], REFUSED, "{relay}");
    assert_eq!(relay["opened_by"], "test-replica", "{relay}");
    assert_eq!(relay["failed_probes"], 0, "{relay}");
    assert_eq!(relay["job"], "email-send", "{relay}");
    let probe_in = relay["next_probe_in_secs"].as_u64().unwrap();
    assert!((3000..=3600).contains(&probe_in), "{relay}");
    assert!(relay["opened_at"].is_string(), "{relay}");

    let operator = Operator::sign_in(&world.host.url(""), TOKEN, "olga").await?;
    let page = operator.get("/jobs/email-send").await?.text().await?;
    assert!(page.contains("Circuit open: smtp-relay"), "{page}");
    assert!(page.contains(REFUSED), "the reason on the job page");
    assert!(page.contains("next probe in"), "{page}");
    assert!(
        page.contains("action=\"/jobs/email-send/circuits/smtp-relay/close\""),
        "an operator gets the close form: {page}"
    );
    let other = operator.get("/jobs/draft-expiry").await?.text().await?;
    assert!(!other.contains("Circuit open"), "a job it does not stop");
    let overview = operator.get("/").await?.text().await?;
    assert!(overview.contains("Circuit open: smtp-relay"), "{overview}");
    assert!(overview.contains(REFUSED), "the reason on the overview");
    let jobs = operator
        .get("/api/overview")
        .await?
        .json::<serde_json::Value>()
        .await?;
    let send = jobs["jobs"]
        .as_array()
        .and_then(|jobs| jobs.iter().find(|j| j["name"] == "email-send"))
        .cloned()
        .unwrap();
    assert_eq!(send["state"], "circuit-open", "{send}");
    assert_eq!(send["circuit"]["dependency"], RELAY, "{send}");

    let scrape = world.host.metrics().await?;
    assert_eq!(
        scrape.sum("worker_circuit_state", &[("dependency", RELAY)]),
        1.0,
        "{}",
        scrape.0
    );
    assert!(scrape.0.contains("# TYPE worker_circuit_state gauge"));
    // Another replica's failure opened it (the test's handle): this one counts none.
    assert!(
        scrape
            .0
            .contains("# TYPE worker_circuit_opened_total counter")
    );
    assert_eq!(
        scrape.sum("worker_circuit_opened_total", &[("dependency", RELAY)]),
        0.0
    );
    world.host.stop_cleanly().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_circuit_closed_through_the_api_is_gone_and_audited_with_the_account_and_reason()
-> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::start("CIRCUITS_SHOW_LOG", Setup::signed_reading()).await?;
    world.add_account("otto", "operator", "otto-password-long")?;
    world.add_account("vera", "viewer", "vera-password-long")?;
    let otto = world.add_token("otto")?;
    let vera = world.add_token("vera")?;
    open_relay_circuit(&world.db.pool).await?;
    on_status(&world.host, 1).await;

    let close = |token: &str| {
        http()
            .post(world.host.url("/api/circuits/smtp-relay/close"))
            .bearer_auth(token)
            .form(&[("reason", "relay credentials rotated")])
            .send()
    };
    let refused = close(&vera).await?;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN, "a viewer may not");
    let closed = close(&otto).await?;
    assert_eq!(closed.status(), StatusCode::OK);
    let body: serde_json::Value = closed.json().await?;
    assert_eq!(body["dependency"], RELAY, "{body}");
    assert_eq!(body["closed"], true, "{body}");

    assert!(
        worker_store::circuits::list(&world.db.pool)
            .await?
            .is_empty()
    );
    on_status(&world.host, 0).await;
    let rows = closes(&world.db.pool).await?;
    assert_eq!(
        rows,
        vec![(
            Some("otto".into()),
            Some("api".into()),
            None,
            Some(RELAY.into()),
            Some("relay credentials rotated".into()),
            Some("relay credentials rotated".into()),
        )]
    );
    world.host.stop_cleanly().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_lists_an_open_circuit_and_closes_it_audited_with_the_actor()
-> anyhow::Result<()> {
    let installation = Installation::new("circuits-cli").await?;
    open_relay_circuit(&installation.db.pool).await?;
    let run = |args: &[&str]| {
        let output = host_command(&installation.config)
            .arg("circuits")
            .args(args)
            .output()
            .expect("the binary runs");
        assert!(
            output.status.success(),
            "circuits {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let listed = run(&["list"]);
    assert!(
        listed.contains("smtp-relay") && listed.contains(REFUSED),
        "{listed}"
    );
    let json: serde_json::Value = serde_json::from_str(&run(&["list", "--json"]))?;
    assert_eq!(json[0]["dependency"], RELAY, "{json}");
    assert_eq!(json[0]["reason"], REFUSED, "{json}");

    let closed: serde_json::Value = serde_json::from_str(&run(&[
        "close",
        RELAY,
        "--reason",
        "relay fixed",
        "--actor",
        "ticket-42",
        "--json",
    ]))?;
    assert_eq!(closed["closed"], true, "{closed}");
    assert!(run(&["list"]).contains("no circuit is open"));
    let again = run(&["close", RELAY]);
    assert!(again.contains("was not open"), "{again}");

    let rows = closes(&installation.db.pool).await?;
    assert_eq!(rows.len(), 2, "{rows:?}");
    let (account, via, actor, dependency, reason, _) = &rows[0];
    assert_eq!(
        (account, via.as_deref(), actor.as_deref()),
        (&None, Some("cli"), Some("ticket-42"))
    );
    assert_eq!(dependency.as_deref(), Some(RELAY));
    assert_eq!(reason.as_deref(), Some("relay fixed"));
    assert_eq!(rows[1].5.as_deref(), Some("was not open"));
    Ok(())
}
