//! The archiver: empties a dead queue into the `dead_letters` table.
//!
//! It is not a [`worker_core::ConsumerJob`] on purpose: a job's input is a decoded JSON body,
//! and the runner's pipeline would dead-letter what it cannot decode, while the archiver must
//! take any body as bytes together with its headers and properties, and must never
//! dead-letter a dead letter. So it runs its own small consume loop on the
//! [`Supervisor`]'s sessions, with the same shape as the runner:
//!
//! 1. take deliveries (up to `prefetch` unacked) into a batch of up to `batch` messages, or
//!    whatever arrived within `batch_wait` of the first;
//! 2. read each ([`NewDeadLetter::from_message`]) and insert the batch in one transaction,
//!    `ON CONFLICT (dedup_key) DO NOTHING` ([`crate::store::insert`]);
//! 3. only after the commit, ack the batch (one `multiple` ack up to its last tag).
//!
//! A database that fails keeps the batch unacked while the archiver tries again with a capped
//! backoff: the messages stay with it (no nack, so no redelivery count grows) until the row
//! commits or the host stops, when closing the channel returns them to the queue. Killed
//! between the commit and the ack, the archiver finds the same messages redelivered next time
//! and archives each once.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::{FieldTable, ShortString};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use worker_broker::{Session, Supervisor, Topology, next_session};
use worker_core::Failure;

use crate::record::{DeadQueue, NewDeadLetter, RawMessage};
use crate::store::{self, InsertReport};

/// `[jobs.dead_letter_archive]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ArchiverSettings {
    /// Deliveries the broker may send ahead of the acks (`basic.qos`), per dead queue.
    pub prefetch: u16,
    /// Messages archived in one transaction.
    pub batch: usize,
    /// Longest wait for a batch to fill before archiving what there is.
    #[serde(with = "humantime_serde")]
    pub batch_wait: Duration,
    /// Bound on one batch's insert.
    #[serde(with = "humantime_serde")]
    pub insert_timeout: Duration,
    /// Longest pause between two tries of a batch the database did not take.
    #[serde(with = "humantime_serde")]
    pub retry_max: Duration,
    /// How long rows already replayed or purged are kept before the sweep deletes them. Rows
    /// still dead are kept for ever.
    #[serde(with = "humantime_serde")]
    pub retention: Duration,
    /// Rows per statement of the outbox archiving and of the sweep.
    pub sweep_batch: u32,
}

impl Default for ArchiverSettings {
    fn default() -> Self {
        Self {
            prefetch: 200,
            batch: 100,
            batch_wait: Duration::from_millis(50),
            insert_timeout: Duration::from_secs(30),
            retry_max: Duration::from_secs(30),
            retention: Duration::from_secs(30 * 24 * 3600),
            sweep_batch: 1000,
        }
    }
}

impl ArchiverSettings {
    /// Checks what an operator wrote; the message names the offending key.
    pub fn validate(&self) -> Result<(), String> {
        if self.prefetch == 0 {
            return Err("`prefetch` must be at least 1".into());
        }
        if self.batch == 0 {
            return Err("`batch` must be at least 1".into());
        }
        if self.insert_timeout.is_zero() {
            return Err("`insert_timeout` must be longer than zero".into());
        }
        if self.retry_max.is_zero() {
            return Err("`retry_max` must be longer than zero".into());
        }
        if self.sweep_batch == 0 {
            return Err("`sweep_batch` must be at least 1".into());
        }
        Ok(())
    }
}

/// The host's hook for metrics and `/status`.
pub trait ArchiveEvents: Send + Sync {
    /// A batch was committed (and is about to be acked).
    fn on_archived(&self, _dead_queue: &str, _report: &InsertReport) {}
    /// A batch could not be archived; it is held and tried again.
    fn on_error(&self, _dead_queue: &str, _failure: &Failure) {}
}

/// Events that go nowhere.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoEvents;

impl ArchiveEvents for NoEvents {}

/// Why [`Archiver::run_session`] returned.
#[derive(Debug)]
pub enum SessionEnd {
    Shutdown,
    /// The channel or the connection was lost (or the queue could not be consumed), with why.
    Lost(String),
}

/// The dead queue of every consumer queue of `topology`, each once (a dead queue shared by
/// several work queues is consumed once, on behalf of the first of them).
pub fn dead_queues(topology: &Topology) -> Vec<DeadQueue> {
    let mut out: Vec<DeadQueue> = Vec::new();
    for dead in topology.queues.iter().map(DeadQueue::of) {
        if !out.iter().any(|d| d.dead_queue == dead.dead_queue) {
            out.push(dead);
        }
    }
    out
}

/// Empties dead queues into the archive; cheap to clone. See the module docs.
#[derive(Clone)]
pub struct Archiver {
    inner: Arc<Inner>,
}

struct Inner {
    pool: PgPool,
    settings: ArchiverSettings,
    events: Arc<dyn ArchiveEvents>,
}

impl std::fmt::Debug for Archiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Archiver")
            .field("settings", &self.inner.settings)
            .finish_non_exhaustive()
    }
}

/// What the archiver is called in logs, spans and consumer tags.
pub const JOB_NAME: &str = "dead-letter-archive";

impl Archiver {
    pub fn new(pool: PgPool, settings: ArchiverSettings) -> Self {
        Self::observed(pool, settings, Arc::new(NoEvents))
    }

    /// An archiver that reports every batch to `events`.
    pub fn observed(
        pool: PgPool,
        settings: ArchiverSettings,
        events: Arc<dyn ArchiveEvents>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                pool,
                settings,
                events,
            }),
        }
    }

    pub fn settings(&self) -> &ArchiverSettings {
        &self.inner.settings
    }

    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// Archives one batch of messages taken from `dead`'s queue: the single step the consume
    /// loop runs between receiving and acking, for tests and tools. Idempotent: messages
    /// already archived count as duplicates.
    pub async fn archive_batch(
        &self,
        dead: &DeadQueue,
        messages: &[RawMessage<'_>],
    ) -> Result<InsertReport, Failure> {
        let now = chrono::Utc::now();
        let rows: Vec<NewDeadLetter> = messages
            .iter()
            .map(|m| NewDeadLetter::from_message(dead, *m, now))
            .collect();
        let timeout = self.inner.settings.insert_timeout;
        match tokio::time::timeout(timeout, store::insert(&self.inner.pool, &rows)).await {
            Ok(result) => result,
            Err(_) => Err(Failure::transient(format!(
                "archiving {} dead letters took longer than {}",
                rows.len(),
                humantime::format_duration(timeout)
            ))),
        }
    }

    /// Consumes `dead` through the supervisor's sessions until `shutdown`, resuming on every
    /// new connection. Spawn one per dead queue on the host's task tracker; it returns only
    /// on shutdown.
    pub async fn run(&self, supervisor: &Supervisor, dead: DeadQueue, shutdown: CancellationToken) {
        let mut sessions = supervisor.sessions();
        let mut failed_generation = None;
        let mut backoff = Duration::from_millis(100);
        loop {
            let session = tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                session = next_session(&mut sessions, failed_generation) => session,
            };
            let Some(session) = session else {
                shutdown.cancelled().await;
                return;
            };
            let hold = supervisor.hold();
            let end = self.run_session(&session, &dead, &shutdown).await;
            drop(hold);
            match end {
                SessionEnd::Shutdown => return,
                SessionEnd::Lost(why) => {
                    tracing::warn!(job = JOB_NAME, dead_queue = %dead.dead_queue, error = %why, "the archiver lost its channel; resuming");
                    if session.is_open() {
                        tokio::select! {
                            () = shutdown.cancelled() => return,
                            () = tokio::time::sleep(backoff) => {}
                        }
                        backoff = (backoff * 2).min(Duration::from_secs(10));
                    } else {
                        failed_generation = Some(session.generation());
                        backoff = Duration::from_millis(100);
                    }
                }
            }
        }
    }

    /// Consumes `dead` on one connection until shutdown or until the channel is lost.
    pub async fn run_session(
        &self,
        session: &Session,
        dead: &DeadQueue,
        shutdown: &CancellationToken,
    ) -> SessionEnd {
        let settings = &self.inner.settings;
        let (channel, mut consumer) = match open(session, dead, settings.prefetch).await {
            Ok(opened) => opened,
            Err(e) => {
                return SessionEnd::Lost(format!(
                    "consuming from {}: {}",
                    dead.dead_queue,
                    worker_core::error_chain(&e)
                ));
            }
        };
        tracing::info!(job = JOB_NAME, dead_queue = %dead.dead_queue, "archiving dead letters");
        let batch_size = settings.batch.max(1);
        let mut batch: Vec<Delivery> = Vec::with_capacity(batch_size);
        let mut flush_at: Option<Instant> = None;
        let end = loop {
            let full = batch.len() >= batch_size;
            if full || (flush_at.is_some_and(|at| at <= Instant::now()) && !batch.is_empty()) {
                match self.archive_and_ack(&channel, dead, &batch, shutdown).await {
                    Ok(()) => {
                        batch.clear();
                        flush_at = None;
                        continue;
                    }
                    Err(end) => break end,
                }
            }
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break SessionEnd::Shutdown,
                () = sleep_until(flush_at) => {}
                delivery = consumer.next() => match delivery {
                    Some(Ok(delivery)) => {
                        if batch.is_empty() {
                            flush_at = Some(Instant::now() + settings.batch_wait);
                        }
                        batch.push(delivery);
                    }
                    Some(Err(e)) => break SessionEnd::Lost(format!("the consumer failed: {}", worker_core::error_chain(&e))),
                    None => break SessionEnd::Lost("the broker cancelled the consumer (queue deleted?) or the channel closed".into()),
                }
            }
        };
        if matches!(end, SessionEnd::Shutdown) {
            let _ = channel
                .basic_cancel(consumer.tag(), BasicCancelOptions::default())
                .await;
            // One last try for what is already here; what is not archived goes back to the
            // queue with the channel.
            if !batch.is_empty() {
                let messages: Vec<RawMessage<'_>> = batch.iter().map(RawMessage::from).collect();
                if let Ok(report) = self.archive_batch(dead, &messages).await {
                    self.inner.events.on_archived(&dead.dead_queue, &report);
                    let _ = ack_upto(&channel, &batch).await;
                }
            }
        }
        drop(consumer);
        let _ = channel
            .close(200, "dead-letter archiver stopping".into())
            .await;
        end
    }

    /// Archives `batch` (trying again while the database fails) and acks it once committed.
    async fn archive_and_ack(
        &self,
        channel: &lapin::Channel,
        dead: &DeadQueue,
        batch: &[Delivery],
        shutdown: &CancellationToken,
    ) -> Result<(), SessionEnd> {
        let messages: Vec<RawMessage<'_>> = batch.iter().map(RawMessage::from).collect();
        let mut pause = Duration::from_millis(100);
        loop {
            let span = tracing::info_span!("archive", job = JOB_NAME, dead_queue = %dead.dead_queue, messages = batch.len());
            let result =
                tracing::Instrument::instrument(self.archive_batch(dead, &messages), span).await;
            match result {
                Ok(report) => {
                    tracing::debug!(dead_queue = %dead.dead_queue, inserted = report.inserted, duplicates = report.duplicates, "archived");
                    self.inner.events.on_archived(&dead.dead_queue, &report);
                    return ack_upto(channel, batch).await.map_err(SessionEnd::Lost);
                }
                Err(failure) => {
                    tracing::error!(dead_queue = %dead.dead_queue, error = %failure, retry_in = ?pause, "archiving dead letters failed; holding them and trying again");
                    self.inner.events.on_error(&dead.dead_queue, &failure);
                    tokio::select! {
                        () = shutdown.cancelled() => return Err(SessionEnd::Shutdown),
                        () = tokio::time::sleep(pause) => {}
                    }
                    pause = (pause * 2).min(self.inner.settings.retry_max);
                    if !channel.status().connected() {
                        return Err(SessionEnd::Lost(
                            "the channel closed while the archive was failing".into(),
                        ));
                    }
                }
            }
        }
    }
}

async fn open(
    session: &Session,
    dead: &DeadQueue,
    prefetch: u16,
) -> Result<(lapin::Channel, lapin::Consumer), lapin::Error> {
    let channel = session.connection().create_channel().await?;
    channel
        .basic_qos(prefetch.max(1), BasicQosOptions::default())
        .await?;
    let tag = format!("{JOB_NAME}@{}", std::process::id());
    let consumer = channel
        .basic_consume(
            ShortString::try_new(dead.dead_queue.as_str()).unwrap_or_default(),
            ShortString::try_new(tag).unwrap_or_default(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    Ok((channel, consumer))
}

/// Acks every delivery of `batch` with one `multiple` ack up to its highest tag. The
/// deliveries before the batch were all acked already, since batches are archived in order.
async fn ack_upto(channel: &lapin::Channel, batch: &[Delivery]) -> Result<(), String> {
    let Some(last) = batch.iter().map(|d| d.delivery_tag).max() else {
        return Ok(());
    };
    channel
        .basic_ack(last, BasicAckOptions { multiple: true })
        .await
        .map_err(|e| format!("ack failed: {}", worker_core::error_chain(&e)))
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dead_queue_once() {
        let settings = worker_broker::TopologySettings::default();
        let queues = ["automation.trigger", "automation.action", "email.send"].map(|name| {
            let defaults = worker_broker::QueueDefaults::command(name, &settings);
            worker_broker::QueueTopology::from_settings(&Default::default(), defaults).unwrap()
        });
        let topology = Topology::from_settings(&settings, queues).unwrap();
        let dead = dead_queues(&topology);
        assert_eq!(
            dead,
            vec![
                DeadQueue::new("automation.trigger.dead", "automation.trigger"),
                DeadQueue::new("automation.action.dead", "automation.action"),
                DeadQueue::new("email.send.dead", "email.send"),
            ]
        );
        let mut shared = topology.clone();
        for q in &mut shared.queues {
            q.dead_queue = "all.dead".into();
        }
        assert_eq!(
            dead_queues(&shared),
            vec![DeadQueue::new("all.dead", "automation.trigger")]
        );
    }

    #[test]
    fn settings_defaults_toml_and_validation() {
        let s: ArchiverSettings = toml_like(r#"{"batch": 10, "batch_wait": "5ms"}"#);
        assert_eq!(s.batch, 10);
        assert_eq!(s.batch_wait, Duration::from_millis(5));
        assert_eq!(s.prefetch, 200);
        assert_eq!(ArchiverSettings::default().validate(), Ok(()));
        let zero = ArchiverSettings {
            batch: 0,
            ..ArchiverSettings::default()
        };
        assert!(zero.validate().unwrap_err().contains("batch"));
        assert!(serde_json::from_str::<ArchiverSettings>(r#"{"batchh": 1}"#).is_err());
    }

    fn toml_like(json: &str) -> ArchiverSettings {
        serde_json::from_str(json).unwrap()
    }
}
