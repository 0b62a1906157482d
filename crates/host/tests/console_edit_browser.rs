//! Edit and retry in a real browser (issue 26): a mail refused with 550 is dead-lettered; an
//! operator opens its dead letter, edits the recipient in the mail's form and sends it; the
//! edited mail is delivered once, and the original is kept and shown superseded.
//!
//! Screenshots `edit-mail.png` (the form) and `mail-superseded.png`; with
//! `WH_CONSOLE_SCREENSHOTS=docs/console` they are written there, else to a folder that is
//! removed.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::time::{Duration, Instant};

use support::SERIAL;
use support::browser::{element, screenshot_dir, text_of};
use support::console::{TOKEN, World};
use support::edit::{delivered, failed_mail, fresh_address, wait_delivered};
use worker_testkit::Browser;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_edits_a_refused_mails_recipient_and_it_is_delivered_once() -> anyhow::Result<()>
{
    let _serial = SERIAL.lock().await;
    let (shots, _temporary) = screenshot_dir();
    let world = World::with_token("CONSOLE_EDIT_BROWSER_SHOW_LOG").await?;
    let failed = failed_mail(&world).await?;
    let browser = Browser::start().await?;
    let client = &browser.client;
    let base = world.host.url("");

    // Sign in, then open the dead letter of the refused mail.
    client.goto(&format!("{base}/sign-in")).await?;
    element(client, "#name").await.send_keys("alice").await?;
    element(client, "#password").await.send_keys(TOKEN).await?;
    element(client, "#submit").await.click().await?;
    text_of(client, "#operator", "alice").await;
    client
        .goto(&format!("{base}/dead-letters/{}", failed.dead_letter))
        .await?;
    text_of(client, "#error-chain", "550 5.1.1 no such user").await;

    // The mail's form: the recipient edited.
    element(client, "#edit-mail").await.click().await?;
    text_of(client, "#original-error", "550 5.1.1 no such user").await;
    let to = fresh_address();
    let field = element(client, "#edit-to").await;
    field.clear().await?;
    field.send_keys(&to).await?;
    browser.screenshot(&shots.join("edit-mail.png")).await?;
    element(client, "#send-edited").await.click().await?;

    // The copy's page names the original; the copy is delivered once.
    text_of(client, "#supersedes", &failed.mail).await;
    assert_eq!(wait_delivered(&world, &to, 1).await, 1);
    // The page does not reload itself (no script): reload until the send is recorded.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        client.refresh().await?;
        let status = element(client, "#mail-status").await.text().await?;
        if status == "sent" || Instant::now() > deadline {
            assert_eq!(status, "sent");
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The original: kept, marked superseded, with the diff.
    element(client, "#original-link").await.click().await?;
    text_of(client, "#mail-status", "superseded").await;
    text_of(client, "#superseded", "alice").await;
    text_of(client, "#mail-to", &world.refused).await;
    text_of(client, "#edits", &to).await;
    browser
        .screenshot(&shots.join("mail-superseded.png"))
        .await?;

    // Its dead letter is settled as edited, and offers no replay.
    client
        .goto(&format!("{base}/dead-letters/{}", failed.dead_letter))
        .await?;
    text_of(client, "#status", "edited").await;
    text_of(client, "#settled", "Edited and sent again").await;
    assert!(
        client
            .find(fantoccini::Locator::Css("button.replay"))
            .await
            .is_err()
    );

    browser.close().await;
    assert_eq!(delivered(&world, &to), 1, "the edited mail, once");
    assert_eq!(world.delivered_to_refused(), 0, "never the original");
    world.host.stop_cleanly().await;
    Ok(())
}
