//! The reconciler against the real PostgreSQL: stuck executions and emails are re-queued
//! through the outbox a bounded number of times, then failed with a dead letter; rows with a
//! live command, recent rows and finished rows are left alone; the gauge's query counts them.

use std::time::Duration;

use job_reconciler::{REASON, Reconciler, ReconcilerConfig, StuckCounts, WorkKind, count_stuck};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;
use worker_core::{NoLease, SkipIfBusy, TickOutcome, WorkContext, tick_once};
use worker_messages::{ActionCommand, EmailSendCommand};
use worker_testkit::TestDb;

/// source, queue, reason, exchange, routing key, last error, body.
type ArchivedRow = (
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    Vec<u8>,
);

const TWO_HOURS: Duration = Duration::from_secs(2 * 3600);

fn ctx() -> WorkContext {
    WorkContext::new("reconciler", CancellationToken::new())
}

fn config(max_requeues: u32) -> ReconcilerConfig {
    ReconcilerConfig {
        stuck_after: TWO_HOURS,
        max_requeues,
        ..ReconcilerConfig::default()
    }
}

async fn automation(pool: &PgPool) -> anyhow::Result<Uuid> {
    let id = Uuid::new_v4();
    sqlx::query("INSERT INTO automations (id, name, event_type, actions) VALUES ($1, $2, 'email.received', '[]')")
        .bind(id)
        .bind(format!("a-{id}"))
        .execute(pool)
        .await?;
    Ok(id)
}

/// An execution in `status`, last changed `age` ago.
async fn execution(
    pool: &PgPool,
    automation_id: Uuid,
    status: &str,
    age: Duration,
) -> anyhow::Result<Uuid> {
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO action_executions (id, automation_id, event_id, action_index, action, event, \
             status, updated_at) \
         VALUES ($1, $2, $3, 0, '{\"type\":\"webhook\"}', '{}', $4, \
                 now() - make_interval(secs => $5))",
    )
    .bind(id)
    .bind(automation_id)
    .bind(Uuid::new_v4())
    .bind(status)
    .bind(age.as_secs_f64())
    .execute(pool)
    .await?;
    Ok(id)
}

/// An email in `status`, last changed `age` ago.
async fn email(pool: &PgPool, status: &str, age: Duration) -> anyhow::Result<Uuid> {
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO outbound_emails (id, message_id, to_addresses, subject, text_body, status, \
             updated_at) \
         VALUES ($1, $1::text || '@test', ARRAY['ann@example.com'], 'hi', 'body', $2, \
                 now() - make_interval(secs => $3))",
    )
    .bind(id)
    .bind(status)
    .bind(age.as_secs_f64())
    .execute(pool)
    .await?;
    Ok(id)
}

async fn age_back(pool: &PgPool, table: &str, id: Uuid, age: Duration) -> anyhow::Result<()> {
    sqlx::query(&format!(
        "UPDATE {table} SET updated_at = now() - make_interval(secs => $2) WHERE id = $1"
    ))
    .bind(id)
    .bind(age.as_secs_f64())
    .execute(pool)
    .await?;
    Ok(())
}

/// The outbox rows for message id `id`: (status, exchange, routing key, body).
async fn outbox_rows(
    pool: &PgPool,
    id: Uuid,
) -> anyhow::Result<Vec<(String, String, String, Vec<u8>)>> {
    Ok(sqlx::query_as(
        "SELECT status, exchange, routing_key, body FROM outbox WHERE message_id = $1 ORDER BY id",
    )
    .bind(id.to_string())
    .fetch_all(pool)
    .await?)
}

async fn status_of(
    pool: &PgPool,
    table: &str,
    id: Uuid,
) -> anyhow::Result<(String, i32, Option<String>)> {
    Ok(sqlx::query_as(&format!(
        "SELECT status, reconciler_requeues, last_error FROM {table} WHERE id = $1"
    ))
    .bind(id)
    .fetch_one(pool)
    .await?)
}

#[tokio::test]
async fn stuck_work_is_requeued_once_then_failed_with_a_dead_letter() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let pool = &db.pool;
    let automation_id = automation(pool).await?;
    let old = Duration::from_secs(3 * 3600);
    let exec = execution(pool, automation_id, "pending", old).await?;
    let mail = email(pool, "queued", old).await?;
    assert_eq!(
        count_stuck(pool, TWO_HOURS).await?,
        StuckCounts {
            executions: 1,
            emails: 1
        }
    );

    let job = Reconciler::new(pool.clone(), config(1));
    let report = job.run(&ctx()).await?;
    assert_eq!(
        (report.requeued_executions, report.requeued_emails),
        (1, 1),
        "{report:?}"
    );
    assert_eq!((report.failed_executions, report.failed_emails), (0, 0));

    // Each command is in the outbox, once, as its first producer wrote it.
    let rows = outbox_rows(pool, exec).await?;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let (status, exchange, key, body) = &rows[0];
    assert_eq!(
        (status.as_str(), exchange.as_str(), key.as_str()),
        ("pending", "commands", "automation.action")
    );
    let command: ActionCommand = serde_json::from_slice(body)?;
    assert_eq!(
        (
            command.action_execution_id,
            command.automation_id,
            command.action_index
        ),
        (exec, automation_id, 0)
    );
    let rows = outbox_rows(pool, mail).await?;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].2, "email.send");
    let command: EmailSendCommand = serde_json::from_slice(&rows[0].3)?;
    assert_eq!(command.outbound_email_id, mail);
    let versions: Vec<Option<String>> = sqlx::query_scalar(
        "SELECT headers ->> 'x-schema-version' FROM outbox WHERE message_id = ANY($1)",
    )
    .bind(vec![exec.to_string(), mail.to_string()])
    .fetch_all(pool)
    .await?;
    assert_eq!(
        versions,
        [Some("1".into()), Some("1".into())],
        "x-schema-version"
    );
    assert_eq!(
        status_of(pool, "action_executions", exec).await?,
        ("pending".into(), 1, None)
    );
    assert_eq!(status_of(pool, "outbound_emails", mail).await?.0, "queued");
    assert_eq!(
        count_stuck(pool, TWO_HOURS).await?,
        StuckCounts::default(),
        "a re-queued row is not stuck"
    );

    // At once again: nothing more (its command is live, and the row was touched).
    let report = job.run(&ctx()).await?;
    assert_eq!(report.items(), 0, "{report:?}");

    // The commands were published (the drain deleted their rows) and lost; another
    // threshold passes.
    let published = [
        (exec, outbox_rows(pool, exec).await?[0].3.clone()),
        (mail, outbox_rows(pool, mail).await?[0].3.clone()),
    ];
    sqlx::query("DELETE FROM outbox").execute(pool).await?;
    age_back(pool, "action_executions", exec, old).await?;
    age_back(pool, "outbound_emails", mail, old).await?;
    assert_eq!(
        count_stuck(pool, TWO_HOURS).await?,
        StuckCounts {
            executions: 1,
            emails: 1
        }
    );
    let report = job.run(&ctx()).await?;
    assert_eq!(
        (report.failed_executions, report.failed_emails),
        (1, 1),
        "{report:?}"
    );
    assert_eq!((report.requeued_executions, report.requeued_emails), (0, 0));
    assert_eq!(outbox_rows(pool, exec).await?.len(), 0, "no new command");
    assert_eq!(outbox_rows(pool, mail).await?.len(), 0, "no new command");

    for (table, id, kind) in [
        ("action_executions", exec, "execution"),
        ("outbound_emails", mail, "email"),
    ] {
        let (status, requeues, error) = status_of(pool, table, id).await?;
        assert_eq!((status.as_str(), requeues), ("failed", 1), "{table}");
        let error = error.unwrap_or_default();
        assert!(
            error.contains("stuck") && error.contains("after 1 re-queues"),
            "{error}"
        );
        let (source, queue, reason, exchange, key, last_error, body): ArchivedRow = sqlx::query_as(
            "SELECT source, queue, reason, exchange, routing_key, last_error, body \
             FROM dead_letters WHERE message_id = $1 AND status = 'dead'",
        )
        .bind(id.to_string())
        .fetch_one(pool)
        .await?;
        assert_eq!(
            (source.as_str(), queue.as_str(), reason.as_str()),
            ("outbox", "outbox", REASON)
        );
        assert_eq!(exchange.as_deref(), Some("commands"));
        assert!(key.is_some());
        let last_error = last_error.unwrap_or_default();
        assert!(
            last_error.contains(kind) && last_error.contains("given up"),
            "{last_error}"
        );
        let sent = published.iter().find(|(of, _)| *of == id).map(|(_, b)| b);
        assert_eq!(
            Some(&body),
            sent,
            "the archived command is the one published"
        );
    }
    assert_eq!(count_stuck(pool, TWO_HOURS).await?, StuckCounts::default());
    Ok(())
}

#[tokio::test]
async fn live_recent_and_finished_rows_are_left_alone() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let pool = &db.pool;
    let automation_id = automation(pool).await?;
    let old = Duration::from_secs(3 * 3600);

    // Old and unfinished, but its command waits in the outbox (a backing-off row included).
    let live = execution(pool, automation_id, "pending", old).await?;
    let live_mail = email(pool, "queued", old).await?;
    for id in [live, live_mail] {
        sqlx::query(
            "INSERT INTO outbox (message_id, exchange, routing_key, body, attempts, next_attempt_at) \
             VALUES ($1, 'commands', 'x', '\\x7b7d', 3, now() + interval '5 minutes')",
        )
        .bind(id.to_string())
        .execute(pool)
        .await?;
    }
    // Recent: still within the retry ladder.
    let recent = execution(pool, automation_id, "pending", Duration::from_secs(600)).await?;
    let recent_mail = email(pool, "queued", Duration::from_secs(600)).await?;
    // Finished.
    let done = [
        execution(pool, automation_id, "succeeded", old).await?,
        execution(pool, automation_id, "failed", old).await?,
    ];
    let done_mail = [
        email(pool, "sent", old).await?,
        email(pool, "failed", old).await?,
    ];
    // Old, and its outbox row gave up: stuck.
    let orphan = email(pool, "queued", old).await?;
    sqlx::query(
        "INSERT INTO outbox (message_id, exchange, routing_key, body, status) \
         VALUES ($1, 'commands', 'email.send', '\\x7b7d', 'failed')",
    )
    .bind(orphan.to_string())
    .execute(pool)
    .await?;

    assert_eq!(
        count_stuck(pool, TWO_HOURS).await?,
        StuckCounts {
            executions: 0,
            emails: 1
        }
    );
    let report = Reconciler::new(pool.clone(), config(1)).run(&ctx()).await?;
    assert_eq!(report.items(), 1, "{report:?}");
    assert_eq!(report.requeued_emails, 1);
    assert_eq!(outbox_rows(pool, orphan).await?.len(), 2);

    for id in [live, recent, done[0], done[1]] {
        let (_, requeues, _) = status_of(pool, "action_executions", id).await?;
        assert_eq!(requeues, 0, "execution {id} was touched");
    }
    for id in [live_mail, recent_mail, done_mail[0], done_mail[1]] {
        let (_, requeues, _) = status_of(pool, "outbound_emails", id).await?;
        assert_eq!(requeues, 0, "email {id} was touched");
    }
    assert_eq!(outbox_rows(pool, live).await?.len(), 1);
    assert_eq!(outbox_rows(pool, recent).await?.len(), 0);
    let archived: i64 = sqlx::query_scalar("SELECT count(*) FROM dead_letters")
        .fetch_one(pool)
        .await?;
    assert_eq!(archived, 0);
    Ok(())
}

#[tokio::test]
async fn a_limit_of_zero_gives_up_at_once() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let pool = &db.pool;
    let automation_id = automation(pool).await?;
    let exec = execution(
        pool,
        automation_id,
        "pending",
        Duration::from_secs(3 * 3600),
    )
    .await?;
    let report = Reconciler::new(pool.clone(), config(0)).run(&ctx()).await?;
    assert_eq!(report.failed_executions, 1, "{report:?}");
    assert_eq!(
        status_of(pool, "action_executions", exec).await?.0,
        "failed"
    );
    assert!(outbox_rows(pool, exec).await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn a_backlog_is_worked_off_in_bounded_batches_through_the_timer_entry() -> anyhow::Result<()>
{
    let db = TestDb::create().await?;
    let pool = &db.pool;
    let automation_id = automation(pool).await?;
    sqlx::query(
        "INSERT INTO action_executions (id, automation_id, event_id, action_index, action, event, \
             updated_at) \
         SELECT gen_random_uuid(), $1, gen_random_uuid(), 0, '{}', '{}', \
                now() - interval '3 hours' - make_interval(secs => i) \
         FROM generate_series(1, 250) AS i",
    )
    .bind(automation_id)
    .execute(pool)
    .await?;
    let job = Reconciler::new(
        pool.clone(),
        ReconcilerConfig {
            batch_size: 100,
            max_batches_per_tick: 2,
            ..config(1)
        },
    );
    let busy = SkipIfBusy::new("reconciler");
    let first = tick_once(
        &job,
        &busy,
        None::<&NoLease>,
        Duration::from_secs(30),
        &ctx(),
    )
    .await;
    assert!(
        matches!(&first, TickOutcome::Ran(r) if r.items == 200
            && r.detail.as_deref().is_some_and(|d| d.ends_with("more may be stuck"))),
        "{first:?}"
    );
    assert_eq!(
        count_stuck(pool, TWO_HOURS).await?.get(WorkKind::Execution),
        50
    );
    let second = tick_once(
        &job,
        &busy,
        None::<&NoLease>,
        Duration::from_secs(30),
        &ctx(),
    )
    .await;
    assert!(
        matches!(&second, TickOutcome::Ran(r) if r.items == 50),
        "{second:?}"
    );
    // Each batch was its own transaction.
    let transactions: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT xmin::text) FROM action_executions WHERE reconciler_requeues = 1",
    )
    .fetch_one(pool)
    .await?;
    assert_eq!(transactions, 3);
    Ok(())
}

#[tokio::test]
async fn a_row_held_by_a_handler_is_passed_over() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let pool = &db.pool;
    let automation_id = automation(pool).await?;
    let held = execution(
        pool,
        automation_id,
        "pending",
        Duration::from_secs(3 * 3600),
    )
    .await?;
    let mut holder = pool.begin().await?;
    sqlx::query("SELECT 1 FROM action_executions WHERE id = $1 FOR UPDATE")
        .bind(held)
        .execute(&mut *holder)
        .await?;
    let job = Reconciler::new(pool.clone(), config(1));
    let report = tokio::time::timeout(Duration::from_secs(10), job.run(&ctx())).await??;
    assert_eq!(report.items(), 0, "skipped, not waited for");
    holder.rollback().await?;
    assert_eq!(job.run(&ctx()).await?.requeued_executions, 1);
    Ok(())
}

/// The claim states other migrations add (`running`, `sending`, `unknown`) are unfinished
/// too: the queries name the finished states only. The test lifts the status checks of its own
/// database so that the states can be written whichever migrations are there.
#[tokio::test]
async fn claim_and_unknown_states_count_as_unfinished() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let pool = &db.pool;
    for table in ["action_executions", "outbound_emails"] {
        sqlx::query(&format!(
            "ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {table}_status_check"
        ))
        .execute(pool)
        .await?;
    }
    let automation_id = automation(pool).await?;
    let old = Duration::from_secs(3 * 3600);
    let running = execution(pool, automation_id, "running", old).await?;
    let sending = email(pool, "sending", old).await?;
    let unknown = email(pool, "unknown", old).await?;
    assert_eq!(
        count_stuck(pool, TWO_HOURS).await?,
        StuckCounts {
            executions: 1,
            emails: 2
        }
    );
    let report = Reconciler::new(pool.clone(), config(0)).run(&ctx()).await?;
    assert_eq!((report.failed_executions, report.failed_emails), (1, 2));
    assert_eq!(
        status_of(pool, "action_executions", running).await?.0,
        "failed"
    );
    assert_eq!(
        status_of(pool, "outbound_emails", sending).await?.0,
        "failed"
    );
    let (_, _, error) = status_of(pool, "outbound_emails", unknown).await?;
    assert!(
        error
            .unwrap_or_default()
            .contains("the server may have accepted it"),
        "an unknown outcome is said so"
    );
    Ok(())
}
