//! The trigger consumer, one event at a time, on a real database.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::type_complexity)]

use chrono::Utc;
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;
use worker_core::{ConsumerJob, FailureClass, Handled, WorkContext, execute_once};
use worker_messages::{ActionCommand, DomainEvent, action_execution_id};
use worker_testkit::TestDb;

use job_automation_trigger::import::{AutomationDefinition, import};
use job_automation_trigger::{AutomationTrigger, ConditionSpec, JOB_NAME, Op};

fn ctx() -> WorkContext {
    WorkContext::new(JOB_NAME, CancellationToken::new())
}

fn event(data: Value) -> DomainEvent {
    DomainEvent {
        id: Uuid::new_v4(),
        event_type: "email.received".into(),
        occurred_at: Utc::now(),
        data,
    }
}

fn mail(subject: &str) -> Value {
    json!({
        "inbound_email_id": Uuid::new_v4(),
        "account": "demo",
        "mailbox": "INBOX",
        "message_id": "m1@example.com",
        "from": "alice@localhost",
        "from_name": "Alice",
        "to": ["demo@localhost"],
        "subject": subject,
        "text": "hello",
        "references": [],
        "parse_error": null
    })
}

fn automation(name: &str, conditions: Vec<ConditionSpec>, actions: Value) -> AutomationDefinition {
    AutomationDefinition {
        id: None,
        name: name.into(),
        enabled: true,
        event_type: "email.received".into(),
        conditions,
        actions: serde_json::from_value(actions).unwrap(),
    }
}

fn cond(path: &str, op: Op, value: Value) -> ConditionSpec {
    ConditionSpec {
        path: path.into(),
        op,
        value,
        ignore_case: false,
    }
}

fn reply() -> Value {
    json!([{"type": "send_email", "to": ["{{ from }}"], "subject": "Re: {{ subject }}", "text": "pong"}])
}

fn reply_and_hook() -> Value {
    json!([
        {"type": "send_email", "to": ["{{ from }}"], "subject": "Re: {{ subject }}", "text": "pong"},
        {"type": "webhook", "url": "http://127.0.0.1:9/hook"}
    ])
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// (message_id, exchange, routing_key, body) of every outbox row, in order; each is checked to
/// be an `automation.action` command of schema version 1.
async fn outbox(pool: &PgPool) -> Vec<(String, String, String, ActionCommand)> {
    type Row = (
        String,
        String,
        String,
        Vec<u8>,
        Option<String>,
        Option<String>,
    );
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT message_id, exchange, routing_key, body, message_type, \
                headers ->> 'x-schema-version' FROM outbox ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    rows.into_iter()
        .map(|(id, exchange, key, body, kind, version)| {
            assert_eq!(kind.as_deref(), Some("automation.action"));
            assert_eq!(version.as_deref(), Some("1"), "x-schema-version");
            (id, exchange, key, serde_json::from_slice(&body).unwrap())
        })
        .collect()
}

#[tokio::test]
async fn a_match_writes_the_log_the_executions_and_the_commands_in_one_go() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let report = import(
        &db.pool,
        &[automation(
            "ping",
            vec![cond("subject", Op::Contains, json!("ping"))],
            reply_and_hook(),
        )],
    )
    .await?;
    let automation_id = report.automations[0].id;
    let trigger = AutomationTrigger::new(db.pool.clone(), "commands");
    let e = event(mail("ping please"));

    let body = serde_json::to_vec(&e)?;
    assert_eq!(execute_once(&trigger, &ctx(), &body).await?, Handled::Done);

    let log: Vec<(Uuid, Uuid, String)> =
        sqlx::query_as("SELECT automation_id, event_id, event_type FROM automation_trigger_log")
            .fetch_all(&db.pool)
            .await?;
    assert_eq!(
        log,
        vec![(automation_id, e.id, "email.received".to_string())]
    );

    let executions: Vec<(Uuid, i32, Value, Value, String, i32)> = sqlx::query_as(
        "SELECT id, action_index, action, event, status, attempts FROM action_executions \
         ORDER BY action_index",
    )
    .fetch_all(&db.pool)
    .await?;
    assert_eq!(executions.len(), 2);
    for (index, (id, at, action, snapshot, status, attempts)) in executions.iter().enumerate() {
        assert_eq!(*id, action_execution_id(e.id, automation_id, index as u32));
        assert_eq!(*at, index as i32);
        assert_eq!((status.as_str(), *attempts), ("pending", 0));
        assert_eq!(snapshot["id"], json!(e.id));
        assert_eq!(snapshot["data"]["subject"], "ping please");
        assert_eq!(
            action["type"],
            if index == 0 { "send_email" } else { "webhook" }
        );
    }

    let commands = outbox(&db.pool).await;
    assert_eq!(commands.len(), 2);
    for (index, (message_id, exchange, key, command)) in commands.iter().enumerate() {
        let expected = action_execution_id(e.id, automation_id, index as u32);
        assert_eq!(message_id, &expected.to_string());
        assert_eq!(
            (exchange.as_str(), key.as_str()),
            ("commands", "automation.action")
        );
        assert_eq!(
            command,
            &ActionCommand {
                action_execution_id: expected,
                automation_id,
                event_id: e.id,
                action_index: index as u32,
            }
        );
    }
    Ok(())
}

#[tokio::test]
async fn each_condition_kind_matches_and_does_not_match() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    import(
        &db.pool,
        &[
            automation(
                "equals",
                vec![cond("from", Op::Equals, json!("alice@localhost"))],
                reply(),
            ),
            automation(
                "contains",
                vec![cond("subject", Op::Contains, json!("ping"))],
                reply(),
            ),
            automation(
                "matches",
                vec![cond("subject", Op::Matches, json!(r"(?i)^urgent:"))],
                reply(),
            ),
            automation(
                "all-of",
                vec![
                    cond("to.0", Op::Equals, json!("demo@localhost")),
                    cond("subject", Op::Matches, json!(r"\d{4}")),
                ],
                reply(),
            ),
        ],
    )
    .await?;
    let trigger = AutomationTrigger::new(db.pool.clone(), "commands");
    let names =
        |m: Vec<job_automation_trigger::Matched>| m.into_iter().map(|m| m.name).collect::<Vec<_>>();

    let e = event(mail("URGENT: ping order 1234"));
    assert_eq!(
        names(trigger.matching(&e).await?),
        ["all-of", "contains", "equals", "matches"]
    );

    let mut other = mail("hello");
    other["from"] = json!("bob@localhost");
    let e = event(other);
    assert!(trigger.matching(&e).await?.is_empty(), "nothing holds");

    let e = event(mail("Re: Ping")); // contains is case-sensitive unless asked
    assert_eq!(names(trigger.matching(&e).await?), ["equals"]);

    let e = event(mail("order 99999 urgent: no"));
    assert_eq!(names(trigger.matching(&e).await?), ["all-of", "equals"]);

    // What does not match writes nothing at all, and is settled as a skip for no match.
    let mut nobody = mail("hello");
    nobody["from"] = json!("bob@localhost");
    let body = serde_json::to_vec(&event(nobody))?;
    assert_eq!(
        execute_once(&trigger, &ctx(), &body).await?,
        Handled::Skipped(job_automation_trigger::NO_MATCH)
    );
    assert_eq!(
        count(&db.pool, "SELECT count(*) FROM automation_trigger_log").await,
        0
    );
    assert_eq!(
        count(&db.pool, "SELECT count(*) FROM action_executions").await,
        0
    );
    assert_eq!(count(&db.pool, "SELECT count(*) FROM outbox").await, 0);
    Ok(())
}

#[tokio::test]
async fn disabled_automations_and_other_event_types_are_ignored() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let mut disabled = automation("disabled", vec![], reply());
    disabled.enabled = false;
    let mut other_type = automation("other-type", vec![], reply());
    other_type.event_type = "order.placed".into();
    import(
        &db.pool,
        &[disabled, other_type, automation("always", vec![], reply())],
    )
    .await?;
    let trigger = AutomationTrigger::new(db.pool.clone(), "commands");
    let matched = trigger.matching(&event(mail("x"))).await?;
    assert_eq!(matched.len(), 1);
    assert_eq!(
        matched[0].name, "always",
        "no conditions: every event of its type"
    );
    Ok(())
}

#[tokio::test]
async fn a_duplicate_event_yields_the_same_execution_ids_and_no_new_executions()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    import(
        &db.pool,
        &[automation(
            "ping",
            vec![cond("subject", Op::Contains, json!("ping"))],
            reply_and_hook(),
        )],
    )
    .await?;
    let trigger = AutomationTrigger::new(db.pool.clone(), "commands");
    let body = serde_json::to_vec(&event(mail("ping")))?;

    assert_eq!(execute_once(&trigger, &ctx(), &body).await?, Handled::Done);
    assert_eq!(
        execute_once(&trigger, &ctx(), &body).await?,
        Handled::Done,
        "not deduplicated"
    );

    assert_eq!(
        count(&db.pool, "SELECT count(*) FROM automation_trigger_log").await,
        2,
        "a duplicate log row"
    );
    assert_eq!(
        count(&db.pool, "SELECT count(*) FROM action_executions").await,
        2,
        "no new execution"
    );
    let commands = outbox(&db.pool).await;
    assert_eq!(commands.len(), 4, "the commands are queued again ...");
    assert_eq!(
        commands[0].0, commands[2].0,
        "... with the same ids, for the executor's guard"
    );
    assert_eq!(commands[1].0, commands[3].0);
    assert_ne!(commands[0].0, commands[1].0);
    Ok(())
}

#[tokio::test]
async fn a_stored_automation_with_an_invalid_regex_is_skipped_not_fatal() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    import(&db.pool, &[automation("good", vec![], reply())]).await?;
    // Written behind the import's back, as the platform might.
    sqlx::query(
        "INSERT INTO automations (id, name, event_type, conditions, actions) \
         VALUES ($1, 'broken-regex', 'email.received', $2, $3), \
                ($4, 'broken-action', 'email.received', '[]', '[{\"type\": \"fax\"}]')",
    )
    .bind(Uuid::new_v4())
    .bind(json!([{"path": "subject", "op": "matches", "value": "(unclosed"}]))
    .bind(reply())
    .bind(Uuid::new_v4())
    .execute(&db.pool)
    .await?;

    let trigger = AutomationTrigger::new(db.pool.clone(), "commands");
    let body = serde_json::to_vec(&event(mail("ping")))?;
    assert_eq!(execute_once(&trigger, &ctx(), &body).await?, Handled::Done);
    let logged: Vec<String> = sqlx::query_scalar(
        "SELECT a.name FROM automation_trigger_log l JOIN automations a ON a.id = l.automation_id",
    )
    .fetch_all(&db.pool)
    .await?;
    assert_eq!(
        logged,
        ["good"],
        "the broken ones are skipped, the good one still runs"
    );
    Ok(())
}

#[tokio::test]
async fn the_routing_key_can_follow_a_renamed_queue() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    import(&db.pool, &[automation("always", vec![], reply())]).await?;
    let trigger =
        AutomationTrigger::new(db.pool.clone(), "cmds").with_action_routing_key("actions-v2");
    assert_eq!(trigger.name(), "automation-trigger");
    trigger.handle(&ctx(), &event(mail("x"))).await?;
    let (_, exchange, key, _) = outbox(&db.pool).await.remove(0);
    assert_eq!((exchange.as_str(), key.as_str()), ("cmds", "actions-v2"));
    Ok(())
}

#[tokio::test]
async fn an_automation_deleted_while_its_event_is_in_flight_is_skipped_and_the_others_run()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let report = import(
        &db.pool,
        &[
            automation("deleted", vec![], reply()),
            automation("kept", vec![], reply_and_hook()),
        ],
    )
    .await?;
    let id = |name: &str| {
        report
            .automations
            .iter()
            .find(|a| a.name == name)
            .unwrap()
            .id
    };
    let (deleted, kept) = (id("deleted"), id("kept"));
    let trigger = AutomationTrigger::new(db.pool.clone(), "commands");
    let e = event(mail("ping"));

    // `handle` is `matching` then `queue`: the platform deletes one automation in between.
    let matched = trigger.matching(&e).await?;
    assert_eq!(matched.len(), 2);
    sqlx::query("DELETE FROM automations WHERE id = $1")
        .bind(deleted)
        .execute(&db.pool)
        .await?;
    assert_eq!(
        trigger.queue(&e, &matched).await?,
        Handled::Done,
        "the event is acked"
    );

    let log: Vec<Uuid> = sqlx::query_scalar("SELECT automation_id FROM automation_trigger_log")
        .fetch_all(&db.pool)
        .await?;
    assert_eq!(log, [kept]);
    let executions: Vec<Uuid> =
        sqlx::query_scalar("SELECT id FROM action_executions ORDER BY action_index")
            .fetch_all(&db.pool)
            .await?;
    let expected = [
        action_execution_id(e.id, kept, 0),
        action_execution_id(e.id, kept, 1),
    ];
    assert_eq!(executions, expected);
    let commands = outbox(&db.pool).await;
    assert_eq!(
        commands
            .iter()
            .map(|c| c.3.action_execution_id)
            .collect::<Vec<_>>(),
        expected,
        "only the kept automation's commands"
    );
    Ok(())
}

#[tokio::test]
async fn a_missing_table_is_transient_not_a_dead_letter() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    import(&db.pool, &[automation("always", vec![], reply())]).await?;
    // As during a rolling migration that has not created the table yet (SQLSTATE 42P01).
    sqlx::query("DROP TABLE automation_trigger_log")
        .execute(&db.pool)
        .await?;
    let trigger = AutomationTrigger::new(db.pool.clone(), "commands");
    let err = trigger.handle(&ctx(), &event(mail("x"))).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::Transient, "{err}");
    assert!(err.detail().contains("automation_trigger_log"), "{err}");
    assert_eq!(count(&db.pool, "SELECT count(*) FROM outbox").await, 0);
    Ok(())
}
