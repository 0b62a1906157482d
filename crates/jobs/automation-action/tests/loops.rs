//! No mail loops and no backscatter (RFC 3834): a `send_email` action does not answer mail
//! that is automatic, bulk, from a list, bounced, or our own, and no automation sends one
//! address more than the reply limit allows.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use chrono::Utc;
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;
use worker_core::{Handled, WorkContext, execute_once};
use worker_messages::{ActionCommand, DomainEvent, action_execution_id};
use worker_testkit::TestDb;

use job_automation_action::{ActionExecutor, GUARD_SCOPE, JOB_NAME, reply_limit};

fn ctx() -> WorkContext {
    WorkContext::new(JOB_NAME, CancellationToken::new())
}

/// An `email.received` event from `from`, with `extra` fields on top of a plain mail's.
fn mail_event(from: &str, extra: Value) -> DomainEvent {
    let mut data = json!({
        "inbound_email_id": Uuid::new_v4(),
        "account": "demo",
        "mailbox": "INBOX",
        "message_id": format!("{}@example.com", Uuid::new_v4().simple()),
        "from": from,
        "from_name": null,
        "to": ["demo@localhost"],
        "subject": "ping",
        "text": "are you there?",
        "references": [],
        "parse_error": null
    });
    if let (Some(data), Value::Object(extra)) = (data.as_object_mut(), extra) {
        data.extend(extra);
    }
    DomainEvent {
        id: Uuid::new_v4(),
        event_type: "email.received".into(),
        occurred_at: Utc::now(),
        data,
    }
}

fn reply_action() -> Value {
    json!({
        "type": "send_email",
        "to": ["{{ from }}"],
        "subject": "Re: {{ subject }}",
        "text": "pong",
    })
}

async fn automation(pool: &PgPool) -> Uuid {
    let id = Uuid::new_v4();
    sqlx::query("INSERT INTO automations (id, name, event_type, actions) VALUES ($1, $2, $3, $4)")
        .bind(id)
        .bind(format!("a-{id}"))
        .bind("email.received")
        .bind(json!([reply_action()]))
        .execute(pool)
        .await
        .unwrap();
    id
}

/// One execution of `automation`'s reply for `event`, as the trigger writes it.
async fn execution(pool: &PgPool, automation_id: Uuid, event: &DomainEvent) -> ActionCommand {
    execution_of(pool, automation_id, event, reply_action()).await
}

/// One execution of `action` for `event`, as the trigger writes it.
async fn execution_of(
    pool: &PgPool,
    automation_id: Uuid,
    event: &DomainEvent,
    action: Value,
) -> ActionCommand {
    let id = action_execution_id(event.id, automation_id, 0);
    sqlx::query(
        "INSERT INTO action_executions (id, automation_id, event_id, action_index, action, event) \
         VALUES ($1, $2, $3, 0, $4, $5)",
    )
    .bind(id)
    .bind(automation_id)
    .bind(event.id)
    .bind(action)
    .bind(serde_json::to_value(event).unwrap())
    .execute(pool)
    .await
    .unwrap();
    ActionCommand {
        action_execution_id: id,
        automation_id,
        event_id: event.id,
        action_index: 0,
    }
}

fn executor(pool: &PgPool) -> ActionExecutor {
    ActionExecutor::new(pool.clone(), "commands", Duration::from_secs(5))
        .unwrap()
        .with_own_addresses(["Worker Host <worker-host@localhost>"])
}

/// Runs the command; returns the execution's status and skip reason, and whether an email
/// was queued for it.
async fn run(
    pool: &PgPool,
    executor: &ActionExecutor,
    command: &ActionCommand,
) -> (String, Option<String>, bool) {
    let body = serde_json::to_vec(command).unwrap();
    let handled = execute_once(executor, &ctx(), &body).await.unwrap();
    let (status, reason, kind): (String, Option<String>, Option<String>) = sqlx::query_as(
        "SELECT status, skip_reason, skip_kind FROM action_executions WHERE id = $1",
    )
    .bind(command.action_execution_id)
    .fetch_one(pool)
    .await
    .unwrap();
    // A skip is stored with its kind and settles the delivery as a skip of that kind.
    match handled {
        Handled::Skipped(counted) => {
            assert_eq!(status, "skipped");
            assert_eq!(kind.as_deref(), Some(counted), "{reason:?}");
        }
        other => {
            assert_eq!(other, Handled::Done);
            assert_ne!(status, "skipped");
            assert_eq!(kind, None);
        }
    }
    let queued: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM outbound_emails WHERE action_execution_id = $1)",
    )
    .bind(command.action_execution_id)
    .fetch_one(pool)
    .await
    .unwrap();
    (status, reason, queued)
}

async fn skip_kind(pool: &PgPool, command: &ActionCommand) -> Option<String> {
    sqlx::query_scalar("SELECT skip_kind FROM action_executions WHERE id = $1")
        .bind(command.action_execution_id)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn mail_that_must_not_be_answered_is_skipped_with_the_reason() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let automation_id = automation(&db.pool).await;
    let executor = executor(&db.pool);
    let cases = [
        (
            "alice@example.com",
            json!({"auto_submitted": "auto-replied"}),
            "Auto-Submitted",
        ),
        (
            "alice@example.com",
            json!({"auto_submitted": "Auto-Generated (x)"}),
            "Auto-Submitted",
        ),
        (
            "alice@example.com",
            json!({"precedence": "bulk"}),
            "Precedence",
        ),
        (
            "alice@example.com",
            json!({"precedence": "List"}),
            "Precedence",
        ),
        (
            "alice@example.com",
            json!({"precedence": "junk"}),
            "Precedence",
        ),
        (
            "alice@example.com",
            json!({"list_id": "Team <team.example.com>"}),
            "List-Id",
        ),
        (
            "alice@example.com",
            json!({"null_sender": true, "return_path": ""}),
            "null sender",
        ),
        ("MAILER-DAEMON@example.com", json!({}), "MAILER-DAEMON"),
        ("worker-host@LOCALHOST", json!({}), "own address"),
    ];
    for (from, extra, why) in cases {
        let event = mail_event(from, extra.clone());
        let command = execution(&db.pool, automation_id, &event).await;
        let (status, reason, queued) = run(&db.pool, &executor, &command).await;
        assert_eq!(status, "skipped", "{from} {extra}");
        assert_eq!(
            skip_kind(&db.pool, &command).await.as_deref(),
            Some("loop-guard")
        );
        let reason = reason.unwrap_or_default();
        assert!(reason.contains(why), "{from} {extra}: {reason}");
        assert!(!queued, "{from} {extra}");
        // Done for good: the guard holds it, a redelivery is a duplicate.
        let marked: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM processed_messages WHERE scope = $1 AND id = $2)",
        )
        .bind(GUARD_SCOPE)
        .bind(command.action_execution_id.to_string())
        .fetch_one(&db.pool)
        .await?;
        assert!(marked, "{from} {extra}");
        let body = serde_json::to_vec(&command)?;
        assert_eq!(
            execute_once(&executor, &ctx(), &body).await?,
            Handled::Duplicate
        );
    }
    let outbox: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
        .fetch_one(&db.pool)
        .await?;
    assert_eq!(outbox, 0);

    // A person's mail, `Auto-Submitted: no` included, is answered.
    for extra in [
        json!({}),
        json!({"auto_submitted": "no", "precedence": "first-class"}),
    ] {
        let event = mail_event("bob@example.com", extra);
        let command = execution(&db.pool, automation_id, &event).await;
        let (status, reason, queued) = run(&db.pool, &executor, &command).await;
        assert_eq!((status.as_str(), reason, queued), ("succeeded", None, true));
    }
    Ok(())
}

#[tokio::test]
async fn the_reply_limit_stops_a_forged_sender_from_making_an_automation_a_mail_cannon()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let automation_id = automation(&db.pool).await;
    let other_automation = automation(&db.pool).await;
    let executor = executor(&db.pool).with_reply_limit(3, Duration::from_secs(3600));

    let mut outcomes = Vec::new();
    for _ in 0..5 {
        let event = mail_event("victim@example.com", json!({}));
        let command = execution(&db.pool, automation_id, &event).await;
        outcomes.push(run(&db.pool, &executor, &command).await);
    }
    let statuses: Vec<&str> = outcomes.iter().map(|o| o.0.as_str()).collect();
    assert_eq!(
        statuses,
        ["succeeded", "succeeded", "succeeded", "skipped", "skipped"]
    );
    let reason = outcomes[3].1.clone().unwrap_or_default();
    assert!(
        reason.contains("reply limit") && reason.contains("victim@example.com"),
        "{reason}"
    );
    assert!(!outcomes[3].2 && !outcomes[4].2);

    // The limit is per recipient (the same automation answers someone else) and per
    // automation (another one still answers the victim).
    let event = mail_event("someone-else@example.com", json!({}));
    let command = execution(&db.pool, automation_id, &event).await;
    assert_eq!(run(&db.pool, &executor, &command).await.0, "succeeded");
    let event = mail_event("VICTIM@example.com", json!({}));
    let command = execution(&db.pool, other_automation, &event).await;
    assert_eq!(run(&db.pool, &executor, &command).await.0, "succeeded");
    let event = mail_event("VICTIM@example.com", json!({}));
    let command = execution(&db.pool, automation_id, &event).await;
    assert_eq!(
        run(&db.pool, &executor, &command).await.0,
        "skipped",
        "addresses compare without case"
    );
    Ok(())
}

#[tokio::test]
async fn the_reply_limit_reads_only_the_mails_to_the_address_it_counts() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let automation_id = automation(&db.pool).await;
    let executor = executor(&db.pool);
    // An automation that has answered many people within the window, and the victim twice.
    for i in 0..300 {
        let event = mail_event(&format!("customer-{i}@example.com"), json!({}));
        let command = execution(&db.pool, automation_id, &event).await;
        assert_eq!(run(&db.pool, &executor, &command).await.0, "succeeded");
    }
    for _ in 0..2 {
        let event = mail_event("victim@example.com", json!({}));
        let command = execution(&db.pool, automation_id, &event).await;
        assert_eq!(run(&db.pool, &executor, &command).await.0, "succeeded");
    }
    sqlx::query("ANALYZE").execute(&db.pool).await?;

    let mut conn = db.pool.acquire().await?;
    let window = Duration::from_secs(3600);
    let sent = reply_limit::sent_within(&mut conn, automation_id, "victim@example.com", window)
        .await
        .map_err(|f| anyhow::anyhow!("{f}"))?;
    assert_eq!(sent, 2);
    let plan: Value = sqlx::query_scalar(&format!(
        "EXPLAIN (ANALYZE, FORMAT JSON) {}",
        reply_limit::SENT_WITHIN
    ))
    .bind(automation_id)
    .bind(window.as_secs_f64())
    .bind(vec!["victim@example.com"])
    .fetch_one(&mut *conn)
    .await?;
    let read = worker_testkit::plan::rows_read(&plan[0]["Plan"]);
    // Each mail costs the same however many others the automation sent: the count reads the
    // victim's rows, not the 300 others'.
    assert!(
        read <= 10.0,
        "the reply limit's count read {read} rows for 2 mails:\n{plan:#}"
    );
    Ok(())
}

#[tokio::test]
async fn the_reply_limit_counts_a_recipient_written_with_a_name() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let automation_id = automation(&db.pool).await;
    let executor = executor(&db.pool).with_reply_limit(1, Duration::from_secs(3600));
    let named = json!({
        "type": "send_email",
        "to": ["Victim <{{ from }}>"],
        "subject": "Re: {{ subject }}",
        "text": "pong",
    });
    let mut statuses = Vec::new();
    for _ in 0..2 {
        let event = mail_event("victim@example.com", json!({}));
        let command = execution_of(&db.pool, automation_id, &event, named.clone()).await;
        statuses.push(run(&db.pool, &executor, &command).await.0);
    }
    assert_eq!(statuses, ["succeeded", "skipped"]);
    Ok(())
}

/// The migration that brought `outbound_email_recipients` in.
const RECIPIENTS_MIGRATION: i64 = 20261202000200;

#[tokio::test]
async fn an_upgraded_installation_keeps_counting_the_mails_it_sent_before() -> anyhow::Result<()> {
    // An installation at the migration before, with mails queued to a named and a bare
    // recipient; then the upgrade.
    let db = TestDb::create_empty().await?;
    let applied = |before: bool| {
        worker_store::MIGRATOR
            .iter()
            .filter(move |m| (m.version < RECIPIENTS_MIGRATION) == before)
    };
    for migration in applied(true) {
        sqlx::raw_sql(&migration.sql).execute(&db.pool).await?;
    }
    let automation_id = automation(&db.pool).await;
    for (n, to) in ["Victim <Victim@Example.com>", "victim@example.com"]
        .iter()
        .enumerate()
    {
        let event = mail_event("victim@example.com", json!({}));
        let command = execution(&db.pool, automation_id, &event).await;
        sqlx::query(
            "INSERT INTO outbound_emails (id, action_execution_id, message_id, to_addresses, subject) \
             VALUES ($1, $2, $3, $4, 'Re: ping')",
        )
        .bind(Uuid::new_v4())
        .bind(command.action_execution_id)
        .bind(format!("old-{n}@worker-host"))
        .bind(vec![to.to_string()])
        .execute(&db.pool)
        .await?;
    }
    for migration in applied(false) {
        sqlx::raw_sql(&migration.sql).execute(&db.pool).await?;
    }

    let mut conn = db.pool.acquire().await?;
    let window = Duration::from_secs(3600);
    let sent = reply_limit::sent_within(&mut conn, automation_id, "victim@example.com", window)
        .await
        .map_err(|f| anyhow::anyhow!("{f}"))?;
    assert_eq!(sent, 2, "both mails sent before the upgrade count");
    // With a limit of 2, the next mail to the victim is not sent.
    let executor = executor(&db.pool).with_reply_limit(2, window);
    let event = mail_event("victim@example.com", json!({}));
    let command = execution(&db.pool, automation_id, &event).await;
    assert_eq!(run(&db.pool, &executor, &command).await.0, "skipped");
    assert_eq!(
        skip_kind(&db.pool, &command).await.as_deref(),
        Some("reply-limit")
    );
    Ok(())
}

#[tokio::test]
async fn a_mail_to_more_recipients_than_the_cap_is_skipped_with_the_count_and_the_cap()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let automation_id = automation(&db.pool).await;
    // Whoever writes the mail chooses its `to`, and a template may copy every address of it.
    let copy_all = json!({
        "type": "send_email",
        "to": ["{{ from }}"],
        "cc": ["{{ to | join(',') }}"],
        "subject": "Re: {{ subject }}",
        "text": "pong",
    });
    let crowd = |n: usize| -> Vec<String> { (0..n).map(|i| format!("r{i}@example.com")).collect() };

    // The default cap, 50: the sender and 49 others go; the sender and 50 others do not.
    let executor = executor(&db.pool);
    let event = mail_event("alice@example.com", json!({"to": crowd(49)}));
    let command = execution_of(&db.pool, automation_id, &event, copy_all.clone()).await;
    assert_eq!(
        run(&db.pool, &executor, &command).await,
        ("succeeded".into(), None, true)
    );
    let event = mail_event("alice@example.com", json!({"to": crowd(50)}));
    let command = execution_of(&db.pool, automation_id, &event, copy_all.clone()).await;
    let (status, reason, queued) = run(&db.pool, &executor, &command).await;
    assert_eq!((status.as_str(), queued), ("skipped", false));
    assert_eq!(
        skip_kind(&db.pool, &command).await.as_deref(),
        Some("recipient-cap")
    );
    let reason = reason.unwrap_or_default();
    assert!(
        reason.contains("51 recipients") && reason.contains("50"),
        "{reason}"
    );

    // An address given twice, or in `to` and `cc` both, is one recipient.
    let mut twice = crowd(49);
    twice.push("ALICE@example.com".into());
    let event = mail_event("alice@example.com", json!({ "to": twice }));
    let command = execution_of(&db.pool, automation_id, &event, copy_all.clone()).await;
    assert_eq!(run(&db.pool, &executor, &command).await.0, "succeeded");

    // The cap is the executor's to set (`auto_replies.recipients_max`).
    let strict = executor.with_recipients_max(1);
    let event = mail_event("alice@example.com", json!({"to": crowd(1)}));
    let command = execution_of(&db.pool, automation_id, &event, copy_all).await;
    let (status, reason, _) = run(&db.pool, &strict, &command).await;
    assert_eq!(status, "skipped");
    assert!(reason.unwrap_or_default().contains("2 recipients"));
    Ok(())
}
