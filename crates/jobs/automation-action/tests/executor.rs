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
use worker_messages::{ActionCommand, DomainEvent, EmailSendCommand, outbound_email_id};
use worker_testkit::TestDb;

mod common;
use common::execution;

use job_automation_action::{ActionExecutor, GUARD_SCOPE, JOB_NAME, WebhookAllow};

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

/// The local HTTP servers of these tests listen on loopback, which a webhook may only reach
/// when the installation allows it.
fn loopback() -> WebhookAllow {
    WebhookAllow::parse(["127.0.0.1"]).unwrap()
}

fn executor(pool: &PgPool) -> ActionExecutor {
    ActionExecutor::new(pool.clone(), "commands", Duration::from_secs(5))
        .unwrap()
        .with_webhook_allow(loopback())
        .unwrap()
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

    let email_id = outbound_email_id(command.action_execution_id);
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
    let version: Option<String> =
        sqlx::query_scalar("SELECT headers ->> 'x-schema-version' FROM outbox")
            .fetch_one(&db.pool)
            .await?;
    assert_eq!(version.as_deref(), Some("1"), "x-schema-version");
    let (message_id, exchange, key, body) = &outbox[0];
    assert_eq!(
        (message_id.as_str(), exchange.as_str(), key.as_str()),
        (email_id.to_string().as_str(), "commands", "email.send")
    );
    assert_eq!(
        serde_json::from_slice::<EmailSendCommand>(body)?,
        EmailSendCommand {
            outbound_email_id: email_id
        }
    );

    assert_eq!(
        execution_state(&db.pool, command.action_execution_id).await,
        ("succeeded".into(), 1, None)
    );
    assert!(marked(&db.pool, command.action_execution_id).await);
    Ok(())
}

/// (seconds from `created_at` to `expires_at`) of the mail the execution queued.
async fn expires_after(pool: &PgPool, execution_id: Uuid) -> Option<f64> {
    sqlx::query_scalar(
        "SELECT extract(epoch FROM expires_at - created_at)::float8 FROM outbound_emails \
         WHERE id = $1",
    )
    .bind(outbound_email_id(execution_id))
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_reply_actions_max_age_becomes_its_mails_expires_at_and_none_leaves_it_unset()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let mut action = reply_action();
    action["max_age"] = json!("2h");
    let limited = execution(&db.pool, &ping_event(), action).await;
    let plain = execution(&db.pool, &ping_event(), reply_action()).await;
    for command in [&limited, &plain] {
        let body = serde_json::to_vec(command)?;
        assert_eq!(
            execute_once(&executor(&db.pool), &ctx(), &body).await?,
            Handled::Done
        );
    }
    assert_eq!(
        expires_after(&db.pool, limited.action_execution_id).await,
        Some(7_200.0)
    );
    assert_eq!(
        expires_after(&db.pool, plain.action_execution_id).await,
        None
    );
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
async fn a_webhook_body_carries_neither_its_url_nor_its_headers() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let (url, hook) = serve(vec![reply(200)]).await;
    let url = format!("{url}?token=s3cret-in-query");
    let action = json!({
        "type": "webhook",
        "url": url,
        "headers": {"authorization": "Bearer t0k-in-header", "x-api-key": "k3y-in-header"}
    });
    let command = execution(&db.pool, &ping_event(), action).await;
    assert_eq!(
        executor(&db.pool).handle(&ctx(), &command).await?,
        Handled::Done
    );

    let received = hook.received.lock().unwrap().clone();
    let (headers, body) = &received[0];
    assert_eq!(headers["authorization"], "Bearer t0k-in-header");
    let text = body.to_string();
    for secret in [
        url.as_str(),
        "s3cret-in-query",
        "t0k-in-header",
        "k3y-in-header",
        "authorization",
        "x-api-key",
    ] {
        assert!(
            !text.contains(secret),
            "the body carries `{secret}`: {text}"
        );
    }
    assert_eq!(body["action"], json!({"type": "webhook"}));
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
    let job = ActionExecutor::new(db.pool.clone(), "commands", Duration::from_millis(300))?
        .with_webhook_allow(loopback())?;

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

/// Waits until the server has received `n` requests; false after `within`.
async fn received(hook: &Hook, n: usize, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    while hook.received.lock().unwrap().len() < n {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}

#[tokio::test]
async fn six_slow_webhooks_hold_no_connection_of_a_pool_of_two() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let mut slow = reply(200);
    slow.delay = Duration::from_secs(4);
    let (url, hook) = serve(vec![slow]).await;
    let mut commands = Vec::new();
    for _ in 0..6 {
        commands.push(execution(&db.pool, &ping_event(), webhook(&url)).await);
    }
    let small = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(2))
        .connect(&db.url)
        .await?;
    let job = executor(&small);

    let started = tokio::time::Instant::now();
    let mut running = tokio::task::JoinSet::new();
    for command in commands.clone() {
        let job = job.clone();
        running.spawn(async move { job.handle(&ctx(), &command).await });
    }
    let all_called = received(&hook, 6, Duration::from_secs(3)).await;
    // Another job's query on the same pool, while every call is still waiting for its answer.
    let probe = sqlx::query_scalar::<_, i32>("SELECT 1")
        .fetch_one(&small)
        .await;
    let probed_after = started.elapsed();
    let mut outcomes = Vec::new();
    while let Some(outcome) = running.join_next().await {
        outcomes.push(outcome?.map_err(|f| f.to_string()));
    }

    assert!(all_called, "all six calls were made at once");
    assert_eq!(probe.map_err(|e| e.to_string()), Ok(1), "no pool timeout");
    assert!(
        probed_after < Duration::from_secs(4),
        "the probe ran during the calls: {probed_after:?}"
    );
    assert_eq!(outcomes, vec![Ok(Handled::Done); 6]);
    for command in &commands {
        assert_eq!(
            execution_state(&db.pool, command.action_execution_id).await,
            ("succeeded".into(), 1, None)
        );
        assert!(marked(&db.pool, command.action_execution_id).await);
    }
    Ok(())
}

#[tokio::test]
async fn an_idle_in_transaction_timeout_never_fails_an_accepted_webhook() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let mut slow = reply(200);
    slow.delay = Duration::from_secs(2);
    let (url, hook) = serve(vec![slow]).await;
    let command = execution(&db.pool, &ping_event(), webhook(&url)).await;
    // The server ends any session that sits in a transaction for a second: one that waits
    // on a webhook inside a transaction loses its session, and the receiver has acted.
    let options: sqlx::postgres::PgConnectOptions = db.url.parse()?;
    let strict = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options.options([("idle_in_transaction_session_timeout", "1000")]))
        .await?;

    let outcome = executor(&strict).handle(&ctx(), &command).await;
    assert_eq!(outcome.map_err(|f| f.to_string()), Ok(Handled::Done));
    assert_eq!(hook.received.lock().unwrap().len(), 1);
    assert_eq!(
        execution_state(&db.pool, command.action_execution_id).await,
        ("succeeded".into(), 1, None)
    );
    assert!(marked(&db.pool, command.action_execution_id).await);
    Ok(())
}

#[tokio::test]
async fn a_duplicate_while_the_first_is_running_backs_off_then_is_a_duplicate() -> anyhow::Result<()>
{
    let db = TestDb::create().await?;
    let mut slow = reply(200);
    slow.delay = Duration::from_secs(2);
    let (url, hook) = serve(vec![slow]).await;
    let command = execution(&db.pool, &ping_event(), webhook(&url)).await;
    let job = executor(&db.pool);
    // Another replica: its own process, its own claims.
    let replica = executor(&db.pool);

    let first = {
        let (job, command) = (job.clone(), command.clone());
        tokio::spawn(async move { job.handle(&ctx(), &command).await })
    };
    assert!(received(&hook, 1, Duration::from_secs(1)).await);
    let status: (String, bool) = sqlx::query_as(
        "SELECT status, claimed_by IS NOT NULL AND claimed_at IS NOT NULL \
         FROM action_executions WHERE id = $1",
    )
    .bind(command.action_execution_id)
    .fetch_one(&db.pool)
    .await?;
    assert_eq!(status, ("running".into(), true), "claimed while it calls");

    for (who, duplicate) in [("another replica", &replica), ("the same process", &job)] {
        let started = tokio::time::Instant::now();
        let outcome =
            tokio::time::timeout(Duration::from_secs(5), duplicate.handle(&ctx(), &command))
                .await?;
        let err = outcome.expect_err(who);
        assert_eq!(err.class(), FailureClass::Transient, "{who}: {err}");
        assert!(err.detail().contains("running"), "{who}: {err}");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{who}: backs off at once, does not wait for the call"
        );
    }
    assert_eq!(
        execution_state(&db.pool, command.action_execution_id).await,
        ("running".into(), 0, None),
        "a back-off leaves the running row alone"
    );

    assert_eq!(first.await??, Handled::Done);
    assert_eq!(replica.handle(&ctx(), &command).await?, Handled::Duplicate);
    assert_eq!(job.handle(&ctx(), &command).await?, Handled::Duplicate);
    assert_eq!(hook.received.lock().unwrap().len(), 1, "called once");
    assert_eq!(
        execution_state(&db.pool, command.action_execution_id).await,
        ("succeeded".into(), 1, None)
    );
    Ok(())
}

#[tokio::test]
async fn a_stale_claim_is_taken_over_and_a_fresh_one_is_not() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let (url, hook) = serve(vec![reply(200)]).await;
    let command = execution(&db.pool, &ping_event(), webhook(&url)).await;
    let job = executor(&db.pool).with_stale_claim_after(Duration::from_secs(60));
    let claim = |age_seconds: f64| {
        sqlx::query(
            "UPDATE action_executions SET status = 'running', claimed_by = $2, \
                 claimed_at = now() - make_interval(secs => $3) WHERE id = $1",
        )
        .bind(command.action_execution_id)
        .bind(Uuid::new_v4())
        .bind(age_seconds)
        .execute(&db.pool)
    };

    // A process that claimed it 50 s ago may still be calling.
    claim(50.0).await?;
    let err = job.handle(&ctx(), &command).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::Transient, "{err}");
    assert!(hook.received.lock().unwrap().is_empty());

    // One that claimed it 70 s ago has died with it.
    claim(70.0).await?;
    assert_eq!(job.handle(&ctx(), &command).await?, Handled::Done);
    assert_eq!(hook.received.lock().unwrap().len(), 1);
    assert_eq!(
        execution_state(&db.pool, command.action_execution_id).await,
        ("succeeded".into(), 1, None)
    );
    Ok(())
}

#[tokio::test]
async fn recording_a_success_rides_out_a_database_error() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let mut slow = reply(200);
    slow.delay = Duration::from_millis(500);
    let (url, hook) = serve(vec![slow]).await;
    let command = execution(&db.pool, &ping_event(), webhook(&url)).await;
    let job = executor(&db.pool);

    let running = {
        let (job, command) = (job.clone(), command.clone());
        tokio::spawn(async move { job.handle(&ctx(), &command).await })
    };
    assert!(received(&hook, 1, Duration::from_secs(1)).await);
    // While the receiver acts, the guard's table goes away (42P01) for two seconds.
    sqlx::query("ALTER TABLE processed_messages RENAME TO processed_messages_away")
        .execute(&db.pool)
        .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!running.is_finished(), "still trying to record");
    sqlx::query("ALTER TABLE processed_messages_away RENAME TO processed_messages")
        .execute(&db.pool)
        .await?;

    assert_eq!(running.await??, Handled::Done);
    assert_eq!(hook.received.lock().unwrap().len(), 1);
    assert_eq!(
        execution_state(&db.pool, command.action_execution_id).await,
        ("succeeded".into(), 1, None)
    );
    assert!(marked(&db.pool, command.action_execution_id).await);
    Ok(())
}

#[tokio::test]
async fn a_success_that_cannot_be_recorded_in_time_is_an_unknown_outcome_not_a_failure()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let (url, hook) = serve(vec![reply(200)]).await;
    let command = execution(&db.pool, &ping_event(), webhook(&url)).await;
    let job = executor(&db.pool).with_record_budget(Duration::from_secs(1));
    // The guard's table is gone after the claim and until after the budget.
    sqlx::query(
        "CREATE FUNCTION hide_guard() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
             ALTER TABLE processed_messages RENAME TO processed_messages_away; RETURN NEW; \
         END $$",
    )
    .execute(&db.pool)
    .await?;
    sqlx::query(
        "CREATE TRIGGER hide_guard AFTER UPDATE OF status ON action_executions \
         FOR EACH ROW WHEN (NEW.status = 'running') EXECUTE FUNCTION hide_guard()",
    )
    .execute(&db.pool)
    .await?;

    let err = job.handle(&ctx(), &command).await.unwrap_err();
    assert!(err.is_unknown(), "{err}");
    assert!(!err.retries_in_process(), "parked, not tried again at once");
    assert_eq!(hook.received.lock().unwrap().len(), 1);
    assert_eq!(
        execution_state(&db.pool, command.action_execution_id).await,
        ("running".into(), 0, None),
        "never recorded failed"
    );

    // The database is back; the next delivery takes the left claim over. At least once:
    // the receiver is called again, with the same Idempotency-Key.
    sqlx::query("DROP TRIGGER hide_guard ON action_executions")
        .execute(&db.pool)
        .await?;
    sqlx::query("ALTER TABLE processed_messages_away RENAME TO processed_messages")
        .execute(&db.pool)
        .await?;
    assert_eq!(job.handle(&ctx(), &command).await?, Handled::Done);
    let received = hook.received.lock().unwrap().clone();
    assert_eq!(received.len(), 2);
    assert_eq!(
        received[0].0["idempotency-key"],
        received[1].0["idempotency-key"]
    );
    assert_eq!(
        execution_state(&db.pool, command.action_execution_id).await,
        ("succeeded".into(), 1, None)
    );
    Ok(())
}

/// Every place a failed webhook's URL can end up: the failure itself and the execution row.
async fn failure_texts(pool: &PgPool, url: &str) -> Vec<String> {
    let command = execution(pool, &ping_event(), webhook(url)).await;
    let err = executor(pool).handle(&ctx(), &command).await.unwrap_err();
    let (_, _, last_error) = execution_state(pool, command.action_execution_id).await;
    vec![
        err.to_string(),
        err.detail().to_string(),
        last_error.unwrap_or_default(),
    ]
}

#[tokio::test]
async fn a_failing_webhook_never_shows_the_token_in_its_url() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let (url, _hook) = serve(vec![reply(500)]).await;
    let answered = url.replace("http://", "http://hookuser:pw-canary-17@") + "?token=tok-canary-17";
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await?
        .local_addr()?;
    let unreachable = format!("http://tok-canary-17@{closed}/hook?token=tok-canary-17&x=1");
    for url in [answered, unreachable] {
        for text in failure_texts(&db.pool, &url).await {
            assert!(!text.contains("canary-17"), "{text}");
            assert!(text.contains("/hook"), "the path is kept: {text}");
        }
    }
    Ok(())
}
