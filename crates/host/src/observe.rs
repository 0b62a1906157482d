//! The host's observers: what the consumer runners and the scheduler report becomes
//! metrics (see [`crate::metrics::names`]) and the counts `/status` shows: a consumer's
//! record here, a timer's in `scheduler/stats.rs`, both with their [`LastResults`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use opentelemetry::KeyValue;
use serde::Serialize;
use worker_broker::{ConsumerEvents, DeliveryReport, Outcome};
use worker_core::TryRecord;
use worker_core::liveness::Liveness;
use worker_store::AttemptLog;
use worker_store::history::{self, JobTally, Tally};

use crate::metrics::Metrics;

/// Records one consumer job's tries and settled deliveries: metrics, `/status` counts and the
/// attempt log.
#[derive(Debug)]
pub struct ConsumerObserver {
    job: String,
    /// The job's metric labels, made once: the job's former name is looked up in the list.
    labels: [KeyValue; 2],
    metrics: Metrics,
    attempt_log: AttemptLog,
    pub stats: Arc<ConsumerStats>,
    /// Where the handler's tries are recorded while they run (the watchdog reads it).
    liveness: Liveness,
    /// Where each settled delivery is counted for the history (flushed once a minute).
    history: Option<Arc<JobTally>>,
}

impl ConsumerObserver {
    pub fn new(
        job: impl Into<String>,
        metrics: Metrics,
        attempt_log: AttemptLog,
        liveness: Liveness,
    ) -> Self {
        let job = job.into();
        Self {
            labels: crate::metrics::job_labels(&job),
            job,
            metrics,
            attempt_log,
            stats: Arc::default(),
            liveness,
            history: None,
        }
    }

    /// Counts each settled delivery in `tally`, for the history.
    #[must_use]
    pub fn counting_into(mut self, tally: &Tally) -> Self {
        self.history = Some(tally.job(&self.job));
        self
    }
}

/// What a settled delivery counts as in the history: its failure's name, if it failed.
fn failure_of(outcome: &Outcome) -> Option<&'static str> {
    match outcome {
        Outcome::Succeeded | Outcome::Duplicate | Outcome::Skipped { .. } => None,
        Outcome::Parked { class, .. } => Some(history::reason::parked(*class)),
        Outcome::DeadLettered { .. }
        | Outcome::Returned
        | Outcome::Requeued
        | Outcome::Abandoned => Some(outcome.as_str()),
    }
}

impl ConsumerObserver {
    fn count_try(&self, record: &TryRecord<'_>) {
        let Some(failure) = record.failure else {
            return;
        };
        if record.will_retry {
            self.stats
                .retried_in_process
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let [job, old_job] = self.labels.clone();
            self.metrics.retried_tries.add(
                1,
                &[
                    job,
                    old_job,
                    KeyValue::new("class", failure.class().as_str()),
                ],
            );
        }
        self.stats.record_error(failure.to_string());
    }
}

impl ConsumerEvents for ConsumerObserver {
    fn liveness(&self) -> Option<&Liveness> {
        Some(&self.liveness)
    }

    fn on_delivery_try(
        &self,
        _queue: &str,
        message_id: Option<&str>,
        attempt: u32,
        record: &TryRecord<'_>,
    ) {
        let unit = worker_store::attempt_log::UnitInfo {
            message_id: message_id.map(str::to_string),
            tick: None,
            attempt: i32::try_from(attempt).unwrap_or(i32::MAX),
        };
        self.attempt_log.record_try(record, &unit);
        self.count_try(record);
    }

    fn on_try(&self, _queue: &str, record: &TryRecord<'_>) {
        worker_core::AttemptObserver::on_try(&self.attempt_log, record);
        self.count_try(record);
    }

    fn on_settled(&self, settled: &DeliveryReport<'_>) {
        if let Some(history) = &self.history {
            history.record(settled.elapsed, failure_of(settled.outcome));
        }
        let mut labels = self.labels.to_vec();
        labels.push(KeyValue::new("queue", settled.queue.to_string()));
        let stats = &self.stats;
        match settled.outcome {
            Outcome::Succeeded => {
                labels.push(KeyValue::new("outcome", "succeeded"));
                stats.record(&stats.succeeded, true, None);
            }
            Outcome::Duplicate => {
                labels.push(KeyValue::new("outcome", "duplicate"));
                stats.record(&stats.duplicate, true, None);
            }
            Outcome::Skipped { reason } => {
                labels.push(KeyValue::new("outcome", "skipped"));
                labels.push(KeyValue::new("reason", *reason));
                stats.record_skip(reason);
            }
            Outcome::Parked { class, tier, .. } => {
                labels.push(KeyValue::new("outcome", "parked"));
                labels.push(KeyValue::new("class", class.as_str()));
                stats.record(&stats.parked, false, None);
                tracing::debug!(job = %self.job, tier = %tier, "parked");
            }
            Outcome::DeadLettered { reason, class } => {
                labels.push(KeyValue::new("outcome", "dead-lettered"));
                labels.push(KeyValue::new("reason", reason.as_str()));
                labels.push(KeyValue::new("class", class.as_str()));
                stats.record(&stats.dead_lettered, false, None);
            }
            Outcome::Returned => {
                labels.push(KeyValue::new("outcome", "returned"));
                labels.push(KeyValue::new("class", "unavailable"));
                stats.record(&stats.requeued, false, None);
            }
            Outcome::Requeued | Outcome::Abandoned => {
                labels.push(KeyValue::new("outcome", settled.outcome.as_str()));
                stats.record(&stats.requeued, false, None);
            }
        }
        // The outcome names the dead-letter reason; the error itself went with the try.
        let class = match settled.outcome {
            Outcome::Parked { class, .. } | Outcome::DeadLettered { class, .. } => Some(*class),
            _ => None,
        };
        self.attempt_log.record_outcome(
            &self.job,
            settled.message_id,
            settled.attempt,
            settled.tries,
            settled.outcome.as_str(),
            class,
            None,
            settled.elapsed,
        );
        self.metrics.messages.add(1, &labels);
        self.metrics
            .handler_duration
            .record(settled.elapsed.as_secs_f64(), &self.labels);
    }
}

/// The last results of a job's runs (a consumer's deliveries, a timer's ticks).
#[derive(Debug, Default, Clone, Serialize)]
pub struct LastResults {
    pub last_run: Option<DateTime<Utc>>,
    pub last_success: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    pub last_error_at: Option<DateTime<Utc>>,
}

impl LastResults {
    /// A run that ended `at`, successful or not.
    pub fn ran(&mut self, at: DateTime<Utc>, success: bool) {
        self.last_run = Some(at);
        if success {
            self.last_success = Some(at);
        }
    }

    /// A failure seen `at` (a run's, or an in-process try's that may yet be retried).
    pub fn failed(&mut self, at: DateTime<Utc>, error: String) {
        self.last_error = Some(error);
        self.last_error_at = Some(at);
    }
}

/// The running record of one consumer job.
#[derive(Debug, Default)]
pub struct ConsumerStats {
    pub succeeded: AtomicU64,
    pub duplicate: AtomicU64,
    pub retried_in_process: AtomicU64,
    pub parked: AtomicU64,
    pub dead_lettered: AtomicU64,
    pub requeued: AtomicU64,
    /// Settled with nothing to do, by reason (`no-match`, `reply-limit`, ...).
    skipped: Mutex<BTreeMap<&'static str, u64>>,
    last: Mutex<LastResults>,
}

/// A copy of [`ConsumerStats`] at one moment.
#[derive(Debug, Clone, Serialize)]
pub struct ConsumerSnapshot {
    pub succeeded: u64,
    pub duplicate: u64,
    pub retried_in_process: u64,
    pub parked: u64,
    pub dead_lettered: u64,
    pub requeued: u64,
    /// Deliveries settled with nothing to do, by reason.
    pub skipped: BTreeMap<&'static str, u64>,
    #[serde(flatten)]
    pub last: LastResults,
}

impl ConsumerStats {
    /// Records a delivery's settlement; `error` is the failure that parked or dead-lettered it.
    pub fn record(&self, counter: &AtomicU64, success: bool, error: Option<String>) {
        counter.fetch_add(1, Ordering::Relaxed);
        let now = Utc::now();
        if let Ok(mut last) = self.last.lock() {
            last.ran(now, success);
            if let Some(error) = error {
                last.failed(now, error);
            }
        }
    }

    /// Records a delivery settled with nothing to do, for `reason`: handled, so a success.
    pub fn record_skip(&self, reason: &'static str) {
        if let Ok(mut skipped) = self.skipped.lock() {
            *skipped.entry(reason).or_default() += 1;
        }
        if let Ok(mut last) = self.last.lock() {
            last.ran(Utc::now(), true);
        }
    }

    /// Remembers the last failure seen by an in-process try.
    pub fn record_error(&self, error: String) {
        if let Ok(mut last) = self.last.lock() {
            last.failed(Utc::now(), error);
        }
    }

    pub fn snapshot(&self) -> ConsumerSnapshot {
        ConsumerSnapshot {
            succeeded: self.succeeded.load(Ordering::Relaxed),
            duplicate: self.duplicate.load(Ordering::Relaxed),
            retried_in_process: self.retried_in_process.load(Ordering::Relaxed),
            parked: self.parked.load(Ordering::Relaxed),
            dead_lettered: self.dead_lettered.load(Ordering::Relaxed),
            requeued: self.requeued.load(Ordering::Relaxed),
            skipped: self.skipped.lock().map(|s| s.clone()).unwrap_or_default(),
            last: self.last.lock().map(|l| l.clone()).unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use worker_broker::DeadReason;
    use worker_core::FailureClass;

    use super::*;

    fn settle(observer: &ConsumerObserver, outcome: Outcome, ms: u64) {
        observer.on_settled(&DeliveryReport {
            queue: "email.send",
            message_id: Some("m-1"),
            attempt: 1,
            tries: 1,
            outcome: &outcome,
            elapsed: Duration::from_millis(ms),
        });
    }

    #[test]
    fn each_settled_delivery_is_a_unit_and_a_failure_is_counted_by_reason() {
        let tally = Tally::default();
        let observer = ConsumerObserver::new(
            "email-send",
            Metrics::new(opentelemetry::global::meter("test")),
            AttemptLog::disabled(),
            Liveness::default(),
        )
        .counting_into(&tally);
        settle(&observer, Outcome::Succeeded, 3);
        settle(&observer, Outcome::Duplicate, 1);
        settle(
            &observer,
            Outcome::Parked {
                next_attempt: 2,
                tier: "30s".into(),
                class: FailureClass::Transient,
            },
            40,
        );
        settle(
            &observer,
            Outcome::DeadLettered {
                reason: DeadReason::GaveUp,
                class: FailureClass::Transient,
            },
            40,
        );
        let counts = tally.drain();
        assert_eq!(counts[0].job, "email-send");
        assert_eq!(counts[0].units, 4);
        assert_eq!(
            counts[0].failures,
            std::collections::BTreeMap::from([
                ("dead-lettered:gave-up".to_string(), 1),
                ("parked:transient".to_string(), 1),
            ])
        );
    }
}
