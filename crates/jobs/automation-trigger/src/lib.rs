//! # job-automation-trigger: from a domain event to the actions it sets off
//!
//! A [`ConsumerJob`] on the `automation.trigger` queue (bound to the events exchange with
//! `#`). For each [`DomainEvent`] it:
//!
//! 1. takes the enabled automations whose `event_type` is the event's type, as last read
//!    ([`known`]: read again when they changed, and before an event is skipped as matching
//!    nothing);
//! 2. evaluates each one's conditions on the event's `data` ([`condition`]: equals, contains,
//!    matches a regular expression, on a dotted JSON path), all of which must hold;
//! 3. in **one statement** ([`AutomationTrigger::queue`], [`QUEUE_SQL`]), its own transaction:
//!    writes a trigger-log row per matching automation still there (see below), and for each
//!    action of each match an `action_executions` row (`ON CONFLICT DO NOTHING` on its id) and
//!    an outbox row for the [`ActionCommand`] on the commands exchange (routing key
//!    `automation.action`). The outbox drain publishes the commands once that commits.
//!
//! ## Idempotency: deliberately not deduplicated
//!
//! Seed 000: this hop has no processed-message guard. A redelivered or republished event
//! matches again and logs its match again (a second trigger-log row), but the execution id is
//! derived from (event id, automation id, action position)
//! ([`worker_messages::action_execution_id`]), so it finds its execution row already there
//! and adds none, and the command it queues again carries the same id: the action executor's
//! guard drops it. A duplicate costs a log row and a dropped command, never a second effect.
//!
//! ## A broken stored automation never poisons the queue
//!
//! Automations are validated when imported ([`import`]), but the platform writes them too.
//! One whose stored conditions or actions cannot be used (an invalid regular expression, an
//! unknown action type) is **logged at error level and skipped** for that event; the other
//! automations still run and the event is acknowledged. Failing the event instead would
//! dead-letter every event of that type until someone fixed the row. The log line names the
//! automation and the problem; fix the row and later events match again.
//!
//! ## An automation deleted while its event is in flight
//!
//! The platform may delete an automation between step 1 and step 3. Step 3 locks the matched
//! automations that are still there (`FOR KEY SHARE`, so that a deletion waits for the commit),
//! writes only for those, and **warns of the ones already gone**; the others run and the event is
//! acknowledged. Failing on the foreign key instead would dead-letter the event and lose every
//! other automation's actions with it.
//!
//! ## Database errors
//!
//! Classified once, by [`worker_store::classify_sqlx`]: only what cannot heal is permanent;
//! a lost connection, a timeout or a table that a rolling migration has not created yet is
//! transient and retried.
//!
//! ## How the host runs it
//!
//! From its one line in the host's job list (`crates/host/src/jobs.rs`), built from its
//! settings section; ARCHITECTURE.md ("Adding a job") walks through that wiring.

pub mod condition;
pub mod import;
mod known;
pub mod settings;
pub mod story;

use std::collections::HashSet;
use std::sync::LazyLock;

use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;
use worker_core::{ConsumerJob, Failure, Handled, WorkContext};
use worker_messages::{
    AUTOMATION_ACTION, ActionCommand, AutomationAction, DomainEvent, Message,
    SCHEMA_VERSION_HEADER, action_execution_id,
};
use worker_store::classify;
use worker_store::outbox::{self, OutboxMessage};

pub use condition::{Condition, ConditionError, ConditionSpec, Op};
pub use import::{AutomationDefinition, ImportError, ImportReport, import_file};
pub use settings::AutomationTriggerSettings;

/// The skip reason of an event no enabled automation matched.
pub const NO_MATCH: &str = "no-match";

/// The skip reason of a message on the events exchange that is not a domain event (an audit
/// entry, which the audit log owns): its queue takes every key (`#`), so it arrives here too.
pub const NOT_AN_EVENT: &str = "not-an-event";

/// How many times an event is matched on a fresh read when the automations keep changing
/// under its writes, before it is written with what the last read matched.
const CHANGED_TRIES: usize = 3;

/// The job's name, in logs, metrics and the attempt log.
pub const JOB_NAME: &str = "automation-trigger";

/// What the host needs to know of this job (its name, kind and lease).
pub const JOB: worker_core::JobSpec = worker_core::catalog::JobSpec::consumer(JOB_NAME);

/// Step 3 in one statement: the matched automations still there locked against deletion
/// (`$1`), and for those only, a trigger-log row each (event `$2` of type `$3`), the actions'
/// executions (ids `$5`, automations `$6`, positions `$7`, actions `$8`, with the event's
/// snapshot `$4`) and their commands in the outbox (message ids `$9`, automations `$10`, types
/// `$11`, content types `$12`, correlation ids `$13`, headers `$14`, bodies `$15`, to exchange
/// `$16` with routing key `$17`), if the event type's automations still have the fingerprint
/// `$18` they were matched with (null: whatever they are now). Returns whether they had, and
/// the automations it wrote for.
pub static QUEUE_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH fresh AS ( \
             SELECT $18::text IS NULL OR {fingerprint} = $18 AS ok), \
         present AS ( \
             SELECT id FROM automations \
             WHERE id = ANY($1) AND (SELECT ok FROM fresh) FOR KEY SHARE), \
         logged AS ( \
             INSERT INTO automation_trigger_log (automation_id, event_id, event_type) \
             SELECT id, $2, $3 FROM present), \
         executions AS ( \
             INSERT INTO action_executions (id, automation_id, event_id, action_index, action, event) \
             SELECT e.id, e.automation_id, $2, e.position, e.action, $4 \
             FROM unnest($5::uuid[], $6::uuid[], $7::bigint[], $8::jsonb[]) \
                  AS e(id, automation_id, position, action) \
             WHERE e.automation_id IN (SELECT id FROM present) \
             ON CONFLICT (id) DO NOTHING), \
         queued AS ( \
             {outbox} \
             SELECT m.id, m.kind, m.content_type, m.correlation_id, $16, $17, m.headers, m.body \
             FROM unnest($9::text[], $10::uuid[], $11::text[], $12::text[], $13::text[], \
                         $14::jsonb[], $15::bytea[]) WITH ORDINALITY \
                  AS m(id, automation_id, kind, content_type, correlation_id, headers, body, n) \
             WHERE m.automation_id IN (SELECT id FROM present) \
             ORDER BY m.n) \
         SELECT (SELECT ok FROM fresh), array(SELECT id FROM present)",
        outbox = outbox::INSERT_INTO,
        fingerprint = known::fingerprint_sql("$3"),
    )
});

/// An automation whose conditions held for an event.
#[derive(Debug, Clone, PartialEq)]
pub struct Matched {
    pub automation_id: Uuid,
    pub name: String,
    pub actions: Vec<AutomationAction>,
}

/// The automation trigger consumer. Input: a [`DomainEvent`].
#[derive(Debug, Clone)]
pub struct AutomationTrigger {
    pool: PgPool,
    commands_exchange: String,
    action_routing_key: String,
    known: known::Known,
}

impl AutomationTrigger {
    /// A trigger that writes to `pool` and queues its commands to `commands_exchange` with
    /// the routing key `automation.action` (see [`Self::with_action_routing_key`]).
    pub fn new(pool: PgPool, commands_exchange: impl Into<String>) -> Self {
        Self {
            pool,
            commands_exchange: commands_exchange.into(),
            action_routing_key: AUTOMATION_ACTION.to_string(),
            known: known::Known::default(),
        }
    }

    /// Routes the action commands with `routing_key` instead (when the action queue was
    /// renamed in the settings).
    #[must_use]
    pub fn with_action_routing_key(mut self, routing_key: impl Into<String>) -> Self {
        self.action_routing_key = routing_key.into();
        self
    }

    /// The enabled automations of the event's type whose conditions all hold, by name, read
    /// afresh. Automations whose stored definition cannot be used are logged and left out.
    pub async fn matching(&self, event: &DomainEvent) -> Result<Vec<Matched>, Failure> {
        let read = self.known.refresh(&self.pool, &event.event_type).await?;
        Ok(read.matching(event))
    }

    /// Steps 1 to 3 (see [`known`]): matched against the automations as last read, confirmed
    /// by a fresh read before a skip, and read again when the writes find them changed.
    async fn trigger(&self, event: &DomainEvent) -> Result<Handled, Failure> {
        let (mut automations, mut fresh) = match self.known.get(&event.event_type) {
            Some(known) => (known, false),
            None => (
                self.known.refresh(&self.pool, &event.event_type).await?,
                true,
            ),
        };
        for _ in 0..CHANGED_TRIES {
            let matched = automations.matching(event);
            if matched.is_empty() {
                if fresh {
                    tracing::debug!("no automation matched");
                    return Ok(Handled::Skipped(NO_MATCH));
                }
            } else if self
                .write(event, &matched, Some(&automations.fingerprint))
                .await?
            {
                return Ok(Handled::Done);
            }
            automations = self.known.refresh(&self.pool, &event.event_type).await?;
            fresh = true;
        }
        // Changed under every try: what the last read matched, whatever they are now.
        let matched = automations.matching(event);
        if matched.is_empty() {
            return Ok(Handled::Skipped(NO_MATCH));
        }
        self.write(event, &matched, None).await?;
        Ok(Handled::Done)
    }

    /// Step 3 of the crate docs for automations [`Self::matching`] found, whatever the
    /// automations are now: the trigger-log rows, the executions and their commands, in one
    /// statement ([`QUEUE_SQL`]).
    pub async fn queue(
        &self,
        event: &DomainEvent,
        matched: &[Matched],
    ) -> Result<Handled, Failure> {
        self.write(event, matched, None).await?;
        Ok(Handled::Done)
    }

    /// [`QUEUE_SQL`] for `matched`, if the event type's automations still have `fingerprint`
    /// (`None`: whatever they are now); `false` when they had changed and nothing was written.
    async fn write(
        &self,
        event: &DomainEvent,
        matched: &[Matched],
        fingerprint: Option<&str>,
    ) -> Result<bool, Failure> {
        let snapshot =
            serde_json::to_value(event).map_err(|err| Failure::permanent("serialize", err))?;
        let mut executions = Executions::default();
        let mut commands = Vec::new();
        for automation in matched {
            for (index, action) in automation.actions.iter().enumerate() {
                let index = u32::try_from(index)
                    .map_err(|_| Failure::permanent("too-many-actions", "over 2^32 actions"))?;
                let execution_id = action_execution_id(event.id, automation.automation_id, index);
                let action_json = serde_json::to_value(action)
                    .map_err(|err| Failure::permanent("serialize", err))?;
                executions.push(execution_id, automation.automation_id, index, action_json);
                let command = ActionCommand {
                    action_execution_id: execution_id,
                    automation_id: automation.automation_id,
                    event_id: event.id,
                    action_index: index,
                };
                let message =
                    OutboxMessage::json(execution_id.to_string(), AUTOMATION_ACTION, &command)
                        .map_err(|err| Failure::permanent("serialize", err))?
                        .with_header(SCHEMA_VERSION_HEADER, ActionCommand::VERSION)
                        .with_correlation_id(event.id.to_string());
                commands.push((automation.automation_id, message));
            }
        }
        let ids: Vec<Uuid> = matched.iter().map(|m| m.automation_id).collect();
        let column = |f: fn(&OutboxMessage) -> Option<&str>| -> Vec<Option<&str>> {
            commands.iter().map(|(_, m)| f(m)).collect()
        };
        let (fresh, present): (bool, Vec<Uuid>) = sqlx::query_as(QUEUE_SQL.as_str())
            .bind(&ids)
            .bind(event.id)
            .bind(&event.event_type)
            .bind(&snapshot)
            .bind(&executions.ids)
            .bind(&executions.automations)
            .bind(&executions.positions)
            .bind(&executions.actions)
            .bind(column(|m| Some(m.message_id.as_str())))
            .bind(commands.iter().map(|(a, _)| *a).collect::<Vec<Uuid>>())
            .bind(column(|m| m.message_type.as_deref()))
            .bind(column(|m| m.content_type.as_deref()))
            .bind(column(|m| m.correlation_id.as_deref()))
            .bind(
                commands
                    .iter()
                    .map(|(_, m)| m.stored_headers())
                    .collect::<Vec<Value>>(),
            )
            .bind(
                commands
                    .iter()
                    .map(|(_, m)| m.body.as_slice())
                    .collect::<Vec<&[u8]>>(),
            )
            .bind(&self.commands_exchange)
            .bind(&self.action_routing_key)
            .bind(fingerprint)
            .fetch_one(&self.pool)
            .await
            .map_err(classify)?;
        if !fresh {
            tracing::debug!("the automations changed since they were read: matching again");
            return Ok(false);
        }
        let present: HashSet<Uuid> = present.into_iter().collect();
        let mut queued = Vec::new();
        for automation in matched {
            if present.contains(&automation.automation_id) {
                queued.push(automation.name.as_str());
            } else {
                // Deleted since `matching` read it: its inserts would fail on the foreign key,
                // and with them the whole event.
                tracing::warn!(
                    automation_id = %automation.automation_id,
                    automation = %automation.name,
                    "skipping an automation deleted while its event was in flight"
                );
            }
        }
        let commands = commands.iter().filter(|(a, _)| present.contains(a)).count();
        // Debug, not info: the mail's own lines say it (recorded, sent), one a mail at info.
        tracing::debug!(
            automations = queued.len(),
            commands,
            matched = ?queued,
            "event matched; action commands queued"
        );
        Ok(true)
    }
}

/// The executions of an event's matched automations, as the columns [`QUEUE_SQL`] unnests.
#[derive(Default)]
struct Executions {
    ids: Vec<Uuid>,
    automations: Vec<Uuid>,
    positions: Vec<i64>,
    actions: Vec<Value>,
}

impl Executions {
    fn push(&mut self, id: Uuid, automation: Uuid, position: u32, action: Value) {
        self.ids.push(id);
        self.automations.push(automation);
        self.positions.push(i64::from(position));
        self.actions.push(action);
    }
}

impl ConsumerJob for AutomationTrigger {
    type Input = DomainEvent;

    fn name(&self) -> &str {
        JOB_NAME
    }

    /// Per event type: automations' conditions and templates read an event's data by field
    /// name, so a newer shape of it is refused here, before anything is written for it.
    fn reads_version(&self, message_type: &str) -> u32 {
        DomainEvent::reads_version(message_type)
    }

    /// Types another job owns on the events exchange ([`worker_messages::NOT_DOMAIN_EVENTS`])
    /// are acked and counted, not dead-lettered: automations are keyed by any event type the
    /// platform emits, so the queue's default binding stays `#` rather than a list of types.
    fn skips(&self, message_type: &str) -> Option<&'static str> {
        worker_messages::NOT_DOMAIN_EVENTS
            .contains(&message_type)
            .then_some(NOT_AN_EVENT)
    }

    #[tracing::instrument(
        name = "automation_trigger",
        skip_all,
        fields(event_id = %event.id, event_type = %event.event_type, attempt = ctx.attempt)
    )]
    async fn handle(&self, ctx: &WorkContext, event: &DomainEvent) -> Result<Handled, Failure> {
        self.trigger(event).await
    }
}
