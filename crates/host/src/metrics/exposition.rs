//! `/metrics`: the OpenTelemetry instruments, read through a manual reader at each scrape and
//! written in Prometheus's text format (0.0.4) by the `prometheus` crate's encoder, beside its
//! process collector (`process_cpu_seconds_total`, `process_resident_memory_bytes`,
//! `process_open_fds`, ...).
//!
//! Why this crate and not another (ARCHITECTURE.md says it too): OpenTelemetry's own
//! Prometheus exporter ended with 0.29, and `prometheus-client` writes only OpenMetrics, where
//! a counter `x_total` and a gauge `x` are one family: the deprecated gauge
//! `worker_broker_reconnects` could not be kept beside `worker_broker_reconnects_total`.
//! What is ours is only the mapping from OpenTelemetry's data to metric families.

use std::sync::{Arc, Weak};
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::reader::MetricReader;
use opentelemetry_sdk::metrics::{InstrumentKind, ManualReader, Pipeline, Temporality};
use prometheus::Encoder as _;
use prometheus::proto::{self, MetricFamily, MetricType};

/// The content type of what [`PrometheusReader::render`] writes.
pub const CONTENT_TYPE: &str = prometheus::TEXT_FORMAT;

/// The pull side: a manual reader shared between the meter provider and `/metrics`, and the
/// registry that writes what it reads.
#[derive(Clone)]
pub struct PrometheusReader {
    reader: Arc<ManualReader>,
    registry: prometheus::Registry,
}

impl std::fmt::Debug for PrometheusReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrometheusReader").finish_non_exhaustive()
    }
}

impl PrometheusReader {
    pub fn new() -> Self {
        let reader = Arc::new(
            ManualReader::builder()
                .with_temporality(Temporality::Cumulative)
                .build(),
        );
        let registry = prometheus::Registry::new();
        // Registration fails only for a collector whose descriptors clash with another's;
        // neither of these declares any (both are read whole at each scrape).
        let _ = registry.register(Box::new(OtelCollector(reader.clone())));
        #[cfg(target_os = "linux")]
        let _ = registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ));
        Self { reader, registry }
    }

    /// Collects every instrument now and writes the text format.
    pub fn render(&self) -> Result<String, String> {
        let mut out = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .map_err(|e| e.to_string())?;
        String::from_utf8(out).map_err(|e| e.to_string())
    }
}

impl Default for PrometheusReader {
    fn default() -> Self {
        Self::new()
    }
}

impl MetricReader for PrometheusReader {
    fn register_pipeline(&self, pipeline: Weak<Pipeline>) {
        self.reader.register_pipeline(pipeline)
    }
    fn collect(&self, rm: &mut ResourceMetrics) -> OTelSdkResult {
        self.reader.collect(rm)
    }
    fn force_flush(&self) -> OTelSdkResult {
        self.reader.force_flush()
    }
    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.reader.shutdown_with_timeout(timeout)
    }
    fn temporality(&self, kind: InstrumentKind) -> Temporality {
        self.reader.temporality(kind)
    }
}

/// The OpenTelemetry instruments as metric families, collected at each scrape.
struct OtelCollector(Arc<ManualReader>);

impl prometheus::core::Collector for OtelCollector {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        Vec::new()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut collected = ResourceMetrics::default();
        if let Err(e) = self.0.collect(&mut collected) {
            tracing::warn!(error = %e, "collecting the metrics for a scrape failed");
            return Vec::new();
        }
        families(&collected)
    }
}

/// One family per instrument that has data points; an instrument with none yet (a gauge
/// whose callback observed nothing) is left out, as the text format has no empty family.
pub fn families(collected: &ResourceMetrics) -> Vec<MetricFamily> {
    let mut out = Vec::new();
    for scope in collected.scope_metrics() {
        for metric in scope.metrics() {
            let metrics = match metric.data() {
                AggregatedMetrics::U64(data) => family(data, |v| v as f64),
                AggregatedMetrics::I64(data) => family(data, |v| v as f64),
                AggregatedMetrics::F64(data) => family(data, |v| v),
            };
            let Some((kind, metrics)) = metrics else {
                continue;
            };
            if metrics.is_empty() {
                continue;
            }
            let mut family = MetricFamily::default();
            family.set_name(metric.name().to_string());
            family.set_help(metric.description().to_string());
            family.set_field_type(kind);
            family.set_metric(metrics);
            out.push(family);
        }
    }
    out
}

fn family<T: Copy>(
    data: &MetricData<T>,
    as_f64: impl Fn(T) -> f64,
) -> Option<(MetricType, Vec<proto::Metric>)> {
    match data {
        MetricData::Gauge(gauge) => Some((
            MetricType::GAUGE,
            gauge
                .data_points()
                .map(|p| gauge_point(p.attributes(), as_f64(p.value())))
                .collect(),
        )),
        MetricData::Sum(sum) if sum.is_monotonic() => Some((
            MetricType::COUNTER,
            sum.data_points()
                .map(|p| {
                    let mut counter = proto::Counter::default();
                    counter.set_value(as_f64(p.value()));
                    let mut metric = proto::Metric::from_label(labels(p.attributes()));
                    metric.set_counter(counter);
                    metric
                })
                .collect(),
        )),
        // An up-down counter is a gauge to Prometheus.
        MetricData::Sum(sum) => Some((
            MetricType::GAUGE,
            sum.data_points()
                .map(|p| gauge_point(p.attributes(), as_f64(p.value())))
                .collect(),
        )),
        MetricData::Histogram(histogram) => Some((
            MetricType::HISTOGRAM,
            histogram
                .data_points()
                .map(|p| {
                    let mut cumulative = 0;
                    // The encoder writes the `+Inf` bucket itself (from the count), spelt as
                    // Prometheus spells it; an infinite bound given here would come out `inf`.
                    let buckets: Vec<proto::Bucket> = p
                        .bounds()
                        .zip(p.bucket_counts())
                        .map(|(bound, count)| {
                            cumulative += count;
                            let mut bucket = proto::Bucket::default();
                            bucket.set_upper_bound(bound);
                            bucket.set_cumulative_count(cumulative);
                            bucket
                        })
                        .collect();
                    let mut value = proto::Histogram::default();
                    value.set_sample_count(p.count());
                    value.set_sample_sum(as_f64(p.sum()));
                    value.set_bucket(buckets);
                    let mut metric = proto::Metric::from_label(labels(p.attributes()));
                    metric.set_histogram(value);
                    metric
                })
                .collect(),
        )),
        // Not recorded by the host (its histograms have explicit buckets).
        MetricData::ExponentialHistogram(_) => None,
    }
}

fn gauge_point<'a>(attributes: impl Iterator<Item = &'a KeyValue>, value: f64) -> proto::Metric {
    let mut gauge = proto::Gauge::default();
    gauge.set_value(value);
    let mut metric = proto::Metric::from_label(labels(attributes));
    metric.set_gauge(gauge);
    metric
}

fn labels<'a>(attributes: impl Iterator<Item = &'a KeyValue>) -> Vec<proto::LabelPair> {
    let mut pairs: Vec<proto::LabelPair> = attributes
        .map(|kv| {
            let mut pair = proto::LabelPair::default();
            pair.set_name(kv.key.as_str().to_string());
            pair.set_value(kv.value.as_str().into_owned());
            pair
        })
        .collect();
    pairs.sort_by(|a, b| a.name().cmp(b.name()));
    pairs
}

#[cfg(test)]
mod tests {
    use opentelemetry::metrics::MeterProvider as _;
    use opentelemetry_sdk::metrics::SdkMeterProvider;

    use super::*;
    use crate::metrics::{Metrics, job_labels, names};

    fn scrape(record: impl FnOnce(&Metrics, &SdkMeterProvider)) -> String {
        let reader = PrometheusReader::new();
        let provider = SdkMeterProvider::builder()
            .with_reader(reader.clone())
            .build();
        let metrics = Metrics::new(provider.meter("test"));
        record(&metrics, &provider);
        reader.render().unwrap()
    }

    #[test]
    fn counters_gauges_and_histograms_are_written_in_the_text_format() {
        let text = scrape(|metrics, provider| {
            let [job, old] = job_labels("email-send");
            let outcome = KeyValue::new("outcome", "succeeded");
            metrics
                .messages
                .add(3, &[job.clone(), old.clone(), outcome]);
            metrics.handler_duration.record(0.02, &[job, old]);
            let _gauge = provider
                .meter("test")
                .u64_observable_gauge(names::QUEUE_DEPTH)
                .with_callback(|o| o.observe(7, &[KeyValue::new("queue", "email.send")]))
                .build();
        });
        for line in [
            "# TYPE worker_messages_total counter",
            r#"worker_messages_total{job="email-send",outcome="succeeded",worker_job="email-send"} 3"#,
            r#"worker_queue_depth{queue="email.send"} 7"#,
            "# TYPE worker_handler_duration_seconds histogram",
            r#"worker_handler_duration_seconds_bucket{job="email-send",worker_job="email-send",le="0.025"} 1"#,
            r#"worker_handler_duration_seconds_bucket{job="email-send",worker_job="email-send",le="0.01"} 0"#,
            r#"worker_handler_duration_seconds_bucket{job="email-send",worker_job="email-send",le="+Inf"} 1"#,
            r#"worker_handler_duration_seconds_count{job="email-send",worker_job="email-send"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }

    #[test]
    fn an_up_down_counter_is_a_gauge() {
        let text = scrape(|metrics, _| {
            metrics.in_flight.add(2, &job_labels("retention"));
            metrics.in_flight.add(-1, &job_labels("retention"));
        });
        assert!(text.contains("# TYPE worker_in_flight gauge"), "{text}");
        assert!(
            text.contains(r#"worker_in_flight{job="retention",worker_job="retention"} 1"#),
            "{text}"
        );
    }

    #[test]
    fn label_values_are_escaped() {
        let text = scrape(|metrics, _| {
            metrics
                .retried_tries
                .add(1, &[KeyValue::new("class", "a \"quoted\"\nline")]);
        });
        assert!(
            text.contains(r#"worker_retried_tries_total{class="a \"quoted\"\nline"} 1"#),
            "{text}"
        );
    }

    #[test]
    fn the_process_collector_is_written_beside_the_instruments() {
        let text = scrape(|_, _| {});
        for name in [
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_cpu_seconds_total",
            "process_start_time_seconds",
        ] {
            assert!(
                text.lines().any(|l| l.starts_with(&format!("{name} "))),
                "{name} in\n{text}"
            );
        }
    }

    #[test]
    fn an_instrument_without_data_points_is_left_out() {
        let text = scrape(|_, provider| {
            let _gauge = provider
                .meter("test")
                .u64_observable_gauge(names::QUEUE_DEPTH)
                .with_callback(|_| {})
                .build();
        });
        assert!(!text.contains(names::QUEUE_DEPTH), "{text}");
    }
}
