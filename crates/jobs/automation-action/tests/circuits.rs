//! A webhook host's circuit (`webhook:<host>:<port>`) on a real database and local HTTP
//! servers: a host nobody listens on opens it after its failures in a row, its actions are
//! then parked without a try (their rows as they were), and another host's actions go on.

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
use worker_broker::consumer::{Decision, decide};
use worker_broker::{QueueDefaults, QueueSettings, QueueTopology, TopologySettings};
use worker_core::circuit::CircuitSettings;
use worker_core::{ConsumerJob, Failure, FailureClass, Handled, RetryOutcome, WorkContext};
use worker_messages::{ActionCommand, DomainEvent};
use worker_store::circuits::Circuits;
use worker_testkit::TestDb;

mod common;

use job_automation_action::{ActionExecutor, JOB_NAME, WebhookAllow};

fn ctx() -> WorkContext {
    WorkContext::new(JOB_NAME, CancellationToken::new())
}

/// Writes an automation with one webhook action to `url` and its execution for a new event,
/// as the trigger does; the command that names it.
async fn webhook_execution(pool: &PgPool, url: &str) -> ActionCommand {
    let event = DomainEvent {
        id: Uuid::new_v4(),
        event_type: "email.received".into(),
        occurred_at: Utc::now(),
        data: json!({"subject": "ping"}),
    };
    common::execution(
        pool,
        &event,
        json!({"type": "webhook", "url": url, "headers": {}}),
    )
    .await
}

async fn state(pool: &PgPool, id: Uuid) -> (String, i32, Option<String>) {
    sqlx::query_as("SELECT status, attempts, last_error FROM action_executions WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A local HTTP server answering 200 to every POST on `/hook`; its URL and the requests it
/// received.
async fn working_host() -> (String, Arc<AtomicUsize>) {
    let received = Arc::new(AtomicUsize::new(0));
    let counted = received.clone();
    let app = Router::new().route(
        "/hook",
        axum::routing::post(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            async { "ok" }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/hook"), received)
}

/// Two refused connections in a row open a host's circuit; its first probe after a minute.
fn circuits(pool: &PgPool) -> Circuits {
    let settings = CircuitSettings {
        failures: 2,
        cool_down: Duration::from_secs(60),
        ..CircuitSettings::default()
    };
    Circuits::new(pool.clone(), settings, "circuit-test")
}

fn executor(pool: &PgPool, circuits: &Circuits) -> ActionExecutor {
    ActionExecutor::new(pool.clone(), "commands", Duration::from_secs(5))
        .unwrap()
        .with_webhook_allow(WebhookAllow::parse(["127.0.0.1"]).unwrap())
        .unwrap()
        .with_circuits(circuits.clone())
}

/// The automation.action queue as the host declares it by default.
fn action_queue() -> QueueTopology {
    QueueTopology::from_settings(
        &QueueSettings::default(),
        QueueDefaults::command("automation.action", &TopologySettings::default()),
    )
    .unwrap()
}

#[tokio::test]
async fn a_host_that_refuses_connections_opens_its_circuit_and_only_its_actions_wait()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let circuits = circuits(&db.pool);
    let job = executor(&db.pool, &circuits);
    let refused = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await?
        .local_addr()?;
    let down_url = format!("http://{refused}/hook");
    let dependency = format!("webhook:{refused}");

    // The first refused connection is an ordinary transient failure, charged its try.
    let first = webhook_execution(&db.pool, &down_url).await;
    let err = job.handle(&ctx(), &first).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::Transient, "{err}");
    assert_eq!(state(&db.pool, first.action_execution_id).await.1, 1);
    assert!(circuits.open_circuit(&dependency).is_none());

    // The second in a row opens the circuit: that try is charged nothing.
    let second = webhook_execution(&db.pool, &down_url).await;
    let err = job.handle(&ctx(), &second).await.unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    let (status, attempts, last_error) = state(&db.pool, second.action_execution_id).await;
    assert_eq!(
        (status.as_str(), attempts),
        ("pending", 0),
        "{last_error:?}"
    );
    let open = circuits
        .open_circuit(&dependency)
        .expect("two refused connections in a row open the host's circuit");
    assert!(open.reason.contains(&refused.to_string()), "{open:?}");

    // While it is open, the host's actions are not tried: parked until its probe, their
    // attempt unchanged, their rows as they were.
    let waiting = webhook_execution(&db.pool, &down_url).await;
    let err: Failure = job.handle(&ctx(), &waiting).await.unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    let wait = err.retry_after().expect("parked for a wait");
    assert!(
        wait > Duration::from_secs(50) && wait <= Duration::from_secs(60),
        "until the probe: {wait:?}"
    );
    assert_eq!(
        state(&db.pool, waiting.action_execution_id).await,
        ("pending".into(), 0, None),
        "untouched"
    );
    assert_eq!(
        state(&db.pool, first.action_execution_id).await.1,
        1,
        "the open circuit charged the earlier action nothing more"
    );
    let parked = decide(
        &RetryOutcome::Failed {
            failure: err,
            tries: 1,
        },
        3,
        5,
        &action_queue(),
    );
    assert!(
        matches!(
            parked,
            Decision::Park {
                next_attempt: 3,
                ..
            }
        ),
        "parked with its attempt unchanged: {parked:?}"
    );

    // Another host's action goes on.
    let (up_url, received) = working_host().await;
    let elsewhere = webhook_execution(&db.pool, &up_url).await;
    assert_eq!(job.handle(&ctx(), &elsewhere).await?, Handled::Done);
    assert_eq!(received.load(Ordering::SeqCst), 1);
    assert_eq!(
        state(&db.pool, elsewhere.action_execution_id).await,
        ("succeeded".into(), 1, None)
    );
    let up_host = up_url
        .trim_start_matches("http://")
        .trim_end_matches("/hook");
    assert!(
        circuits
            .open_circuit(&format!("webhook:{up_host}"))
            .is_none()
    );
    Ok(())
}

/// A 5xx or 4xx answer is the action's own: however many, the host's circuit stays closed.
#[tokio::test]
async fn answers_however_bad_never_open_the_hosts_circuit() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let circuits = circuits(&db.pool);
    let job = executor(&db.pool, &circuits);
    let app = Router::new().route(
        "/hook",
        axum::routing::post(|| async { (axum::http::StatusCode::SERVICE_UNAVAILABLE, "busy") }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    for _ in 0..3 {
        let command = webhook_execution(&db.pool, &format!("http://{addr}/hook")).await;
        let err = job.handle(&ctx(), &command).await.unwrap_err();
        assert_eq!(err.class(), FailureClass::Transient, "{err}");
        assert_eq!(state(&db.pool, command.action_execution_id).await.1, 1);
    }
    assert!(circuits.open_circuit(&format!("webhook:{addr}")).is_none());
    Ok(())
}

/// After the cool-down the next action for the host is the probe: answered, it closes the
/// circuit and is done.
#[tokio::test]
async fn the_first_action_after_the_cool_down_probes_and_its_answer_closes_the_circuit()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let settings = CircuitSettings {
        failures: 1,
        cool_down: Duration::from_secs(1),
        ..CircuitSettings::default()
    };
    let circuits = Circuits::new(db.pool.clone(), settings, "circuit-test");
    let job = executor(&db.pool, &circuits);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    drop(listener);
    let url = format!("http://{addr}/hook");
    let dependency = format!("webhook:{addr}");
    let down = webhook_execution(&db.pool, &url).await;
    assert!(
        job.handle(&ctx(), &down)
            .await
            .unwrap_err()
            .is_unavailable()
    );
    assert!(circuits.open_circuit(&dependency).is_some());

    // The host is back on the same port.
    let received = Arc::new(AtomicUsize::new(0));
    let counted = received.clone();
    let app = Router::new().route(
        "/hook",
        axum::routing::post(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            async { "ok" }
        }),
    );
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    tokio::time::sleep(Duration::from_millis(1100)).await;

    assert_eq!(job.handle(&ctx(), &down).await?, Handled::Done);
    assert_eq!(received.load(Ordering::SeqCst), 1);
    assert!(circuits.open_circuit(&dependency).is_none());
    assert!(worker_store::circuits::list(&db.pool).await?.is_empty());
    assert_eq!(
        state(&db.pool, down.action_execution_id).await,
        ("succeeded".into(), 1, None),
        "the try the circuit opened on was not counted"
    );
    Ok(())
}
