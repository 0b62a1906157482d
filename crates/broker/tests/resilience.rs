//! 10 000 messages through a consumer while its connections are closed under it and the
//! broker application is restarted: none lost, every effect applied exactly once, thanks to
//! the PostgreSQL processed-message guard.
//!
//! This test restarts the RabbitMQ application (`rabbitmqctl stop_app` / `start_app`) of the
//! local broker for a few seconds; it restores it even when it fails.

// Helpers outside #[test] functions assert too: a failed expectation fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use common::*;
use serde::Deserialize;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use worker_broker::consumer::{ConsumerRunner, ConsumerSettings};
use worker_broker::{Outgoing, Publisher, PublisherSettings, Supervisor};
use worker_core::{ConsumerJob, Failure, Handled, RetryPolicy, WorkContext};
use worker_store::{ProcessedMessages, classify};
use worker_testkit::{TestDb, TestVhost};

const MESSAGES: usize = 10_000;

#[derive(Debug, Deserialize)]
struct Effect {
    id: String,
}

/// Applies each message's effect (a row in `effects`) once, guarded in the same transaction.
#[derive(Clone)]
struct GuardedJob {
    pool: PgPool,
    guard: ProcessedMessages,
}

impl ConsumerJob for GuardedJob {
    type Input = Effect;

    fn name(&self) -> &str {
        "effects"
    }

    async fn handle(&self, _ctx: &WorkContext, input: &Effect) -> Result<Handled, Failure> {
        let mut tx = self.pool.begin().await.map_err(classify)?;
        if !self.guard.mark(&mut tx, "effects", &input.id).await? {
            return Ok(Handled::Duplicate);
        }
        sqlx::query("INSERT INTO effects (id) VALUES ($1)")
            .bind(&input.id)
            .execute(&mut *tx)
            .await
            .map_err(classify)?;
        tx.commit().await.map_err(classify)?;
        Ok(Handled::Done)
    }
}

/// Starts the broker application again if a test stopped it and then failed.
struct AppGuard {
    stopped: bool,
}

impl Drop for AppGuard {
    fn drop(&mut self) {
        if self.stopped {
            let _ = rabbitmqctl(&["start_app"]);
        }
    }
}

async fn count(pool: &PgPool) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar("SELECT count(*) FROM effects")
        .fetch_one(pool)
        .await?)
}

async fn close_connections(vhost: &TestVhost) -> anyhow::Result<()> {
    let name = vhost.name.clone();
    tokio::task::spawn_blocking(move || {
        rabbitmqctl(&["close_all_connections", "-p", &name, "resilience test"])
    })
    .await?
}

/// Publishes every message through the supervised publisher, trying again whatever failed
/// (a publish whose confirm was lost may arrive twice: the guard absorbs it).
async fn publish_all(publisher: Publisher) -> anyhow::Result<()> {
    let all: Vec<Outgoing> = (0..MESSAGES)
        .map(|i| {
            Outgoing::json(
                "commands",
                QUEUE,
                &serde_json::json!({"id": format!("e{i}")}),
            )
            .map(|m| m.with_message_id(&format!("e{i}")))
        })
        .collect::<Result<_, _>>()?;
    for chunk in all.chunks(250) {
        let mut pending: Vec<Outgoing> = chunk.to_vec();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        while !pending.is_empty() {
            let results = publisher.publish_many(&pending).await;
            pending = pending
                .into_iter()
                .zip(results)
                .filter(|(_, r)| r.is_err())
                .map(|(m, _)| m)
                .collect();
            if !pending.is_empty() {
                anyhow::ensure!(
                    tokio::time::Instant::now() < deadline,
                    "could not publish for two minutes"
                );
                tokio::time::sleep(ms(200)).await;
            }
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_messages_through_closed_connections_and_a_broker_restart()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    sqlx::query("CREATE TABLE effects (id text NOT NULL, at timestamptz NOT NULL DEFAULT now())")
        .execute(&db.pool)
        .await?;
    let vhost = TestVhost::create().await?;
    let topology = topology(&queue_settings(&[200, 500], 10))?;
    let supervisor = Supervisor::new(connection_settings(&vhost)?, topology.clone());
    let shutdown = CancellationToken::new();
    let sup_task = tokio::spawn(supervisor.clone().run(shutdown.clone()));

    let job = GuardedJob {
        pool: db.pool.clone(),
        guard: ProcessedMessages::new(),
    };
    let settings = ConsumerSettings {
        prefetch: 50,
        concurrency: 8,
        max_attempts: 5,
        timeout: Duration::from_secs(10),
        retry: Some(RetryPolicy {
            max_tries: 3,
            base_delay: ms(50),
            factor: 2.0,
            max_delay: ms(500),
            jitter: true,
        }),
        settle_deadline: Duration::from_secs(5),
        in_process_wait: Duration::from_secs(30),
        ack_interval: ms(10),
        publish_timeout: Duration::from_secs(5),
    };
    let events = Arc::new(Recorder::default());
    let runner =
        ConsumerRunner::observed(job, topology.queues[0].clone(), settings, events.clone());
    let consumer_task = {
        let supervisor = supervisor.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move { runner.run(&supervisor, shutdown).await })
    };
    let mut status = supervisor.status();
    tokio::time::timeout(Duration::from_secs(15), status.wait_for(|s| s.is_ready())).await??;

    let publisher = Publisher::new(supervisor.sessions(), PublisherSettings::default());
    let publish_task = tokio::spawn(publish_all(publisher));

    let mut app = AppGuard { stopped: false };
    let started = tokio::time::Instant::now();
    let deadline = started + Duration::from_secs(240);
    let mut chaos = vec![
        (1_000, "close"),
        (3_000, "close"),
        (5_000, "restart"),
        (7_000, "close"),
        (8_500, "close"),
    ]
    .into_iter()
    .peekable();
    loop {
        let done = count(&db.pool).await?;
        if done as usize >= MESSAGES && publish_task.is_finished() {
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "only {done} effects after four minutes; status {:?}",
            *status.borrow()
        );
        if let Some(&(at, what)) = chaos.peek()
            && done >= at
        {
            chaos.next();
            eprintln!(
                "{:>6.1}s  {done} effects: {what}",
                started.elapsed().as_secs_f64()
            );
            match what {
                "close" => close_connections(&vhost).await?,
                _ => {
                    app.stopped = true;
                    tokio::task::spawn_blocking(|| rabbitmqctl(&["stop_app"])).await??;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    tokio::task::spawn_blocking(|| rabbitmqctl(&["start_app"])).await??;
                    app.stopped = false;
                }
            }
        }
        tokio::time::sleep(ms(100)).await;
    }
    publish_task.await??;
    eprintln!(
        "{:>6.1}s  all {MESSAGES} effects applied",
        started.elapsed().as_secs_f64()
    );
    assert!(chaos.peek().is_none(), "every fault was injected");

    // Let the last acks go out, then look at what is left.
    tokio::time::sleep(Duration::from_secs(1)).await;
    shutdown.cancel();
    consumer_task.await?;
    sup_task.await?;
    let reconnects = supervisor.status().borrow().reconnects;
    assert!(reconnects >= 5, "reconnected {reconnects} times");

    let (total, distinct): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(DISTINCT id) FROM effects")
            .fetch_one(&db.pool)
            .await?;
    assert_eq!(
        (total, distinct),
        (MESSAGES as i64, MESSAGES as i64),
        "every effect exactly once"
    );
    let conn = connection_settings(&vhost)?
        .connect()
        .await
        .context("reconnecting to check the queues")?;
    let ch = conn.create_channel().await?;
    let queue = &topology.queues[0];
    for q in [queue.name.as_str(), queue.dead_queue.as_str()] {
        let depth = ch
            .queue_declare(
                q.into(),
                lapin::options::QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                Default::default(),
            )
            .await?
            .message_count();
        assert_eq!(depth, 0, "{q} is empty");
    }
    let settled = events.settled.lock().unwrap();
    let duplicates = settled
        .iter()
        .filter(|e| e.outcome == worker_broker::Outcome::Duplicate)
        .count();
    eprintln!(
        "settled {} deliveries, {duplicates} duplicates absorbed by the guard, {reconnects} reconnects",
        settled.len()
    );
    Ok(())
}
