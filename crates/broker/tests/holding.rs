//! What the runner holds, and for how long: a throttled delivery is parked at once rather
//! than waited out in memory, a handler in flight outlives a lost channel, and shutdown
//! finishes the deliveries already held instead of returning them to the queue.

// Helpers outside #[test] functions assert too: a failed expectation fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use common::*;
use lapin::options::BasicGetOptions;
use serde::Deserialize;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use worker_broker::consumer::{ConsumerRunner, Outcome};
use worker_broker::{Outgoing, Publisher, PublisherSettings, Supervisor};
use worker_core::{ConsumerJob, Failure, FailureClass, Handled, WorkContext};
use worker_store::{ProcessedMessages, classify};
use worker_testkit::{TestDb, TestVhost};

const WAIT: Duration = Duration::from_secs(20);

fn order(id: &str, behaviour: &str) -> Vec<u8> {
    format!(r#"{{"id":"{id}","behaviour":{behaviour}}}"#).into_bytes()
}

/// Twelve deliveries throttled for an hour, then an ordinary one, with two handlers: the
/// ordinary one is handled within seconds, the throttled ones wait in the longest tier.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_hour_long_throttle_is_parked_at_once_and_the_queue_keeps_flowing() -> anyhow::Result<()>
{
    let settings = worker_broker::ConsumerSettings {
        concurrency: 2,
        ..consumer_settings(5)
    };
    // No tier waits an hour: the longest one (two minutes) is taken.
    let mut h = Harness::start(queue_settings(&[1_000, 120_000], 5), settings).await?;
    let conn = h.connection().await?;
    let ch = conn.create_channel().await?;
    ch.confirm_select(Default::default()).await?;
    for i in 0..12 {
        let id = format!("slow{i}");
        let body = order(&id, r#"{"kind":"throttled","ms":3600000}"#);
        publish_raw(&ch, "commands", QUEUE, &body, properties(&id)).await?;
    }
    publish_raw(
        &ch,
        "commands",
        QUEUE,
        &order("ordinary", r#"{"kind":"ok"}"#),
        properties("ordinary"),
    )
    .await?;

    h.events
        .wait_for("ordinary", Duration::from_secs(10), |e| {
            e.iter().any(|e| e.outcome == Outcome::Succeeded)
        })
        .await?;
    let longest = h.queue().tiers[1].queue.clone();
    for i in 0..12 {
        let events = h
            .events
            .wait_for(&format!("slow{i}"), WAIT, |e| !e.is_empty())
            .await?;
        assert_eq!(
            events[0].outcome,
            Outcome::Parked {
                next_attempt: 2,
                tier: longest.clone(),
                class: FailureClass::Throttled
            }
        );
        assert_eq!(events[0].tries, 1, "no second try in process");
    }
    assert_eq!(
        depth(&ch, &longest).await?,
        12,
        "all twelve wait in {longest}"
    );
    h.stop().await
}

/// Messages ready in `queue`, as the broker says now (the management API lags).
async fn depth(ch: &lapin::Channel, queue: &str) -> anyhow::Result<u32> {
    let q = ch
        .queue_declare(
            queue.into(),
            lapin::options::QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            Default::default(),
        )
        .await?;
    Ok(q.message_count())
}

#[derive(Debug, Deserialize)]
struct Effect {
    id: String,
}

/// A slow effect in the shape of an SMTP send: a claim in a short transaction, four seconds
/// with no connection held, the outcome recorded with the guard's mark. A delivery that finds
/// the effect recorded is a duplicate; one that finds a claim in flight backs off.
#[derive(Clone)]
struct SlowEffect {
    pool: PgPool,
    guard: ProcessedMessages,
    started: Arc<AtomicU32>,
    cut: Arc<AtomicU32>,
}

impl ConsumerJob for SlowEffect {
    type Input = Effect;

    fn name(&self) -> &str {
        "effects"
    }

    async fn handle(&self, ctx: &WorkContext, input: &Effect) -> Result<Handled, Failure> {
        let done: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM effects WHERE id = $1)")
            .bind(&input.id)
            .fetch_one(&self.pool)
            .await
            .map_err(classify)?;
        if done {
            return Ok(Handled::Duplicate);
        }
        let claimed = sqlx::query("INSERT INTO claims (id) VALUES ($1) ON CONFLICT DO NOTHING")
            .bind(&input.id)
            .execute(&self.pool)
            .await
            .map_err(classify)?
            .rows_affected()
            == 1;
        if !claimed {
            return Err(Failure::transient("another handler has it in flight"));
        }
        self.started.fetch_add(1, Ordering::SeqCst);
        tokio::select! {
            () = ctx.cancel.cancelled() => {
                // Cut mid-effect: whether it happened is unknown, and the claim stays.
                self.cut.fetch_add(1, Ordering::SeqCst);
                return Err(Failure::unknown("cut short mid-effect"));
            }
            () = tokio::time::sleep(Duration::from_secs(4)) => {}
        }
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

/// The connection is closed while a four-second effect is in flight: the handler is not cut,
/// it records its effect, and the redelivery is answered as a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_in_flight_outlives_a_lost_connection() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    sqlx::query("CREATE TABLE effects (id text NOT NULL)")
        .execute(&db.pool)
        .await?;
    sqlx::query("CREATE TABLE claims (id text PRIMARY KEY)")
        .execute(&db.pool)
        .await?;
    let vhost = TestVhost::create().await?;
    let topology = topology(&queue_settings(&[300, 600], 10))?;
    let supervisor = Supervisor::new(connection_settings(&vhost)?, topology.clone());
    let shutdown = CancellationToken::new();
    let sup_task = tokio::spawn(supervisor.clone().run(shutdown.clone()));
    let job = SlowEffect {
        pool: db.pool.clone(),
        guard: ProcessedMessages::new(),
        started: Arc::default(),
        cut: Arc::default(),
    };
    let (started, cut) = (job.started.clone(), job.cut.clone());
    let events = Arc::new(Recorder::default());
    let settings = worker_broker::ConsumerSettings {
        timeout: Duration::from_secs(10),
        ..consumer_settings(10)
    };
    let runner =
        ConsumerRunner::observed(job, topology.queues[0].clone(), settings, events.clone());
    let consumer_task = {
        let (supervisor, shutdown) = (supervisor.clone(), shutdown.clone());
        tokio::spawn(async move { runner.run(&supervisor, shutdown).await })
    };
    let mut status = supervisor.status();
    tokio::time::timeout(WAIT, status.wait_for(|s| s.is_ready())).await??;

    let publisher = Publisher::new(supervisor.sessions(), PublisherSettings::default());
    publisher
        .publish(
            &Outgoing::json("commands", QUEUE, &serde_json::json!({"id": "m1"}))?
                .with_message_id("m1"),
        )
        .await?;
    let deadline = tokio::time::Instant::now() + WAIT;
    while started.load(Ordering::SeqCst) == 0 {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the effect never started"
        );
        tokio::time::sleep(ms(20)).await;
    }
    let name = vhost.name.clone();
    tokio::task::spawn_blocking(move || {
        rabbitmqctl(&["close_all_connections", "-p", &name, "holding test"])
    })
    .await??;

    // The redelivery ends as a duplicate once the first handler has recorded its effect.
    events
        .wait_for("m1", Duration::from_secs(30), |e| {
            e.iter().any(|e| e.outcome == Outcome::Duplicate)
        })
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "{e}; started {}, cut {}",
                started.load(Ordering::SeqCst),
                cut.load(Ordering::SeqCst)
            )
        })?;
    let effects: i64 = sqlx::query_scalar("SELECT count(*) FROM effects")
        .fetch_one(&db.pool)
        .await?;
    assert_eq!(effects, 1, "the effect is recorded once");
    assert_eq!(
        cut.load(Ordering::SeqCst),
        0,
        "the handler was not cut short"
    );
    assert_eq!(started.load(Ordering::SeqCst), 1, "the effect ran once");
    shutdown.cancel();
    tokio::time::timeout(WAIT, consumer_task).await??;
    tokio::time::timeout(WAIT, sup_task).await??;
    Ok(())
}

/// Shutdown within the settle deadline: every delivery the consumer held, started or only
/// prefetched, is finished and acked; the rest of the backlog was never delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_the_prefetched_deliveries_and_returns_none() -> anyhow::Result<()> {
    let mut h = Harness::start(queue_settings(&[200], 5), consumer_settings(5)).await?;
    let conn = h.connection().await?;
    let ch = conn.create_channel().await?;
    ch.confirm_select(Default::default()).await?;
    for i in 0..200 {
        let id = format!("s{i}");
        let body = order(&id, r#"{"kind":"sleep","ms":50}"#);
        publish_raw(&ch, "commands", QUEUE, &body, properties(&id)).await?;
    }
    h.events.wait_for("s0", WAIT, |e| !e.is_empty()).await?;
    h.stop().await?;
    let settled = h.events.settled.lock().unwrap().clone();
    let not_done: Vec<_> = settled
        .iter()
        .filter(|e| e.outcome != Outcome::Succeeded)
        .collect();
    assert!(not_done.is_empty(), "not finished: {not_done:?}");
    assert!(
        settled.len() < 200,
        "the test stopped too late to show anything"
    );
    // What is left in the queue was never delivered: nothing was returned.
    let mut left = 0;
    let mut returned = Vec::new();
    while let Some(m) = ch
        .basic_get(QUEUE.into(), BasicGetOptions { no_ack: true })
        .await?
    {
        left += 1;
        if m.delivery.redelivered {
            returned.push(m.delivery.properties.message_id().clone());
        }
    }
    assert_eq!(
        settled.len() + left,
        200,
        "settled {}, left {left}",
        settled.len()
    );
    assert!(returned.is_empty(), "returned to the queue: {returned:?}");
    Ok(())
}

/// One proxied connection: its mute switch and the task copying it.
type Link = (Arc<AtomicBool>, tokio::task::JoinHandle<()>);

/// A proxy to the local broker whose links can be muted towards the client (the broker gets
/// everything, the client hears nothing more: a confirm is lost on the way) and cut.
struct MutingProxy {
    port: u16,
    links: Arc<tokio::sync::Mutex<Vec<Link>>>,
}

impl MutingProxy {
    async fn start() -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let links: Arc<tokio::sync::Mutex<Vec<Link>>> = Arc::default();
        let accepted = links.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect("127.0.0.1:5672").await else {
                    continue;
                };
                let muted = Arc::new(AtomicBool::new(false));
                let task = tokio::spawn(link(client, server, muted.clone()));
                accepted.lock().await.push((muted, task));
            }
        });
        Ok(Self { port, links })
    }

    /// From now on, the current links pass nothing from the broker to the client.
    async fn mute(&self) {
        for (muted, _) in self.links.lock().await.iter() {
            muted.store(true, Ordering::SeqCst);
        }
    }

    /// Drops every current link, as a dead network would.
    async fn cut(&self) {
        for (_, task) in self.links.lock().await.drain(..) {
            task.abort();
        }
    }
}

async fn link(
    client: tokio::net::TcpStream,
    server: tokio::net::TcpStream,
    muted: Arc<AtomicBool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let up = async move {
        let _ = tokio::io::copy(&mut cr, &mut sw).await;
    };
    let down = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match sr.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if !muted.load(Ordering::SeqCst) && cw.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    tokio::join!(up, down);
}

/// Fails every first attempt; from the second on, applies the effect once under the guard.
/// The first call for `m1` mutes the proxy, so that its park's confirm never comes back.
#[derive(Clone)]
struct ParkThenApply {
    pool: PgPool,
    guard: ProcessedMessages,
    mute: Arc<tokio::sync::Notify>,
    muted_once: Arc<AtomicBool>,
    second_attempts: Arc<AtomicU32>,
}

impl ConsumerJob for ParkThenApply {
    type Input = Effect;

    fn name(&self) -> &str {
        "effects"
    }

    async fn handle(&self, ctx: &WorkContext, input: &Effect) -> Result<Handled, Failure> {
        if ctx.attempt == 1 {
            if input.id == "m1" && !self.muted_once.swap(true, Ordering::SeqCst) {
                self.mute.notify_one();
                // The proxy mutes before the park is published.
                tokio::time::sleep(ms(200)).await;
            }
            return Err(Failure::transient("not yet"));
        }
        self.second_attempts.fetch_add(1, Ordering::SeqCst);
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

/// A park whose confirm is lost with the connection: the parked copy reached its tier, and
/// the delivery, never acked, came back too, so the message exists twice. Nothing is lost,
/// and the job's guard answers the second copy as a duplicate: the effect happens once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_park_whose_confirm_is_lost_leaves_a_second_copy_that_the_guard_absorbs()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    sqlx::query("CREATE TABLE effects (id text NOT NULL)")
        .execute(&db.pool)
        .await?;
    let vhost = TestVhost::create().await?;
    let proxy = MutingProxy::start().await?;
    let topology = topology(&queue_settings(&[1_500], 10))?;
    let mut settings = connection_settings(&vhost)?;
    settings.addresses = vec![worker_broker::BrokerAddress::new("127.0.0.1", proxy.port)];
    let supervisor = Supervisor::new(settings, topology.clone());
    let shutdown = CancellationToken::new();
    let sup_task = tokio::spawn(supervisor.clone().run(shutdown.clone()));
    let job = ParkThenApply {
        pool: db.pool.clone(),
        guard: ProcessedMessages::new(),
        mute: Arc::default(),
        muted_once: Arc::default(),
        second_attempts: Arc::default(),
    };
    let (mute, second_attempts) = (job.mute.clone(), job.second_attempts.clone());
    let recorder = Arc::new(Recorder::default());
    let runner = ConsumerRunner::observed(
        job,
        topology.queues[0].clone(),
        consumer_settings(10),
        recorder.clone(),
    );
    let consumer_task = {
        let (supervisor, shutdown) = (supervisor.clone(), shutdown.clone());
        tokio::spawn(async move { runner.run(&supervisor, shutdown).await })
    };
    let mut status = supervisor.status();
    tokio::time::timeout(WAIT, status.wait_for(|s| s.is_ready())).await??;

    // A direct connection of the test's own, for publishing.
    let direct = connection_settings(&vhost)?.connect().await?;
    let ch = direct.create_channel().await?;
    ch.confirm_select(Default::default()).await?;
    let publish = |id: &'static str| {
        let ch = ch.clone();
        async move {
            let body = format!(r#"{{"id":"{id}"}}"#);
            publish_raw(&ch, "commands", QUEUE, body.as_bytes(), properties(id)).await
        }
    };
    // m0 and m0b open the runner's two publishing channels with parks of their own, so that
    // m1's park needs no answer from the broker to go out.
    for id in ["m0", "m0b"] {
        publish(id).await?;
        recorder.wait_for(id, WAIT, |e| !e.is_empty()).await?;
    }

    publish("m1").await?;
    tokio::time::timeout(WAIT, mute.notified()).await?;
    proxy.mute().await;
    // The park goes out and is routed to its tier; its confirm is swallowed. Then the link
    // dies, and the unacked delivery goes back to the queue.
    tokio::time::sleep(ms(1_000)).await;
    proxy.cut().await;

    let events = recorder
        .wait_for("m1", Duration::from_secs(30), |e| {
            e.iter().any(|e| e.outcome == Outcome::Succeeded)
                && e.iter().any(|e| e.outcome == Outcome::Duplicate)
        })
        .await?;
    eprintln!("m1: {events:?}");
    events
        .iter()
        .find(|e| e.outcome == Outcome::Requeued)
        .expect("the park's confirm was lost: the delivery went back to the queue");
    for id in ["m0", "m0b"] {
        recorder
            .wait_for(id, WAIT, |e| {
                e.iter().any(|e| e.outcome == Outcome::Succeeded)
            })
            .await?;
    }
    let effects: i64 = sqlx::query_scalar("SELECT count(*) FROM effects WHERE id = 'm1'")
        .fetch_one(&db.pool)
        .await?;
    assert_eq!(effects, 1, "the effect happened once");
    assert_eq!(
        second_attempts.load(Ordering::SeqCst),
        4,
        "m0 and m0b once each, and both copies of m1 at attempt 2"
    );
    assert_eq!(depth(&ch, &topology.queues[0].dead_queue).await?, 0);
    shutdown.cancel();
    tokio::time::timeout(WAIT, consumer_task).await??;
    tokio::time::timeout(WAIT, sup_task).await??;
    Ok(())
}

/// Shutdown with handlers that outlast the settle deadline: what finished is acked, the
/// handlers still running are cancelled at the deadline, and only they and the deliveries
/// never started go back to the queue; the runner stops soon after the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_settle_deadline_only_the_unfinished_go_back() -> anyhow::Result<()> {
    let settings = worker_broker::ConsumerSettings {
        prefetch: 10,
        concurrency: 2,
        settle_deadline: Duration::from_secs(1),
        ..consumer_settings(5)
    };
    let mut h = Harness::start(queue_settings(&[200], 5), settings).await?;
    let conn = h.connection().await?;
    let ch = conn.create_channel().await?;
    ch.confirm_select(Default::default()).await?;
    for id in ["q0", "q1"] {
        publish_raw(
            &ch,
            "commands",
            QUEUE,
            &order(id, r#"{"kind":"ok"}"#),
            properties(id),
        )
        .await?;
    }
    for i in 0..4 {
        let id = format!("s{i}");
        let body = order(&id, r#"{"kind":"sleep","ms":60000}"#);
        publish_raw(&ch, "commands", QUEUE, &body, properties(&id)).await?;
    }
    let deadline = tokio::time::Instant::now() + WAIT;
    while h.job.calls_for("s0").is_empty() || h.job.calls_for("s1").is_empty() {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "s0 and s1 never started"
        );
        tokio::time::sleep(ms(20)).await;
    }
    let stopping = tokio::time::Instant::now();
    h.stop().await?;
    let took = stopping.elapsed();
    assert!(
        took < Duration::from_secs(3),
        "stopped {took:?} after the shutdown"
    );
    for id in ["q0", "q1"] {
        assert_eq!(h.events.for_message(id)[0].outcome, Outcome::Succeeded);
    }
    for id in ["s0", "s1"] {
        assert_eq!(h.events.for_message(id)[0].outcome, Outcome::Abandoned);
    }
    for id in ["s2", "s3"] {
        assert!(h.job.calls_for(id).is_empty(), "{id} never started");
    }
    let mut back = Vec::new();
    while let Some(m) = ch
        .basic_get(QUEUE.into(), BasicGetOptions { no_ack: true })
        .await?
    {
        back.push(
            m.delivery
                .properties
                .message_id()
                .clone()
                .unwrap()
                .to_string(),
        );
    }
    back.sort();
    assert_eq!(
        back,
        ["s0", "s1", "s2", "s3"],
        "only the unfinished went back"
    );
    Ok(())
}
