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

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::{PgConnection, PgPool, QueryBuilder};
use tokio::time::Instant;
use worker_broker::{HeaderValue, Headers, Outgoing, Properties, PublishError, Publisher};
use worker_core::Failure;
use worker_store::classify;

use crate::query::Filter;
use crate::record::{
    MessageProperties, REPLAYED_FROM_HEADER, Source, is_dead_letter_bookkeeping, json_to_table,
};

/// Rows per replay transaction when no rate is asked for.
const BATCH: u32 = 100;

/// Items a [`ReplayReport`] lists (failures are always listed).
pub const REPORT_ITEMS_MAX: usize = 1000;

/// Who runs a replay or a purge: the operating-system user and the host name, as the host's
/// command line found them, and the name the operator gave, if any (`--actor`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Actor {
    pub user: String,
    pub host: String,
    /// The name the operator gave for themselves (a person behind a shared account, a
    /// ticket); recorded beside `user`, never instead of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl Actor {
    pub fn new(user: impl Into<String>, host: impl Into<String>) -> Self {
        Self {
            user: user.into(),
            host: host.into(),
            name: None,
        }
    }

    /// The same actor, with the name the operator gave.
    #[must_use]
    pub fn with_name(mut self, name: Option<String>) -> Self {
        self.name = name.filter(|n| !n.trim().is_empty());
        self
    }
}

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
    pub elapsed_ms: u64,
}

/// What `dlq purge` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PurgeReport {
    pub action_id: i64,
    /// Rows marked `purged` (none for a dry run).
    pub purged: u64,
    /// Rows that matched.
    pub matched: u64,
}

/// One recorded replay or purge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct Action {
    pub id: i64,
    pub action: String,
    pub actor_user: String,
    pub actor_host: String,
    /// The name the operator gave (`--actor`), if any.
    pub actor: Option<String>,
    /// The database role the command connected as, as the database recorded it.
    pub db_user: String,
    /// A dry run: it moved nothing, `matched` says what it would have moved.
    pub dry_run: bool,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub filter: Value,
    pub rate: Option<i32>,
    pub matched: i64,
    pub succeeded: i64,
    pub failed: i64,
    pub note: Option<String>,
}

/// The recorded replays and purges, newest first.
pub async fn actions(pool: &PgPool, limit: u32) -> Result<Vec<Action>, Failure> {
    sqlx::query_as(
        "SELECT id, action, actor_user, actor_host, actor, db_user, dry_run, started_at, \
                finished_at, filter, rate, matched, succeeded, failed, note \
         FROM dead_letter_actions ORDER BY id DESC LIMIT $1",
    )
    .bind(i64::from(limit.max(1)))
    .fetch_all(pool)
    .await
    .map_err(classify)
}

/// How many dead letters (status `dead`) match `filter`, up to its limit: what a replay or a
/// purge would act on, for the host's confirmation prompt.
pub async fn count(pool: &PgPool, filter: &Filter) -> Result<u64, Failure> {
    filter
        .validate()
        .map_err(|e| Failure::permanent("bad-filter", e))?;
    let mut q =
        QueryBuilder::new("SELECT count(*) FROM (SELECT 1 FROM dead_letters WHERE status = 'dead'");
    filter.push_where(&mut q);
    q.push(crate::store::not_retried_in_outbox_sql());
    if let Some(limit) = filter.limit {
        q.push(" LIMIT ").push_bind(i64::from(limit));
    }
    q.push(") t");
    let n: i64 = q
        .build_query_scalar()
        .fetch_one(pool)
        .await
        .map_err(classify)?;
    Ok(u64::try_from(n).unwrap_or(0))
}

#[derive(Debug, sqlx::FromRow)]
struct ReplayRow {
    id: i64,
    source: String,
    queue: String,
    exchange: Option<String>,
    routing_key: Option<String>,
    message_id: Option<String>,
    reason: String,
    error_fingerprint: String,
    properties: Value,
    amqp_headers: Option<Value>,
    headers: Value,
    body: Vec<u8>,
}

impl ReplayRow {
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
    filter
        .validate()
        .map_err(|e| Failure::permanent("bad-filter", e))?;
    if rate == Some(0) {
        return Err(Failure::permanent(
            "bad-filter",
            "--rate must be at least 1",
        ));
    }
    let started = Instant::now();
    let action_id = start_action(pool, "replay", filter, rate, dry_run, actor).await?;
    let mut report = ReplayReport {
        action_id,
        dry_run,
        matched: 0,
        replayed: 0,
        failed: 0,
        items: Vec::new(),
        items_truncated: false,
        stopped: None,
        elapsed_ms: 0,
    };
    let result = replay_batches(
        pool,
        publisher,
        filter,
        rate,
        action_id,
        dry_run,
        &mut report,
    )
    .await;
    report.elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let note = match &result {
        Err(failure) => Some(format!("stopped: {failure}")),
        Ok(()) => report
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
    };
    // A dry run's count is written once, at its end; a replay's grows batch by batch.
    let matched = dry_run.then(|| i64::try_from(report.matched).unwrap_or(i64::MAX));
    finish_action(pool, action_id, note, matched).await?;
    result.map(|()| report)
}

async fn replay_batches(
    pool: &PgPool,
    publisher: &Publisher,
    filter: &Filter,
    rate: Option<u32>,
    action_id: i64,
    dry_run: bool,
    report: &mut ReplayReport,
) -> Result<(), Failure> {
    // A batch holds its rows' locks while it publishes: with a rate, about a second's worth.
    let batch = rate.map_or(BATCH, |r| r.clamp(1, BATCH));
    let mut pacer = Pacer::new(rate);
    let mut after = 0i64;
    let mut remaining = filter.limit.map(u64::from);
    loop {
        let take = remaining.map_or(u64::from(batch), |r| r.min(u64::from(batch)));
        if take == 0 {
            return Ok(());
        }
        let mut tx = pool.begin().await.map_err(classify)?;
        let rows = select_batch(&mut tx, filter, after, take, !dry_run).await?;
        let Some(last) = rows.last() else {
            return Ok(());
        };
        after = last.id;
        let n = rows.len() as u64;
        report.matched += n;
        remaining = remaining.map(|r| r.saturating_sub(n));
        if dry_run {
            for row in &rows {
                push_item(report, row.item(ItemOutcome::WouldReplay, None));
            }
            continue;
        }
        let messages: Vec<Outgoing> = rows.iter().map(ReplayRow::outgoing).collect();
        let results = pacer.publish(publisher, &messages).await;
        let mut done = Vec::with_capacity(rows.len());
        let mut failed = 0i64;
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
        let marked = sqlx::query(
            "UPDATE dead_letters SET status = 'replayed', replayed_at = now(), action_id = $1 \
             WHERE id = ANY($2) AND status = 'dead'",
        )
        .bind(action_id)
        .bind(&done)
        .execute(&mut *tx)
        .await
        .map_err(classify)?
        .rows_affected();
        // A replayed outbox row is settled in the same transaction: it was published (by the
        // replay), so `outbox retry --all-failed` must not publish it once more.
        sqlx::query(
            "UPDATE outbox SET status = 'processed', processed_at = now() \
             WHERE status = 'failed' AND id IN ( \
                 SELECT outbox_id FROM dead_letters \
                 WHERE id = ANY($1) AND source = 'outbox' AND outbox_id IS NOT NULL)",
        )
        .bind(&done)
        .execute(&mut *tx)
        .await
        .map_err(classify)?;
        sqlx::query(
            "UPDATE dead_letter_actions SET matched = matched + $2, succeeded = succeeded + $3, \
                    failed = failed + $4 WHERE id = $1",
        )
        .bind(action_id)
        .bind(i64::try_from(n).unwrap_or(i64::MAX))
        .bind(i64::try_from(marked).unwrap_or(i64::MAX))
        .bind(failed)
        .execute(&mut *tx)
        .await
        .map_err(classify)?;
        tx.commit().await.map_err(classify)?;
        report.replayed += marked;
        report.failed += u64::try_from(failed).unwrap_or(0);
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

async fn select_batch(
    tx: &mut PgConnection,
    filter: &Filter,
    after: i64,
    take: u64,
    lock: bool,
) -> Result<Vec<ReplayRow>, Failure> {
    let mut q = QueryBuilder::new(
        "SELECT id, source, queue, exchange, routing_key, message_id, reason, error_fingerprint, \
                properties, amqp_headers, headers, body \
         FROM dead_letters WHERE status = 'dead' AND id > ",
    );
    q.push_bind(after);
    filter.push_where(&mut q);
    q.push(crate::store::not_retried_in_outbox_sql());
    q.push(" ORDER BY id LIMIT ");
    q.push_bind(i64::try_from(take).unwrap_or(i64::MAX));
    if lock {
        q.push(" FOR UPDATE SKIP LOCKED");
    }
    q.build_query_as().fetch_all(tx).await.map_err(classify)
}

/// Sends at most `rate` messages per second, in slices of a tenth of a second's worth.
struct Pacer {
    rate: Option<u32>,
    start: Instant,
    sent: u64,
}

impl Pacer {
    fn new(rate: Option<u32>) -> Self {
        Self {
            rate,
            start: Instant::now(),
            sent: 0,
        }
    }

    async fn publish(
        &mut self,
        publisher: &Publisher,
        messages: &[Outgoing],
    ) -> Vec<Result<(), PublishError>> {
        let Some(rate) = self.rate else {
            return publisher.publish_many(messages).await;
        };
        let slice = usize::try_from((rate / 10).clamp(1, BATCH)).unwrap_or(1);
        let mut results = Vec::with_capacity(messages.len());
        for chunk in messages.chunks(slice) {
            let due = self.start + Duration::from_secs_f64(self.sent as f64 / f64::from(rate));
            tokio::time::sleep_until(due).await;
            results.extend(publisher.publish_many(chunk).await);
            self.sent += chunk.len() as u64;
        }
        results
    }
}

/// `dlq purge`: marks every `dead` row matching `filter` (oldest first, at most
/// `filter.limit`) `purged`, in one transaction, and records it. Nothing is deleted: the
/// retention sweep deletes purged rows once they are older than its window. The host asks for
/// `--yes` first (see [`count`]).
pub async fn purge(pool: &PgPool, filter: &Filter, actor: &Actor) -> Result<PurgeReport, Failure> {
    filter
        .validate()
        .map_err(|e| Failure::permanent("bad-filter", e))?;
    let mut tx = pool.begin().await.map_err(classify)?;
    let action_id = insert_action(&mut tx, "purge", filter, None, false, actor).await?;
    let mut q = QueryBuilder::new(
        "UPDATE dead_letters SET status = 'purged', purged_at = now(), action_id = ",
    );
    q.push_bind(action_id);
    q.push(" WHERE id IN (SELECT id FROM dead_letters WHERE status = 'dead'");
    filter.push_where(&mut q);
    q.push(" ORDER BY id");
    if let Some(limit) = filter.limit {
        q.push(" LIMIT ").push_bind(i64::from(limit));
    }
    q.push(" FOR UPDATE SKIP LOCKED)");
    let purged = q
        .build()
        .execute(&mut *tx)
        .await
        .map_err(classify)?
        .rows_affected();
    let n = i64::try_from(purged).unwrap_or(i64::MAX);
    sqlx::query(
        "UPDATE dead_letter_actions SET matched = $2, succeeded = $2, finished_at = now() \
         WHERE id = $1",
    )
    .bind(action_id)
    .bind(n)
    .execute(&mut *tx)
    .await
    .map_err(classify)?;
    tx.commit().await.map_err(classify)?;
    tracing::info!(action_id, purged, user = %actor.user, host = %actor.host, "purged dead letters");
    Ok(PurgeReport {
        action_id,
        purged,
        matched: purged,
    })
}

/// `dlq purge` without `--yes`: how many dead letters `filter` would purge, recorded as a
/// dry run (its id and the count).
pub async fn purge_dry_run(
    pool: &PgPool,
    filter: &Filter,
    actor: &Actor,
) -> Result<PurgeReport, Failure> {
    let matching = count(pool, filter).await?;
    let action_id = start_action(pool, "purge", filter, None, true, actor).await?;
    finish_action(
        pool,
        action_id,
        None,
        Some(i64::try_from(matching).unwrap_or(i64::MAX)),
    )
    .await?;
    Ok(PurgeReport {
        action_id,
        purged: 0,
        matched: matching,
    })
}

async fn start_action(
    pool: &PgPool,
    action: &str,
    filter: &Filter,
    rate: Option<u32>,
    dry_run: bool,
    actor: &Actor,
) -> Result<i64, Failure> {
    let mut conn = pool.acquire().await.map_err(classify)?;
    insert_action(&mut conn, action, filter, rate, dry_run, actor).await
}

async fn insert_action(
    conn: &mut PgConnection,
    action: &str,
    filter: &Filter,
    rate: Option<u32>,
    dry_run: bool,
    actor: &Actor,
) -> Result<i64, Failure> {
    let filter = serde_json::to_value(filter).unwrap_or_default();
    sqlx::query_scalar(
        "INSERT INTO dead_letter_actions (action, actor_user, actor_host, actor, dry_run, \
                                          filter, rate) \
         VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
    )
    .bind(action)
    .bind(&actor.user)
    .bind(&actor.host)
    .bind(&actor.name)
    .bind(dry_run)
    .bind(filter)
    .bind(rate.map(|r| i32::try_from(r).unwrap_or(i32::MAX)))
    .fetch_one(conn)
    .await
    .map_err(classify)
}

/// Ends an action's row (after which the database lets nothing change it), with `matched`
/// for a dry run, which counts only at its end.
async fn finish_action(
    pool: &PgPool,
    id: i64,
    note: Option<String>,
    matched: Option<i64>,
) -> Result<(), Failure> {
    sqlx::query(
        "UPDATE dead_letter_actions SET finished_at = now(), note = $2, \
                matched = coalesce($3, matched) \
         WHERE id = $1",
    )
    .bind(id)
    .bind(note)
    .bind(matched)
    .execute(pool)
    .await
    .map_err(classify)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(source: &str) -> ReplayRow {
        let mut table = Headers::new();
        table.insert("traceparent", "00-a-b-01");
        table.insert("x-attempt", HeaderValue::I64(4));
        table.insert("x-dead-reason", "gave-up");
        table.insert("x-tenant", HeaderValue::I32(7));
        ReplayRow {
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
