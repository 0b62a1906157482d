//! A bounced reply in Chromium (issue 39): a customer's mail is answered through Postfix,
//! which bounces the reply itself (its `error` transport for `bounce.test`, 5.1.1), and the
//! console's story of the customer's mail says it ended bounced, with the status and the
//! reason in words, the state marked by a badge in the failures' colours; axe-core finds
//! nothing on the page. With `WH_CONSOLE_SCREENSHOTS=docs/console` its screenshot is written
//! there (`mail-story-bounced.png`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use support::SERIAL;
use support::browser::{element, screenshot_dir, text_of};
use support::story::{Bounced, bounced_reply};
use worker_testkit::Browser;

/// The failures' badge (`.badge.dead`, `.badge.failing`, ...) as Chromium computes it: its
/// background, its text's colour (`--bad`, 5.6:1 on that background).
const FAILURE_BACKGROUND: &str = "rgba(253, 232, 231, 1)";
const FAILURE_TEXT: &str = "rgba(179, 38, 30, 1)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounced_mails_page_names_the_status_and_the_reason_in_words() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let (shots, _temporary) = screenshot_dir();
    let Bounced {
        host,
        mail,
        db: _db,
        vhost: _vhost,
        ..
    } = bounced_reply("console-bounce").await?;
    let id = mail["id"].as_str().unwrap();

    let browser = Browser::start().await?;
    let client = &browser.client;
    client.goto(&host.url(&format!("/mail/{id}"))).await?;
    let end = text_of(client, "#end-state", "Bounced: the reply to ").await;
    assert!(
        end.contains("was accepted by the relay, then bounced for ")
            && end.contains("5.1.1, the address does not exist")
            && end.contains("no such mailbox at bounce.test (test kit)"),
        "{end}"
    );
    // The state is marked, not only said: a badge, in the failures' colours.
    let badge = element(client, "#end-state .badge.bounced").await;
    assert_eq!(badge.text().await?, "bounced");
    assert_eq!(
        badge.css_value("background-color").await?,
        FAILURE_BACKGROUND
    );
    assert_eq!(badge.css_value("color").await?, FAILURE_TEXT);
    // The timeline ends with the report's step, in the same words.
    let last = text_of(client, "#timeline tr.step:last-child", "A delivery report").await;
    assert!(last.contains("5.1.1, the address does not exist"), "{last}");
    element(client, "#timeline tr.step.bounced:last-child").await;
    browser.assert_accessible(&format!("/mail/{id}")).await?;
    browser
        .screenshot(&shots.join("mail-story-bounced.png"))
        .await?;
    browser.close().await;
    host.stop_cleanly().await;
    Ok(())
}
