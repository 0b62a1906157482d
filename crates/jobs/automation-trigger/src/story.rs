//! What the trigger decided for one event, read back for a mail's story: each automation of
//! the event's type, whether it matched (the trigger log keeps the matches), and for the ones
//! that did not, which condition did not hold. The trigger records only matches, so a
//! non-match is worked out here, from the event and the automation as it is now; an
//! automation changed since the event says so.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;
use worker_core::Failure;
use worker_messages::DomainEvent;
use worker_store::classify;

use crate::condition::ConditionSpec;

/// One automation's verdict on one event.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    pub automation_id: Uuid,
    pub automation: String,
    pub enabled: bool,
    /// When the trigger logged it matching this event; `None` when it did not (or has not yet).
    pub matched_at: Option<DateTime<Utc>>,
    /// The conditions that do not hold for the event, in words (`subject contains "ping"`);
    /// empty when every one holds.
    pub failed_conditions: Vec<String>,
    /// Why the stored conditions cannot be used at all, if they cannot.
    pub unusable: Option<String>,
    /// The automation was edited after the event: the verdict reads today's conditions.
    pub changed_since: bool,
}

impl Verdict {
    /// Whether today's conditions all hold for the event.
    pub fn would_match(&self) -> bool {
        self.unusable.is_none() && self.failed_conditions.is_empty()
    }
}

/// A condition in words, as an operator reads it.
pub fn describe(spec: &ConditionSpec) -> String {
    let op = match spec.op {
        crate::condition::Op::Equals => "equals",
        crate::condition::Op::Contains => "contains",
        crate::condition::Op::Matches => "matches",
    };
    let case = if spec.ignore_case { " (any case)" } else { "" };
    format!("{} {op} {}{case}", spec.path, spec.value)
}

/// The conditions of `conditions` that do not hold for `data`, in words, or why they cannot
/// be used.
pub fn failing(conditions: &Value, data: &Value) -> Result<Vec<String>, String> {
    let specs: Vec<ConditionSpec> =
        serde_json::from_value(conditions.clone()).map_err(|err| format!("conditions: {err}"))?;
    let mut failed = Vec::new();
    for (at, spec) in specs.iter().enumerate() {
        let condition = spec
            .compile()
            .map_err(|err| format!("conditions[{at}]: {err}"))?;
        if !condition.holds(data) {
            failed.push(describe(spec));
        }
    }
    Ok(failed)
}

/// An automation as its verdict needs it: id, name, event type, enabled, conditions, last edit.
type AutomationRow = (Uuid, String, String, bool, Value, DateTime<Utc>);

/// Every automation of `event`'s type, enabled or not, with its verdict on the event.
pub async fn verdicts(pool: &PgPool, event: &DomainEvent) -> Result<Vec<Verdict>, Failure> {
    let mut all = verdicts_of(pool, std::slice::from_ref(event)).await?;
    Ok(all.pop().unwrap_or_default())
}

/// [`verdicts`] for each of `events`, in their order, in two statements whatever their
/// number (a page of a search).
pub async fn verdicts_of(
    pool: &PgPool,
    events: &[DomainEvent],
) -> Result<Vec<Vec<Verdict>>, Failure> {
    if events.is_empty() {
        return Ok(Vec::new());
    }
    let types: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
    let ids: Vec<Uuid> = events.iter().map(|e| e.id).collect();
    let automations: Vec<AutomationRow> = sqlx::query_as(
        "SELECT id, name, event_type, enabled, conditions, updated_at FROM automations \
         WHERE event_type = ANY($1) ORDER BY name, id",
    )
    .bind(&types)
    .fetch_all(pool)
    .await
    .map_err(classify)?;
    let matches: Vec<(Uuid, Uuid, DateTime<Utc>)> = sqlx::query_as(
        "SELECT automation_id, event_id, min(matched_at) FROM automation_trigger_log \
         WHERE event_id = ANY($1) GROUP BY automation_id, event_id",
    )
    .bind(&ids)
    .fetch_all(pool)
    .await
    .map_err(classify)?;
    Ok(events
        .iter()
        .map(|event| {
            automations
                .iter()
                .filter(|a| a.2 == event.event_type)
                .map(|(id, name, _, enabled, conditions, updated_at)| {
                    let (failed_conditions, unusable) = match failing(conditions, &event.data) {
                        Ok(failed) => (failed, None),
                        Err(problem) => (Vec::new(), Some(problem)),
                    };
                    Verdict {
                        automation_id: *id,
                        automation: name.clone(),
                        enabled: *enabled,
                        matched_at: matches
                            .iter()
                            .find(|(a, e, _)| a == id && *e == event.id)
                            .map(|m| m.2),
                        failed_conditions,
                        unusable,
                        changed_since: *updated_at > event.occurred_at,
                    }
                })
                .collect()
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_conditions_that_do_not_hold_are_named_in_words() {
        let conditions = json!([
            {"path": "subject", "op": "contains", "value": "ping"},
            {"path": "from", "op": "equals", "value": "ann@example.com", "ignore_case": true},
        ]);
        let data = json!({"subject": "hello", "from": "ANN@example.com"});
        assert_eq!(
            failing(&conditions, &data),
            Ok(vec![r#"subject contains "ping""#.to_string()])
        );
        let data = json!({"subject": "ping", "from": "bob@example.com"});
        assert_eq!(
            failing(&conditions, &data),
            Ok(vec![
                r#"from equals "ann@example.com" (any case)"#.to_string()
            ])
        );
    }

    #[test]
    fn conditions_that_cannot_be_used_say_why() {
        let conditions = json!([{"path": "subject", "op": "matches", "value": "("}]);
        let problem = failing(&conditions, &json!({})).unwrap_err();
        assert!(
            problem.starts_with("conditions[0]: invalid regular expression"),
            "{problem}"
        );
    }
}
