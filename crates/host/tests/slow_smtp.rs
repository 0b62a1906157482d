//! A slow SMTP server starves nothing else: with every email-send slot waiting on a server
//! that takes 20 s to answer each mail, `/readyz` stays 200, the trigger, the action executor
//! and the outbox drain keep flowing, and nothing anywhere waits out a database pool timeout.
//! The real `worker-host` binary, the real broker and database, and a private instance of the
//! project's SMTP sink that holds back its answers.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::time::{Duration, Instant};

use support::{Host, SERIAL, base_settings, publish_pings, write_automation};
use worker_testkit::{SmtpSink, TestDb, TestVhost};

/// How long the server holds its answer to each slow mail's end of DATA.
const SLOW: Duration = Duration::from_secs(20);
/// Sends in flight at once: the email-send concurrency and the SMTP pool.
const IN_FLIGHT: usize = 8;

async fn scalar(db: &TestDb, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(&db.pool).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_smtp_server_starves_neither_readiness_nor_the_other_jobs() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let db = TestDb::create().await?;
    let vhost = TestVhost::create().await?;
    let sink = SmtpSink::start()?;
    sink.delay_answer("slow@localhost", SLOW)?;
    let host = Host::launch("SLOW_SMTP_SHOW_LOG", |dir, port| {
        let automations = write_automation(dir)?;
        let mut settings = base_settings("slow-smtp-test", &automations, &db, &vhost, port);
        settings.push_str(&format!(
            r#"
[smtp]
port = {smtp_port}
pool_size = {IN_FLIGHT}

[jobs.email_send]
concurrency = {IN_FLIGHT}
"#,
            smtp_port = sink.port,
        ));
        Ok(settings)
    })
    .await?;

    publish_pings(&vhost, "slow@localhost", IN_FLIGHT).await?;
    host.wait_for("every slow reply to be in DATA", || async {
        Ok((sink.delivered("slow").len() == IN_FLIGHT).then_some(()))
    })
    .await;
    let slow_started = Instant::now();

    // Every send slot now waits on the server. The rest of the loop must go on.
    publish_pings(&vhost, "fast@localhost", IN_FLIGHT).await?;
    let mut readiness = Vec::new();
    let mut flowed_after = None;
    while slow_started.elapsed() < SLOW - Duration::from_secs(4) {
        readiness.push(host.readyz().await.unwrap_or(0));
        let executed = scalar(
            &db,
            "SELECT count(*) FROM action_executions \
             WHERE status = 'succeeded' AND event->'data'->>'from' = 'fast@localhost'",
        )
        .await;
        let queued = scalar(
            &db,
            "SELECT count(*) FROM outbound_emails WHERE to_addresses = '{fast@localhost}'",
        )
        .await;
        let unpublished = scalar(
            &db,
            // A published row is deleted: what is left waits or failed.
            "SELECT count(*) FROM outbox",
        )
        .await;
        if flowed_after.is_none()
            && executed == IN_FLIGHT as i64
            && queued == IN_FLIGHT as i64
            && unpublished == 0
        {
            flowed_after = Some(slow_started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        readiness.iter().all(|&status| status == 200),
        "/readyz while the server was slow: {readiness:?}\n{}",
        host.log_tail()
    );
    let flowed_after = flowed_after.unwrap_or_else(|| {
        panic!(
            "the trigger, executor and drain did not handle the fast pings while every send \
             waited on the server\n{}",
            host.log_tail()
        )
    });
    eprintln!(
        "the fast pings were executed and their mails queued {flowed_after:?} into the slow sends"
    );

    // The slow answers come; then the fast replies go out through the freed slots.
    host.wait_for("every reply to be recorded sent", || async {
        let sent = scalar(
            &db,
            "SELECT count(*) FROM outbound_emails WHERE status = 'sent'",
        )
        .await;
        Ok((sent == 2 * IN_FLIGHT as i64).then_some(()))
    })
    .await;
    assert_eq!(
        sink.delivered("slow").len(),
        IN_FLIGHT,
        "one reply per slow ping"
    );
    assert_eq!(
        sink.delivered("fast").len(),
        IN_FLIGHT,
        "one reply per fast ping"
    );
    let log = host.log_text();
    assert!(
        !log.contains("pool timed out"),
        "a database pool timeout in the host's log:\n{}",
        host.log_tail()
    );
    host.stop_cleanly().await;
    Ok(())
}
