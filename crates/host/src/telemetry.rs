//! Logs and traces: tracing with a human or JSON format, and OpenTelemetry traces over
//! OTLP/HTTP (protobuf) when an endpoint is set.
//!
//! Some libraries log secrets at their most verbose levels; their targets
//! ([`SECRET_BEARING_TARGETS`]) are dropped before any level filter is consulted.
//!
//! Set up before the async runtime starts and shut down after it ends: the OTLP exporter
//! runs its own blocking HTTP client on a thread of its own, which must not be created or
//! dropped inside the runtime.

use opentelemetry::KeyValue;
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::metrics::{Metrics, PrometheusReader};
use crate::settings::{LogFormat, TelemetrySettings};

/// The resource attribute naming the client installation.
pub const INSTALLATION_ATTRIBUTE: &str = "worker_host.installation";

/// The resource attribute naming this replica (OpenTelemetry's own key for one instance of a
/// service).
pub const REPLICA_ATTRIBUTE: &str = "service.instance.id";

/// Keeps the exporters alive; `shutdown` flushes what is buffered.
#[derive(Debug)]
pub struct Telemetry {
    tracer_provider: Option<SdkTracerProvider>,
    meter_provider: SdkMeterProvider,
    /// Where `/metrics` reads from.
    pub prometheus: PrometheusReader,
    /// The instruments the host records into.
    pub metrics: Metrics,
}

impl Telemetry {
    /// Flushes and stops the exporters. Call outside the async runtime.
    pub fn shutdown(self) {
        if let Some(provider) = self.tracer_provider
            && let Err(e) = provider.shutdown()
        {
            eprintln!("worker-host: flushing traces at exit failed: {e}");
        }
        if let Err(e) = self.meter_provider.shutdown() {
            eprintln!("worker-host: flushing metrics at exit failed: {e}");
        }
    }
}

/// Log targets never written, whatever the level or `RUST_LOG` asks: the IMAP client's
/// protocol trace logs each command it sends, `LOGIN user "password"` among them.
pub const SECRET_BEARING_TARGETS: &[&str] = &["async_imap::imap_stream"];

/// True for an event of a target in [`SECRET_BEARING_TARGETS`] (or below one).
pub fn is_secret_bearing(target: &str) -> bool {
    SECRET_BEARING_TARGETS.iter().any(|t| {
        target
            .strip_prefix(t)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
    })
}

/// Installs the global subscriber. `RUST_LOG` wins over the settings' level when set.
pub fn init(
    settings: &TelemetrySettings,
    installation: &str,
    replica: &str,
) -> anyhow::Result<Telemetry> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(value) if !value.is_empty() => EnvFilter::try_new(&value).map_err(|e| {
            anyhow::anyhow!("RUST_LOG `{value}` is not a valid tracing filter: {e}")
        })?,
        _ => EnvFilter::try_new(&settings.log_level)?,
    };
    let fmt_layer = match settings.log_format {
        LogFormat::Human => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_writer(std::io::stderr)
            .boxed(),
    };

    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let resource = Resource::builder()
        .with_service_name(settings.service_name.clone())
        .with_attribute(KeyValue::new(
            INSTALLATION_ATTRIBUTE,
            installation.to_string(),
        ))
        .with_attribute(KeyValue::new(REPLICA_ATTRIBUTE, replica.to_string()))
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build();

    let prometheus = PrometheusReader::new();
    let mut meters = SdkMeterProvider::builder()
        .with_resource(resource.clone())
        .with_reader(prometheus.clone());
    if let Some(endpoint) = &settings.otlp_endpoint {
        let exporter = opentelemetry_otlp::MetricExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(format!("{}/v1/metrics", endpoint.trim_end_matches('/')))
            .with_timeout(settings.export_timeout)
            .build()?;
        meters = meters.with_reader(
            PeriodicReader::builder(exporter)
                .with_interval(settings.metrics_interval)
                .build(),
        );
    }
    let meter_provider = meters.build();
    opentelemetry::global::set_meter_provider(meter_provider.clone());
    let metrics = Metrics::new(meter_provider.meter("worker-host"));

    let (otel_layer, tracer_provider) = match &settings.otlp_endpoint {
        Some(endpoint) => {
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')))
                .with_timeout(settings.export_timeout)
                .build()?;
            let provider = SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(resource)
                .build();
            let tracer = provider.tracer("worker-host");
            opentelemetry::global::set_tracer_provider(provider.clone());
            (
                Some(tracing_opentelemetry::layer().with_tracer(tracer)),
                Some(provider),
            )
        }
        None => (None, None),
    };

    tracing_subscriber::registry()
        .with(filter)
        .with(tracing_subscriber::filter::filter_fn(|meta| {
            !is_secret_bearing(meta.target())
        }))
        .with(fmt_layer)
        .with(otel_layer)
        .try_init()?;
    Ok(Telemetry {
        tracer_provider,
        meter_provider,
        prometheus,
        metrics,
    })
}
