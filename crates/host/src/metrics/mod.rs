//! Metrics: one set of OpenTelemetry instruments, read two ways — pulled by Prometheus from
//! `/metrics` on the admin port, and pushed over OTLP when an endpoint is set.
//!
//! Every metric the host records is named here, in [`names`], so that the list an operator
//! reads (README, dashboards, alert rules) is kept in one place.

use std::fmt::Write as _;
use std::sync::{Arc, Weak};
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Histogram, Meter};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::reader::MetricReader;
use opentelemetry_sdk::metrics::{InstrumentKind, ManualReader, Pipeline, Temporality};

/// The metric names, documented once.
pub mod names {
    /// Counter: consumer deliveries settled, by `job`, `queue` and `outcome` (`succeeded`,
    /// `duplicate`, `parked`, `dead-lettered`, `requeued`, `abandoned`) and, for dead letters,
    /// `reason` (`malformed`, `rejected`, `gave-up`).
    pub const MESSAGES: &str = "worker_messages_total";
    /// Counter: in-process tries that failed and were tried again, by `job` and `class`.
    pub const RETRIED_TRIES: &str = "worker_retried_tries_total";
    /// Histogram (seconds): time from a delivery's start to its settlement, by `job`.
    pub const HANDLER_DURATION: &str = "worker_handler_duration_seconds";
    /// Counter: timer ticks by `job` and `outcome` (`ran`, `failed`, `skipped-busy`,
    /// `skipped-lease`, `cancelled`).
    pub const TICKS: &str = "worker_ticks_total";
    /// Histogram (seconds): duration of the timer ticks that ran, by `job`.
    pub const TICK_DURATION: &str = "worker_tick_duration_seconds";
    /// Up-down counter: units of work running now, by `job`.
    pub const IN_FLIGHT: &str = "worker_in_flight";
    /// Gauge: messages ready in a consumer queue, by `queue`.
    pub const QUEUE_DEPTH: &str = "worker_queue_depth";
    /// Gauge: messages waiting in a queue's dead-letter queue, by `queue`.
    pub const DEAD_LETTER_DEPTH: &str = "worker_dead_letter_depth";
    /// Gauge: dead letters archived in the last minute, over all queues.
    pub const DEAD_LETTER_INFLOW: &str = "worker_dead_letter_inflow_per_minute";
    /// Gauge (seconds): age of the oldest dead letter waiting in the archive.
    pub const DEAD_LETTER_OLDEST_AGE: &str = "worker_dead_letter_oldest_age_seconds";
    /// Counter: dead letters archived, by `dead_queue`.
    pub const DEAD_LETTERS_ARCHIVED: &str = "worker_dead_letters_archived_total";
    /// Counter: rows the retention job deleted past their retention, by `table`
    /// (`processed_messages`, `attempt_log`).
    pub const RETENTION_SWEPT: &str = "worker_retention_swept_total";
    /// Gauge: outbox rows waiting to be published.
    pub const OUTBOX_PENDING: &str = "worker_outbox_pending";
    /// Gauge: outbox rows that gave up (`failed`), waiting for an operator.
    pub const OUTBOX_FAILED: &str = "worker_outbox_failed";
    /// Gauge (seconds): age of the oldest pending outbox row (0 when none).
    pub const OUTBOX_OLDEST_AGE: &str = "worker_outbox_oldest_pending_age_seconds";
    /// Gauge (seconds): latency of the last database probe.
    pub const DB_PROBE_LATENCY: &str = "worker_db_probe_latency_seconds";
    /// Gauge: 1 while the last database probe succeeded, else 0.
    pub const DB_HEALTHY: &str = "worker_db_healthy";
    /// Gauge: 1 while the broker link is connected, else 0.
    pub const BROKER_CONNECTED: &str = "worker_broker_connected";
    /// Gauge: reconnections of the broker link since start.
    pub const BROKER_RECONNECTS: &str = "worker_broker_reconnects";
    /// Gauge: stuck work by `kind` (`execution`, `email`): rows unfinished and unchanged for
    /// longer than `jobs.reconciler.stuck_after`, with no live outbox row for their command.
    pub const STUCK_WORK: &str = "worker_stuck_work";
    /// Counter: outbound emails whose send outcome is unknown (no answer after the final "."
    /// of DATA, or a stale `sending` claim taken over): each may have gone out twice.
    pub const EMAIL_UNKNOWN_OUTCOMES: &str = "worker_email_unknown_outcomes_total";
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
        self.ticks.add(
            1,
            &[
                KeyValue::new("job", job.to_string()),
                KeyValue::new("outcome", outcome.to_string()),
            ],
        );
        if let Some(duration) = duration {
            self.tick_duration.record(
                duration.as_secs_f64(),
                &[KeyValue::new("job", job.to_string())],
            );
        }
    }
}

/// The pull side: a manual reader shared between the meter provider and `/metrics`.
#[derive(Debug, Clone)]
pub struct PrometheusReader(Arc<ManualReader>);

impl PrometheusReader {
    pub fn new() -> Self {
        Self(Arc::new(
            ManualReader::builder()
                .with_temporality(Temporality::Cumulative)
                .build(),
        ))
    }

    /// Collects every instrument now and renders the Prometheus text format.
    pub fn render(&self) -> Result<String, String> {
        let mut collected = ResourceMetrics::default();
        self.0.collect(&mut collected).map_err(|e| e.to_string())?;
        Ok(render(&collected))
    }
}

impl Default for PrometheusReader {
    fn default() -> Self {
        Self::new()
    }
}

impl MetricReader for PrometheusReader {
    fn register_pipeline(&self, pipeline: Weak<Pipeline>) {
        self.0.register_pipeline(pipeline)
    }
    fn collect(&self, rm: &mut ResourceMetrics) -> OTelSdkResult {
        self.0.collect(rm)
    }
    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }
    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }
    fn temporality(&self, kind: InstrumentKind) -> Temporality {
        self.0.temporality(kind)
    }
}

fn labels<'a>(
    attributes: impl Iterator<Item = &'a KeyValue>,
    extra: Option<(&str, String)>,
) -> String {
    let mut pairs: Vec<(String, String)> = attributes
        .map(|kv| (sanitize(kv.key.as_str()), kv.value.as_str().into_owned()))
        .collect();
    if let Some((key, value)) = extra {
        pairs.push((key.to_string(), value));
    }
    if pairs.is_empty() {
        return String::new();
    }
    pairs.sort();
    let body: Vec<String> = pairs
        .iter()
        .map(|(k, v)| {
            format!(
                "{k}=\"{}\"",
                v.replace('\\', "\\\\")
                    .replace('"', "\\\"")
                    .replace('\n', "\\n")
            )
        })
        .collect();
    format!("{{{}}}", body.join(","))
}

fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Renders collected metrics in the Prometheus text exposition format (version 0.0.4).
pub fn render(collected: &ResourceMetrics) -> String {
    let mut out = String::new();
    for scope in collected.scope_metrics() {
        for metric in scope.metrics() {
            let name = sanitize(metric.name());
            let help = metric.description().replace('\n', " ");
            match metric.data() {
                AggregatedMetrics::U64(data) => {
                    write_data(&mut out, &name, &help, data, |v| v as f64)
                }
                AggregatedMetrics::I64(data) => {
                    write_data(&mut out, &name, &help, data, |v| v as f64)
                }
                AggregatedMetrics::F64(data) => write_data(&mut out, &name, &help, data, |v| v),
            }
        }
    }
    out
}

fn write_data<T: Copy>(
    out: &mut String,
    name: &str,
    help: &str,
    data: &MetricData<T>,
    as_f64: impl Fn(T) -> f64,
) {
    match data {
        MetricData::Gauge(gauge) => {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            for point in gauge.data_points() {
                let _ = writeln!(
                    out,
                    "{name}{} {}",
                    labels(point.attributes(), None),
                    as_f64(point.value())
                );
            }
        }
        MetricData::Sum(sum) => {
            let kind = if sum.is_monotonic() {
                "counter"
            } else {
                "gauge"
            };
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for point in sum.data_points() {
                let _ = writeln!(
                    out,
                    "{name}{} {}",
                    labels(point.attributes(), None),
                    as_f64(point.value())
                );
            }
        }
        MetricData::Histogram(histogram) => {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
            for point in histogram.data_points() {
                let mut cumulative = 0u64;
                let bounds: Vec<f64> = point.bounds().collect();
                for (i, count) in point.bucket_counts().enumerate() {
                    cumulative += count;
                    let le = bounds
                        .get(i)
                        .map(|b| b.to_string())
                        .unwrap_or_else(|| "+Inf".to_string());
                    let _ = writeln!(
                        out,
                        "{name}_bucket{} {cumulative}",
                        labels(point.attributes(), Some(("le", le)))
                    );
                }
                let plain = labels(point.attributes(), None);
                let _ = writeln!(out, "{name}_sum{plain} {}", as_f64(point.sum()));
                let _ = writeln!(out, "{name}_count{plain} {}", point.count());
            }
        }
        MetricData::ExponentialHistogram(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::metrics::MeterProvider as _;
    use opentelemetry_sdk::metrics::SdkMeterProvider;

    use super::*;

    #[test]
    fn counters_gauges_and_histograms_render_in_the_text_format() {
        let reader = PrometheusReader::new();
        let provider = SdkMeterProvider::builder()
            .with_reader(reader.clone())
            .build();
        let metrics = Metrics::new(provider.meter("test"));
        let labels = [
            KeyValue::new("job", "email_send"),
            KeyValue::new("outcome", "succeeded"),
        ];
        metrics.messages.add(3, &labels);
        metrics
            .handler_duration
            .record(0.02, &[KeyValue::new("job", "email_send")]);
        let _gauge = provider
            .meter("test")
            .u64_observable_gauge(names::QUEUE_DEPTH)
            .with_callback(|observer| observer.observe(7, &[KeyValue::new("queue", "email.send")]))
            .build();

        let text = reader.render().unwrap();
        assert!(
            text.contains("# TYPE worker_messages_total counter"),
            "{text}"
        );
        assert!(
            text.contains(r#"worker_messages_total{job="email_send",outcome="succeeded"} 3"#),
            "{text}"
        );
        assert!(
            text.contains(r#"worker_queue_depth{queue="email.send"} 7"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"worker_handler_duration_seconds_bucket{job="email_send",le="0.025"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"worker_handler_duration_seconds_bucket{job="email_send",le="+Inf"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"worker_handler_duration_seconds_count{job="email_send"} 1"#),
            "{text}"
        );
    }

    #[test]
    fn label_values_are_escaped() {
        let attributes = [KeyValue::new("error", "a \"quoted\"\nline")];
        assert_eq!(
            labels(attributes.iter(), None),
            r#"{error="a \"quoted\"\nline"}"#
        );
    }
}
