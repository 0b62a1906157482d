//! A consumer's span continues the publisher's trace, through W3C headers on the message.

// Helpers outside #[test] functions assert too: a failed expectation fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use worker_broker::consumer::Outcome;
use worker_broker::{Outgoing, Publisher, PublisherSettings};

#[derive(Debug, Clone, Default)]
struct Collector(Arc<Mutex<Vec<SpanData>>>);

impl SpanExporter for Collector {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        self.0.lock().unwrap().extend(batch);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consumer_span_continues_the_publishers_trace() -> anyhow::Result<()> {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let collector = Collector::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(collector.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("broker-test")));
    tracing::subscriber::set_global_default(subscriber)?;

    let mut h = Harness::start(queue_settings(&[200], 5), consumer_settings(5)).await?;
    let publisher = Publisher::new(h.supervisor.sessions(), PublisherSettings::default());
    let span = tracing::info_span!("place order");
    let publisher_cx = span.context().span().span_context().clone();
    assert!(publisher_cx.is_valid());
    let message =
        Outgoing::json("commands", QUEUE, &serde_json::json!({"id": "tr"}))?.with_message_id("tr");
    publisher.publish(&message).instrument(span).await?;

    h.events
        .wait_for("tr", Duration::from_secs(10), |e| {
            e.iter().any(|e| e.outcome == Outcome::Succeeded)
        })
        .await?;
    h.stop().await?;
    let _ = provider.force_flush();

    let spans = collector.0.lock().unwrap().clone();
    let consume = spans
        .iter()
        .find(|s| s.name == "consume orders")
        .unwrap_or_else(|| {
            panic!(
                "no consumer span in {:?}",
                spans.iter().map(|s| s.name.clone()).collect::<Vec<_>>()
            )
        });
    assert_eq!(
        consume.span_context.trace_id(),
        publisher_cx.trace_id(),
        "same trace"
    );
    assert_eq!(
        consume.parent_span_id,
        publisher_cx.span_id(),
        "the publisher's span is the parent"
    );
    let attr = |k: &str| {
        consume
            .attributes
            .iter()
            .find(|kv| kv.key.as_str() == k)
            .map(|kv| kv.value.to_string())
    };
    assert_eq!(attr("messaging.system").as_deref(), Some("rabbitmq"));
    assert_eq!(attr("messaging.destination.name").as_deref(), Some(QUEUE));
    assert_eq!(attr("messaging.message.id").as_deref(), Some("tr"));
    assert_eq!(attr("outcome").as_deref(), Some("succeeded"));
    assert_eq!(attr("attempt").as_deref(), Some("1"));
    Ok(())
}
