//! An outbox row carries the W3C trace context of the span that enqueued it.

use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use worker_store::OutboxMessage;
use worker_store::outbox;
use worker_testkit::TestDb;

#[tokio::test]
async fn an_enqueued_row_carries_the_enqueuing_spans_trace() -> anyhow::Result<()> {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let provider = SdkTracerProvider::builder().build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("store-test")));
    tracing::subscriber::set_global_default(subscriber)?;

    let db = TestDb::create().await?;
    let span = tracing::info_span!("receive mail");
    let cx = span.context().span().span_context().clone();
    assert!(cx.is_valid());
    let pool = db.pool.clone();
    let id = async move {
        let mut tx = pool.begin().await?;
        let id = outbox::enqueue(
            &mut tx,
            "events",
            "email.received",
            &OutboxMessage::new("m-1", b"{}".to_vec()),
        )
        .await?;
        tx.commit().await?;
        anyhow::Ok(id)
    }
    .instrument(span)
    .await?;

    let headers: serde_json::Value = sqlx::query_scalar("SELECT headers FROM outbox WHERE id = $1")
        .bind(id)
        .fetch_one(&db.pool)
        .await?;
    let traceparent = headers["traceparent"].as_str().unwrap_or_default();
    assert_eq!(
        traceparent,
        format!("00-{}-{}-01", cx.trace_id(), cx.span_id()),
        "{headers}"
    );
    Ok(())
}
