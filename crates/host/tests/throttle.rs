//! A throttled webhook does not hold the action queue, with the real `worker-host` binary on
//! the real services: twelve webhook actions whose receiver answers `429 Retry-After: 3600`,
//! then a ping mail; the ping's reply goes out within seconds, and each webhook was called
//! once and parked for later instead of being waited out in memory.
//!
//! `THROTTLE_SHOW_LOG=1` prints the host's log when it stops.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use support::{
    AUTOMATION, Host, SERIAL, base_settings, http_receiver, inbox, mail_account_settings,
    send_mail, short_id,
};
use worker_testkit::{TestDb, TestVhost};

const HOOKS: usize = 12;
/// "Within seconds": the whole loop (poll, trigger, action, send, IMAP) of one ping.
const REPLY_WITHIN: Duration = Duration::from_secs(20);

/// The demo's ping automation, and twelve automations that each call the receiver on any
/// mail whose subject contains `hook`.
fn automations(port: u16) -> String {
    let mut text = AUTOMATION.to_string();
    for i in 0..HOOKS {
        write!(
            text,
            r#"
[[automations]]
name = "hook-{i}"
event_type = "email.received"
conditions = [{{ path = "subject", op = "contains", value = "hook" }}]

[[automations.actions]]
type = "webhook"
url = "http://127.0.0.1:{port}/hook/{i}"
"#
        )
        .unwrap();
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twelve_webhooks_throttled_for_an_hour_do_not_hold_a_ping_reply() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let db = TestDb::create_empty().await?;
    let vhost = TestVhost::create().await?;
    // Every webhook call is answered 429, come back in an hour.
    let (port, calls) = http_receiver(
        "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 3600\r\nContent-Length: 0\r\n",
    )
    .await?;
    let id = short_id();
    let account = format!("throttle-{id}");
    let sender = format!("sender-throttle-{id}");
    let host = Host::launch("THROTTLE_SHOW_LOG", |dir, admin| {
        let file = dir.join("automations.toml");
        std::fs::write(&file, automations(port))?;
        let files = format!("[{:?}]", file.display().to_string());
        let mut settings = base_settings("throttle-test", &files, &db, &vhost, admin);
        settings.push_str(&mail_account_settings(&account));
        // The receiver is on loopback, which a webhook reaches only when allowed.
        settings.push_str(&format!(
            "\n[jobs.automation_action]\nwebhook_allow = [\"127.0.0.1:{port}\"]\n"
        ));
        Ok(settings)
    })
    .await?;

    // Twelve webhook actions, each answered 429 for an hour.
    send_mail(
        &format!("{sender}@localhost"),
        &format!("{account}@localhost"),
        &format!("hook storm {id}"),
        "throttle.test",
    )
    .await?;
    let calls_ref = &calls;
    host.wait_for("the webhooks called", || async move {
        // Eight at least: as many as the action consumer runs at once by default.
        Ok((calls_ref.load(Ordering::SeqCst) >= 8).then_some(()))
    })
    .await;

    let subject = format!("ping after the storm {id}");
    send_mail(
        &format!("{sender}@localhost"),
        &format!("{account}@localhost"),
        &subject,
        "throttle.test",
    )
    .await?;
    let sent = Instant::now();
    let reply = loop {
        let mails = inbox(&sender).await?;
        if let Some(reply) = mails
            .into_iter()
            .find(|m| m.subject.as_deref() == Some(format!("Re: {subject}").as_str()))
        {
            break reply;
        }
        assert!(
            sent.elapsed() < REPLY_WITHIN,
            "no reply within {REPLY_WITHIN:?} of the ping: the throttled webhooks hold the action queue ({} webhook calls)\n{}",
            calls.load(Ordering::SeqCst),
            host.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("reply {:?} after the ping: {reply:?}", sent.elapsed());

    // Each webhook was called once and parked, not tried again in memory.
    let host_ref = &host;
    let metrics = host
        .wait_for("twelve parked actions on /metrics", || async move {
            let m = host_ref.metrics().await?;
            Ok((m.messages("automation-action", "parked") >= HOOKS as f64).then_some(m))
        })
        .await;
    let parked: Vec<&str> = metrics
        .0
        .lines()
        .filter(|l| l.starts_with("worker_messages_total") && l.contains("parked"))
        .collect();
    assert_eq!(
        metrics.messages("automation-action", "parked"),
        HOOKS as f64,
        "{parked:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), HOOKS, "one call per webhook");
    host.stop_cleanly().await;
    Ok(())
}
