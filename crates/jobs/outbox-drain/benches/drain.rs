//! Drain throughput against bare confirmed publishing of the same messages, in the same run,
//! on the local services: `BENCH_ROWS` 1 KiB JSON messages to a quorum queue, printed as rows
//! per second and as a ratio (target: the drain at 0.8 of bare publishing or better).
//!
//! * **bare**: [`Publisher::publish_many`] in chunks of `BENCH_BATCH`, with `BENCH_IN_FLIGHT`
//!   chunks at once: pipelined, mandatory, confirmed; no database. Also with one chunk at a
//!   time, for reference.
//! * **drain**: the same messages enqueued in the outbox beforehand (not timed), then one
//!   [`OutboxDrain::drain`] with the same batch size and batches in flight: claim
//!   `FOR UPDATE SKIP LOCKED`, publish, delete (recording the publications), commit, per
//!   batch.
//! * **claim + delete**: the drain's database work alone (claim, delete, commit), for
//!   the ceiling PostgreSQL puts on it.
//!
//! Each run also prints the CPU it cost per 1000 rows (broker, this run's PostgreSQL backends,
//! this process, from `/proc`): on a small machine whose cores the broker, PostgreSQL and the
//! host share, the ratio follows the CPU ratio, since every core is busy. `BENCH_PROFILE=1`
//! adds the time of each step of a batch on one lane.
//!
//! ```text
//! cargo bench -p job-outbox-drain --bench drain
//! BENCH_ROWS=20000 BENCH_BATCH=500 BENCH_IN_FLIGHT=3 BENCH_ROUNDS=6 cargo bench -p job-outbox-drain --bench drain
//! ```
//!
//! Needs the local services (`scripts/services.sh up`).
//!
//! Each round also prints the two runs' CPU per row (broker, PostgreSQL and this process
//! together) as a ratio: where they share the cores, the rate ratio follows it. Figures, and
//! what they mean: `docs/SCALING.md`, "The outbox drain against bare publishing".

// A benchmark program: a failure should stop it loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use job_outbox_drain::{OutboxDrain, OutboxDrainSettings};
use lapin::options::{
    ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions, QueuePurgeOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Connection, ConnectionProperties, ExchangeKind};
use tokio_util::sync::CancellationToken;
use worker_broker::{Outgoing, Publisher, PublisherSettings, Session};
use worker_store::{OutboxMessage, outbox};
use worker_testkit::{TestDb, TestVhost};

const EXCHANGE: &str = "events";
const QUEUE: &str = "bench";
const ROUTING_KEY: &str = "bench.row";

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The `i`-th message of round `round`: about 1 KiB of JSON, with a traceparent header as an
/// enqueued row would carry.
fn message(round: usize, i: usize) -> OutboxMessage {
    let id = format!("r{round}-m{i:07}");
    let pad = "x".repeat(1024 - 40);
    OutboxMessage::json(
        id.clone(),
        "bench.row",
        &serde_json::json!({ "id": id, "pad": pad }),
    )
    .unwrap()
    .with_header(
        "traceparent",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    )
}

/// The same message as the drain would publish it.
fn outgoing(m: &OutboxMessage) -> Outgoing {
    let mut out = Outgoing::new(EXCHANGE, ROUTING_KEY, m.body.clone())
        .with_message_id(&m.message_id)
        .with_type(m.message_type.as_deref().unwrap_or_default());
    out.properties.content_type = Some("application/json".into());
    out.properties.timestamp = Some(0);
    out.properties.headers =
        job_outbox_drain::publish::headers_of(&serde_json::Value::Object(m.headers.clone()));
    out
}

async fn bare(
    publisher: &Publisher,
    messages: &[Outgoing],
    batch: usize,
    in_flight: usize,
) -> Duration {
    use futures::StreamExt;
    let started = Instant::now();
    // A sliding window of `in_flight` batches, each publish_many pipelined and confirmed.
    let mut results = futures::stream::iter(messages.chunks(batch))
        .map(|chunk| publisher.publish_many(chunk))
        .buffer_unordered(in_flight.max(1));
    while let Some(batch_results) = results.next().await {
        for r in batch_results {
            r.unwrap();
        }
    }
    started.elapsed()
}

async fn fill_outbox(db: &TestDb, messages: &[OutboxMessage]) {
    for chunk in messages.chunks(1000) {
        let mut tx = db.pool.begin().await.unwrap();
        outbox::enqueue_many(&mut tx, EXCHANGE, ROUTING_KEY, chunk)
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
    // A table fresh from a bulk insert draws autovacuum onto the run that follows; settle it
    // first, as a table in steady use would be.
    sqlx::query("VACUUM (ANALYZE) outbox")
        .execute(&db.pool)
        .await
        .unwrap();
}

/// The drain's database work alone: claim a batch, delete it (its publications recorded),
/// commit.
async fn claim_and_delete(drain: &OutboxDrain, batch: u32) -> (u64, Duration) {
    let started = Instant::now();
    let mut total = 0;
    loop {
        let mut tx = drain.begin().await.unwrap();
        let rows = outbox::claim(&mut tx, batch).await.unwrap();
        let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
        outbox::delete_published(&mut tx, &ids).await.unwrap();
        tx.commit().await.unwrap();
        total += ids.len() as u64;
        if ids.len() < batch as usize {
            return (total, started.elapsed());
        }
    }
}

/// One lane of batches with the time of each step, to show where a batch's time goes.
async fn profile(db: &TestDb, publisher: &Publisher, batch: u32) {
    let mut steps = [Duration::ZERO; 4];
    let mut n = 0u32;
    let cancel = CancellationToken::new();
    loop {
        let mut tx = db.pool.begin().await.unwrap();
        let t0 = Instant::now();
        let rows = outbox::claim(&mut tx, batch).await.unwrap();
        if rows.is_empty() {
            break;
        }
        let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
        let messages: Vec<Outgoing> = rows
            .into_iter()
            .map(job_outbox_drain::publish::to_outgoing)
            .collect();
        let t1 = Instant::now();
        let verdicts = job_outbox_drain::publish::publish_rows(publisher, &messages, &cancel).await;
        assert!(verdicts.iter().all(|v| v.is_published()));
        let t2 = Instant::now();
        outbox::delete_published(&mut tx, &ids).await.unwrap();
        let t3 = Instant::now();
        tx.commit().await.unwrap();
        for (step, took) in steps
            .iter_mut()
            .zip([t1 - t0, t2 - t1, t3 - t2, t3.elapsed()])
        {
            *step += took;
        }
        n += 1;
    }
    let n = n.max(1);
    println!(
        "  per batch, one lane: claim {:.2?}, publish {:.2?}, delete {:.2?}, commit {:.2?}",
        steps[0] / n,
        steps[1] / n,
        steps[2] / n,
        steps[3] / n
    );
}

/// CPU time (user + system, in clock ticks) of the broker, of this run's PostgreSQL backends
/// and of this process, read from `/proc`, to show where a run's CPU goes on a machine whose
/// cores they share. The broker is shared with whatever else runs on the machine.
#[derive(Debug, Clone, Copy, Default)]
struct Cpu {
    broker: u64,
    database: u64,
    this: u64,
}

impl Cpu {
    /// `database`: only the PostgreSQL backends serving this database are counted (the
    /// server is shared with other users of the machine).
    fn now(database: &str) -> Self {
        let mut cpu = Self::default();
        let ticks = |stat: &str| -> Option<(String, u64)> {
            let (_, rest) = stat.split_once(" (")?;
            let (comm, rest) = rest.rsplit_once(") ")?;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let utime: u64 = fields.get(11)?.parse().ok()?;
            let stime: u64 = fields.get(12)?.parse().ok()?;
            Some((comm.to_string(), utime + stime))
        };
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return cpu;
        };
        for entry in dir.flatten() {
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            if let Some((comm, t)) = ticks(&stat) {
                if comm == "beam.smp" {
                    cpu.broker += t;
                } else if comm == "postgres"
                    && std::fs::read(entry.path().join("cmdline"))
                        .is_ok_and(|c| String::from_utf8_lossy(&c).contains(database))
                {
                    cpu.database += t;
                }
            }
        }
        if let Ok(stat) = std::fs::read_to_string("/proc/self/stat") {
            cpu.this = ticks(&stat).map_or(0, |(_, t)| t);
        }
        cpu
    }

    /// CPU milliseconds per 1000 rows since `before`, of the three together.
    fn total_per_thousand(self, before: Self, rows: usize) -> f64 {
        let ticks = (self.broker + self.database + self.this)
            .saturating_sub(before.broker + before.database + before.this);
        (ticks * 10) as f64 * 1000.0 / rows as f64
    }

    /// CPU milliseconds per 1000 rows since `before`, assuming 100 ticks a second.
    fn per_thousand(self, before: Self, rows: usize) -> String {
        let ms = |a: u64, b: u64| (a.saturating_sub(b) * 10) as f64 * 1000.0 / rows as f64;
        format!(
            "CPU per 1000 rows: broker {:.0} ms, PostgreSQL {:.0} ms, this process {:.0} ms",
            ms(self.broker, before.broker),
            ms(self.database, before.database),
            ms(self.this, before.this)
        )
    }
}

fn rate(n: usize, took: Duration) -> f64 {
    n as f64 / took.as_secs_f64()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let rows = env("BENCH_ROWS", 20_000);
    let batch = env("BENCH_BATCH", 500);
    let in_flight = env("BENCH_IN_FLIGHT", 3);
    let rounds = env("BENCH_ROUNDS", 4);

    let db = TestDb::create().await.unwrap();
    let vhost = TestVhost::create().await.unwrap();
    let connection = Connection::connect(&vhost.amqp_url(), ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
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
        .await
        .unwrap();
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
        .await
        .unwrap();
    channel
        .queue_bind(
            QUEUE.into(),
            EXCHANGE.into(),
            "bench.*".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();

    let publisher_connection =
        Connection::connect(&vhost.amqp_url(), ConnectionProperties::default())
            .await
            .unwrap();
    let publisher = Publisher::new(
        Session::new(publisher_connection).fixed(),
        PublisherSettings {
            channels: in_flight.max(1),
            ..PublisherSettings::default()
        },
    );
    let settings = OutboxDrainSettings {
        batch_size: u32::try_from(batch).unwrap(),
        batches_in_flight: in_flight,
        ..OutboxDrainSettings::default()
    };
    let drain = OutboxDrain::new(db.pool.clone(), publisher.clone(), settings);

    println!(
        "{rows} rows of ~1 KiB to a quorum queue, batches of {batch}, {in_flight} in flight, {rounds} rounds"
    );
    let mut best_bare: f64 = 0.0;
    let mut best_drain: f64 = 0.0;
    let mut ratios = Vec::new();
    let mut cpu_ratios = Vec::new();
    // A warm-up round (a tenth of the rows, not reported) so that no run pays for first use.
    {
        let messages: Vec<OutboxMessage> = (0..rows / 10).map(|i| message(usize::MAX, i)).collect();
        let out: Vec<Outgoing> = messages.iter().map(outgoing).collect();
        bare(&publisher, &out, batch, in_flight).await;
        sqlx::query("TRUNCATE outbox")
            .execute(&db.pool)
            .await
            .unwrap();
        fill_outbox(&db, &messages).await;
        drain.drain(&CancellationToken::new()).await.unwrap();
        channel
            .queue_purge(QUEUE.into(), QueuePurgeOptions::default())
            .await
            .unwrap();
    }
    for round in 0..rounds {
        let messages: Vec<OutboxMessage> = (0..rows).map(|i| message(round, i)).collect();
        let out: Vec<Outgoing> = messages.iter().map(outgoing).collect();

        // Alternate the order, so that neither always runs on a warmer broker.
        let mut bare_rate = 0.0;
        let mut drain_rate = 0.0;
        let mut bare_cpu_total = 0.0;
        let mut drain_cpu_total = 0.0;
        for which in if round % 2 == 0 { [0, 1] } else { [1, 0] } {
            if which == 0 {
                let cpu = Cpu::now(&db.name);
                let took = bare(&publisher, &out, batch, in_flight).await;
                bare_rate = rate(rows, took);
                let after = Cpu::now(&db.name);
                bare_cpu_total = after.total_per_thousand(cpu, rows);
                let bare_cpu = after.per_thousand(cpu, rows);
                let took1 = {
                    channel
                        .queue_purge(QUEUE.into(), QueuePurgeOptions::default())
                        .await
                        .unwrap();
                    bare(&publisher, &out, batch, 1).await
                };
                println!(
                    "round {round}: bare publish_many   {:>8.0} rows/s ({took:.2?}); one batch at a time {:>8.0} rows/s",
                    bare_rate,
                    rate(rows, took1)
                );
                println!("  bare: {bare_cpu}");
            } else {
                sqlx::query("TRUNCATE outbox")
                    .execute(&db.pool)
                    .await
                    .unwrap();
                fill_outbox(&db, &messages).await;
                let cpu = Cpu::now(&db.name);
                let started = Instant::now();
                let report = drain.drain(&CancellationToken::new()).await.unwrap();
                let took = started.elapsed();
                let after = Cpu::now(&db.name);
                drain_cpu_total = after.total_per_thousand(cpu, rows);
                let drain_cpu = after.per_thousand(cpu, rows);
                assert_eq!(report.published, rows as u64, "{report:?}");
                drain_rate = rate(rows, took);
                println!(
                    "round {round}: outbox drain        {:>8.0} rows/s ({took:.2?})",
                    drain_rate
                );
                println!("  drain: {drain_cpu}");
            }
            channel
                .queue_purge(QUEUE.into(), QueuePurgeOptions::default())
                .await
                .unwrap();
        }
        // On cores shared by the broker, PostgreSQL and the publisher, a run's rate follows
        // its CPU per row: the second ratio says how much of the first is that.
        println!(
            "round {round}: ratio drain / bare   {:.2} (CPU per row, bare / drain: {:.2})",
            drain_rate / bare_rate,
            bare_cpu_total / drain_cpu_total.max(f64::MIN_POSITIVE)
        );
        ratios.push(drain_rate / bare_rate);
        cpu_ratios.push(bare_cpu_total / drain_cpu_total.max(f64::MIN_POSITIVE));
        best_bare = best_bare.max(bare_rate);
        best_drain = best_drain.max(drain_rate);

        if std::env::var_os("BENCH_PROFILE").is_some() {
            sqlx::query("TRUNCATE outbox")
                .execute(&db.pool)
                .await
                .unwrap();
            fill_outbox(&db, &messages).await;
            profile(&db, &publisher, u32::try_from(batch).unwrap()).await;
            channel
                .queue_purge(QUEUE.into(), QueuePurgeOptions::default())
                .await
                .unwrap();
        }
        sqlx::query("TRUNCATE outbox")
            .execute(&db.pool)
            .await
            .unwrap();
        fill_outbox(&db, &messages).await;
        let cpu = Cpu::now(&db.name);
        let (deleted, took) = claim_and_delete(&drain, u32::try_from(batch).unwrap()).await;
        assert_eq!(deleted, rows as u64);
        println!(
            "  claim + delete: {}",
            Cpu::now(&db.name).per_thousand(cpu, rows)
        );
        println!(
            "round {round}: claim + delete only {:>8.0} rows/s ({took:.2?}, one worker, no publish)",
            rate(rows, took)
        );
    }
    ratios.sort_by(f64::total_cmp);
    cpu_ratios.sort_by(f64::total_cmp);
    println!(
        "best: bare {best_bare:.0} rows/s, drain {best_drain:.0} rows/s, ratio of bests {:.2}; \
         median ratio of the rounds {:.2}; median CPU ratio (bare / drain) {:.2}",
        best_drain / best_bare,
        ratios[ratios.len() / 2],
        cpu_ratios[cpu_ratios.len() / 2]
    );
}
