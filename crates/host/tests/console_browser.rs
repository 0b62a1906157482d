//! The console in a real browser: Debian's headless Chromium, through a ChromeDriver of the
//! test's own, against the real binary on the real services. An operator opens the overview,
//! finds a group of dead letters by search, opens one, signs in, dry-runs the group's replay,
//! replays it, and sees the mails delivered and the group marked replayed.
//!
//! It takes a screenshot of each page on the way; with `WH_CONSOLE_SCREENSHOTS=docs/console`
//! they are written there (the README's pictures), else to a folder that is removed.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::time::{Duration, Instant};

use support::browser::{element, screenshot_dir, text_of};
use support::console::{TOKEN, World};
use support::{SERIAL, publish_confirmed};
use worker_testkit::Browser;

/// Five commands that never decode: a second group, so that the search has to find ours.
async fn malformed_commands(world: &World) -> anyhow::Result<()> {
    let bodies: Vec<(lapin::BasicProperties, &[u8])> = (0..5)
        .map(|i| {
            let properties = lapin::BasicProperties::default()
                .with_delivery_mode(2)
                .with_message_id(format!("broken-{i}").into());
            (properties, b"{not json".as_slice())
        })
        .collect();
    publish_confirmed(&world.vhost, "commands", "email.send", &bodies).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_finds_a_group_by_search_and_replays_it_from_the_browser() -> anyhow::Result<()>
{
    let _serial = SERIAL.lock().await;
    let (shots, _temporary) = screenshot_dir();
    let world = World::with_token("CONSOLE_BROWSER_SHOW_LOG").await?;
    malformed_commands(&world).await?;
    world.dead_letters(3).await?;
    let browser = Browser::start().await?;
    let client = &browser.client;
    let base = world.host.url("");

    // The overview: the dead letters waiting, the jobs, the queues.
    client.goto(&format!("{base}/")).await?;
    text_of(client, "#dead-letters", "8 waiting").await;
    browser.screenshot(&shots.join("overview.png")).await?;

    // Find the refused replies by their error.
    element(client, "header nav a[href='/dead-letters']")
        .await
        .click()
        .await?;
    element(client, "input[name=search]")
        .await
        .send_keys("no such user")
        .await?;
    element(client, "#find").await.click().await?;
    text_of(client, "#group-count", "1 group matches").await;
    let group = element(client, "tr.group").await;
    assert!(group.text().await?.contains("550 5.1.1 no such user"));
    browser.screenshot(&shots.join("dead-letters.png")).await?;

    // Open the group, then one of its dead letters.
    element(client, "a.open-group").await.click().await?;
    text_of(client, "#message-count", "3 dead letters match").await;
    let group_url = client.current_url().await?.to_string();
    browser.screenshot(&shots.join("messages.png")).await?;
    element(client, "a.open-message").await.click().await?;
    text_of(client, "#error-chain", "550 5.1.1 no such user").await;
    browser.screenshot(&shots.join("dead-letter.png")).await?;

    // Sign in.
    element(client, "#sign-in").await.click().await?;
    element(client, "#name").await.send_keys("alice").await?;
    element(client, "#password").await.send_keys(TOKEN).await?;
    browser.screenshot(&shots.join("sign-in.png")).await?;
    element(client, "#submit").await.click().await?;
    text_of(client, "#operator", "alice").await;

    // The group's replay: a dry run first, then the run at a chosen rate.
    client.goto(&group_url).await?;
    element(client, "button.replay").await.click().await?;
    text_of(client, "#planned", "3").await;
    browser.screenshot(&shots.join("confirm.png")).await?;
    assert_eq!(world.delivered_to_refused(), 0, "the dry run sent nothing");
    world.sink.accept_recipient(&world.refused)?;
    let rate = element(client, "#rate").await;
    rate.clear().await?;
    rate.send_keys("20").await?;
    element(client, "#confirm").await.click().await?;
    text_of(client, "#action-state", "finished").await;
    text_of(client, "#counts", "3 done").await;
    browser.screenshot(&shots.join("action.png")).await?;

    // The mails went out, once each, and the group is marked replayed.
    let deadline = Instant::now() + Duration::from_secs(60);
    while world.delivered_to_refused() < 3 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(world.delivered_to_refused(), 3);
    element(client, "#its-dead-letters").await.click().await?;
    text_of(client, "#messages", "replayed").await;
    client
        .goto(&format!(
            "{base}/dead-letters?status=all&search=no+such+user"
        ))
        .await?;
    text_of(client, "tr.group .badge", "replayed").await;
    browser
        .screenshot(&shots.join("dead-letters-replayed.png"))
        .await?;

    // The remaining pages, for the README.
    client.goto(&format!("{base}/jobs/draft-expiry")).await?;
    element(client, "#tick-counts").await;
    browser.screenshot(&shots.join("job.png")).await?;
    client.goto(&format!("{base}/outbox")).await?;
    element(client, "#outbox-counts").await;
    browser.screenshot(&shots.join("outbox.png")).await?;
    client.goto(&format!("{base}/actions")).await?;
    text_of(client, "#trail", "alice").await;
    browser.screenshot(&shots.join("audit-trail.png")).await?;
    client.goto(&format!("{base}/accounts")).await?;
    text_of(client, "#accounts", "bootstrap").await;
    element(client, "#add-account").await;
    browser.screenshot(&shots.join("accounts.png")).await?;

    browser.close().await;
    let trail = world.trail().await?;
    assert_eq!(
        trail,
        vec![
            ("replay".into(), Some("alice".into()), true, None, 0),
            ("replay".into(), Some("alice".into()), false, Some(3), 3),
        ]
    );
    world.host.stop_cleanly().await;
    Ok(())
}
