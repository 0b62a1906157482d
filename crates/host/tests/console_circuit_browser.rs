//! The relay's open circuit in Chromium: the page of the job it stops (`email-send`) and the
//! overview show it with its reason, and the job page's Close circuit button closes it on every
//! replica, recorded with the operator's name and reason. With
//! `WH_CONSOLE_SCREENSHOTS=docs/console` the job page's screenshot is written there
//! (`job-circuit-open.png`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::time::{Duration, Instant};

use fantoccini::{Client, Locator};
use support::SERIAL;
use support::browser::{element, screenshot_dir, sign_in, text_of};
use support::circuits::{REFUSED, RELAY, on_status, open_relay_circuit};
use support::console::{Setup, TOKEN, World};
use worker_testkit::Browser;

/// Waits up to a minute until `css` is no longer on the page (the page the action redirected
/// to has replaced the one with the button).
async fn gone(client: &Client, css: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while client.find(Locator::Css(css)).await.is_ok() {
        assert!(Instant::now() < deadline, "`{css}` is still on the page");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_job_page_and_the_overview_show_the_open_circuit_and_its_button_closes_it()
-> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let (shots, _temporary) = screenshot_dir();
    let world = World::start("CONSOLE_CIRCUIT_SHOW_LOG", Setup::with_token()).await?;
    open_relay_circuit(&world.db.pool).await?;

    let browser = Browser::start().await?;
    let client = &browser.client;
    let base = world.host.url("");
    sign_in(client, &base, "olga", TOKEN).await;

    client.goto(&format!("{base}/jobs/email-send")).await?;
    text_of(client, "#circuit-1", "Circuit open: smtp-relay").await;
    text_of(client, "#circuit-1", REFUSED).await;
    text_of(client, "#circuit-1", "next probe in").await;
    browser
        .screenshot(&shots.join("job-circuit-open.png"))
        .await?;
    browser
        .assert_accessible("the job page with an open circuit")
        .await?;
    client.goto(&format!("{base}/")).await?;
    text_of(client, "#circuits", "Circuit open: smtp-relay").await;
    text_of(client, "#circuits", REFUSED).await;
    browser
        .assert_accessible("the overview with an open circuit")
        .await?;

    client.goto(&format!("{base}/jobs/email-send")).await?;
    element(client, "#circuit-reason-1")
        .await
        .send_keys("relay password rotated")
        .await?;
    element(client, "#close-circuit-1").await.click().await?;
    gone(client, "#circuit-1").await;
    client.goto(&format!("{base}/")).await?;
    text_of(client, "#circuits", "No circuit is open").await;

    assert!(
        worker_store::circuits::list(&world.db.pool)
            .await?
            .is_empty()
    );
    on_status(&world.host, 0).await;
    let (actor, via, dependency, note): (
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
    ) = sqlx::query_as(
        "SELECT actor, via, filter->>'dependency', note FROM dead_letter_actions \
             WHERE action = 'circuit-close'",
    )
    .fetch_one(&world.db.pool)
    .await?;
    assert_eq!(actor.as_deref(), Some("olga"));
    assert_eq!(via.as_deref(), Some("console"));
    assert_eq!(dependency.as_deref(), Some(RELAY));
    assert_eq!(note.as_deref(), Some("relay password rotated"));
    world.host.stop_cleanly().await;
    Ok(())
}
