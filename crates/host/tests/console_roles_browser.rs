//! The console's roles and shared sessions in a real browser: Debian's headless Chromium,
//! through a ChromeDriver of the test's own, against the real binary on the real services,
//! with reading behind a session (`Setup::signed_reading`).
//!
//! - A viewer reads every page but is shown no action's button, and a POST forged with its
//!   own session and CSRF token is refused (403) and recorded nowhere.
//! - An operator's replay is recorded in the audit trail with the operator's account.
//! - A session made on one replica is valid on another (sessions live in PostgreSQL and a
//!   browser sends a host's cookies to every port of it), and signing out on one ends it on
//!   both.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::time::{Duration, Instant};

use fantoccini::{Client, Locator};
use reqwest::StatusCode;
use support::SERIAL;
use support::browser::{element, sign_in, text_of};
use support::console::{Setup, World, http};
use worker_testkit::Browser;

/// Each test's host prints its whole log at the end when this variable is set.
const SHOW_LOG: &str = "CONSOLE_ROLES_SHOW_LOG";

/// What no viewer may be shown: the buttons of every action.
const ACTION_BUTTONS: &[&str] = &[
    "button.replay",
    "button.danger",
    "#run-now",
    "#pause",
    "#resume",
    "#cancel",
    "#retry-all",
    "#confirm",
];

/// Waits up to a minute for the browser's address to contain `wanted`.
async fn url_contains(client: &Client, wanted: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let url = client.current_url().await.unwrap().to_string();
        if url.contains(wanted) {
            return url;
        }
        if Instant::now() > deadline {
            let source = client.source().await.unwrap_or_default();
            panic!("the browser never got to `{wanted}` (it is at `{url}`)\n{source}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Asserts that the page at the browser's address shows none of [`ACTION_BUTTONS`].
async fn no_action_button(client: &Client) {
    let url = client.current_url().await.unwrap().to_string();
    for css in ACTION_BUTTONS {
        let found = client.find_all(Locator::Css(css)).await.unwrap();
        if !found.is_empty() {
            let source = client.source().await.unwrap_or_default();
            panic!("{url} shows a viewer {} `{css}`\n{source}", found.len());
        }
    }
}

/// The audit trail's rows: (action, account, via, dry run), oldest first.
async fn trail(world: &World) -> Vec<(String, Option<String>, Option<String>, bool)> {
    sqlx::query_as("SELECT action, account, via, dry_run FROM dead_letter_actions ORDER BY id")
        .fetch_all(&world.db.pool)
        .await
        .unwrap()
}

/// The row `worker-host operators add` records (the command line: no account).
fn account_made() -> (String, Option<String>, Option<String>, bool) {
    ("operator-add".into(), None, Some("cli".into()), false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_sees_every_page_but_no_action_button_and_a_forged_post_is_refused()
-> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::start(SHOW_LOG, Setup::signed_reading()).await?;
    world.add_account("vera", "viewer", "vera-password")?;
    let ids = world.dead_letters(2).await?;
    let browser = Browser::start().await?;
    let client = &browser.client;
    let base = world.host.url("");

    sign_in(client, &base, "vera", "vera-password").await;
    text_of(client, "#role", "viewer").await;

    // Every page, each with something of its own to show that it rendered.
    let pages: [(String, &str); 4] = [
        (format!("{base}/"), "#dead-letters"),
        (format!("{base}/dead-letters"), "#group-count"),
        (format!("{base}/dead-letters/{}", ids[0]), "#error-chain"),
        (format!("{base}/outbox"), "#outbox-counts"),
    ];
    for (url, own) in &pages {
        client.goto(url).await?;
        element(client, own).await;
        text_of(client, "#operator", "vera").await;
        no_action_button(client).await;
    }
    // The group's messages page, through its link.
    client.goto(&format!("{base}/dead-letters")).await?;
    element(client, "a.open-group").await.click().await?;
    text_of(client, "#message-count", "2 dead letters match").await;
    text_of(client, "#operator", "vera").await;
    no_action_button(client).await;
    for (path, own) in [
        ("/actions", "#trail"),
        ("/jobs/draft-expiry", "#tick-counts"),
    ] {
        client.goto(&format!("{base}{path}")).await?;
        element(client, own).await;
        text_of(client, "#operator", "vera").await;
        no_action_button(client).await;
    }
    let before = trail(&world).await;
    assert_eq!(
        before,
        vec![account_made()],
        "only the account was recorded"
    );

    // The viewer's own session and CSRF token, as a forger of the forms would use them.
    let session = client.get_named_cookie("wh_session").await?;
    let cookie = format!("wh_session={}", session.value());
    let csrf = element(client, "form[action='/sign-out'] input[name=csrf]")
        .await
        .attr("value")
        .await?
        .expect("the sign-out form carries the session's CSRF token");
    assert!(!csrf.is_empty());
    let id = ids[0].to_string();
    let http = http();
    let replay = http
        .post(world.host.url("/dead-letters/replay/run"))
        .header(reqwest::header::COOKIE, &cookie)
        .form(&[
            ("csrf", csrf.as_str()),
            ("id", id.as_str()),
            ("rate", "10"),
            ("planned", "1"),
        ])
        .send()
        .await?;
    let status = replay.status();
    let body = replay.text().await?;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "a viewer's replay: {body}\n{}",
        world.host.log_tail()
    );
    assert!(
        body.contains("viewer"),
        "the refusal names the role: {body}"
    );
    let pause = http
        .post(world.host.url("/jobs/draft-expiry/pause"))
        .header(reqwest::header::COOKIE, &cookie)
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await?;
    let status = pause.status();
    let body = pause.text().await?;
    assert_eq!(status, StatusCode::FORBIDDEN, "a viewer's pause: {body}");
    assert!(
        body.contains("viewer"),
        "the refusal names the role: {body}"
    );

    // Nothing was recorded, nothing moved, nothing paused.
    assert_eq!(
        trail(&world).await,
        before,
        "a refused action is not recorded"
    );
    let dead: i64 = sqlx::query_scalar("SELECT count(*) FROM dead_letters WHERE status = 'dead'")
        .fetch_one(&world.db.pool)
        .await?;
    assert_eq!(dead, 2, "the dead letters stay dead");
    let paused: i64 = sqlx::query_scalar("SELECT count(*) FROM job_pauses")
        .fetch_one(&world.db.pool)
        .await?;
    assert_eq!(paused, 0, "no job is paused");

    browser.close().await;
    world.host.stop_cleanly().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_replay_is_recorded_with_the_operators_account() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::start(SHOW_LOG, Setup::signed_reading()).await?;
    world.add_account("otto", "operator", "otto-password")?;
    world.dead_letters(2).await?;
    let browser = Browser::start().await?;
    let client = &browser.client;
    let base = world.host.url("");

    sign_in(client, &base, "otto", "otto-password").await;
    text_of(client, "#role", "operator").await;

    // The group's replay: a dry run first, then the confirmed run.
    client.goto(&format!("{base}/dead-letters")).await?;
    element(client, "a.open-group").await.click().await?;
    text_of(client, "#message-count", "2 dead letters match").await;
    element(client, "button.replay").await.click().await?;
    text_of(client, "#planned", "2").await;
    world.sink.accept_recipient(&world.refused)?;
    let rate = element(client, "#rate").await;
    rate.clear().await?;
    rate.send_keys("20").await?;
    element(client, "#confirm").await.click().await?;
    text_of(client, "#action-state", "finished").await;
    text_of(client, "#counts", "2 done").await;

    assert_eq!(
        trail(&world).await,
        vec![
            account_made(),
            (
                "replay".into(),
                Some("otto".into()),
                Some("console".into()),
                true
            ),
            (
                "replay".into(),
                Some("otto".into()),
                Some("console".into()),
                false
            ),
        ]
    );
    client.goto(&format!("{base}/actions")).await?;
    text_of(client, "#trail", "otto").await;

    browser.close().await;
    world.host.stop_cleanly().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_made_on_one_replica_is_valid_on_another_and_signing_out_on_one_ends_it_on_both()
-> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::start(SHOW_LOG, Setup::signed_reading()).await?;
    world.add_account("rita", "operator", "rita-password")?;
    let second = world.replica(SHOW_LOG, "r2").await?;
    let browser = Browser::start().await?;
    let client = &browser.client;
    let first = world.host.url("");

    // Signed in on the first replica, the browser is signed in on the second too.
    sign_in(client, &first, "rita", "rita-password").await;
    text_of(client, "header .where", "replica r1").await;
    let session = client.get_named_cookie("wh_session").await?;
    let cookie = format!("wh_session={}", session.value());
    client.goto(&second.url("/")).await?;
    text_of(client, "#operator", "rita").await;
    text_of(client, "header .where", "replica r2").await;

    // Signing out on the first ends the session on both.
    client.goto(&first).await?;
    text_of(client, "header .where", "replica r1").await;
    element(client, "#sign-out").await.click().await?;
    url_contains(client, "/sign-in").await;
    client.goto(&second.url("/")).await?;
    url_contains(client, "/sign-in").await;
    element(client, "#sign-in").await;
    client.goto(&first).await?;
    url_contains(client, "/sign-in").await;
    element(client, "#sign-in").await;

    // Not only the browser's cookie is gone: the session itself is, on every replica.
    let sessions: i64 =
        sqlx::query_scalar("SELECT count(*) FROM operator_sessions WHERE account = 'rita'")
            .fetch_one(&world.db.pool)
            .await?;
    assert_eq!(sessions, 0, "rita's session is deleted");
    let http = http();
    for host in [&world.host, &second] {
        let answer = http
            .get(host.url("/"))
            .header(reqwest::header::COOKIE, &cookie)
            .send()
            .await?;
        assert!(
            answer.status().is_redirection(),
            "the old cookie on {}: {}",
            host.url("/"),
            answer.status()
        );
        let location = answer
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|l| l.to_str().ok())
            .unwrap_or_default();
        assert!(location.starts_with("/sign-in"), "sent to {location}");
    }

    browser.close().await;
    second.stop_cleanly().await;
    world.host.stop_cleanly().await;
    Ok(())
}
