//! Metrics: one set of OpenTelemetry instruments, read two ways — pulled by Prometheus from
//! `/metrics` on the admin port ([`exposition`]), and pushed over OTLP when an endpoint is set.
//!
//! Every metric the host records is named in [`names`], so that the list an operator reads
//! (README, dashboards, alert rules) is kept in one place.

pub mod circuits;
pub mod exposition;
pub mod jobs;
pub mod names;
pub mod oauth;

use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Histogram, Meter};

pub use exposition::PrometheusReader;

/// The labels that name a worker job: [`names::JOB_LABEL`], and the deprecated
/// [`names::DEPRECATED_JOB_LABEL`] with the same value until [`names::DEPRECATED_UNTIL`].
pub fn job_labels(job: &str) -> [KeyValue; 2] {
    [
        KeyValue::new(names::JOB_LABEL, job.to_string()),
        KeyValue::new(names::DEPRECATED_JOB_LABEL, job.to_string()),
    ]
}

/// The instruments the host records into.
#[derive(Debug, Clone)]
pub struct Metrics {
    pub meter: Meter,
    pub messages: Counter<u64>,
    pub retried_tries: Counter<u64>,
    pub handler_duration: Histogram<f64>,
    pub ticks: Counter<u64>,
    pub tick_duration: Histogram<f64>,
    pub in_flight: opentelemetry::metrics::UpDownCounter<i64>,
}

/// Buckets for unit-of-work durations, in seconds: 1 ms to 2 min.
const DURATION_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

impl Metrics {
    pub fn new(meter: Meter) -> Self {
        Self {
            messages: meter
                .u64_counter(names::MESSAGES)
                .with_description("consumer deliveries settled")
                .build(),
            retried_tries: meter
                .u64_counter(names::RETRIED_TRIES)
                .with_description("in-process tries that failed and were tried again")
                .build(),
            handler_duration: meter
                .f64_histogram(names::HANDLER_DURATION)
                .with_unit("s")
                .with_boundaries(DURATION_BUCKETS.to_vec())
                .with_description("time from a delivery's start to its settlement")
                .build(),
            ticks: meter
                .u64_counter(names::TICKS)
                .with_description("timer ticks by outcome")
                .build(),
            tick_duration: meter
                .f64_histogram(names::TICK_DURATION)
                .with_unit("s")
                .with_boundaries(DURATION_BUCKETS.to_vec())
                .with_description("duration of the timer ticks that ran")
                .build(),
            in_flight: meter
                .i64_up_down_counter(names::IN_FLIGHT)
                .with_description("units of work running now")
                .build(),
            meter,
        }
    }

    pub fn tick(&self, job: &str, outcome: &str, duration: Option<Duration>) {
        let [job_label, old_job_label] = job_labels(job);
        self.ticks.add(
            1,
            &[
                job_label.clone(),
                old_job_label.clone(),
                KeyValue::new("outcome", outcome.to_string()),
            ],
        );
        if let Some(duration) = duration {
            self.tick_duration
                .record(duration.as_secs_f64(), &[job_label, old_job_label]);
        }
    }
}
