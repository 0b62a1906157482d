//! Every page of the console as a person would use it: in Chromium, each page passes
//! axe-core (no serious or critical violation) at a desktop width and at a phone's, and at a
//! phone's width none is wider than the window (a wide table scrolls inside its own box).
//!
//! With `WH_CONSOLE_SCREENSHOTS=docs/console`, the narrow pages' screenshots are written
//! there (`narrow-*.png`, the README's), else to a folder that is removed.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::path::PathBuf;

use fantoccini::Locator;
use support::browser::{element, screenshot_dir, text_of};
use support::console::{TOKEN, World};
use support::{SERIAL, publish_confirmed};
use worker_testkit::Browser;

/// A phone held upright, in CSS pixels.
const PHONE: (u32, u32) = (390, 844);
const DESKTOP: (u32, u32) = (1280, 900);

/// Checks the page now shown at both widths; returns what failed, page by page.
async fn check_page(browser: &Browser, page: &str, shot: Option<PathBuf>) -> Vec<String> {
    let mut problems = Vec::new();
    for (width, height) in [DESKTOP, PHONE] {
        if let Err(e) = browser.resize(width, height).await {
            problems.push(format!("{page}: {e:#}"));
            continue;
        }
        if let Err(e) = browser.assert_accessible(page).await {
            problems.push(format!("at {width} px, {e:#}"));
        }
        if (width, height) == PHONE {
            if let Err(e) = browser.assert_fits_width(page).await {
                problems.push(format!("{e:#}"));
            }
            if let Some(path) = &shot {
                browser.screenshot(path).await.unwrap();
            }
        }
    }
    browser.resize(DESKTOP.0, DESKTOP.1).await.unwrap();
    problems
}

/// The `href` of the first link matching `css`.
async fn link(browser: &Browser, css: &str) -> String {
    let found = element(&browser.client, css).await;
    found.attr("href").await.unwrap().expect("a link")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_console_page_passes_axe_core_and_fits_a_phone() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let (shots, _temporary) = screenshot_dir();
    let world = World::with_token("CONSOLE_ACCESSIBILITY_SHOW_LOG").await?;
    let broken: Vec<(lapin::BasicProperties, &[u8])> = vec![(
        lapin::BasicProperties::default()
            .with_delivery_mode(2)
            .with_message_id("broken-0".into()),
        b"{not json".as_slice(),
    )];
    publish_confirmed(&world.vhost, "commands", "email.send", &broken).await?;
    let dead = world.dead_letters(2).await?;
    let browser = Browser::start().await?;
    let client = &browser.client;
    let base = world.host.url("");
    let mut problems = Vec::new();

    // Signed out: the sign-in form.
    client.goto(&format!("{base}/sign-in")).await?;
    element(client, "#password").await;
    problems.extend(check_page(&browser, "/sign-in", Some(shots.join("narrow-sign-in.png"))).await);

    element(client, "#name").await.send_keys("alice").await?;
    element(client, "#password").await.send_keys(TOKEN).await?;
    element(client, "#submit").await.click().await?;
    text_of(client, "#operator", "alice").await;

    // Signed in as an admin, every page that reads.
    let pages: Vec<(String, &str, Option<&str>)> = vec![
        ("/".into(), "#dead-letters", Some("narrow-overview.png")),
        (
            "/dead-letters".into(),
            "tr.group",
            Some("narrow-dead-letters.png"),
        ),
        ("/dead-letters?status=all".into(), "tr.group", None),
        ("/dead-letters/messages".into(), "#messages", None),
        (
            format!("/dead-letters/{}", dead[0]),
            "#error-chain",
            Some("narrow-dead-letter.png"),
        ),
        (
            "/jobs/draft-expiry".into(),
            "#tick-counts",
            Some("narrow-job.png"),
        ),
        ("/jobs/email-send".into(), "h1", None),
        ("/outbox".into(), "#outbox-counts", None),
        ("/accounts".into(), "#accounts", None),
        ("/dead-letters/999999999".into(), "main", None),
    ];
    for (path, ready, shot) in &pages {
        client.goto(&format!("{base}{path}")).await?;
        element(client, ready).await;
        problems.extend(check_page(&browser, path, shot.map(|s| shots.join(s))).await);
    }

    // The pages past the anchors: the mail search, the audit log, a queue's history, the outbound mail a
    // dead letter names and its edit form, a malformed dead letter's edit form.
    let malformed: i64 =
        sqlx::query_scalar("SELECT id FROM dead_letters WHERE message_id = 'broken-0'")
            .fetch_one(&world.db.pool)
            .await?;
    client
        // The last is a refused reply's (the first may be the malformed one, on its queue).
        .goto(&format!(
            "{base}/dead-letters/{}",
            dead.last().expect("dead letters")
        ))
        .await?;
    let outbound = link(&browser, "#mail-link a").await;
    let more: Vec<(String, &str)> = vec![
        ("/mail".into(), "#mails"),
        ("/audit-log".into(), "#entries"),
        ("/queues/email.send".into(), "h1"),
        (outbound.clone(), "#mail-status"),
        (format!("{outbound}/edit"), "form"),
        (format!("/dead-letters/{malformed}/edit"), "form"),
    ];
    for (path, ready) in &more {
        client.goto(&format!("{base}{path}")).await?;
        element(client, ready).await;
        problems.extend(check_page(&browser, path, None).await);
    }

    // A replay's dry run (the confirm page), then the trail and its entry.
    client.goto(&format!("{base}/dead-letters")).await?;
    element(client, "a.open-group").await.click().await?;
    element(client, "button.replay").await.click().await?;
    text_of(client, "#planned", "").await;
    problems.extend(
        check_page(
            &browser,
            "the replay's confirm page",
            Some(shots.join("narrow-confirm.png")),
        )
        .await,
    );
    client.goto(&format!("{base}/actions")).await?;
    text_of(client, "#trail", "alice").await;
    problems.extend(check_page(&browser, "/actions", None).await);
    let entry = link(&browser, "#trail a[href^='/actions/']").await;
    client.goto(&format!("{base}{entry}")).await?;
    element(client, "main").await;
    problems.extend(check_page(&browser, &entry, None).await);

    // Nothing on a page is reached only by script.
    assert!(
        client.find_all(Locator::Css("script")).await?.is_empty(),
        "a page carries a script"
    );
    browser.close().await;
    world.host.stop_cleanly().await;
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(())
}
