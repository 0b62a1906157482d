//! [`AttemptLog`], the handle every try and outcome is recorded through, without waiting: what
//! is worth a row, and the bounded channel to the writer.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use tokio::sync::mpsc;
use worker_core::{
    AttemptObserver, FailureClass, TickOutcome, TryOutcome, TryRecord, WorkContext, truncate,
};

use super::record::{AttemptRecord, ERROR_MAX, UnitInfo, to_i32};
use super::settings::AttemptLogSettings;
use super::writer::AttemptLogWriter;

/// A final outcome that is one of the "nothing to see" ones: written only when successes are.
fn is_quiet(outcome: &str, tries: u32) -> bool {
    match outcome {
        // A success after failed tries completes their story: keep it.
        // A skip (nothing to do, by decision) is recorded where the decision is (a skipped
        // execution's row) and counted; a row per unmatched event would cost without telling.
        "succeeded" | "duplicate" | "skipped" | "done" | "ran" => tries <= 1,
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
    /// Shared with the writer (weakly: it counts only while a handle lives).
    dropped: Arc<AtomicU64>,
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
        let dropped = Arc::new(AtomicU64::new(0));
        let writer = AttemptLogWriter::new(pool, receiver, settings, Arc::downgrade(&dropped));
        let inner = Arc::new(Inner {
            sender,
            log_successes: settings.log_successes,
            dropped,
        });
        (Self { inner }, writer)
    }

    /// A handle that records nothing.
    pub fn disabled() -> Self {
        Self {
            inner: Arc::new(Inner {
                sender: None,
                log_successes: false,
                dropped: Arc::default(),
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

    /// The final outcome of tick number `tick` of a timer job, which ran for `duration` up to
    /// `ended` (its work's end, not this call's moment: a leased tick's record then spans only
    /// the time its lease was held). A tick that ran, or was skipped because another replica
    /// holds the lease, is written only when successes are.
    pub fn record_tick(
        &self,
        job: &str,
        tick: u64,
        outcome: &TickOutcome,
        duration: Duration,
        ended: DateTime<Utc>,
    ) {
        if self.inner.sender.is_none()
            || (!self.inner.log_successes && is_quiet(outcome.as_str(), 1))
        {
            return;
        }
        self.push(AttemptRecord::from_tick(
            job, tick, outcome, duration, ended,
        ));
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

#[cfg(test)]
mod tests {
    use tokio_util::sync::CancellationToken;
    use worker_core::Failure;

    use super::*;

    fn failure() -> Failure {
        Failure::transient("connection reset")
    }

    #[test]
    fn quiet_outcomes_are_first_try_successes_and_lease_skips() {
        assert!(is_quiet("succeeded", 1));
        assert!(is_quiet("skipped", 1));
        assert!(!is_quiet("skipped", 2));
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
                dropped: Arc::default(),
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
                dropped: Arc::default(),
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
                dropped: Arc::default(),
            }),
        };
        for tick in 0..5 {
            log.record_tick(
                "drain",
                tick,
                &TickOutcome::SkippedBusy,
                Duration::ZERO,
                Utc::now(),
            );
        }
        assert_eq!(log.dropped(), 4);
    }

    #[test]
    fn a_disabled_log_records_nothing() {
        let log = AttemptLog::disabled();
        log.record_tick(
            "drain",
            1,
            &TickOutcome::Failed(failure()),
            Duration::ZERO,
            Utc::now(),
        );
        assert_eq!(log.dropped(), 0);
        assert!(!log.logs_successes());
    }
}
