//! What the action executor's tests share: an automation and its execution, written as the
//! trigger writes them.

#![allow(dead_code, clippy::unwrap_used)]

use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;
use worker_messages::{ActionCommand, DomainEvent, action_execution_id};

/// Writes an automation and one execution of its action `action` for `event`, as the
/// trigger does, and returns the command that names it.
pub async fn execution(pool: &PgPool, event: &DomainEvent, action: Value) -> ActionCommand {
    let automation_id = Uuid::new_v4();
    sqlx::query("INSERT INTO automations (id, name, event_type, actions) VALUES ($1, $2, $3, $4)")
        .bind(automation_id)
        .bind(format!("a-{automation_id}"))
        .bind(&event.event_type)
        .bind(json!([action.clone()]))
        .execute(pool)
        .await
        .unwrap();
    let id = action_execution_id(event.id, automation_id, 0);
    sqlx::query(
        "INSERT INTO action_executions (id, automation_id, event_id, action_index, action, event) \
         VALUES ($1, $2, $3, 0, $4, $5)",
    )
    .bind(id)
    .bind(automation_id)
    .bind(event.id)
    .bind(&action)
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
