//! The attempt log, a row per try: every failed try and every final outcome of a consumer
//! message or a timer tick, with the job, the message id or tick, the attempt, the
//! outcome, the failure class, the error, the duration and when.
//!
//! Successful tries, and final outcomes that are plain first-try successes, are written only
//! when [`AttemptLogSettings::log_successes`] asks for them, so that the hot path stays fast.
//!
//! ## Writing without blocking the retry loop
//!
//! [`worker_core::AttemptObserver::on_try`] is called synchronously from inside the retry
//! loop, so it must never wait on the database. [`AttemptLog`] (cheap to clone) turns each
//! record into an owned [`AttemptRecord`] and hands it to a bounded channel with `try_send`;
//! an [`AttemptLogWriter`] task, which the host spawns through its task tracker, writes the
//! records in batches: every [`AttemptLogSettings::batch_size`] records or every
//! [`AttemptLogSettings::flush_interval`], whichever comes first, one `INSERT` per batch.
//!
//! **When the channel is full** (the database is slow or down and
//! [`AttemptLogSettings::capacity`] records are waiting), a record is **dropped**, not waited
//! for: the work goes on, the drop is counted ([`AttemptLog::dropped`]) and the writer logs one
//! warning per flush with how many were lost. A batch the database refuses is also dropped,
//! with a warning, after one retry. The attempt log is for operators; it never holds back or
//! fails the work it describes.
//!
//! ## What the host wires
//!
//! * consumers: from the runner's event hook, each try through [`AttemptLog::record_try`]
//!   (`ConsumerEvents::on_delivery_try` gives the message id and the delivery attempt) and the
//!   settled outcome through [`AttemptLog::record_outcome`]; where a [`WorkContext`] is at
//!   hand, `log.for_unit(&ctx)` is an observer for [`worker_core::Retry::observer`];
//! * timer jobs: [`AttemptLog::record_tick`] after each [`worker_core::tick_once`];
//! * retention: the host's retention job calls [`purge_batch`] on a schedule, in bounded
//!   batches.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use worker_core::{
    AttemptObserver, Failure, FailureClass, TickOutcome, TryOutcome, TryRecord, WorkContext,
};

use crate::classify;
use worker_core::truncate;

/// The longest error kept in a row, in bytes.
pub const ERROR_MAX: usize = 2048;

/// `[workers.attempt_log]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AttemptLogSettings {
    /// Write the attempt log at all.
    pub enabled: bool,
    /// Also write successful tries and first-try successes (one row per message: costly).
    pub log_successes: bool,
    /// Records waiting for the writer before new ones are dropped.
    pub capacity: usize,
    /// Records per `INSERT`; a full batch is written at once.
    pub batch_size: usize,
    /// Longest a record waits before its batch is written.
    #[serde(with = "humantime_serde")]
    pub flush_interval: Duration,
    /// Rows older than this are deleted by the retention job ([`purge_batch`]).
    #[serde(with = "humantime_serde")]
    pub retention: Duration,
}

impl Default for AttemptLogSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            log_successes: false,
            capacity: 10_000,
            batch_size: 500,
            flush_interval: Duration::from_millis(500),
            retention: Duration::from_secs(14 * 24 * 3600),
        }
    }
}

impl AttemptLogSettings {
    /// Checks what an operator wrote; the message names the offending key.
    pub fn validate(&self) -> Result<(), String> {
        if self.capacity == 0 {
            return Err("`capacity` must be at least 1".into());
        }
        if self.batch_size == 0 {
            return Err("`batch_size` must be at least 1".into());
        }
        if self.flush_interval.is_zero() {
            return Err("`flush_interval` must be longer than zero".into());
        }
        if self.retention.is_zero() {
            return Err("`retention` must be longer than zero".into());
        }
        Ok(())
    }
}

/// One row of the attempt log, owned, ready to write.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AttemptRecord {
    pub job: String,
    pub message_id: Option<String>,
    pub tick: Option<i64>,
    /// The attempt across parks (`x-attempt`), 1 for a tick.
    pub attempt: i32,
    /// The in-process try; 0 on a final outcome that stands for the whole delivery.
    pub try_number: i32,
    /// `succeeded`, `failed`, `cancelled` for a try; the runner's or the tick's outcome
    /// (`parked`, `dead-lettered:gave-up`, `failed`, `skipped-busy`...) for a final one.
    pub outcome: String,
    pub is_final: bool,
    pub failure_class: Option<String>,
    pub error: Option<String>,
    #[serde(rename = "duration_ms", serialize_with = "as_millis")]
    pub duration: Duration,
    pub at: DateTime<Utc>,
}

fn as_millis<S: serde::Serializer>(duration: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(duration.as_secs_f64() * 1000.0)
}

impl AttemptRecord {
    /// A try, as the retry loop reports it, of the unit described by `ctx` (message id,
    /// tick, delivery attempt), or of an unknown unit when `ctx` is `None`.
    pub fn from_try(record: &TryRecord<'_>, ctx: Option<&UnitInfo>) -> Self {
        Self {
            job: record.job.to_string(),
            message_id: ctx.and_then(|c| c.message_id.clone()),
            tick: ctx.and_then(|c| c.tick),
            attempt: ctx.map_or(1, |c| c.attempt),
            try_number: to_i32(record.try_number),
            outcome: record.outcome.as_str().to_string(),
            is_final: false,
            failure_class: record.failure.map(|f| f.class().as_str().to_string()),
            error: record
                .failure
                .map(|f| truncate(&f.to_string(), ERROR_MAX).to_string()),
            duration: record.duration,
            at: Utc::now(),
        }
    }

    /// The final outcome of a timer tick.
    pub fn from_tick(job: &str, tick: u64, outcome: &TickOutcome, duration: Duration) -> Self {
        let failure = match outcome {
            TickOutcome::Failed(failure) => Some(failure),
            _ => None,
        };
        Self {
            job: job.to_string(),
            message_id: None,
            tick: Some(i64::try_from(tick).unwrap_or(i64::MAX)),
            attempt: 1,
            try_number: 1,
            outcome: outcome.as_str().to_string(),
            is_final: true,
            failure_class: failure.map(|f| f.class().as_str().to_string()),
            error: failure.map(|f| truncate(&f.to_string(), ERROR_MAX).to_string()),
            duration,
            at: Utc::now(),
        }
    }
}

/// What the attempt log needs to know about a unit of work beyond the [`TryRecord`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnitInfo {
    pub message_id: Option<String>,
    pub tick: Option<i64>,
    pub attempt: i32,
}

impl UnitInfo {
    pub fn of(ctx: &WorkContext) -> Self {
        Self {
            message_id: ctx.message_id.clone(),
            tick: ctx.tick.map(|t| i64::try_from(t).unwrap_or(i64::MAX)),
            attempt: to_i32(ctx.attempt),
        }
    }
}

fn to_i32(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// A final outcome that is one of the "nothing to see" ones: written only when successes are.
fn is_quiet(outcome: &str, tries: u32) -> bool {
    match outcome {
        // A success after failed tries completes their story: keep it.
        "succeeded" | "duplicate" | "done" | "ran" => tries <= 1,
        // Every tick of a replica that does not hold the lease.
        "skipped-lease" => true,
        _ => false,
    }
}

/// The handle the retry loop, the consumer runner's events and the timer loop write through;
/// cheap to clone. See the module docs for what happens when the writer falls behind.
#[derive(Clone)]
pub struct AttemptLog {
    inner: Arc<Inner>,
}

struct Inner {
    sender: Option<mpsc::Sender<AttemptRecord>>,
    log_successes: bool,
    dropped: AtomicU64,
}

impl fmt::Debug for AttemptLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttemptLog")
            .field("enabled", &self.inner.sender.is_some())
            .field("log_successes", &self.inner.log_successes)
            .field("dropped", &self.dropped())
            .finish()
    }
}

impl AttemptLog {
    /// The log and its writer. Spawn [`AttemptLogWriter::run`] through the host's task
    /// tracker; it returns once its token fires (after writing what is buffered) or once
    /// every handle is dropped. With `enabled = false` the handle records nothing and the
    /// writer returns at once.
    pub fn new(pool: PgPool, settings: &AttemptLogSettings) -> (Self, AttemptLogWriter) {
        let (sender, receiver) = if settings.enabled {
            let (tx, rx) = mpsc::channel(settings.capacity.max(1));
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        let inner = Arc::new(Inner {
            sender,
            log_successes: settings.log_successes,
            dropped: AtomicU64::new(0),
        });
        let writer = AttemptLogWriter {
            pool,
            receiver,
            batch_size: settings.batch_size.max(1),
            flush_interval: settings.flush_interval.max(Duration::from_millis(1)),
            log: Arc::downgrade(&inner),
        };
        (Self { inner }, writer)
    }

    /// A handle that records nothing.
    pub fn disabled() -> Self {
        Self {
            inner: Arc::new(Inner {
                sender: None,
                log_successes: false,
                dropped: AtomicU64::new(0),
            }),
        }
    }

    /// Records dropped so far because the channel was full or the writer gone.
    pub fn dropped(&self) -> u64 {
        self.inner.dropped.load(Ordering::Relaxed)
    }

    /// Whether successful tries and first-try successes are written.
    pub fn logs_successes(&self) -> bool {
        self.inner.log_successes
    }

    /// Queues `record` for the writer without waiting; drops it (counted) when the channel
    /// is full. Applies no filter: the caller decided it is worth a row.
    pub fn push(&self, record: AttemptRecord) {
        let Some(sender) = &self.inner.sender else {
            return;
        };
        if sender.try_send(record).is_err() {
            self.inner.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// An observer for one unit of work: its rows carry `ctx`'s message id, tick and
    /// delivery attempt.
    pub fn for_unit(&self, ctx: &WorkContext) -> UnitObserver {
        UnitObserver {
            log: self.clone(),
            unit: UnitInfo::of(ctx),
        }
    }

    /// A try of the unit `unit` (for a consumer runner's event hook, which knows the delivery
    /// but not its [`WorkContext`]). Successful tries are dropped unless successes are logged.
    pub fn record_try(&self, record: &TryRecord<'_>, unit: &UnitInfo) {
        self.on_try_of(record, Some(unit));
    }

    fn on_try_of(&self, record: &TryRecord<'_>, unit: Option<&UnitInfo>) {
        if self.inner.sender.is_none() {
            return;
        }
        if record.outcome == TryOutcome::Succeeded && !self.inner.log_successes {
            return;
        }
        self.push(AttemptRecord::from_try(record, unit));
    }

    /// The final outcome of a consumer message, as the runner settled it (`outcome` is the
    /// runner's name for it: `succeeded`, `duplicate`, `parked`, `dead-lettered:gave-up`...),
    /// after `tries` in-process tries. A success on the first try is written only when
    /// successes are.
    #[allow(clippy::too_many_arguments)]
    pub fn record_outcome(
        &self,
        job: &str,
        message_id: Option<&str>,
        attempt: u32,
        tries: u32,
        outcome: &str,
        class: Option<FailureClass>,
        error: Option<&str>,
        duration: Duration,
    ) {
        if self.inner.sender.is_none() || (!self.inner.log_successes && is_quiet(outcome, tries)) {
            return;
        }
        self.push(AttemptRecord {
            job: job.to_string(),
            message_id: message_id.map(str::to_string),
            tick: None,
            attempt: to_i32(attempt),
            try_number: 0,
            outcome: outcome.to_string(),
            is_final: true,
            failure_class: class.map(|c| c.as_str().to_string()),
            error: error.map(|e| truncate(e, ERROR_MAX).to_string()),
            duration,
            at: Utc::now(),
        });
    }

    /// The final outcome of tick number `tick` of a timer job. A tick that ran, or was
    /// skipped because another replica holds the lease, is written only when successes are.
    pub fn record_tick(&self, job: &str, tick: u64, outcome: &TickOutcome, duration: Duration) {
        if self.inner.sender.is_none()
            || (!self.inner.log_successes && is_quiet(outcome.as_str(), 1))
        {
            return;
        }
        self.push(AttemptRecord::from_tick(job, tick, outcome, duration));
    }
}

/// Reports tries without knowing their unit (no message id or tick): prefer
/// [`AttemptLog::for_unit`] where the context is at hand.
impl AttemptObserver for AttemptLog {
    fn on_try(&self, record: &TryRecord<'_>) {
        self.on_try_of(record, None);
    }
}

/// The observer of one unit of work, from [`AttemptLog::for_unit`].
#[derive(Debug, Clone)]
pub struct UnitObserver {
    log: AttemptLog,
    unit: UnitInfo,
}

impl AttemptObserver for UnitObserver {
    fn on_try(&self, record: &TryRecord<'_>) {
        self.log.on_try_of(record, Some(&self.unit));
    }
}

/// The task that writes the attempt log in batches; from [`AttemptLog::new`].
pub struct AttemptLogWriter {
    pool: PgPool,
    receiver: Option<mpsc::Receiver<AttemptRecord>>,
    batch_size: usize,
    flush_interval: Duration,
    log: std::sync::Weak<Inner>,
}

impl fmt::Debug for AttemptLogWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttemptLogWriter")
            .field("batch_size", &self.batch_size)
            .field("flush_interval", &self.flush_interval)
            .finish_non_exhaustive()
    }
}

impl AttemptLogWriter {
    /// Writes batches until `shutdown` fires or every [`AttemptLog`] handle is dropped, then
    /// writes what is left in the channel and returns.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let Some(mut receiver) = self.receiver.take() else {
            return;
        };
        let mut batch: Vec<AttemptRecord> = Vec::with_capacity(self.batch_size);
        let mut reported_drops = 0;
        loop {
            let deadline = tokio::time::sleep(self.flush_interval);
            tokio::pin!(deadline);
            // Collect until the batch is full, the interval passes, or we must stop.
            let stop = loop {
                let room = self.batch_size.saturating_sub(batch.len()).max(1);
                tokio::select! {
                    biased;
                    () = shutdown.cancelled() => break true,
                    received = receiver.recv_many(&mut batch, room) => {
                        if received == 0 {
                            break true;
                        }
                        if batch.len() >= self.batch_size {
                            break false;
                        }
                    }
                    () = &mut deadline => break false,
                }
            };
            if stop {
                receiver.close();
                while let Some(record) = receiver.recv().await {
                    batch.push(record);
                    if batch.len() >= self.batch_size {
                        self.write(&mut batch).await;
                    }
                }
                self.write(&mut batch).await;
                self.report_drops(&mut reported_drops);
                return;
            }
            self.write(&mut batch).await;
            self.report_drops(&mut reported_drops);
        }
    }

    async fn write(&self, batch: &mut Vec<AttemptRecord>) {
        if batch.is_empty() {
            return;
        }
        let mut result = insert_batch(&self.pool, batch).await;
        if let Err(failure) = &result
            && failure.class().is_retryable()
        {
            tokio::time::sleep(self.flush_interval).await;
            result = insert_batch(&self.pool, batch).await;
        }
        if let Err(failure) = result {
            tracing::warn!(
                records = batch.len(),
                error = %failure,
                "could not write attempt-log records; dropping them"
            );
            if let Some(inner) = self.log.upgrade() {
                inner
                    .dropped
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
            }
        }
        batch.clear();
    }

    fn report_drops(&self, reported: &mut u64) {
        let Some(inner) = self.log.upgrade() else {
            return;
        };
        let dropped = inner.dropped.load(Ordering::Relaxed);
        if dropped > *reported {
            tracing::warn!(
                dropped = dropped - *reported,
                total_dropped = dropped,
                "attempt-log records dropped: the writer is behind (channel full) or the database refused them"
            );
            *reported = dropped;
        }
    }
}

/// Writes one record in `conn` (inside the caller's transaction, if it is one).
pub async fn record(conn: &mut PgConnection, record: &AttemptRecord) -> Result<(), Failure> {
    insert_batch(conn, std::slice::from_ref(record)).await
}

/// Writes `records` in one statement.
pub async fn insert_batch<'c, E>(executor: E, records: &[AttemptRecord]) -> Result<(), Failure>
where
    E: sqlx::PgExecutor<'c>,
{
    if records.is_empty() {
        return Ok(());
    }
    let n = records.len();
    let mut jobs = Vec::with_capacity(n);
    let mut message_ids = Vec::with_capacity(n);
    let mut ticks = Vec::with_capacity(n);
    let mut attempts = Vec::with_capacity(n);
    let mut tries = Vec::with_capacity(n);
    let mut outcomes = Vec::with_capacity(n);
    let mut finals = Vec::with_capacity(n);
    let mut classes = Vec::with_capacity(n);
    let mut errors = Vec::with_capacity(n);
    let mut durations = Vec::with_capacity(n);
    let mut ats = Vec::with_capacity(n);
    for r in records {
        jobs.push(r.job.as_str());
        message_ids.push(r.message_id.as_deref());
        ticks.push(r.tick);
        attempts.push(r.attempt);
        tries.push(r.try_number);
        outcomes.push(r.outcome.as_str());
        finals.push(r.is_final);
        classes.push(r.failure_class.as_deref());
        errors.push(r.error.as_deref());
        durations.push(r.duration.as_secs_f64() * 1000.0);
        ats.push(r.at);
    }
    sqlx::query(
        "INSERT INTO attempt_log (job, message_id, tick, attempt, try_number, outcome, is_final, \
                                  failure_class, error, duration_ms, at) \
         SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::int[], $5::int[], \
                              $6::text[], $7::bool[], $8::text[], $9::text[], $10::float8[], \
                              $11::timestamptz[])",
    )
    .bind(&jobs)
    .bind(&message_ids)
    .bind(&ticks)
    .bind(&attempts)
    .bind(&tries)
    .bind(&outcomes)
    .bind(&finals)
    .bind(&classes)
    .bind(&errors)
    .bind(&durations)
    .bind(&ats)
    .execute(executor)
    .await
    .map_err(classify)?;
    Ok(())
}

/// Deletes rows older than `retention`, at most `batch` per statement, until none is left.
/// Returns how many went. The host's retention job uses [`purge_batch`], bounded per tick.
pub async fn purge(pool: &PgPool, retention: Duration, batch: u32) -> Result<u64, Failure> {
    let batch = batch.max(1);
    let mut total = 0;
    loop {
        let done = purge_batch(pool, retention, batch).await?;
        total += done;
        if done < u64::from(batch) {
            return Ok(total);
        }
    }
}

/// Deletes at most `batch` rows older than `retention`, oldest first, in one statement.
/// Returns how many went.
pub async fn purge_batch(pool: &PgPool, retention: Duration, batch: u32) -> Result<u64, Failure> {
    let done = sqlx::query(
        "DELETE FROM attempt_log WHERE id IN ( \
             SELECT id FROM attempt_log WHERE at < now() - make_interval(secs => $1) \
             ORDER BY at LIMIT $2)",
    )
    .bind(retention.as_secs_f64())
    .bind(i64::from(batch.max(1)))
    .execute(pool)
    .await
    .map_err(classify)?;
    Ok(done.rows_affected())
}

/// Failures per job, outcome and class since `since`: what failed, and how often.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct AttemptSummary {
    pub job: String,
    pub outcome: String,
    pub is_final: bool,
    pub failure_class: Option<String>,
    pub count: i64,
    pub last_at: DateTime<Utc>,
    pub last_error: Option<String>,
}

/// Counts the rows written since `since`, grouped by job, outcome and failure class, with
/// the latest error of each group.
pub async fn summary(pool: &PgPool, since: Duration) -> Result<Vec<AttemptSummary>, Failure> {
    sqlx::query_as(
        "SELECT job, outcome, is_final, failure_class, count(*) AS count, max(at) AS last_at, \
                (array_agg(error ORDER BY at DESC))[1] AS last_error \
         FROM attempt_log WHERE at >= now() - make_interval(secs => $1) \
         GROUP BY job, outcome, is_final, failure_class \
         ORDER BY job, is_final, outcome, failure_class",
    )
    .bind(since.as_secs_f64())
    .fetch_all(pool)
    .await
    .map_err(classify)
}

type Row = (
    String,
    Option<String>,
    Option<i64>,
    i32,
    i32,
    String,
    bool,
    Option<String>,
    Option<String>,
    f64,
    DateTime<Utc>,
);

const ROW_COLUMNS: &str = "job, message_id, tick, attempt, try_number, outcome, is_final, \
                           failure_class, error, duration_ms, at";

fn record_of(r: Row) -> AttemptRecord {
    AttemptRecord {
        job: r.0,
        message_id: r.1,
        tick: r.2,
        attempt: r.3,
        try_number: r.4,
        outcome: r.5,
        is_final: r.6,
        failure_class: r.7,
        error: r.8,
        duration: Duration::from_secs_f64((r.9 / 1000.0).max(0.0)),
        at: r.10,
    }
}

/// The rows of one message of one job, in order, for an operator following its story.
pub async fn for_message(
    pool: &PgPool,
    job: &str,
    message_id: &str,
) -> Result<Vec<AttemptRecord>, Failure> {
    let rows: Vec<Row> = sqlx::query_as(&format!(
        "SELECT {ROW_COLUMNS} FROM attempt_log WHERE job = $1 AND message_id = $2 ORDER BY at, id"
    ))
    .bind(job)
    .bind(message_id)
    .fetch_all(pool)
    .await
    .map_err(classify)?;
    Ok(rows.into_iter().map(record_of).collect())
}

/// What [`recent`] selects from: a job's (`$1`) latest `$2` rows, newest first. A range of
/// `attempt_log_job_at`, however many rows the other jobs wrote. Public so that a test can
/// read its plan.
pub const RECENT: &str = "FROM attempt_log WHERE job = $1 ORDER BY at DESC, id DESC LIMIT $2";

/// A job's latest rows (a timer's failed ticks, say), newest first, at most `limit`.
pub async fn recent(pool: &PgPool, job: &str, limit: u32) -> Result<Vec<AttemptRecord>, Failure> {
    let rows: Vec<Row> = sqlx::query_as(&format!("SELECT {ROW_COLUMNS} {RECENT}"))
        .bind(job)
        .bind(i64::from(limit.max(1)))
        .fetch_all(pool)
        .await
        .map_err(classify)?;
    Ok(rows.into_iter().map(record_of).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure() -> Failure {
        Failure::transient("connection reset")
    }

    #[test]
    fn quiet_outcomes_are_first_try_successes_and_lease_skips() {
        assert!(is_quiet("succeeded", 1));
        assert!(!is_quiet("succeeded", 2));
        assert!(is_quiet("ran", 1));
        assert!(is_quiet("skipped-lease", 1));
        assert!(!is_quiet("skipped-busy", 1));
        assert!(!is_quiet("dead-lettered:gave-up", 3));
        assert!(!is_quiet("failed", 1));
    }

    #[tokio::test]
    async fn successful_tries_are_filtered_unless_asked_for() {
        let (tx, mut rx) = mpsc::channel(10);
        let log = AttemptLog {
            inner: Arc::new(Inner {
                sender: Some(tx),
                log_successes: false,
                dropped: AtomicU64::new(0),
            }),
        };
        let ctx = WorkContext::new("mailer", CancellationToken::new())
            .with_message_id("m-1")
            .with_attempt(3);
        let observer = log.for_unit(&ctx);
        let f = failure();
        observer.on_try(&TryRecord {
            job: "mailer",
            try_number: 1,
            outcome: TryOutcome::Failed,
            failure: Some(&f),
            duration: Duration::from_millis(5),
            will_retry: true,
        });
        observer.on_try(&TryRecord {
            job: "mailer",
            try_number: 2,
            outcome: TryOutcome::Succeeded,
            failure: None,
            duration: Duration::from_millis(5),
            will_retry: false,
        });
        log.record_outcome(
            "mailer",
            Some("m-1"),
            3,
            2,
            "succeeded",
            None,
            None,
            Duration::from_millis(12),
        );
        log.record_outcome(
            "mailer",
            Some("m-2"),
            1,
            1,
            "succeeded",
            None,
            None,
            Duration::from_millis(1),
        );
        drop(log);
        drop(observer);
        let mut got = Vec::new();
        while let Some(r) = rx.recv().await {
            got.push(r);
        }
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0].outcome, "failed");
        assert_eq!(got[0].message_id.as_deref(), Some("m-1"));
        assert_eq!((got[0].attempt, got[0].try_number), (3, 1));
        assert_eq!(got[0].failure_class.as_deref(), Some("transient"));
        assert_eq!(got[0].error.as_deref(), Some("connection reset"));
        assert!(!got[0].is_final);
        assert_eq!(got[1].outcome, "succeeded");
        assert!(got[1].is_final);
    }

    #[tokio::test]
    async fn a_consumer_hooks_tries_carry_the_delivery() {
        let (tx, mut rx) = mpsc::channel(10);
        let log = AttemptLog {
            inner: Arc::new(Inner {
                sender: Some(tx),
                log_successes: false,
                dropped: AtomicU64::new(0),
            }),
        };
        let f = failure();
        let unit = UnitInfo {
            message_id: Some("m-9".into()),
            tick: None,
            attempt: 4,
        };
        log.record_try(
            &TryRecord {
                job: "executor",
                try_number: 2,
                outcome: TryOutcome::Failed,
                failure: Some(&f),
                duration: Duration::from_millis(3),
                will_retry: false,
            },
            &unit,
        );
        drop(log);
        let r = rx.recv().await.unwrap();
        assert_eq!(
            (
                r.job.as_str(),
                r.message_id.as_deref(),
                r.attempt,
                r.try_number
            ),
            ("executor", Some("m-9"), 4, 2)
        );
        assert!(rx.recv().await.is_none());
    }

    #[test]
    fn a_full_channel_drops_and_counts() {
        let (tx, _rx) = mpsc::channel(1);
        let log = AttemptLog {
            inner: Arc::new(Inner {
                sender: Some(tx),
                log_successes: true,
                dropped: AtomicU64::new(0),
            }),
        };
        for tick in 0..5 {
            log.record_tick("drain", tick, &TickOutcome::SkippedBusy, Duration::ZERO);
        }
        assert_eq!(log.dropped(), 4);
    }

    #[test]
    fn a_disabled_log_records_nothing() {
        let log = AttemptLog::disabled();
        log.record_tick("drain", 1, &TickOutcome::Failed(failure()), Duration::ZERO);
        assert_eq!(log.dropped(), 0);
        assert!(!log.logs_successes());
    }

    #[test]
    fn settings_are_validated() {
        assert!(AttemptLogSettings::default().validate().is_ok());
        let bad = AttemptLogSettings {
            batch_size: 0,
            ..AttemptLogSettings::default()
        };
        assert!(bad.validate().unwrap_err().contains("batch_size"));
    }
}
