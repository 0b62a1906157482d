//! Shutdown finishes what was already delivered, with the real `worker-host` binary on the
//! real services: ten SIGTERM restarts in a row under a backlog of 5,000 events, each of
//! which the trigger turns into a webhook action. Every restart exits 0 within the grace, no
//! message is dead-lettered by the delivery limit (set to 1 here, so that returning a
//! delivery twice to the queue would show), none is lost and each event is handled once.
//!
//! How long the last run takes to finish the backlog depends on the machine's load (in the
//! full suite, on two shared cores, several times what it takes alone), so that wait is bounded
//! by progress ([`support::progress`]): it fails when nothing moved for [`STALL`], when
//! anything is dead-lettered or handled twice, or past [`CAP`]. A failure prints the counts
//! over time and the last host's log tail; every host's whole log is kept in
//! `target/tmp/shutdown/` (`restart-N.log`, `last.log`). `SHUTDOWN_SHOW_LOG=1` also prints
//! the last host's log when it stops.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use support::progress::{Look, wait_while_progressing};
use support::{Host, POLL, SERIAL, base_settings, http_receiver};
use worker_testkit::{TestDb, TestVhost};

const EVENTS: usize = 5_000;
const RESTARTS: usize = 10;
/// `workers.shutdown_grace` here, in place of the harness's 5 s. A restart works off what it
/// holds (up to a prefetch of 50 on each of two queues) within two thirds of it, the settle
/// deadline, and only returns deliveries to the queue past that. Alone that takes under half a
/// second; on a loaded machine (the test on one core with three busy loops) up to 4.8 s, past
/// the 5 s grace's settle deadline (3.3 s): the deliveries then returned twice were
/// dead-lettered by the delivery limit of 1. The property is that nothing held is returned
/// when the grace allows finishing it, not that it is finished within 3.3 s on any machine.
const GRACE: Duration = Duration::from_secs(20);
/// Longest time the last run may go without handling an event or finishing an action. Alone
/// it handles hundreds a second; on a loaded machine, tens, but steadily. A stall this long is
/// a host that stopped working: deliveries held by a closed channel, messages parked in a
/// retry tier (the first waits 10 s, the next 30 s).
const STALL: Duration = Duration::from_secs(30);
/// Longest time the last run may take in all while it progresses (alone: about 10 s).
const CAP: Duration = Duration::from_secs(600);

/// One automation: every `order.placed` event calls the receiver.
fn automation(port: u16) -> String {
    format!(
        r#"
[[automations]]
name = "hook-on-order"
event_type = "order.placed"

[[automations.actions]]
type = "webhook"
url = "http://127.0.0.1:{port}/orders"
"#
    )
}

async fn launch(db: &TestDb, vhost: &TestVhost, hook_port: u16) -> anyhow::Result<Host> {
    Host::launch("SHUTDOWN_SHOW_LOG", |dir, port| {
        let file = dir.join("automations.toml");
        std::fs::write(&file, automation(hook_port))?;
        let files = format!("[{:?}]", file.display().to_string());
        let harness_grace = "shutdown_grace = \"5s\"";
        let base = base_settings("shutdown-test", &files, db, vhost, port);
        anyhow::ensure!(
            base.contains(harness_grace),
            "the harness's settings no longer say {harness_grace}"
        );
        let mut settings = base.replace(
            harness_grace,
            &format!("shutdown_grace = \"{}s\"", GRACE.as_secs()),
        );
        // One return to the queue is allowed, a second dead-letters the message: a restart
        // that returns deliveries it never tried shows at once.
        settings.push_str(&format!(
            r#"
[jobs.automation_trigger.queue]
delivery_limit = 1

[jobs.automation_action]
# The receiver is on loopback, which a webhook reaches only when allowed.
webhook_allow = ["127.0.0.1:{hook_port}"]

[jobs.automation_action.queue]
delivery_limit = 1
"#
        ));
        Ok(settings)
    })
    .await
}

/// Publishes the backlog to the events exchange, confirms awaited together.
async fn publish_events(vhost: &TestVhost) -> anyhow::Result<()> {
    let connection =
        Connection::connect(&vhost.amqp_url(), ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let mut confirms = Vec::with_capacity(EVENTS);
    for _ in 0..EVENTS {
        let id = uuid::Uuid::new_v4();
        let body = serde_json::to_vec(&serde_json::json!({
            "id": id,
            "type": "order.placed",
            "occurred_at": "2026-12-01T00:00:00Z",
            "data": {"total": 42},
        }))?;
        let properties = BasicProperties::default()
            .with_delivery_mode(2)
            .with_message_id(id.to_string().as_str().into())
            .with_type("order.placed".into())
            .with_content_type("application/json".into());
        confirms.push(
            channel
                .basic_publish(
                    "events".into(),
                    "order.placed".into(),
                    BasicPublishOptions {
                        mandatory: true,
                        immediate: false,
                    },
                    &body,
                    properties,
                )
                .await?,
        );
    }
    for confirm in confirms {
        let confirm = confirm.await?;
        anyhow::ensure!(confirm.is_ack(), "an event was not confirmed");
        anyhow::ensure!(
            confirm.take_message().is_none(),
            "an event was returned unroutable"
        );
    }
    let _ = connection.close(200, "done".into()).await;
    Ok(())
}

async fn scalar(db: &TestDb, sql: &str) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(sql).fetch_one(&db.pool).await?)
}

/// One look at the last run's work: done when every event is handled and its action succeeded;
/// broken at the first dead letter or the first event handled twice.
async fn look(db: &TestDb) -> anyhow::Result<Look> {
    // Both from one snapshot: counted apart, rows written between the two would look like
    // events handled twice.
    let (handled, logged): (i64, i64) =
        sqlx::query_as("SELECT count(DISTINCT event_id), count(*) FROM automation_trigger_log")
            .fetch_one(&db.pool)
            .await?;
    let done = scalar(
        db,
        "SELECT count(*) FROM action_executions WHERE status = 'succeeded'",
    )
    .await?;
    let dead: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT queue, reason, count(*) FROM dead_letters GROUP BY queue, reason ORDER BY queue",
    )
    .fetch_all(&db.pool)
    .await?;
    Ok(if !dead.is_empty() {
        Look::Broken(format!("dead-lettered (queue, reason, count): {dead:?}"))
    } else if logged > handled {
        Look::Broken(format!(
            "{} events handled twice ({logged} trigger-log rows for {handled} events): {}",
            logged - handled,
            handled_twice(db).await?
        ))
    } else if handled == EVENTS as i64 && done == EVENTS as i64 {
        Look::Done(vec![handled, done])
    } else {
        Look::Working(vec![handled, done])
    })
}

/// The events handled more than once (at most five): when each was matched, and the tries
/// the attempt log holds for it, to tell which host handled it again and why.
async fn handled_twice(db: &TestDb) -> anyhow::Result<String> {
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT event_id::text, string_agg(matched_at::text, ', ' ORDER BY matched_at) \
         FROM automation_trigger_log GROUP BY event_id HAVING count(*) > 1 LIMIT 5",
    )
    .fetch_all(&db.pool)
    .await?;
    let mut text = String::new();
    for (event, matched) in rows {
        let tries: Vec<(String, i32, i32, String, Option<String>)> = sqlx::query_as(
            "SELECT at::text, attempt, try_number, outcome, error FROM attempt_log \
             WHERE job = 'automation-trigger' AND message_id = $1 ORDER BY at",
        )
        .bind(&event)
        .fetch_all(&db.pool)
        .await?;
        text.push_str(&format!(
            "\n  event {event} matched at {matched}; tries (at, attempt, try, outcome, error): {tries:?}"
        ));
    }
    Ok(text)
}

/// `target/tmp/shutdown/`, emptied: where each host's whole log is kept, so that a failed
/// run's logs outlive the hosts' temporary folders.
fn logs_folder() -> anyhow::Result<PathBuf> {
    let folder = Path::new(env!("CARGO_TARGET_TMPDIR")).join("shutdown");
    let _ = std::fs::remove_dir_all(&folder);
    std::fs::create_dir_all(&folder)?;
    Ok(folder)
}

/// Copies `host`'s log to `folder/name.log` (best effort: a log that cannot be kept must not
/// hide the failure being reported).
fn keep_log(folder: &Path, name: &str, host: &Host) {
    let _ = std::fs::write(folder.join(format!("{name}.log")), host.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_restarts_under_a_backlog_dead_letter_nothing_and_lose_nothing() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let began = Instant::now();
    let logs = logs_folder()?;
    let db = TestDb::create_empty().await?;
    let vhost = TestVhost::create().await?;
    let (hook_port, hooks) = http_receiver("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n").await?;

    // A first run declares the topology; the backlog goes in while no host runs.
    let mut host = launch(&db, &vhost, hook_port).await?;
    assert_eq!(host.stop().await, Some(0), "{}", host.log_tail());
    publish_events(&vhost).await?;
    eprintln!(
        "{:>5.1}s  {EVENTS} events queued",
        began.elapsed().as_secs_f64()
    );

    for restart in 0..RESTARTS {
        let mut host = launch(&db, &vhost, hook_port).await?;
        // Stop at varying moments of the first prefetches.
        tokio::time::sleep(Duration::from_millis(200 + 150 * restart as u64)).await;
        let stopping = Instant::now();
        let code = host.stop().await;
        let took = stopping.elapsed();
        keep_log(&logs, &format!("restart-{restart}"), &host);
        assert!(
            !host.log_text().contains("settle deadline over"),
            "restart {restart}: the machine did not finish the deliveries held within the settle \
             deadline (two thirds of the {GRACE:?} grace), so some went back to the queue and \
             count against its delivery limit\n{}",
            host.log_tail()
        );
        assert_eq!(
            code,
            Some(0),
            "restart {restart}: SIGTERM must exit 0\n{}",
            host.log_tail()
        );
        assert!(
            took <= GRACE + Duration::from_secs(1),
            "restart {restart}: exited {took:?} after SIGTERM, past the {GRACE:?} grace\n{}",
            host.log_tail()
        );
        let handled = scalar(&db, "SELECT count(*) FROM automation_trigger_log").await?;
        eprintln!(
            "{:>5.1}s  restart {restart}: stopped in {took:?}, {handled} events handled",
            began.elapsed().as_secs_f64()
        );
    }

    // A last run finishes the backlog: every event handled once, its action done, nothing
    // dead-lettered, however long a loaded machine takes as long as the work moves.
    let host = launch(&db, &vhost, hook_port).await?;
    let drained = wait_while_progressing(
        "the last run finishing the backlog",
        &["events handled", "actions done"],
        (STALL, CAP, POLL),
        || {
            keep_log(&logs, "last", &host);
            format!(
                "(every host's whole log: {})\n{}",
                logs.display(),
                host.log_tail()
            )
        },
        || look(&db),
    )
    .await;
    keep_log(&logs, "last", &host);
    eprintln!(
        "{:>5.1}s  the last run drained the backlog in {:.1}s:\n{}",
        began.elapsed().as_secs_f64(),
        drained.took().as_secs_f64(),
        drained.table(Duration::from_secs(5))
    );
    eprintln!(
        "{:>5.1}s  all {EVENTS} events handled, {} webhook calls",
        began.elapsed().as_secs_f64(),
        hooks.load(Ordering::SeqCst)
    );
    let logged = scalar(&db, "SELECT count(*) FROM automation_trigger_log").await?;
    assert_eq!(logged, EVENTS as i64, "each event handled once");
    for queue in ["automation.trigger.dead", "automation.action.dead"] {
        assert_eq!(vhost.queue_depth(queue).await?, 0, "{queue}");
    }
    host.stop_cleanly().await;
    Ok(())
}
