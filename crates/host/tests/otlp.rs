//! Traces from the host reach an OTLP/HTTP receiver over the wire, with the service name, the
//! installation's name and the replica's as resource attributes.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;
use worker_testkit::TestDb;

type Received = Arc<Mutex<Vec<ExportTraceServiceRequest>>>;

async fn receive(State(received): State<Received>, body: Bytes) -> &'static str {
    if let Ok(request) = ExportTraceServiceRequest::decode(body) {
        received.lock().unwrap().push(request);
    }
    ""
}

fn string_attribute(
    attributes: &[opentelemetry_proto::tonic::common::v1::KeyValue],
    key: &str,
) -> Option<String> {
    attributes.iter().find(|kv| kv.key == key).and_then(|kv| {
        match kv.value.as_ref()?.value.as_ref()? {
            Value::StringValue(s) => Some(s.clone()),
            _ => None,
        }
    })
}

#[tokio::test]
async fn a_span_from_the_host_arrives_at_the_otlp_receiver() -> anyhow::Result<()> {
    let received: Received = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let endpoint = format!("http://{}", listener.local_addr()?);
    let app = Router::new()
        .route("/v1/traces", post(receive))
        .with_state(received.clone());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let db = TestDb::create_empty().await?;
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_worker-host"))
        .arg("migrate")
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .env_remove("WORKER_HOST_CONFIG")
        .env("WORKER_HOST__DATABASE__NAME", &db.name)
        .env("WORKER_HOST__INSTALLATION", "client-otlp-test")
        .env("WORKER_HOST__REPLICA", "replica-7")
        .env("WORKER_HOST__TELEMETRY__OTLP_ENDPOINT", &endpoint)
        .output()
        .await?;
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    // The host flushes its exporter before it exits, so the spans are already here.
    let requests = received.lock().unwrap().clone();
    server.abort();
    let resource_spans: Vec<_> = requests
        .iter()
        .flat_map(|r| r.resource_spans.iter())
        .collect();
    let migrate = resource_spans
        .iter()
        .find(|rs| {
            rs.scope_spans
                .iter()
                .flat_map(|s| s.spans.iter())
                .any(|span| span.name == "migrate")
        })
        .unwrap_or_else(|| panic!("no `migrate` span among {} export requests", requests.len()));
    let resource = migrate.resource.as_ref().expect("a resource");
    assert_eq!(
        string_attribute(&resource.attributes, "service.name").as_deref(),
        Some("worker-host")
    );
    assert_eq!(
        string_attribute(&resource.attributes, "worker_host.installation").as_deref(),
        Some("client-otlp-test")
    );
    assert_eq!(
        string_attribute(&resource.attributes, "service.instance.id").as_deref(),
        Some("replica-7")
    );
    Ok(())
}
