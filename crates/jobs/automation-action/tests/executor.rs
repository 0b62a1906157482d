//! The action executor, one command at a time, on a real database and a local HTTP server.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::type_complexity)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;
use worker_core::{ConsumerJob, Failure, FailureClass, Handled, WorkContext, execute_once};
use worker_messages::{
    ActionCommand, DomainEvent, EmailSendCommand, action_execution_id, email_message_id,
};
use worker_testkit::TestDb;

use job_automation_action::{ActionExecutor, GUARD_SCOPE, JOB_NAME};

fn ctx() -> WorkContext {
    WorkContext::new(JOB_NAME, CancellationToken::new())
}

fn ping_event() -> DomainEvent {
    DomainEvent {
        id: Uuid::new_v4(),
        event_type: "email.received".into(),
        occurred_at: Utc::now(),
        data: json!({
            "inbound_email_id": Uuid::new_v4(),
            "account": "demo",
            "mailbox": "INBOX",
            "message_id": "ping-1@example.com",
            "from": "alice@localhost",
            "from_name": "Alice",
            "to": ["demo@localhost"],
            "subject": "ping",
            "text": "are you there?",
            "references": ["root@example.com"],
            "parse_error": null
        }),
    }
}

fn reply_action() -> Value {
    json!({
        "type": "send_email",
        "to": ["{{ from }}"],
        "subject": "Re: {{ subject }}",
        "text": "Hello {{ from_name }}, pong.",
    })
}

/// Writes an automation and one execution of its action `action` for `event`, as the
/// trigger does, and returns the command that names it.
async fn execution(pool: &PgPool, event: &DomainEvent, action: Value) -> ActionCommand {
    let automation_id = Uuid::new_v4();
    sqlx::query("INSERT INTO automations (id, name, event_type, actions) VALUES ($1, $2, $3, $4)")
        .bind(automation_id)
        .bind(format!("a-{automation_id}"))
        .bind(&event.event_type)
        .bind(json!([action.clone()]))
        .execute(pool)
        .await
        .unwrap();
    let id = action_execution_id(event.id, automation_id, 0);
    sqlx::query(
        "INSERT INTO action_executions (id, automation_id, event_id, action_index, action, event) \
         VALUES ($1, $2, $3, 0, $4, $5)",
    )
    .bind(id)
    .bind(automation_id)
    .bind(event.id)
    .bind(&action)
    .bind(serde_json::to_value(event).unwrap())
    .execute(pool)
    .await
    .unwrap();
    ActionCommand {
        action_execution_id: id,
        automation_id,
        event_id: event.id,
        action_index: 0,
    }
}

async fn execution_state(pool: &PgPool, id: Uuid) -> (String, i32, Option<String>) {
    sqlx::query_as("SELECT status, attempts, last_error FROM action_executions WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn marked(pool: &PgPool, id: Uuid) -> bool {
    sqlx::query_scalar("SELECT count(*) = 1 FROM processed_messages WHERE scope = $1 AND id = $2")
        .bind(GUARD_SCOPE)
        .bind(id.to_string())
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

fn executor(pool: &PgPool) -> ActionExecutor {
    ActionExecutor::new(pool.clone(), "commands", Duration::from_secs(5)).unwrap()
}

#[tokio::test]
async fn send_email_renders_the_reply_and_queues_it_with_the_mark() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let event = ping_event();
    let command = execution(&db.pool, &event, reply_action()).await;
    let body = serde_json::to_vec(&command)?;

    assert_eq!(
        execute_once(&executor(&db.pool), &ctx(), &body).await?,
        Handled::Done
    );

    let email_id = email_message_id(command.action_execution_id);
    let row: (
        Option<Uuid>,
        String,
        Vec<String>,
        String,
        Option<String>,
        Option<String>,
        Vec<String>,
        String,
    ) = sqlx::query_as(
        "SELECT action_execution_id, message_id, to_addresses, subject, text_body, in_reply_to, \
                    reference_ids, status FROM outbound_emails WHERE id = $1",
    )
    .bind(email_id)
    .fetch_one(&db.pool)
    .await?;
    assert_eq!(row.0, Some(command.action_execution_id));
    assert_eq!(row.1, format!("{email_id}@worker-host"));
    assert_eq!(row.2, ["alice@localhost"]);
    assert_eq!(row.3, "Re: ping");
    assert_eq!(row.4.as_deref(), Some("Hello Alice, pong."));
    assert_eq!(row.5.as_deref(), Some("ping-1@example.com"));
    assert_eq!(row.6, ["root@example.com", "ping-1@example.com"]);
    assert_eq!(row.7, "queued");

    let outbox: Vec<(String, String, String, Vec<u8>)> =
        sqlx::query_as("SELECT message_id, exchange, routing_key, body FROM outbox")
            .fetch_all(&db.pool)
            .await?;
    assert_eq!(outbox.len(), 1);
    let (message_id, exchange, key, body) = &outbox[0];
    assert_eq!(
        (message_id.as_str(), exchange.as_str(), key.as_str()),
        (email_id.to_string().as_str(), "commands", "email.send")
    );
    assert_eq!(
        serde_json::from_slice::<EmailSendCommand>(body)?,
        EmailSendCommand {
            email_message_id: email_id
        }
    );

    assert_eq!(
        execution_state(&db.pool, command.action_execution_id).await,
        ("succeeded".into(), 1, None)
    );
    assert!(marked(&db.pool, command.action_execution_id).await);
    Ok(())
}

#[tokio::test]
async fn the_guard_drops_a_duplicate_command() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let command = execution(&db.pool, &ping_event(), reply_action()).await;
    let job = executor(&db.pool);
    assert_eq!(job.handle(&ctx(), &command).await?, Handled::Done);
    assert_eq!(job.handle(&ctx(), &command).await?, Handled::Duplicate);
    assert_eq!(
        count(&db.pool, "SELECT count(*) FROM outbound_emails").await,
        1
    );
    assert_eq!(count(&db.pool, "SELECT count(*) FROM outbox").await, 1);
    assert_eq!(
        execution_state(&db.pool, command.action_execution_id)
            .await
            .1,
        1,
        "one try counted"
    );

    // Even with the mark swept by retention, the succeeded row keeps it a duplicate.
    sqlx::query("DELETE FROM processed_messages")
        .execute(&db.pool)
        .await?;
    assert_eq!(job.handle(&ctx(), &command).await?, Handled::Duplicate);
    assert_eq!(count(&db.pool, "SELECT count(*) FROM outbox").await, 1);
    Ok(())
}

#[tokio::test]
async fn a_template_error_is_permanent_and_fails_the_execution() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let action = json!({"type": "send_email", "to": ["{{ from }}"], "subject": "Re: {{ subjetc }}", "text": "x"});
    let command = execution(&db.pool, &ping_event(), action).await;
    let err = executor(&db.pool)
        .handle(&ctx(), &command)
        .await
        .unwrap_err();
    assert_eq!(
        (err.class(), err.reason()),
        (FailureClass::Permanent, "template-error")
    );
    let (status, attempts, last_error) =
        execution_state(&db.pool, command.action_execution_id).await;
    assert_eq!((status.as_str(), attempts), ("failed", 1));
    assert!(last_error.unwrap().contains("template-error"));
    assert_eq!(
        count(&db.pool, "SELECT count(*) FROM outbound_emails").await,
        0
    );
    assert_eq!(count(&db.pool, "SELECT count(*) FROM outbox").await, 0);
    assert!(
        !marked(&db.pool, command.action_execution_id).await,
        "a replay after a fix runs again"
    );
    Ok(())
}

#[tokio::test]
async fn an_unknown_execution_is_permanent() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let command = ActionCommand {
        action_execution_id: Uuid::new_v4(),
        automation_id: Uuid::new_v4(),
        event_id: Uuid::new_v4(),
        action_index: 0,
    };
    let err = executor(&db.pool)
        .handle(&ctx(), &command)
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "unknown-execution");
    Ok(())
}

// ---- webhooks against a local HTTP server ----

/// What the local server answers, one entry per request (the last one repeats).
#[derive(Clone)]
struct Reply {
    status: u16,
    headers: Vec<(&'static str, String)>,
    delay: Duration,
}

fn reply(status: u16) -> Reply {
    Reply {
        status,
        headers: vec![],
        delay: Duration::ZERO,
    }
}

#[derive(Clone, Default)]
struct Hook {
    script: Arc<Mutex<VecDeque<Reply>>>,
    received: Arc<Mutex<Vec<(HeaderMap, Value)>>>,
}

async fn answer(State(hook): State<Hook>, headers: HeaderMap, body: Bytes) -> Response {
    hook.received.lock().unwrap().push((
        headers,
        serde_json::from_slice(&body).unwrap_or(Value::Null),
    ));
    let next = {
        let mut script = hook.script.lock().unwrap();
        if script.len() > 1 {
            script.pop_front().unwrap()
        } else {
            script.front().cloned().unwrap()
        }
    };
    tokio::time::sleep(next.delay).await;
    let mut response =
        (StatusCode::from_u16(next.status).unwrap(), "server says no").into_response();
    for (name, value) in next.headers {
        response.headers_mut().insert(name, value.parse().unwrap());
    }
    response
}

/// Starts a server on 127.0.0.1:0 answering `script`; returns its URL and what it received.
async fn serve(script: Vec<Reply>) -> (String, Hook) {
    let hook = Hook {
        script: Arc::new(Mutex::new(script.into())),
        ..Hook::default()
    };
    let app = Router::new()
        .route("/hook", axum::routing::post(answer))
        .with_state(hook.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/hook"), hook)
}

fn webhook(url: &str) -> Value {
    json!({"type": "webhook", "url": url, "headers": {"authorization": "Bearer t0k"}})
}

#[tokio::test]
async fn a_webhook_answered_200_succeeds_with_the_event_and_action_posted() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let (url, hook) = serve(vec![reply(200)]).await;
    let event = ping_event();
    let command = execution(&db.pool, &event, webhook(&url)).await;
    assert_eq!(
        executor(&db.pool).handle(&ctx(), &command).await?,
        Handled::Done
    );

    let received = hook.received.lock().unwrap().clone();
    assert_eq!(received.len(), 1);
    let (headers, body) = &received[0];
    assert_eq!(body["event"]["id"], json!(event.id));
    assert_eq!(body["event"]["type"], "email.received");
    assert_eq!(body["event"]["data"]["subject"], "ping");
    assert_eq!(body["action"]["type"], "webhook");
    assert_eq!(
        headers["idempotency-key"],
        command.action_execution_id.to_string().as_str()
    );
    assert_eq!(headers["authorization"], "Bearer t0k");
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(
        execution_state(&db.pool, command.action_execution_id).await,
        ("succeeded".into(), 1, None)
    );
    assert!(marked(&db.pool, command.action_execution_id).await);
    Ok(())
}

#[tokio::test]
async fn a_webhook_answered_503_then_200_is_transient_then_done() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let (url, hook) = serve(vec![reply(503), reply(200)]).await;
    let command = execution(&db.pool, &ping_event(), webhook(&url)).await;
    let job = executor(&db.pool);

    let err = job.handle(&ctx(), &command).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::Transient, "{err}");
    assert!(
        err.detail()
            .contains("503 Service Unavailable: server says no"),
        "{err}"
    );
    let (status, attempts, last_error) =
        execution_state(&db.pool, command.action_execution_id).await;
    assert_eq!(
        (status.as_str(), attempts),
        ("pending", 1),
        "left for the retry tiers"
    );
    assert!(last_error.unwrap().contains("503"));
    assert!(
        !marked(&db.pool, command.action_execution_id).await,
        "no mark before a 2xx"
    );

    assert_eq!(
        job.handle(&ctx().with_attempt(2), &command).await?,
        Handled::Done
    );
    assert_eq!(
        execution_state(&db.pool, command.action_execution_id).await,
        ("succeeded".into(), 2, None)
    );
    assert_eq!(hook.received.lock().unwrap().len(), 2);
    Ok(())
}

#[tokio::test]
async fn a_webhook_answered_429_is_throttled_for_its_retry_after() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let mut seconds = reply(429);
    seconds.headers.push(("retry-after", "7".into()));
    let mut date = reply(429);
    let in_two_minutes = (Utc::now() + chrono::Duration::seconds(120))
        .to_rfc2822()
        .replace("+0000", "GMT");
    date.headers.push(("retry-after", in_two_minutes));
    let (url, _hook) = serve(vec![seconds, date, reply(429)]).await;
    let command = execution(&db.pool, &ping_event(), webhook(&url)).await;
    let job = executor(&db.pool);

    let err = job.handle(&ctx(), &command).await.unwrap_err();
    assert_eq!(
        (err.class(), err.retry_after()),
        (FailureClass::Throttled, Some(Duration::from_secs(7)))
    );

    let err = job.handle(&ctx(), &command).await.unwrap_err();
    let waited = err.retry_after().unwrap();
    assert!(
        (Duration::from_secs(115)..=Duration::from_secs(120)).contains(&waited),
        "{waited:?}"
    );

    let err = job.handle(&ctx(), &command).await.unwrap_err();
    assert_eq!(
        err.retry_after(),
        Some(Duration::from_secs(30)),
        "the default without Retry-After"
    );
    assert_eq!(
        execution_state(&db.pool, command.action_execution_id)
            .await
            .0,
        "pending"
    );
    Ok(())
}

#[tokio::test]
async fn a_webhook_answered_404_is_permanent_and_fails_the_execution() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let (url, _hook) = serve(vec![reply(404)]).await;
    let command = execution(&db.pool, &ping_event(), webhook(&url)).await;
    let err = executor(&db.pool)
        .handle(&ctx(), &command)
        .await
        .unwrap_err();
    assert_eq!(
        (err.class(), err.reason()),
        (FailureClass::Permanent, "webhook-4xx")
    );
    let (status, attempts, last_error) =
        execution_state(&db.pool, command.action_execution_id).await;
    assert_eq!((status.as_str(), attempts), ("failed", 1));
    assert!(last_error.unwrap().contains("404 Not Found"));
    Ok(())
}

#[tokio::test]
async fn a_webhook_that_never_answers_times_out_transiently() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let mut silent = reply(200);
    silent.delay = Duration::from_secs(3600);
    let (url, _hook) = serve(vec![silent]).await;
    let command = execution(&db.pool, &ping_event(), webhook(&url)).await;
    let job = ActionExecutor::new(db.pool.clone(), "commands", Duration::from_millis(300))?;

    let started = tokio::time::Instant::now();
    let err = job.handle(&ctx(), &command).await.unwrap_err();
    let took = started.elapsed();
    assert_eq!(err.class(), FailureClass::Transient, "{err}");
    assert!(err.detail().contains("no answer within 300ms"), "{err}");
    assert!(
        took < Duration::from_secs(3),
        "bounded by the webhook timeout: {took:?}"
    );
    assert_eq!(
        execution_state(&db.pool, command.action_execution_id)
            .await
            .0,
        "pending"
    );
    Ok(())
}

#[tokio::test]
async fn a_webhook_nobody_listens_on_is_transient() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await?
        .local_addr()?;
    let command = execution(
        &db.pool,
        &ping_event(),
        webhook(&format!("http://{closed}/hook")),
    )
    .await;
    let err: Failure = executor(&db.pool)
        .handle(&ctx(), &command)
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::Transient, "{err}");
    Ok(())
}

#[tokio::test]
async fn concurrent_duplicates_call_the_webhook_once() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let mut slow = reply(200);
    slow.delay = Duration::from_millis(300);
    let (url, hook) = serve(vec![slow]).await;
    let command = execution(&db.pool, &ping_event(), webhook(&url)).await;
    let job = executor(&db.pool);
    let (c1, c2) = (ctx(), ctx());
    let (a, b) = tokio::join!(job.handle(&c1, &command), job.handle(&c2, &command));
    let mut outcomes = vec![a?, b?];
    outcomes.sort_by_key(|h| h.as_str());
    assert_eq!(outcomes, [Handled::Done, Handled::Duplicate]);
    assert_eq!(
        hook.received.lock().unwrap().len(),
        1,
        "the second waited on the mark, then found it"
    );
    Ok(())
}
