//! The host's observers: what the consumer runners and the scheduler report becomes
//! metrics (see [`crate::metrics::names`]) and the counts `/status` shows.

use std::sync::Arc;

use opentelemetry::KeyValue;
use worker_broker::{ConsumerEvents, DeliveryReport, Outcome};
use worker_core::TryRecord;
use worker_core::liveness::Liveness;
use worker_store::AttemptLog;

use crate::metrics::Metrics;
use crate::status::ConsumerStats;

/// Records one consumer job's tries and settled deliveries: metrics, `/status` counts and the
/// attempt log.
#[derive(Debug)]
pub struct ConsumerObserver {
    job: String,
    metrics: Metrics,
    attempt_log: AttemptLog,
    pub stats: Arc<ConsumerStats>,
    /// Where the handler's tries are recorded while they run (the watchdog reads it).
    liveness: Liveness,
}

impl ConsumerObserver {
    pub fn new(
        job: impl Into<String>,
        metrics: Metrics,
        attempt_log: AttemptLog,
        liveness: Liveness,
    ) -> Self {
        Self {
            job: job.into(),
            metrics,
            attempt_log,
            stats: Arc::default(),
            liveness,
        }
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
            let [job, old_job] = crate::metrics::job_labels(&self.job);
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
        let mut labels = crate::metrics::job_labels(&self.job).to_vec();
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
        self.metrics.handler_duration.record(
            settled.elapsed.as_secs_f64(),
            &crate::metrics::job_labels(&self.job),
        );
    }
}
