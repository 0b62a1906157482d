//! Consume-and-ack throughput of the consumer runner against a bare lapin consumer, on the
//! local RabbitMQ (quorum queues, 1 KiB JSON messages, prefetch 100), printed as messages per
//! second and as a ratio:
//!
//! 1. no guard: the runner with a no-op handler vs a bare consumer that acks each message;
//! 2. with the guard: the runner with a handler that marks the message in PostgreSQL through
//!    the guard's batched path (`ProcessedMessages::mark_many`, coalesced across the handlers
//!    in flight) vs a bare consumer that does one insert (one commit) per message.
//!
//! ```text
//! cargo bench -p worker-broker --bench consume
//! BENCH_MESSAGES=20000 BENCH_ROUNDS=2 cargo bench -p worker-broker --bench consume
//! ```
//!
//! Needs the local services (`scripts/services.sh up`).
//!
//! Measured on the 2-core development machine (RabbitMQ 3.10.8, PostgreSQL 15, shared with
//! other builds, load average ~3.5), 20 000 messages, 2 rounds:
//!
//! | | bare lapin | runner | ratio |
//! |---|---|---|---|
//! | no guard (ack each / no-op handler, 8 in flight) | 5.0–5.2k msg/s | 16.1–16.7k msg/s | 3.1–3.3 |
//! | guard (insert each / batched `mark_many`, 64 in flight) | 0.4–1.2k msg/s | 7.1–7.3k msg/s | 5.7–20 |

// A benchmark program: a failure should stop it loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use lapin::Connection;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use serde::Deserialize;
use sqlx::PgPool;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use worker_broker::consumer::{ConsumerEvents, ConsumerRunner, ConsumerSettings, DeliveryReport};
use worker_broker::{
    ConnectionSettings, Outgoing, Publisher, PublisherSettings, QueueDefaults, QueueSettings,
    QueueTopology, Session, Topology, TopologySettings, declare,
};
use worker_core::{ConsumerJob, Failure, Handled, RetryPolicy, WorkContext};
use worker_store::ProcessedMessages;
use worker_testkit::{TestDb, TestVhost};

const PREFETCH: u16 = 100;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[derive(Debug, Deserialize)]
struct Message {
    id: String,
    #[allow(dead_code)]
    pad: String,
}

/// Fills `queue` (through the commands exchange) with `n` 1 KiB JSON messages.
async fn fill(publisher: &Publisher, routing_key: &str, n: usize, round: usize) {
    let pad = "x".repeat(1024 - 40);
    let all: Vec<Outgoing> = (0..n)
        .map(|i| {
            Outgoing::json(
                "commands",
                routing_key,
                &serde_json::json!({"id": format!("r{round}-m{i:07}"), "pad": pad}),
            )
            .unwrap()
        })
        .collect();
    for chunk in all.chunks(1000) {
        for r in publisher.publish_many(chunk).await {
            r.unwrap();
        }
    }
}

/// A bare lapin consumer: prefetch 100, one ack per message, optionally one insert per message.
async fn bare(connection: &Connection, queue: &str, n: usize, db: Option<&PgPool>) -> Duration {
    let channel = connection.create_channel().await.unwrap();
    channel
        .basic_qos(PREFETCH, BasicQosOptions::default())
        .await
        .unwrap();
    let started = Instant::now();
    let mut consumer = channel
        .basic_consume(
            queue.into(),
            "bare".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let mut seen = 0;
    while let Some(delivery) = consumer.next().await {
        let delivery = delivery.unwrap();
        if let Some(pool) = db {
            let id = format!("bare-{}-{}", queue, delivery.delivery_tag);
            sqlx::query("INSERT INTO processed_messages (scope, id) VALUES ('bench', $1) ON CONFLICT DO NOTHING")
                .bind(id)
                .execute(pool)
                .await
                .unwrap();
        }
        delivery.ack(BasicAckOptions::default()).await.unwrap();
        seen += 1;
        if seen == n {
            break;
        }
    }
    let elapsed = started.elapsed();
    let _ = channel.close(200, "done".into()).await;
    elapsed
}

/// Counts settled deliveries and wakes the bench at `n`.
struct Counter {
    settled: AtomicUsize,
    target: usize,
    done: Notify,
}

impl ConsumerEvents for Counter {
    fn on_settled(&self, _s: &DeliveryReport<'_>) {
        if self.settled.fetch_add(1, Ordering::Relaxed) + 1 == self.target {
            self.done.notify_one();
        }
    }
}

struct NoOp;

impl ConsumerJob for NoOp {
    type Input = Message;

    fn name(&self) -> &str {
        "bench-noop"
    }

    async fn handle(&self, _ctx: &WorkContext, _input: &Message) -> Result<Handled, Failure> {
        Ok(Handled::Done)
    }
}

/// Gathers the marks of the handlers in flight into one `mark_many` statement: the guard's
/// batched path, for a consumer whose only write is the mark.
#[derive(Clone)]
struct GuardBatcher {
    tx: mpsc::UnboundedSender<(String, oneshot::Sender<Result<bool, Failure>>)>,
}

impl GuardBatcher {
    fn start(pool: PgPool, scope: &'static str, max_batch: usize) -> Self {
        let (tx, mut rx) =
            mpsc::unbounded_channel::<(String, oneshot::Sender<Result<bool, Failure>>)>();
        tokio::spawn(async move {
            let guard = ProcessedMessages::new();
            while let Some(first) = rx.recv().await {
                let mut batch = vec![first];
                while batch.len() < max_batch {
                    match rx.try_recv() {
                        Ok(item) => batch.push(item),
                        Err(_) => break,
                    }
                }
                let ids: Vec<String> = batch.iter().map(|(id, _)| id.clone()).collect();
                let result = async {
                    let mut conn = pool.acquire().await.map_err(worker_store::classify)?;
                    guard.mark_many(&mut conn, scope, &ids).await
                }
                .await;
                match result {
                    Ok(fresh) => {
                        for ((_, reply), fresh) in batch.into_iter().zip(fresh) {
                            let _ = reply.send(Ok(fresh));
                        }
                    }
                    Err(failure) => {
                        for (_, reply) in batch {
                            let _ = reply.send(Err(failure.clone()));
                        }
                    }
                }
            }
        });
        Self { tx }
    }

    async fn mark(&self, id: &str) -> Result<bool, Failure> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send((id.to_string(), reply))
            .map_err(|_| Failure::transient("guard batcher gone"))?;
        answer
            .await
            .map_err(|_| Failure::transient("guard batcher gone"))?
    }
}

struct Guarded(GuardBatcher);

impl ConsumerJob for Guarded {
    type Input = Message;

    fn name(&self) -> &str {
        "bench-guarded"
    }

    async fn handle(&self, _ctx: &WorkContext, input: &Message) -> Result<Handled, Failure> {
        Ok(if self.0.mark(&input.id).await? {
            Handled::Done
        } else {
            Handled::Duplicate
        })
    }
}

async fn runner<J: ConsumerJob>(
    connection: Connection,
    job: J,
    queue: QueueTopology,
    concurrency: usize,
    n: usize,
) -> Duration {
    let counter = Arc::new(Counter {
        settled: AtomicUsize::new(0),
        target: n,
        done: Notify::new(),
    });
    let settings = ConsumerSettings {
        prefetch: PREFETCH,
        concurrency,
        retry: Some(RetryPolicy::no_retry()),
        ..ConsumerSettings::default()
    };
    let runner = ConsumerRunner::observed(job, queue, settings, counter.clone());
    let session = Session::new(connection);
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let task = {
        let shutdown = shutdown.clone();
        let session = session.clone();
        tokio::spawn(async move { runner.run_session(&session, &shutdown).await })
    };
    counter.done.notified().await;
    let elapsed = started.elapsed();
    shutdown.cancel();
    let _ = task.await;
    elapsed
}

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

#[tokio::main]
async fn main() {
    let n = env("BENCH_MESSAGES", 20_000);
    let rounds = env("BENCH_ROUNDS", 2);
    let vhost = TestVhost::create()
        .await
        .expect("RabbitMQ (scripts/services.sh up)");
    let db = TestDb::create()
        .await
        .expect("PostgreSQL (scripts/services.sh up)");
    let settings = ConnectionSettings {
        heartbeat: Duration::from_secs(30),
        ..ConnectionSettings::from_uri(&vhost.amqp_url()).unwrap()
    };

    let topo = TopologySettings::default();
    let queue = |name: &str| {
        QueueTopology::from_settings(
            &QueueSettings::default(),
            QueueDefaults::command(name, &topo),
        )
        .unwrap()
    };
    let (runner_q, guarded_q) = (queue("bench.runner"), queue("bench.guarded"));
    let topology = Topology::from_settings(&topo, [runner_q.clone(), guarded_q.clone()]).unwrap();
    let setup = settings.connect().await.unwrap();
    let channel = setup.create_channel().await.unwrap();
    declare(&channel, &topology).await.unwrap();
    // The bare consumers' queues: the same kind of queue (quorum, same arguments) as the runner's.
    for bare_q in ["bench.bare", "bench.bare-db"] {
        let mut args = FieldTable::default();
        args.insert(
            "x-queue-type".into(),
            lapin::types::AMQPValue::LongString("quorum".into()),
        );
        args.insert(
            "x-delivery-limit".into(),
            lapin::types::AMQPValue::LongLongInt(5),
        );
        channel
            .queue_declare(
                bare_q.into(),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                args,
            )
            .await
            .unwrap();
        channel
            .queue_bind(
                bare_q.into(),
                "commands".into(),
                bare_q.into(),
                Default::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
    }
    let publisher = Publisher::new(Session::new(setup).fixed(), PublisherSettings::default());

    println!(
        "{n} messages of 1 KiB per run, quorum queues, prefetch {PREFETCH}, {rounds} rounds\n"
    );
    let mut ratios = (Vec::new(), Vec::new());
    for round in 0..rounds {
        fill(&publisher, "bench.bare", n, round).await;
        let bare_t = bare(&settings.connect().await.unwrap(), "bench.bare", n, None).await;
        fill(&publisher, "bench.runner", n, round).await;
        let runner_t = runner(
            settings.connect().await.unwrap(),
            NoOp,
            runner_q.clone(),
            8,
            n,
        )
        .await;
        let (b, r) = (rate(n, bare_t), rate(n, runner_t));
        println!(
            "round {round} no guard:   bare lapin (ack each) {b:>8.0} msg/s | runner, no-op handler {r:>8.0} msg/s | ratio {:.2}",
            r / b
        );
        ratios.0.push(r / b);

        fill(&publisher, "bench.bare-db", n, round).await;
        let bare_t = bare(
            &settings.connect().await.unwrap(),
            "bench.bare-db",
            n,
            Some(&db.pool),
        )
        .await;
        fill(&publisher, "bench.guarded", n, round).await;
        let batcher = GuardBatcher::start(db.pool.clone(), "bench", 50);
        let runner_t = runner(
            settings.connect().await.unwrap(),
            Guarded(batcher),
            guarded_q.clone(),
            64,
            n,
        )
        .await;
        let (b, r) = (rate(n, bare_t), rate(n, runner_t));
        println!(
            "round {round} with guard: bare lapin (insert each) {b:>5.0} msg/s | runner, batched guard {r:>8.0} msg/s | ratio {:.2}",
            r / b
        );
        ratios.1.push(r / b);
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    println!(
        "\nmean ratio without guard {:.2} (target ≥ 1.0), with guard {:.2} (target ≥ 0.8)",
        mean(&ratios.0),
        mean(&ratios.1)
    );
}
