//! The trigger matches against the automations as it last read them: a change to them, by
//! import or by a direct write, is seen by the next event, on a real database.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use chrono::Utc;
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;
use worker_core::{ConsumerJob, Handled, WorkContext};
use worker_messages::DomainEvent;
use worker_testkit::TestDb;

use job_automation_trigger::import::{AutomationDefinition, import};
use job_automation_trigger::{AutomationTrigger, ConditionSpec, JOB_NAME, NO_MATCH, Op};

fn ctx() -> WorkContext {
    WorkContext::new(JOB_NAME, CancellationToken::new())
}

fn ping(subject: &str) -> DomainEvent {
    DomainEvent {
        id: Uuid::new_v4(),
        event_type: "email.received".into(),
        occurred_at: Utc::now(),
        data: json!({"from": "alice@localhost", "subject": subject}),
    }
}

fn contains(name: &str, word: &str) -> AutomationDefinition {
    AutomationDefinition {
        id: None,
        name: name.into(),
        enabled: true,
        event_type: "email.received".into(),
        conditions: vec![ConditionSpec {
            path: "subject".into(),
            op: Op::Contains,
            value: Value::from(word),
            ignore_case: false,
        }],
        actions: serde_json::from_value(json!([
            {"type": "send_email", "to": ["{{ from }}"], "subject": "Re", "text": "pong"}
        ]))
        .unwrap(),
    }
}

async fn commands(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM action_executions")
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn handle(trigger: &AutomationTrigger, event: &DomainEvent) -> Handled {
    trigger.handle(&ctx(), event).await.unwrap()
}

#[tokio::test]
async fn an_automation_added_after_an_event_matched_nothing_matches_the_next() -> anyhow::Result<()>
{
    let db = TestDb::create().await?;
    let trigger = AutomationTrigger::new(db.pool.clone(), "commands");
    assert_eq!(
        handle(&trigger, &ping("ping")).await,
        Handled::Skipped(NO_MATCH)
    );
    import(&db.pool, &[contains("ping", "ping")]).await?;
    assert_eq!(handle(&trigger, &ping("ping")).await, Handled::Done);
    assert_eq!(commands(&db.pool).await, 1);
    Ok(())
}

#[tokio::test]
async fn an_automation_edited_by_a_direct_write_is_used_by_the_next_event() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    import(&db.pool, &[contains("ping", "ping")]).await?;
    let trigger = AutomationTrigger::new(db.pool.clone(), "commands");
    assert_eq!(handle(&trigger, &ping("ping")).await, Handled::Done);
    // As the platform would: a write that bumps nothing but the row itself.
    sqlx::query(
        "UPDATE automations SET conditions = \
         '[{\"path\": \"subject\", \"op\": \"contains\", \"value\": \"pong\"}]'",
    )
    .execute(&db.pool)
    .await?;
    assert_eq!(
        handle(&trigger, &ping("ping")).await,
        Handled::Skipped(NO_MATCH),
        "the old condition still matched"
    );
    assert_eq!(handle(&trigger, &ping("pong")).await, Handled::Done);
    assert_eq!(commands(&db.pool).await, 2);
    Ok(())
}

#[tokio::test]
async fn an_automation_disabled_after_it_matched_runs_no_more() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    import(&db.pool, &[contains("ping", "ping"), contains("any", "")]).await?;
    let trigger = AutomationTrigger::new(db.pool.clone(), "commands");
    assert_eq!(handle(&trigger, &ping("ping")).await, Handled::Done);
    assert_eq!(commands(&db.pool).await, 2);
    sqlx::query("UPDATE automations SET enabled = false WHERE name = 'ping'")
        .execute(&db.pool)
        .await?;
    // What was known still matches both; the write finds them changed and matches anew.
    assert_eq!(handle(&trigger, &ping("ping")).await, Handled::Done);
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT a.name FROM action_executions e JOIN automations a ON a.id = e.automation_id \
         ORDER BY e.created_at, a.name",
    )
    .fetch_all(&db.pool)
    .await?;
    assert_eq!(names, ["any", "ping", "any"]);
    Ok(())
}

#[tokio::test]
async fn an_automation_deleted_after_it_matched_runs_no_more() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    import(&db.pool, &[contains("ping", "ping")]).await?;
    let trigger = AutomationTrigger::new(db.pool.clone(), "commands");
    assert_eq!(handle(&trigger, &ping("ping")).await, Handled::Done);
    sqlx::query("DELETE FROM automations")
        .execute(&db.pool)
        .await?;
    assert_eq!(
        handle(&trigger, &ping("ping")).await,
        Handled::Skipped(NO_MATCH)
    );
    Ok(())
}
