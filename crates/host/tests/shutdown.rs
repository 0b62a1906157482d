//! Shutdown finishes what was already delivered, with the real `worker-host` binary on the
//! real services: ten SIGTERM restarts in a row under a backlog of 5,000 events, each of
//! which the trigger turns into a webhook action. Every restart exits 0 within the grace, no
//! message is dead-lettered by the delivery limit (set to 1 here, so that returning a
//! delivery twice to the queue would show), none is lost and each event is handled once.
//!
//! `SHUTDOWN_SHOW_LOG=1` prints each host's log when it stops.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use support::{Host, SERIAL, base_settings, http_receiver};
use worker_testkit::{TestDb, TestVhost};

const EVENTS: usize = 5_000;
const RESTARTS: usize = 10;
/// `workers.shutdown_grace` of the harness's settings.
const GRACE: Duration = Duration::from_secs(5);

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
        let mut settings = base_settings("shutdown-test", &files, db, vhost, port);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_restarts_under_a_backlog_dead_letter_nothing_and_lose_nothing() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let began = Instant::now();
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

    // A last run finishes the backlog: every event is handled or, were one dead-lettered,
    // archived as dead.
    let host = launch(&db, &vhost, hook_port).await?;
    let db_ref = &db;
    host.wait_for("every event handled or dead", || async move {
        let handled = scalar(
            db_ref,
            "SELECT count(DISTINCT event_id) FROM automation_trigger_log",
        )
        .await?;
        let dead = scalar(
            db_ref,
            "SELECT count(*) FROM dead_letters WHERE queue = 'automation.trigger'",
        )
        .await?;
        Ok((handled + dead >= EVENTS as i64).then_some(()))
    })
    .await;
    let dead: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT queue, reason, count(*) FROM dead_letters GROUP BY queue, reason ORDER BY queue",
    )
    .fetch_all(&db.pool)
    .await?;
    assert!(
        dead.is_empty(),
        "dead-lettered (queue, reason, count): {dead:?}"
    );
    host.wait_for("every action done", || async move {
        let done = scalar(
            db_ref,
            "SELECT count(*) FROM action_executions WHERE status = 'succeeded'",
        )
        .await?;
        Ok((done == EVENTS as i64).then_some(()))
    })
    .await;
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
