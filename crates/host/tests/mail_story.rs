//! A mail's story, for every end state, each set up for real through the loop: mails sent
//! over SMTP to an IMAP account the host polls, answered (or not) through the trigger, the
//! action and the send, with the local SMTP server refusing some replies. For each, the CLI's
//! `mail find --json` and `mail show --json` name the end state and its reason, and the
//! console's `/mail/{id}` says it in words, in Chromium (axe-core clean).
//!
//! With `WH_CONSOLE_SCREENSHOTS=docs/console` the story of the mail skipped by the reply
//! limit and the search page are written there (`mail-story-skipped.png`, `mail-search.png`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use serde_json::Value;
use support::browser::{element, screenshot_dir, text_of};
use support::story::{Bounced, bounced_reply, found_in_state, show};
use support::{
    Host, SERIAL, SmtpFailSwitch, base_settings, mail_account_settings, send_mail, short_id,
    write_automation,
};
use worker_testkit::{Browser, TestDb, TestVhost};

const TOKEN: &str = "mail-story-operator-token";

/// A host polling `account` every second, answering each address once an hour, with a short
/// first retry tier and a long second one (a refused reply waits there).
async fn start(db: &TestDb, vhost: &TestVhost, account: &str) -> anyhow::Result<Host> {
    Host::launch("MAIL_STORY_SHOW_LOG", |dir, port| {
        let automations = write_automation(dir)?;
        let mut settings = base_settings("mail-story-test", &automations, db, vhost, port);
        settings = settings.replacen(
            "[admin]\n",
            &format!("[admin]\noperator_token = {TOKEN:?}\nopen_reading = true\n"),
            1,
        );
        settings.push_str(&mail_account_settings(account));
        settings.push_str(
            r#"
[jobs.automation_action.auto_replies]
per_recipient = 1

[jobs.email_send]
max_attempts = 10

[jobs.email_send.queue]
retry_tiers = ["1s", "300s"]
"#,
        );
        Ok(settings)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_end_state_is_named_in_words_by_the_cli_and_the_console() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let (shots, _temporary) = screenshot_dir();
    let db = TestDb::create_empty().await?;
    let vhost = TestVhost::create().await?;
    let id = short_id();
    let account = format!("story-{id}");
    let to = format!("{account}@localhost");
    let sender = |who: &str| format!("{who}-{id}@localhost");
    let (answered, refused, later) = (sender("ann"), sender("bob"), sender("cat"));
    let unmatched = sender("dan");
    let bounce = format!("MAILER-DAEMON@story-{id}.test");
    let refusal = "550 5.1.1 no such user";
    let refused_switch = SmtpFailSwitch::set(&refused, refusal)?;
    let _later_switch = SmtpFailSwitch::set(&later, "451 4.3.0 try again later")?;
    let host = start(&db, &vhost, &account).await?;

    send_mail(&answered, &to, "ping one", "story.test").await?;
    send_mail(&unmatched, &to, "hello, anyone?", "story.test").await?;
    send_mail(&bounce, &to, "ping: undeliverable", "story.test").await?;
    send_mail(&refused, &to, "ping from nowhere", "story.test").await?;
    send_mail(&later, &to, "ping later", "story.test").await?;

    // Answered; then the same sender again, held back by the reply limit (once an hour).
    let first = found_in_state(&host, &answered, "answered").await;
    send_mail(&answered, &to, "ping two", "story.test").await?;
    let limited = host
        .wait_for("the second mail from ann skipped", || async {
            let (_, out, _) = host
                .cli(&["mail", "find", "--from", &answered, "--json"])
                .await?;
            let found: Vec<Value> = serde_json::from_str(&out)?;
            Ok(found.into_iter().find(|m| m["end"]["state"] == "skipped"))
        })
        .await;
    assert_eq!(limited["end"]["reason"], "reply-limit", "{limited:#}");
    let no_match = found_in_state(&host, &unmatched, "skipped").await;
    assert_eq!(no_match["end"]["reason"], "no-match", "{no_match:#}");
    assert!(
        no_match["end"]["detail"]
            .as_str()
            .unwrap()
            .contains(r#"subject contains "ping" does not hold"#),
        "{no_match:#}"
    );
    let guarded = found_in_state(&host, &bounce, "skipped").await;
    assert_eq!(guarded["end"]["reason"], "loop-guard", "{guarded:#}");
    let failed = found_in_state(&host, &refused, "failed").await;
    assert!(
        failed["end"]["detail"].as_str().unwrap().contains(refusal),
        "{failed:#}"
    );
    let waiting = found_in_state(&host, &later, "waiting").await;
    assert!(
        waiting["end"]["detail"]
            .as_str()
            .unwrap()
            .contains("retry tier"),
        "{waiting:#}"
    );

    // The failed one's story: its dead letter, then replayed once the address is accepted.
    let failed_story = show(&host, failed["id"].as_str().unwrap()).await;
    let dead = failed_story["dead_letters"][0]["id"].as_i64().unwrap();
    assert!(
        failed_story["steps"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["kind"] == "dead-lettered"),
        "{failed_story:#}"
    );
    drop(refused_switch);
    let (code, _, err) = host
        .cli(&["dlq", "replay", "--id", &dead.to_string()])
        .await?;
    assert_eq!(code, Some(0), "dlq replay: {err}");
    let replayed = found_in_state(&host, &refused, "answered").await;
    assert!(
        replayed["end"]["detail"]
            .as_str()
            .unwrap()
            .contains("after an operator's replay"),
        "{replayed:#}"
    );

    // The whole story of the answered mail: each hop with its time and the gap before it.
    let story = show(&host, first["id"].as_str().unwrap()).await;
    let kinds: Vec<&str> = story["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["kind"].as_str().unwrap())
        .collect();
    for kind in [
        "received",
        "published",
        "matched",
        "queued",
        "executed",
        "sent",
    ] {
        assert!(kinds.contains(&kind), "no {kind} step: {kinds:?}");
    }
    // (Trace ids are kept where the host traces: this host exports no spans, so it has none;
    // the store's test holds a publication to its trace id.)
    assert!(story["steps"][1]["gap_ms"].is_i64(), "{story:#}");

    // The console: each end state in words.
    let browser = Browser::start().await?;
    let client = &browser.client;
    let base = host.url("");
    let pages = [
        (&first, "Answered"),
        (&limited, "the reply limit"),
        (&no_match, "no automation matched"),
        (&guarded, "the loop guard"),
        (&waiting, "retry tier"),
        (&replayed, "after an operator's replay"),
    ];
    // A dead letter links to the story of the mail it answers.
    client.goto(&format!("{base}/dead-letters/{dead}")).await?;
    element(client, "#story-link a").await.click().await?;
    text_of(client, "#end-state", "after an operator's replay").await;
    for (mail, words) in pages {
        let id = mail["id"].as_str().unwrap();
        client.goto(&format!("{base}/mail/{id}")).await?;
        text_of(client, "#end-state", words).await;
        element(client, "#timeline tr.step").await;
        browser.assert_accessible(&format!("/mail/{id}")).await?;
    }
    client
        .goto(&format!("{base}/mail/{}", limited["id"].as_str().unwrap()))
        .await?;
    browser
        .screenshot(&shots.join("mail-story-skipped.png"))
        .await?;
    // The overview counts the skips by reason, and so does /metrics.
    client.goto(&format!("{base}/")).await?;
    text_of(client, "#jobs", "skipped (reply-limit)").await;
    text_of(client, "#jobs", "skipped (no-match)").await;
    let metrics = host.metrics().await?;
    assert_eq!(
        metrics.sum(
            "worker_messages_total",
            &[("outcome", "skipped"), ("reason", "loop-guard")]
        ),
        1.0,
        "{}",
        metrics.0
    );
    // The search, from the header's link.
    element(client, "header nav a[href='/mail']")
        .await
        .click()
        .await?;
    element(client, "input[name=from]")
        .await
        .send_keys(&answered)
        .await?;
    element(client, "#find").await.click().await?;
    text_of(client, "#mail-count", "2 mails").await;
    text_of(client, "#mails", "reply limit").await;
    browser.assert_accessible("/mail").await?;
    browser.screenshot(&shots.join("mail-search.png")).await?;
    browser.close().await;
    host.stop_cleanly().await;
    Ok(())
}

/// A reply past `jobs.email_send.max_age` when its turn comes (here: the relay answers 451 for
/// longer than the limit) ends `expired`, in words, in `mail find|show --json`, and is counted
/// as a skip with reason `expired`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_past_max_age_ends_expired_in_words() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let db = TestDb::create_empty().await?;
    let vhost = TestVhost::create().await?;
    let id = short_id();
    let account = format!("stale-{id}");
    let to = format!("{account}@localhost");
    let late = format!("eve-{id}@localhost");
    let _refused = SmtpFailSwitch::set(&late, "451 4.3.0 try again later")?;
    let host = Host::launch("MAIL_STORY_SHOW_LOG", |dir, port| {
        let automations = write_automation(dir)?;
        let mut settings = base_settings("mail-story-stale", &automations, &db, &vhost, port);
        settings.push_str(&mail_account_settings(&account));
        settings.push_str(
            r#"
[jobs.email_send]
max_attempts = 10
max_age = "2s"

[jobs.email_send.queue]
retry_tiers = ["3s"]
"#,
        );
        Ok(settings)
    })
    .await?;

    send_mail(&late, &to, "ping, slowly", "story.test").await?;
    let expired = found_in_state(&host, &late, "expired").await;
    let detail = expired["end"]["detail"].as_str().unwrap();
    assert!(
        detail.contains("old when its turn came, past jobs.email_send.max_age (2 seconds)"),
        "{expired:#}"
    );
    let story = show(&host, expired["id"].as_str().unwrap()).await;
    assert_eq!(story["end"]["state"], "expired", "{story:#}");
    assert_eq!(story["outbound"][0]["status"], "expired", "{story:#}");
    let metrics = host.metrics().await?;
    assert_eq!(
        metrics.sum(
            "worker_messages_total",
            &[("outcome", "skipped"), ("reason", "expired")]
        ),
        1.0,
        "{}",
        metrics.0
    );
    assert_eq!(
        metrics.sum("worker_messages_total", &[("outcome", "dead-lettered")]),
        0.0,
        "{}",
        metrics.0
    );
    host.stop_cleanly().await;
    Ok(())
}

/// A reply Postfix accepts and then bounces itself (its `error` transport for `bounce.test`,
/// 5.1.1): its real delivery status notification comes back to the host's sender address,
/// which the poller reads, and the story of the mail it answered ends `bounced`, with the
/// status and the reason in words, in `mail find|show --json`; the report is a mail of its own
/// whose story says what it is; the bounce is counted by class.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_postfix_bounces_ends_the_story_of_the_mail_it_answered_bounced()
-> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let Bounced {
        host,
        customer,
        mail: bounced,
        db: _db,
        vhost: _vhost,
    } = bounced_reply("mail-story-bounced").await?;
    let detail = bounced["end"]["detail"].as_str().unwrap();
    assert!(
        detail.starts_with(&format!(
            "the reply to {customer} was accepted by the relay, then bounced for {customer}: \
             5.1.1, the address does not exist"
        )) && detail.contains("no such mailbox at bounce.test (test kit)"),
        "{bounced:#}"
    );
    let story = show(&host, bounced["id"].as_str().unwrap()).await;
    assert_eq!(story["end"]["state"], "bounced", "{story:#}");
    assert_eq!(story["outbound"][0]["status"], "bounced", "{story:#}");
    assert_eq!(story["bounces"][0]["status"], "5.1.1", "{story:#}");
    assert_eq!(
        story["bounces"][0]["recipient"],
        customer.as_str(),
        "{story:#}"
    );
    let kinds: Vec<&str> = story["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds.last(), Some(&"bounced"), "{story:#}");
    // The console says it in the same words (addresses masked for an open reader).
    let page = host
        .get_text(&format!("/mail/{}", bounced["id"].as_str().unwrap()))
        .await?;
    assert!(
        page.contains(r#"<span class="badge bounced">bounced</span> Bounced: the reply to "#)
            && page.contains("5.1.1, the address does not exist"),
        "{page}"
    );

    // The report itself: stored as what it is, never answered.
    let report = found_in_state(&host, "MAILER-DAEMON@localhost", "skipped").await;
    assert_eq!(report["end"]["reason"], "delivery-report", "{report:#}");
    assert!(
        report["end"]["detail"]
            .as_str()
            .unwrap()
            .contains(&format!("{customer}: 5.1.1")),
        "{report:#}"
    );
    let metrics = host.metrics().await?;
    assert_eq!(
        metrics.sum(
            "worker_bounces_total",
            &[("class", "permanent"), ("matched", "true")]
        ),
        1.0,
        "{}",
        metrics.0
    );
    host.stop_cleanly().await;
    Ok(())
}
