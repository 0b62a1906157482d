//! Customers' personal data by role in a real browser (Debian's headless Chromium through a
//! ChromeDriver of the test's own), against the real binary on the real services: a viewer
//! sees a refused reply's customer address masked and its dead letter's body hidden; an
//! operator sees both and allows another viewer to reveal; that viewer's reveal shows the page
//! and is in the audit trail.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use fantoccini::{Client, Locator};
use support::SERIAL;
use support::browser::{element, sign_in, sign_out, text_of};
use support::console::{Setup, World};
use support::edit::failed_mail;
use worker_testkit::Browser;

const SHOW_LOG: &str = "CONSOLE_PERSONAL_SHOW_LOG";
const PASSWORD: &str = "a-long-enough-password";
const HIDDEN: &str = "[hidden: personal data]";

async fn source(client: &Client) -> String {
    client.source().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_sees_masks_an_operator_sees_the_data_and_a_reveal_is_audited() {
    let _serial = SERIAL.lock().await;
    let world = World::start(SHOW_LOG, Setup::signed_reading())
        .await
        .unwrap();
    let failed = failed_mail(&world).await.unwrap();
    let local = world.refused.split('@').next().unwrap().to_string();
    for (name, role) in [("vera", "viewer"), ("rita", "viewer"), ("olga", "operator")] {
        world.add_account(name, role, PASSWORD).unwrap();
    }
    let browser = Browser::start().await.unwrap();
    let client = &browser.client;
    let base = world.host.url("");
    let dead_letter = format!("{base}/dead-letters/{}", failed.dead_letter);
    let mail = format!("{base}/outbound/{}", failed.mail);
    let masked = format!("{}***@localhost", &local[..1]);

    sign_in(client, &base, "vera", PASSWORD).await;
    client.goto(&dead_letter).await.unwrap();
    text_of(client, "#personal-data", "masked").await;
    text_of(client, "#body", HIDDEN).await;
    client.goto(&mail).await.unwrap();
    text_of(client, "#mail-to", &masked).await;
    let seen = source(client).await;
    assert!(!seen.contains(&local), "a viewer is shown {local}:\n{seen}");
    assert!(
        client.find(Locator::Css("#reveal")).await.is_err(),
        "a viewer not allowed is offered a reveal"
    );
    sign_out(client).await;

    sign_in(client, &base, "olga", PASSWORD).await;
    client.goto(&dead_letter).await.unwrap();
    text_of(client, "#body", "email_message_id").await;
    client.goto(&mail).await.unwrap();
    text_of(client, "#mail-to", &local).await;
    assert!(
        client.find(Locator::Css("#personal-data")).await.is_err(),
        "an operator is told the page is masked"
    );
    client.goto(&format!("{base}/accounts")).await.unwrap();
    element(client, "#personal-data-rita")
        .await
        .click()
        .await
        .unwrap();
    text_of(client, "#account-rita .personal-data", "may reveal").await;
    sign_out(client).await;

    sign_in(client, &base, "rita", PASSWORD).await;
    client.goto(&mail).await.unwrap();
    text_of(client, "#mail-to", &masked).await;
    element(client, "#reveal").await.click().await.unwrap();
    text_of(client, "#mail-to", &local).await;
    assert!(
        client.find(Locator::Css("#personal-data")).await.is_err(),
        "the revealed page still says it is masked"
    );
    client.goto(&dead_letter).await.unwrap();
    text_of(client, "#body", HIDDEN).await;
    client.goto(&format!("{base}/actions")).await.unwrap();
    text_of(client, "#trail", "reveal").await;

    let reveals: Vec<(Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT account, filter ->> 'page' FROM dead_letter_actions WHERE action = 'reveal'",
    )
    .fetch_all(&world.db.pool)
    .await
    .unwrap();
    assert_eq!(
        reveals,
        vec![(
            Some("rita".to_string()),
            Some(format!("/outbound/{}", failed.mail))
        )]
    );
}
