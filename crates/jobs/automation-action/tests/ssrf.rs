//! Webhooks cannot reach inside: by default a webhook to a loopback, private, link-local,
//! unique-local, multicast, unspecified, IETF-protocol, benchmarking, local-use NAT64 or
//! Teredo address is refused before any connection, checked
//! on the address a name resolves to; `webhook_allow` names the inside hosts an installation
//! needs. On a real database and a local HTTP server.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use chrono::Utc;
use serde_json::json;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;
use worker_core::{ConsumerJob, FailureClass, Handled, WorkContext};
use worker_messages::{ActionCommand, DomainEvent};
use worker_testkit::TestDb;

mod common;

use job_automation_action::{ActionExecutor, JOB_NAME, WebhookAllow};

fn ctx() -> WorkContext {
    WorkContext::new(JOB_NAME, CancellationToken::new())
}

/// A local receiver on 127.0.0.1 that answers 200 and counts the calls; its port.
async fn receiver() -> (u16, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let app = Router::new().route(
        "/hook",
        axum::routing::post(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            async { "ok" }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (port, calls)
}

/// An automation and one execution of a webhook to `url`, as the trigger writes them.
async fn webhook_execution(pool: &PgPool, url: &str) -> ActionCommand {
    let event = DomainEvent {
        id: Uuid::new_v4(),
        event_type: "ping".into(),
        occurred_at: Utc::now(),
        data: json!({"subject": "ping"}),
    };
    common::execution(pool, &event, json!({"type": "webhook", "url": url})).await
}

async fn state(pool: &PgPool, id: Uuid) -> (String, Option<String>) {
    sqlx::query_as("SELECT status, last_error FROM action_executions WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

fn default_executor(pool: &PgPool) -> ActionExecutor {
    ActionExecutor::new(pool.clone(), "commands", Duration::from_secs(5)).unwrap()
}

/// Runs the webhook to `url` with `job`; asserts it was refused as `why` without a call.
async fn assert_refused(
    db: &TestDb,
    job: &ActionExecutor,
    url: &str,
    calls: &AtomicUsize,
    why: &str,
) {
    let command = webhook_execution(&db.pool, url).await;
    let err = job.handle(&ctx(), &command).await.unwrap_err();
    assert_eq!(
        (err.class(), err.reason()),
        (FailureClass::Permanent, "webhook-refused"),
        "{url}: {err}"
    );
    assert!(err.detail().contains(why), "{url}: {err}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "{url}: the receiver was called"
    );
    let (status, last_error) = state(&db.pool, command.action_execution_id).await;
    assert_eq!(status, "failed");
    assert!(last_error.unwrap_or_default().contains(why));
}

/// A webhook to `url(port)`, `port` a receiver's on this machine, is refused as `kind` by an
/// executor with the default allow list, and never reaches the receiver.
async fn refused_with_defaults(url: impl FnOnce(u16) -> String, kind: &str) -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let (port, calls) = receiver().await;
    let job = default_executor(&db.pool);
    assert_refused(&db, &job, &url(port), &calls, kind).await;
    Ok(())
}

#[tokio::test]
async fn a_webhook_to_loopback_is_refused_without_a_call() -> anyhow::Result<()> {
    refused_with_defaults(|port| format!("http://127.0.0.1:{port}/hook"), "loopback").await
}

#[tokio::test]
async fn a_name_that_resolves_to_loopback_is_refused() -> anyhow::Result<()> {
    refused_with_defaults(|port| format!("http://localhost:{port}/hook"), "loopback").await
}

#[tokio::test]
async fn an_ipv4_mapped_ipv6_loopback_is_refused() -> anyhow::Result<()> {
    refused_with_defaults(
        |port| format!("http://[::ffff:127.0.0.1]:{port}/hook"),
        "loopback",
    )
    .await
}

#[tokio::test]
async fn a_decimal_ipv4_loopback_is_refused() -> anyhow::Result<()> {
    // 2130706433 is 127.0.0.1 written as one number; URL parsers accept it.
    refused_with_defaults(|port| format!("http://2130706433:{port}/hook"), "loopback").await
}

#[tokio::test]
async fn a_webhook_to_the_unspecified_address_is_refused() -> anyhow::Result<()> {
    // 0.0.0.0 connects to the local host on Linux.
    refused_with_defaults(|port| format!("http://0.0.0.0:{port}/hook"), "unspecified").await
}

#[tokio::test]
async fn a_webhook_to_an_ietf_protocol_assignment_is_refused() -> anyhow::Result<()> {
    // 192.0.0.0/24: DS-Lite, NAT64 and PCP machinery of the network the host is in.
    refused_with_defaults(
        |port| format!("http://192.0.0.8:{port}/hook"),
        "IETF protocol assignments",
    )
    .await
}

#[tokio::test]
async fn a_webhook_to_a_benchmarking_address_is_refused() -> anyhow::Result<()> {
    refused_with_defaults(
        |port| format!("http://198.18.0.1:{port}/hook"),
        "benchmarking",
    )
    .await
}

#[tokio::test]
async fn a_webhook_to_a_local_use_nat64_address_is_refused() -> anyhow::Result<()> {
    // 64:ff9b:1::/48 with 169.254.169.254 (the metadata service) at its end.
    refused_with_defaults(
        |port| format!("http://[64:ff9b:1::a9fe:a9fe]:{port}/hook"),
        "local-use NAT64",
    )
    .await
}

#[tokio::test]
async fn a_webhook_to_a_teredo_address_is_refused() -> anyhow::Result<()> {
    refused_with_defaults(
        |port| format!("http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]:{port}/hook"),
        "Teredo",
    )
    .await
}

fn allowing(pool: &PgPool, entries: &[String]) -> ActionExecutor {
    default_executor(pool)
        .with_webhook_allow(WebhookAllow::parse(entries).unwrap())
        .unwrap()
}

async fn assert_called(db: &TestDb, job: &ActionExecutor, url: &str, calls: &AtomicUsize) {
    let command = webhook_execution(&db.pool, url).await;
    assert_eq!(
        job.handle(&ctx(), &command).await.unwrap(),
        Handled::Done,
        "{url}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "{url}");
}

#[tokio::test]
async fn an_address_and_port_in_webhook_allow_is_called_and_no_other_port() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let (port, calls) = receiver().await;
    let (other, other_calls) = receiver().await;
    let job = allowing(&db.pool, &[format!("127.0.0.1:{port}")]);
    assert_called(&db, &job, &format!("http://127.0.0.1:{port}/hook"), &calls).await;
    assert_refused(
        &db,
        &job,
        &format!("http://127.0.0.1:{other}/hook"),
        &other_calls,
        "loopback",
    )
    .await;
    Ok(())
}

#[tokio::test]
async fn a_range_in_webhook_allow_lets_its_addresses_through() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let (port, calls) = receiver().await;
    let job = allowing(&db.pool, &["127.0.0.0/8".to_string()]);
    assert_called(&db, &job, &format!("http://127.0.0.1:{port}/hook"), &calls).await;
    Ok(())
}

#[tokio::test]
async fn a_name_in_webhook_allow_may_resolve_inside() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let (port, calls) = receiver().await;
    let job = allowing(&db.pool, &["LocalHost".to_string()]);
    assert_called(&db, &job, &format!("http://localhost:{port}/hook"), &calls).await;
    Ok(())
}

#[tokio::test]
async fn a_name_allowed_on_one_port_is_refused_on_another() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let (port, calls) = receiver().await;
    let (other, other_calls) = receiver().await;
    let job = allowing(&db.pool, &[format!("localhost:{port}")]);
    assert_called(&db, &job, &format!("http://localhost:{port}/hook"), &calls).await;
    assert_refused(
        &db,
        &job,
        &format!("http://localhost:{other}/hook"),
        &other_calls,
        "localhost resolves to",
    )
    .await;
    Ok(())
}
