//! The archiver: empties a dead queue into the `dead_letters` table.
//!
//! It is not a [`worker_core::ConsumerJob`] on purpose: a job's input is a decoded JSON body,
//! and the runner's pipeline would dead-letter what it cannot decode, while the archiver must
//! take any body as bytes together with its headers and properties, and must never
//! dead-letter a dead letter. So it runs the broker's consume loop ([`ConsumeLoop`], the
//! runner's own) with a handler of its own:
//!
//! 1. each delivery (up to `prefetch` unacked, all handled at once) joins a batch of up to
//!    `batch` messages, archived when full or `batch_wait` after its first;
//! 2. read each ([`FromMessage::from_message`](crate::FromMessage)) and insert the batch in one transaction,
//!    `ON CONFLICT (dedup_key) DO NOTHING` ([`crate::store::insert`]);
//! 3. only after the commit, every delivery of the batch answers [`Settle::Ack`], and the
//!    loop acks them together (one `multiple` ack).
//!
//! A database that fails keeps the batch unacked while the archiver tries again with a capped
//! backoff: the messages stay with it (no nack, so no redelivery count grows) until the rows
//! commit or the host stops (one last try, then back to the queue). Killed between the commit
//! and the ack, the archiver finds the same messages redelivered next time and archives each
//! once.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use tokio::sync::{Notify, oneshot};
use tokio_util::sync::CancellationToken;
pub use worker_broker::SessionEnd;
use worker_broker::{
    ConsumeLoop, ConsumeSettings, Delivery, Scope, Session, Settle, Supervisor, Topology,
};
use worker_core::Failure;

use crate::record::{DeadQueue, FromMessage, NewDeadLetter, RawMessage};
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

/// The job's name: its archivers' in logs, spans and consumer tags, and its maintenance tick's.
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
        let consume = self.consume_loop(&dead);
        let dead = Arc::new(dead);
        consume
            .run(supervisor, shutdown.clone(), |_| {
                self.handler(dead.clone(), shutdown.clone())
            })
            .await;
    }

    /// Consumes `dead` on one connection until shutdown or until the channel is lost.
    pub async fn run_session(
        &self,
        session: &Session,
        dead: &DeadQueue,
        shutdown: &CancellationToken,
    ) -> SessionEnd {
        let handler = self.handler(Arc::new(dead.clone()), shutdown.clone());
        self.consume_loop(dead)
            .run_session(session, shutdown, handler)
            .await
    }

    fn consume_loop(&self, dead: &DeadQueue) -> ConsumeLoop {
        let settings = &self.inner.settings;
        ConsumeLoop::new(ConsumeSettings {
            queue: dead.dead_queue.clone(),
            consumer_name: JOB_NAME.into(),
            prefetch: settings.prefetch,
            // Every delivery held waits in a batch for its commit: all may be waiting at once.
            concurrency: usize::from(settings.prefetch.max(1)),
            ack_interval: ACK_INTERVAL,
            // As long as one last try of the batch in hand.
            settle_deadline: settings.insert_timeout,
            cancel_timeout: settings.insert_timeout,
        })
    }

    /// Each delivery joins the batch being gathered and is settled once that batch commits.
    fn handler(
        &self,
        dead: Arc<DeadQueue>,
        shutdown: CancellationToken,
    ) -> impl Fn(Delivery, Scope) -> BoxFuture<'static, Settle> + use<> {
        let batcher = Arc::new(Batcher::default());
        let archiver = self.clone();
        tracing::info!(job = JOB_NAME, dead_queue = %dead.dead_queue, "archiving dead letters");
        move |delivery, scope| {
            let (archiver, batcher, dead, shutdown) = (
                archiver.clone(),
                batcher.clone(),
                dead.clone(),
                shutdown.clone(),
            );
            Box::pin(async move {
                let (answer, settled) = oneshot::channel();
                let batch_size = archiver.inner.settings.batch.max(1);
                if batcher.join(Waiting { delivery, answer }, batch_size) {
                    archiver
                        .lead(&batcher, &dead, &scope, &shutdown, batch_size)
                        .await;
                }
                // A leader that died (a panic) answers nobody: back to the queue.
                settled.await.unwrap_or(Settle::Requeue)
            })
        }
    }

    /// Gathers batches (full, or `batch_wait` after the leader's delivery), archives each and
    /// answers its deliveries, until none are waiting.
    async fn lead(
        &self,
        batcher: &Batcher,
        dead: &DeadQueue,
        scope: &Scope,
        shutdown: &CancellationToken,
        batch_size: usize,
    ) {
        loop {
            batcher
                .filled(batch_size, self.inner.settings.batch_wait)
                .await;
            let Some(batch) = batcher.take(batch_size) else {
                return;
            };
            let settle = self.archive_held(dead, &batch, scope, shutdown).await;
            for waiting in batch {
                let _ = waiting.answer.send(settle);
            }
        }
    }

    /// Archives `batch`, trying again while the database fails: the messages stay held (no
    /// nack, so no redelivery count grows) until the rows commit, the host stops (one last
    /// try, then back to the queue) or the delivery can no longer be settled.
    async fn archive_held(
        &self,
        dead: &DeadQueue,
        batch: &[Waiting],
        scope: &Scope,
        shutdown: &CancellationToken,
    ) -> Settle {
        let messages: Vec<RawMessage<'_>> = batch
            .iter()
            .map(|w| RawMessage::from(&w.delivery))
            .collect();
        let mut pause = worker_core::Backoff::doubling(
            Duration::from_millis(100),
            self.inner.settings.retry_max,
        );
        loop {
            let last_try = shutdown.is_cancelled();
            let span = tracing::info_span!("archive", job = JOB_NAME, dead_queue = %dead.dead_queue, messages = batch.len());
            let result =
                tracing::Instrument::instrument(self.archive_batch(dead, &messages), span).await;
            let failure = match result {
                Ok(report) => {
                    tracing::debug!(dead_queue = %dead.dead_queue, inserted = report.inserted, duplicates = report.duplicates, "archived");
                    self.inner.events.on_archived(&dead.dead_queue, &report);
                    return Settle::Ack;
                }
                Err(failure) => failure,
            };
            tracing::error!(dead_queue = %dead.dead_queue, error = %failure, retry_in = ?pause.current(), "archiving dead letters failed; holding them and trying again");
            self.inner.events.on_error(&dead.dead_queue, &failure);
            if last_try {
                return Settle::Requeue;
            }
            tokio::select! {
                () = shutdown.cancelled() => {}
                () = scope.cancel().cancelled() => return Settle::Requeue,
                () = scope.orphaned().cancelled() => return Settle::Requeue,
                () = tokio::time::sleep(pause.next_wait()) => {}
            }
        }
    }
}

/// How long archived deliveries wait to be acked together with the next batch's.
const ACK_INTERVAL: Duration = Duration::from_millis(10);

/// A delivery waiting for its batch's commit.
struct Waiting {
    delivery: Delivery,
    answer: oneshot::Sender<Settle>,
}

/// The deliveries of one session waiting to be archived, and whether one of their handlers
/// leads (gathers and archives the batches). One leader at a time keeps batches in order and
/// one transaction at a time, as a single consume loop would.
#[derive(Default)]
struct Batcher {
    state: Mutex<Gathering>,
    full: Notify,
}

#[derive(Default)]
struct Gathering {
    waiting: Vec<Waiting>,
    led: bool,
}

impl Batcher {
    /// Adds a delivery; true when its handler is to lead.
    fn join(&self, waiting: Waiting, batch_size: usize) -> bool {
        let mut state = self.lock();
        state.waiting.push(waiting);
        if state.waiting.len() >= batch_size {
            self.full.notify_waiters();
        }
        !std::mem::replace(&mut state.led, true)
    }

    /// Returns once a batch is full, or after `wait`.
    async fn filled(&self, batch_size: usize, wait: Duration) {
        let full = self.full.notified();
        tokio::pin!(full);
        full.as_mut().enable();
        if self.lock().waiting.len() >= batch_size {
            return;
        }
        tokio::select! {
            () = full => {}
            () = tokio::time::sleep(wait) => {}
        }
    }

    /// The next batch, oldest first; `None` (and no leader any more) when nothing waits.
    fn take(&self, batch_size: usize) -> Option<Vec<Waiting>> {
        let mut state = self.lock();
        if state.waiting.is_empty() {
            state.led = false;
            return None;
        }
        let n = state.waiting.len().min(batch_size);
        Some(state.waiting.drain(..n).collect())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Gathering> {
        // A panic while the lock is held leaves the list as it was: still usable.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
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
