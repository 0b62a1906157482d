//! The automations of each event type as this trigger last read them, compiled, with the
//! fingerprint of the rows they came from.
//!
//! An event is matched against what is known, so that a matching event costs the trigger one
//! statement (the writes) instead of two (a read, then the writes). The writes' statement
//! recomputes the fingerprint and writes nothing if it changed ([`crate::QUEUE_SQL`]): the
//! automations are then read again and the event matched anew. An event that matches nothing
//! that is known is matched again on a fresh read before it is skipped, so an automation
//! added, enabled or edited since is never missed.
//!
//! The fingerprint is every row of the event type (enabled or not) by id and `xmin`, the id of
//! the transaction that wrote its current version: any insert, update or delete changes it,
//! whoever wrote the row (the platform writes automations directly).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;
use worker_core::Failure;
use worker_messages::{AutomationAction, DomainEvent};
use worker_store::classify;

use crate::Matched;
use crate::condition::{self, Condition, ConditionSpec};

/// The SQL expression of the fingerprint of the automations whose event type is the
/// statement's placeholder `event_type` (`"$1"`).
pub(crate) fn fingerprint_sql(event_type: &str) -> String {
    format!(
        "coalesce((SELECT string_agg(id::text || ':' || xmin::text, ',' ORDER BY id) \
         FROM automations WHERE event_type = {event_type}), '')"
    )
}

/// The read: the fingerprint on every row, and the enabled automations (none: one row of
/// nulls).
static READ_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT f.fingerprint, a.id, a.name, a.conditions, a.actions \
         FROM (SELECT {fingerprint} AS fingerprint) AS f \
         LEFT JOIN automations AS a ON a.event_type = $1 AND a.enabled \
         ORDER BY a.name, a.id",
        fingerprint = fingerprint_sql("$1")
    )
});

/// One event type's enabled automations, as read together with their fingerprint.
#[derive(Debug)]
pub(crate) struct Automations {
    pub(crate) fingerprint: String,
    automations: Vec<Automation>,
}

/// A stored automation, compiled, or why it cannot be used.
#[derive(Debug)]
struct Automation {
    id: Uuid,
    name: String,
    usable: Result<(Vec<Condition>, Vec<AutomationAction>), String>,
}

type Row = (
    String,
    Option<Uuid>,
    Option<String>,
    Option<Value>,
    Option<Value>,
);

impl Automations {
    /// Reads event type `event_type`'s enabled automations and their fingerprint, in one
    /// statement.
    pub(crate) async fn read(pool: &PgPool, event_type: &str) -> Result<Self, Failure> {
        let rows: Vec<Row> = sqlx::query_as(READ_SQL.as_str())
            .bind(event_type)
            .fetch_all(pool)
            .await
            .map_err(classify)?;
        let fingerprint = rows.first().map(|r| r.0.clone()).unwrap_or_default();
        let automations = rows
            .into_iter()
            .filter_map(|(_, id, name, conditions, actions)| {
                Some(Automation {
                    id: id?,
                    name: name?,
                    usable: usable(conditions?, actions?),
                })
            })
            .collect();
        Ok(Self {
            fingerprint,
            automations,
        })
    }

    /// Those whose conditions all hold for `event`, by name. Automations whose stored
    /// definition cannot be used are logged and left out.
    pub(crate) fn matching(&self, event: &DomainEvent) -> Vec<Matched> {
        let mut matched = Vec::new();
        for automation in &self.automations {
            match &automation.usable {
                Ok((conditions, actions)) => {
                    if conditions.iter().all(|c| c.holds(&event.data)) {
                        matched.push(Matched {
                            automation_id: automation.id,
                            name: automation.name.clone(),
                            actions: actions.clone(),
                        });
                    }
                }
                Err(problem) => tracing::error!(
                    automation_id = %automation.id,
                    automation = %automation.name,
                    event_id = %event.id,
                    problem = %problem,
                    "skipping an automation whose stored definition cannot be used; fix the row"
                ),
            }
        }
        matched
    }
}

/// The stored conditions compiled and actions decoded, or why they cannot be.
fn usable(
    conditions: Value,
    actions: Value,
) -> Result<(Vec<Condition>, Vec<AutomationAction>), String> {
    let specs: Vec<ConditionSpec> =
        serde_json::from_value(conditions).map_err(|err| format!("conditions: {err}"))?;
    let compiled =
        condition::compile_all(&specs).map_err(|(at, err)| format!("conditions[{at}]: {err}"))?;
    let actions: Vec<AutomationAction> =
        serde_json::from_value(actions).map_err(|err| format!("actions: {err}"))?;
    Ok((compiled, actions))
}

/// What this trigger last read, by event type: shared by its clones.
#[derive(Debug, Default, Clone)]
pub(crate) struct Known {
    by_type: Arc<Mutex<HashMap<String, Arc<Automations>>>>,
}

impl Known {
    pub(crate) fn get(&self, event_type: &str) -> Option<Arc<Automations>> {
        self.by_type
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(event_type)
            .cloned()
    }

    /// Reads event type `event_type`'s automations afresh and keeps them.
    pub(crate) async fn refresh(
        &self,
        pool: &PgPool,
        event_type: &str,
    ) -> Result<Arc<Automations>, Failure> {
        let read = Arc::new(Automations::read(pool, event_type).await?);
        self.by_type
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(event_type.to_string(), Arc::clone(&read));
        Ok(read)
    }
}
