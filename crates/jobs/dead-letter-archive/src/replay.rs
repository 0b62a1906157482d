//! Acting on the archive: `dlq replay` and `dlq purge`, each recorded in
//! `dead_letter_actions` with who ran it, from which host, when, with which filter and how
//! many it moved.
//!
//! A replay goes in batches of rows locked with `FOR UPDATE SKIP LOCKED` (two operators
//! replaying at once never send a row twice). For each batch it publishes every row, confirmed
//! and `mandatory`, to where it died: the default exchange with the queue's name as routing
//! key (an outbox row to its own exchange and routing key), with its body, its properties and
//! its application headers, minus the dead-letter bookkeeping (`x-attempt`, `x-dead-*`,
//! `x-death`, `x-first-death-*`, the delivery counters), plus `x-replayed-from` = the dead
//! letter's id. Only the rows whose publish was confirmed are marked `replayed`, in the
//! transaction that held their locks; the others stay `dead`, with why in the report. A
//! replayed outbox row's own `outbox` row is settled (`processed`) in that same transaction,
//! so that `worker-host outbox retry --all-failed` does not publish it again; and a dead letter
//! of an outbox row that an operator has retried since (`outbox retry`) is not replayed at all:
//! the drain publishes that row again, and the maintenance settles the dead letter. Rows are
//! never deleted. A replay stopped between the confirm and the commit leaves its rows `dead`,
//! so running it again sends them again: at least once, and consumers dedup on the message id.

use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use tokio::time::Instant;
use worker_broker::{HeaderValue, Headers, Outgoing, Properties, PublishError, Publisher};
use worker_core::Failure;
use worker_store::classify;
use worker_store::dead_letters::{
    Replayable, mark_replayed, replayable_batch, settle_replayed_outbox,
};

use worker_store::audit::{self, Actor, EntryKind};

use crate::bulk::{Run, beyond_planned_note, check, new_entry};
use crate::headers::json_to_table;
use crate::pacer::Pacer;
use crate::query::Filter;
use crate::record::{MessageProperties, REPLAYED_FROM_HEADER, Source, is_dead_letter_bookkeeping};

/// Rows per replay transaction when no rate is asked for.
const BATCH: u32 = 100;

/// Items a [`ReplayReport`] lists (failures are always listed).
pub const REPORT_ITEMS_MAX: usize = 1000;

/// What became of one dead letter in a replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ItemOutcome {
    /// `--dry-run`: it would have been sent.
    WouldReplay,
    Replayed,
    /// The publish was not confirmed: it stays dead.
    Failed,
}

/// One dead letter of a replay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayItem {
    pub id: i64,
    pub queue: String,
    pub message_id: Option<String>,
    pub reason: String,
    pub fingerprint: String,
    /// Where it goes: `""` (the default exchange) and the queue, or an outbox row's own.
    pub exchange: String,
    pub routing_key: String,
    pub outcome: ItemOutcome,
    pub error: Option<String>,
}

/// What `dlq replay` did (or, with `--dry-run`, would do).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayReport {
    /// The `dead_letter_actions` row (a dry run has one too).
    pub action_id: i64,
    pub dry_run: bool,
    /// Dead letters that matched the filter.
    pub matched: u64,
    /// Published, confirmed and marked `replayed`.
    pub replayed: u64,
    /// Not confirmed: still `dead`.
    pub failed: u64,
    /// Every failure, and the others up to [`REPORT_ITEMS_MAX`] items in all.
    pub items: Vec<ReplayItem>,
    /// Whether items were left out.
    pub items_truncated: bool,
    /// Why the replay stopped before the end: a whole batch failed for a reason that would
    /// fail the rest too (the broker unreachable, say). What was not tried stays dead.
    pub stopped: Option<String>,
    /// Dead letters that matched beyond the count the operator confirmed, left dead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beyond_planned: Option<u64>,
    pub elapsed_ms: u64,
}

/// How a replay takes a dead letter: where it goes, what it reports, what it publishes.
trait ReplayRow {
    fn target(&self) -> (String, String);
    fn item(&self, outcome: ItemOutcome, error: Option<String>) -> ReplayItem;
    fn outgoing(&self) -> Outgoing;
}

impl ReplayRow for Replayable {
    /// Where the copy goes: an outbox row to its exchange and routing key, anything else to
    /// its queue through the default exchange.
    fn target(&self) -> (String, String) {
        if Source::parse(&self.source) == Source::Outbox {
            (
                self.exchange.clone().unwrap_or_default(),
                self.routing_key.clone().unwrap_or_default(),
            )
        } else {
            (String::new(), self.queue.clone())
        }
    }

    fn item(&self, outcome: ItemOutcome, error: Option<String>) -> ReplayItem {
        let (exchange, routing_key) = self.target();
        ReplayItem {
            id: self.id,
            queue: self.queue.clone(),
            message_id: self.message_id.clone(),
            reason: self.reason.clone(),
            fingerprint: self.error_fingerprint.clone(),
            exchange,
            routing_key,
            outcome,
            error,
        }
    }

    /// The copy a replay publishes (see the module docs).
    fn outgoing(&self) -> Outgoing {
        let (exchange, routing_key) = self.target();
        let properties: MessageProperties =
            serde_json::from_value(self.properties.clone()).unwrap_or_default();
        let mut headers = self
            .amqp_headers
            .clone()
            .and_then(|v| serde_json::from_value::<Headers>(v).ok())
            .unwrap_or_else(|| json_to_table(&self.headers));
        headers.retain(|k, _| !is_dead_letter_bookkeeping(k));
        headers.insert(REPLAYED_FROM_HEADER, HeaderValue::I64(self.id));
        Outgoing {
            exchange,
            routing_key,
            body: self.body.clone(),
            properties: Properties {
                headers,
                ..properties.for_replay()
            },
        }
    }
}

/// `dlq replay`: republishes every `dead` row matching `filter` (oldest first, at most
/// `filter.limit`) to where it died, confirmed, and marks each `replayed` once confirmed.
/// With `dry_run`, lists what would go and moves nothing (recorded as a dry run, with what it
/// matched). With `rate`, sends at most that many messages per second. Recorded in
/// `dead_letter_actions`.
pub async fn replay(
    pool: &PgPool,
    publisher: &Publisher,
    filter: &Filter,
    dry_run: bool,
    rate: Option<u32>,
    actor: &Actor,
) -> Result<ReplayReport, Failure> {
    let run = Run::new(actor.clone()).dry(dry_run).rate(rate);
    replay_run(pool, publisher, filter, &run).await
}

/// [`replay`] with every option of a [`Run`]: what the operator confirmed, and a [`Control`](crate::Control)
/// seen before each batch and while pacing. A stopped replay ends `Ok`, with why in
/// [`ReplayReport::stopped`] and its audit row's note; what it had not reached stays dead.
pub async fn replay_run(
    pool: &PgPool,
    publisher: &Publisher,
    filter: &Filter,
    run: &Run,
) -> Result<ReplayReport, Failure> {
    check(filter, run.rate)?;
    let started = Instant::now();
    let action_id = {
        let mut conn = pool.acquire().await.map_err(classify)?;
        audit::begin(&mut conn, &new_entry(EntryKind::Replay, filter, run)).await?
    };
    run.control.begun(action_id);
    let mut report = ReplayReport {
        action_id,
        dry_run: run.dry_run,
        matched: 0,
        replayed: 0,
        failed: 0,
        items: Vec::new(),
        items_truncated: false,
        stopped: None,
        beyond_planned: None,
        elapsed_ms: 0,
    };
    let mut result = replay_batches(pool, publisher, filter, run, action_id, &mut report).await;
    if result.is_ok() && report.stopped.is_none() {
        match run
            .beyond_planned(pool, filter, report.matched, report.failed)
            .await
        {
            Ok(more) => report.beyond_planned = more,
            Err(failure) => result = Err(failure),
        }
    }
    report.elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let note = match &result {
        Err(failure) => Some(format!("stopped: {failure}")),
        Ok(()) => {
            let notes: Vec<String> = [
                report
                    .stopped
                    .clone()
                    .map(|why| format!("stopped: {why}"))
                    .or_else(|| {
                        report
                            .items
                            .iter()
                            .find_map(|i| i.error.clone())
                            .map(|e| format!("first failure: {e}"))
                    }),
                report
                    .beyond_planned
                    .map(|more| beyond_planned_note(run.planned, more)),
            ]
            .into_iter()
            .flatten()
            .collect();
            (!notes.is_empty()).then(|| notes.join("; "))
        }
    };
    // A dry run's count is written once, at its end; a replay's grows batch by batch.
    let matched = run.dry_run.then_some(report.matched);
    let mut conn = pool.acquire().await.map_err(classify)?;
    audit::finish(&mut conn, action_id, note, matched).await?;
    result.map(|()| report)
}

async fn replay_batches(
    pool: &PgPool,
    publisher: &Publisher,
    filter: &Filter,
    run: &Run,
    action_id: i64,
    report: &mut ReplayReport,
) -> Result<(), Failure> {
    let dry_run = run.dry_run;
    // A batch holds its rows' locks while it publishes: with a rate, about a second's worth.
    let batch = run.rate.map_or(BATCH, |r| r.clamp(1, BATCH));
    let mut pacer = Pacer::new(run.rate, BATCH, run.control.clone());
    let mut after = 0i64;
    let mut remaining = run.cap(filter.limit);
    loop {
        if let Some(why) = run.control.why() {
            report.stopped = Some(why);
            return Ok(());
        }
        let take = remaining.map_or(u64::from(batch), |r| r.min(u64::from(batch)));
        if take == 0 {
            return Ok(());
        }
        let mut tx = pool.begin().await.map_err(classify)?;
        let rows = replayable_batch(&mut tx, filter, after, take, !dry_run).await?;
        let Some(last) = rows.last() else {
            return Ok(());
        };
        after = last.id;
        let n = rows.len() as u64;
        remaining = remaining.map(|r| r.saturating_sub(n));
        if dry_run {
            report.matched += n;
            for row in &rows {
                push_item(report, row.item(ItemOutcome::WouldReplay, None));
            }
            continue;
        }
        let messages: Vec<Outgoing> = rows.iter().map(Replayable::outgoing).collect();
        let Some(results) = pacer.publish(publisher, &messages).await else {
            // Stopped while pacing: the batch's rows were not sent, and stay dead.
            drop(tx);
            continue;
        };
        // Stopped in the middle of a paced batch, only the first rows were sent.
        let tried = results.len() as u64;
        report.matched += tried;
        let mut done = Vec::with_capacity(rows.len());
        let mut failed = 0u64;
        let hopeless = results
            .iter()
            .all(|r| r.as_ref().is_err_and(PublishError::is_transient));
        if hopeless && let Some(Err(err)) = results.first() {
            report.stopped = Some(format!(
                "a whole batch of {} failed to publish: {err}",
                rows.len()
            ));
        }
        for (row, result) in rows.iter().zip(results) {
            match result {
                Ok(()) => {
                    done.push(row.id);
                    push_item(report, row.item(ItemOutcome::Replayed, None));
                }
                Err(err) => {
                    failed += 1;
                    tracing::warn!(id = row.id, queue = %row.queue, error = %err, "replaying a dead letter failed; it stays dead");
                    push_item(report, row.item(ItemOutcome::Failed, Some(err.to_string())));
                }
            }
        }
        let marked = mark_replayed(&mut tx, action_id, &done).await?;
        // A replayed outbox row is settled in the same transaction: it was published (by the
        // replay), so `outbox retry --all-failed` must not publish it once more.
        settle_replayed_outbox(&mut tx, &done).await?;
        audit::progress(&mut tx, action_id, tried, marked, failed).await?;
        tx.commit().await.map_err(classify)?;
        report.replayed += marked;
        report.failed += failed;
        if report.stopped.is_some() {
            tracing::error!(stopped = ?report.stopped, "replay stopped early");
            return Ok(());
        }
    }
}

fn push_item(report: &mut ReplayReport, item: ReplayItem) {
    if item.outcome == ItemOutcome::Failed || report.items.len() < REPORT_ITEMS_MAX {
        report.items.push(item);
    } else {
        report.items_truncated = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(source: &str) -> Replayable {
        let mut table = Headers::new();
        table.insert("traceparent", "00-a-b-01");
        table.insert("x-attempt", HeaderValue::I64(4));
        table.insert("x-dead-reason", "gave-up");
        table.insert("x-tenant", HeaderValue::I32(7));
        Replayable {
            id: 42,
            source: source.into(),
            queue: "email.send".into(),
            exchange: Some("commands".into()),
            routing_key: Some("email.send".into()),
            message_id: Some("m-1".into()),
            reason: "gave-up".into(),
            error_fingerprint: "abc".into(),
            properties: serde_json::json!({"message_id": "m-1", "type": "email.send", "expiration": "5"}),
            amqp_headers: serde_json::to_value(&table).ok(),
            headers: serde_json::json!({}),
            body: b"{}".to_vec(),
        }
    }

    #[test]
    fn a_replayed_copy_resets_the_attempt_and_says_where_it_came_from() {
        let out = row("runner").outgoing();
        assert_eq!(
            (out.exchange.as_str(), out.routing_key.as_str()),
            ("", "email.send")
        );
        let h = &out.properties.headers;
        assert_eq!(h.get("traceparent"), Some(&HeaderValue::text("00-a-b-01")));
        assert_eq!(
            h.get("x-tenant"),
            Some(&HeaderValue::I32(7)),
            "types are kept"
        );
        assert_eq!(h.get(REPLAYED_FROM_HEADER), Some(&HeaderValue::I64(42)));
        assert!(h.get("x-attempt").is_none());
        assert!(h.get("x-dead-reason").is_none());
        assert_eq!(out.properties.message_id.as_deref(), Some("m-1"));
        assert_eq!(out.properties.kind.as_deref(), Some("email.send"));
        assert_eq!(out.properties.expiration, None);
    }

    #[test]
    fn an_outbox_row_goes_back_to_its_exchange() {
        let out = row("outbox").outgoing();
        assert_eq!(
            (out.exchange.as_str(), out.routing_key.as_str()),
            ("commands", "email.send")
        );
    }

    #[test]
    fn without_exact_headers_the_readable_ones_are_used() {
        let mut r = row("runner");
        r.amqp_headers = None;
        r.headers = serde_json::json!({"x-tenant": 7, "x-dead-error": "boom"});
        let out = r.outgoing();
        let headers = &out.properties.headers;
        assert_eq!(headers.get("x-tenant"), Some(&HeaderValue::I64(7)));
        assert!(headers.get("x-dead-error").is_none());
    }
}
