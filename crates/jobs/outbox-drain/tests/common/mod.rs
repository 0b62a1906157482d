//! Shared support for the drain's integration tests: a database and a vhost of the test's
//! own, a topic exchange `events` bound to a quorum queue `sink` for `order.*`, a drain over
//! its own connection, a consumer that records every message id it sees (optionally applying
//! an effect once through the processed-message guard), and a host-like tick loop.
#![allow(dead_code)]
// Test support: a failed expectation should fail the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use job_outbox_drain::{DrainBackoff, OutboxDrain, OutboxDrainSettings};
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicQosOptions, ExchangeDeclareOptions,
    QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Connection, ConnectionProperties, ExchangeKind};
use sqlx::PgPool;
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use worker_broker::{Publisher, PublisherSettings, Session};
use worker_core::{NoLease, SkipIfBusy, TickOutcome, WorkContext, tick_once};
use worker_store::{OutboxMessage, ProcessedMessages, outbox};
use worker_testkit::{TestDb, TestVhost};

pub const EXCHANGE: &str = "events";
pub const QUEUE: &str = "sink";
pub const ROUTED: &str = "order.placed";

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Drain settings for tests: small batches, quick backoff.
pub fn settings(batch_size: u32, max_attempts: u32) -> OutboxDrainSettings {
    OutboxDrainSettings {
        batch_size,
        max_attempts,
        backoff: DrainBackoff {
            base_delay: ms(50),
            factor: 2.0,
            max_delay: ms(200),
            jitter: false,
        },
        ..OutboxDrainSettings::default()
    }
}

pub struct Env {
    pub db: TestDb,
    pub vhost: TestVhost,
}

impl Env {
    pub async fn create() -> anyhow::Result<Self> {
        let db = TestDb::create().await?;
        let vhost = TestVhost::create().await?;
        let env = Self { db, vhost };
        let connection = env.connection().await?;
        let channel = connection.create_channel().await?;
        channel
            .exchange_declare(
                EXCHANGE.into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
        let mut args = FieldTable::default();
        args.insert(
            ShortString::from("x-queue-type"),
            AMQPValue::LongString(LongString::from("quorum")),
        );
        channel
            .queue_declare(
                QUEUE.into(),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                args,
            )
            .await?;
        channel
            .queue_bind(
                QUEUE.into(),
                EXCHANGE.into(),
                "order.*".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        connection.close(200, "topology declared".into()).await?;
        Ok(env)
    }

    pub async fn connection(&self) -> anyhow::Result<Connection> {
        Connection::connect(&self.vhost.amqp_url(), ConnectionProperties::default())
            .await
            .context("connecting to the test vhost")
    }

    /// A publisher on a connection of its own (as a replica would have).
    pub async fn publisher(&self) -> anyhow::Result<Publisher> {
        let session = Session::new(self.connection().await?);
        Ok(Publisher::new(
            session.fixed(),
            PublisherSettings {
                channels: 4,
                confirm_timeout: Duration::from_secs(10),
                connect_wait: Duration::from_secs(2),
            },
        ))
    }

    /// A drain on the test database's pool (or `pool`) and a connection of its own.
    pub async fn drain(
        &self,
        pool: Option<PgPool>,
        settings: OutboxDrainSettings,
    ) -> anyhow::Result<OutboxDrain> {
        Ok(OutboxDrain::new(
            pool.unwrap_or_else(|| self.db.pool.clone()),
            self.publisher().await?,
            settings,
        ))
    }

    /// Enqueues `n` messages `prefix-0..n` to `routing_key`, committed in chunks of 1000.
    pub async fn enqueue(
        &self,
        prefix: &str,
        n: usize,
        routing_key: &str,
    ) -> anyhow::Result<Vec<i64>> {
        let mut ids = Vec::with_capacity(n);
        let all: Vec<OutboxMessage> = (0..n).map(|i| message(&format!("{prefix}-{i}"))).collect();
        for chunk in all.chunks(1000) {
            let mut tx = self.db.pool.begin().await?;
            ids.extend(outbox::enqueue_many(&mut tx, EXCHANGE, routing_key, chunk).await?);
            tx.commit().await?;
        }
        Ok(ids)
    }

    /// The publications recorded (one per row the drain deleted once it was confirmed).
    pub async fn publications(&self) -> anyhow::Result<i64> {
        Ok(sqlx::query_scalar("SELECT count(*) FROM publications")
            .fetch_one(&self.db.pool)
            .await?)
    }

    /// The outbox's rows by status: a published row is gone, so only what waits or failed.
    pub async fn statuses(&self) -> anyhow::Result<HashMap<String, i64>> {
        let rows: Vec<(String, i64)> =
            sqlx::query_as("SELECT status, count(*) FROM outbox GROUP BY status")
                .fetch_all(&self.db.pool)
                .await?;
        Ok(rows.into_iter().collect())
    }
}

pub fn message(id: &str) -> OutboxMessage {
    OutboxMessage::json(id, "order.placed", &serde_json::json!({ "id": id })).unwrap()
}

/// What a consumer has seen: deliveries per message id, and when each was first seen.
#[derive(Debug, Default)]
pub struct Seen {
    pub counts: HashMap<String, u32>,
    pub first_at: HashMap<String, Instant>,
    pub deliveries: u64,
    /// Effects applied through the guard (once per message id).
    pub effects: u64,
}

/// A consumer on `sink` that acks everything and records the message ids; with `guard`, it
/// applies an "effect" (a row in `effects`) once per message id through the
/// processed-message guard, in one transaction with the mark.
pub struct Recorder {
    pub seen: Arc<Mutex<Seen>>,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
    _connection: Connection,
}

impl Recorder {
    pub async fn start(env: &Env, guard: Option<PgPool>) -> anyhow::Result<Self> {
        if let Some(pool) = &guard {
            sqlx::query("CREATE TABLE IF NOT EXISTS effects (message_id text NOT NULL)")
                .execute(pool)
                .await?;
        }
        let connection = env.connection().await?;
        let channel = connection.create_channel().await?;
        channel.basic_qos(500, BasicQosOptions::default()).await?;
        let mut consumer = channel
            .basic_consume(
                QUEUE.into(),
                "recorder".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = CancellationToken::new();
        let task = {
            let seen = seen.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let guard_impl = ProcessedMessages::new();
                loop {
                    let delivery = tokio::select! {
                        () = stop.cancelled() => return,
                        d = consumer.next() => d,
                    };
                    let Some(Ok(delivery)) = delivery else { return };
                    let id = delivery
                        .properties
                        .message_id()
                        .as_ref()
                        .map(|s| s.to_string())
                        .unwrap_or_default();
                    if let Some(pool) = &guard {
                        let mut tx = pool.begin().await.unwrap();
                        if guard_impl.mark(&mut tx, "sink", &id).await.unwrap() {
                            sqlx::query("INSERT INTO effects (message_id) VALUES ($1)")
                                .bind(&id)
                                .execute(&mut *tx)
                                .await
                                .unwrap();
                            seen.lock().unwrap().effects += 1;
                        }
                        tx.commit().await.unwrap();
                    }
                    {
                        let mut seen = seen.lock().unwrap();
                        seen.deliveries += 1;
                        *seen.counts.entry(id.clone()).or_default() += 1;
                        seen.first_at.entry(id).or_insert_with(Instant::now);
                    }
                    let _ = delivery.ack(BasicAckOptions::default()).await;
                }
            })
        };
        Ok(Self {
            seen,
            stop,
            task: Some(task),
            _connection: connection,
        })
    }

    pub fn deliveries(&self) -> u64 {
        self.seen.lock().unwrap().deliveries
    }

    /// Waits until `done` holds for what was seen, up to `within`.
    pub async fn wait_until(
        &self,
        within: Duration,
        what: &str,
        done: impl Fn(&Seen) -> bool,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            if done(&self.seen.lock().unwrap()) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let seen = self.seen.lock().unwrap();
                anyhow::bail!(
                    "timed out waiting for {what}: {} deliveries of {} ids",
                    seen.deliveries,
                    seen.counts.len()
                );
            }
            tokio::time::sleep(ms(10)).await;
        }
    }

    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
    }
}

/// Ticks `drain` until a tick publishes nothing (and leaves nothing due), at most `max` ticks.
pub async fn tick_until_idle(drain: &OutboxDrain, max: usize) -> anyhow::Result<u64> {
    let busy = SkipIfBusy::new("outbox-drain");
    let ctx = WorkContext::new("outbox-drain", CancellationToken::new());
    let mut published = 0;
    for n in 0..max {
        match tick_once(
            drain,
            &busy,
            None::<&NoLease>,
            Duration::from_secs(60),
            &ctx.clone().with_tick(n as u64),
        )
        .await
        {
            TickOutcome::Ran(report) if report.items == 0 => return Ok(published),
            TickOutcome::Ran(report) => published += report.items,
            other => anyhow::bail!("tick {n}: {other:?}"),
        }
    }
    Ok(published)
}

/// A host-like loop: ticks on `every` and whenever `wake` is signalled, until `stop` fires.
/// Sends each tick's outcome to the returned receiver.
pub fn spawn_tick_loop(
    drain: Arc<OutboxDrain>,
    wake: Arc<Notify>,
    every: Duration,
    stop: CancellationToken,
) -> (
    tokio::task::JoinHandle<()>,
    mpsc::UnboundedReceiver<TickOutcome>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let busy = SkipIfBusy::new("outbox-drain");
        let mut n = 0u64;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = wake.notified() => {}
                () = tokio::time::sleep(every) => {}
            }
            n += 1;
            let ctx = WorkContext::new("outbox-drain", stop.child_token()).with_tick(n);
            let outcome = tick_once(
                drain.as_ref(),
                &busy,
                None::<&NoLease>,
                Duration::from_secs(30),
                &ctx,
            )
            .await;
            let _ = tx.send(outcome);
        }
    });
    (task, rx)
}
