//! Stuck work, with the real `worker-host` binary on the real services: an action execution
//! left `pending` with no command to finish it is counted by `worker_stuck_work` and raises the
//! `stuck-work:execution` alert on `/status` (readiness untouched); a host whose reconciler
//! ticks re-queues its command, and the loop finishes it: the action runs, the mail it queues
//! is sent once, and the alert clears.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::time::Duration;

use serde_json::json;
use support::{Host, SERIAL, base_settings, inbox_count, short_id};
use uuid::Uuid;
use worker_testkit::{TestDb, TestVhost};

/// Starts a host whose reconciler ticks on `schedule`, with readings every 300 ms.
async fn start(db: &TestDb, vhost: &TestVhost, schedule: &str) -> anyhow::Result<Host> {
    Host::launch("STUCK_WORK_SHOW_LOG", |_dir, port| {
        let mut settings = base_settings("stuck-work-test", "[]", db, vhost, port);
        settings.push_str(&format!(
            "\n[alerts]\ninterval = \"300ms\"\n\n[jobs.reconciler]\nschedule = {schedule:?}\n"
        ));
        Ok(settings)
    })
    .await
}

async fn execution_state(db: &TestDb, id: Uuid) -> anyhow::Result<(String, i32)> {
    Ok(
        sqlx::query_as("SELECT status, reconciler_requeues FROM action_executions WHERE id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await?,
    )
}

#[tokio::test]
async fn stuck_work_is_shown_then_healed_by_the_running_host() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let db = TestDb::create().await?;
    let vhost = TestVhost::create().await?;

    // A send_email execution whose command was lost three hours ago: no outbox row.
    let user = format!("stuck-{}", short_id());
    let automation_id = Uuid::new_v4();
    let action = json!({
        "type": "send_email",
        "to": ["{{ from }}"],
        "subject": "Re: {{ subject }}",
        "text": "pong",
    });
    sqlx::query(
        "INSERT INTO automations (id, name, event_type, actions) \
         VALUES ($1, 'stuck', 'email.received', $2)",
    )
    .bind(automation_id)
    .bind(json!([action]))
    .execute(&db.pool)
    .await?;
    let event_id = Uuid::new_v4();
    let event = json!({
        "id": event_id,
        "type": "email.received",
        "occurred_at": "2026-12-01T00:00:00Z",
        "data": {"from": format!("{user}@example.com"), "subject": "ping"},
    });
    let execution = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO action_executions (id, automation_id, event_id, action_index, action, \
             event, updated_at) \
         VALUES ($1, $2, $3, 0, $4, $5, now() - interval '3 hours')",
    )
    .bind(execution)
    .bind(automation_id)
    .bind(event_id)
    .bind(&action)
    .bind(&event)
    .execute(&db.pool)
    .await?;

    // A host whose reconciler does not tick (once a year): the gauge and the alert see it.
    let host = start(&db, &vhost, "0 0 0 1 1 *").await?;
    let host_ref = &host;
    host.wait_for(
        "worker_stuck_work{kind=execution} 1 on /metrics",
        || async move {
            let scrape = host_ref.metrics().await?;
            Ok((scrape.sum("worker_stuck_work", &[("kind", "execution")]) == 1.0).then_some(()))
        },
    )
    .await;
    host.wait_for("the stuck-work:execution alert on /status", || async move {
        let alerts = host_ref.alerts().await?;
        Ok(alerts
            .iter()
            .any(|a| a["name"] == "stuck-work:execution")
            .then_some(()))
    })
    .await;
    assert_eq!(
        host.readyz().await?,
        200,
        "an alert never touches readiness"
    );
    assert_eq!(
        host.metrics()
            .await?
            .sum("worker_stuck_work", &[("kind", "email")]),
        0.0
    );
    host.stop_cleanly().await;

    // A host whose reconciler ticks: the command is re-queued and the loop finishes the work.
    let host = start(&db, &vhost, "every 1s").await?;
    let host_ref = &host;
    let db_ref = &db;
    host.wait_for(
        "the execution succeeded after one re-queue",
        || async move {
            let state = execution_state(db_ref, execution).await?;
            Ok((state == ("succeeded".to_string(), 1)).then_some(()))
        },
    )
    .await;
    host.wait_for("the reply sent", || async move {
        let status: Option<String> =
            sqlx::query_scalar("SELECT status FROM outbound_emails WHERE action_execution_id = $1")
                .bind(execution)
                .fetch_optional(&db_ref.pool)
                .await?;
        Ok((status.as_deref() == Some("sent")).then_some(()))
    })
    .await;
    let user_ref = &user;
    host.wait_for("one mail in the inbox", || async move {
        Ok((inbox_count(user_ref).await? >= 1).then_some(()))
    })
    .await;
    host.wait_for("the alert cleared and the gauge at 0", || async move {
        let alerts = host_ref.alerts().await?;
        let scrape = host_ref.metrics().await?;
        Ok(
            (alerts.is_empty() && scrape.sum("worker_stuck_work", &[("kind", "execution")]) == 0.0)
                .then_some(()),
        )
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(inbox_count(&user).await?, 1, "one mail, not two");
    host.stop_cleanly().await;
    Ok(())
}
