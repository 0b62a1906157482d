//! The dead-letter archive on the real services: each test has a database and a vhost of its
//! own (worker-testkit), the topology of two consumer queues (`orders`, `invoices`) declared
//! by a real supervisor, and bounded waits only.

// Test support: a failed expectation should fail the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use futures::StreamExt;
use job_dead_letter_archive::*;
use lapin::options::{
    BasicConsumeOptions, BasicGetOptions, BasicNackOptions, BasicQosOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Connection};
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use worker_broker::consumer::{
    DEAD_AT_HEADER, DEAD_ATTEMPTS_HEADER, DEAD_CLASS_HEADER, DEAD_ERROR_HEADER, DEAD_QUEUE_HEADER,
    DEAD_REASON_HEADER,
};
use worker_broker::{
    ConnectionSettings, Outgoing, Properties, Publisher, PublisherSettings, QueueDefaults,
    QueueSettings, QueueTopology, Session, Supervisor, Topology, TopologySettings,
};
use worker_core::Failure;
use worker_testkit::{TestDb, TestVhost};

const ORDERS: &str = "orders";
const INVOICES: &str = "invoices";

struct Harness {
    // Dropped last: the database and vhost outlive every task.
    db: TestDb,
    vhost: TestVhost,
    topology: Topology,
    supervisor: Supervisor,
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    events: Arc<Counts>,
}

impl Harness {
    async fn start(delivery_limit: u32) -> anyhow::Result<Self> {
        let db = TestDb::create().await?;
        let vhost = TestVhost::create().await?;
        let topo = TopologySettings::default();
        let settings = QueueSettings {
            delivery_limit,
            retry_tiers: vec![Duration::from_secs(60)],
            ..QueueSettings::default()
        };
        let queues = [ORDERS, INVOICES]
            .map(|q| QueueTopology::from_settings(&settings, QueueDefaults::command(q, &topo)));
        let [orders, invoices] = queues;
        let topology = Topology::from_settings(&topo, [orders?, invoices?])?;
        let supervisor = Supervisor::new(connection_settings(&vhost)?, topology.clone());
        let shutdown = CancellationToken::new();
        let tasks = vec![tokio::spawn(supervisor.clone().run(shutdown.clone()))];
        let mut status = supervisor.status();
        tokio::time::timeout(Duration::from_secs(15), status.wait_for(|s| s.is_ready()))
            .await
            .context("the supervisor did not connect in time")??;
        Ok(Self {
            db,
            vhost,
            topology,
            supervisor,
            shutdown,
            tasks,
            events: Arc::new(Counts::default()),
        })
    }

    fn pool(&self) -> &PgPool {
        &self.db.pool
    }

    fn publisher(&self) -> Publisher {
        self.supervisor.publisher(PublisherSettings::default())
    }

    fn archiver(&self) -> Archiver {
        Archiver::observed(self.pool().clone(), fast_settings(), self.events.clone())
    }

    /// Runs the archiver on every dead queue of the topology.
    fn start_archiver(&mut self) {
        let archiver = self.archiver();
        for dead in dead_queues(&self.topology) {
            let (archiver, supervisor, token) = (
                archiver.clone(),
                self.supervisor.clone(),
                self.shutdown.clone(),
            );
            self.tasks.push(tokio::spawn(async move {
                archiver.run(&supervisor, dead, token).await;
            }));
        }
    }

    async fn connection(&self) -> anyhow::Result<Connection> {
        Ok(connection_settings(&self.vhost)?.connect().await?)
    }

    async fn stop(mut self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        for task in self.tasks.drain(..) {
            tokio::time::timeout(Duration::from_secs(20), task)
                .await
                .context("a task did not stop in time")??;
        }
        Ok(())
    }
}

fn connection_settings(vhost: &TestVhost) -> anyhow::Result<ConnectionSettings> {
    let mut settings = ConnectionSettings::from_uri(&vhost.amqp_url())?;
    settings.reconnect_min = Duration::from_millis(100);
    settings.reconnect_max = Duration::from_secs(1);
    settings.close_wait = Duration::from_secs(2);
    settings.connection_name = format!("dead-letter-archive-test {}", vhost.name);
    Ok(settings)
}

fn fast_settings() -> ArchiverSettings {
    ArchiverSettings {
        prefetch: 200,
        batch: 100,
        batch_wait: Duration::from_millis(20),
        insert_timeout: Duration::from_secs(10),
        retry_max: Duration::from_millis(500),
        ..ArchiverSettings::default()
    }
}

/// Sums what the archiver reported.
#[derive(Debug, Default)]
struct Counts {
    inserted: AtomicU64,
    duplicates: AtomicU64,
}

impl ArchiveEvents for Counts {
    fn on_archived(&self, _dead_queue: &str, report: &InsertReport) {
        self.inserted.fetch_add(report.inserted, Ordering::SeqCst);
        self.duplicates
            .fetch_add(report.duplicates, Ordering::SeqCst);
    }
}

fn text(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

/// A dead letter as the consumer runner publishes it to `Q.dead`.
fn runner_dead_letter(
    queue: &str,
    message_id: &str,
    reason: &str,
    class: &str,
    attempts: i64,
    error: &str,
) -> Outgoing {
    let body = serde_json::to_vec(&serde_json::json!({"id": message_id})).unwrap();
    let mut out = Outgoing::new(format!("{queue}.dead"), queue, body)
        .with_message_id(message_id)
        .with_type("order.placed")
        .with_correlation_id(&format!("c-{message_id}"));
    out.properties.content_type = Some("application/json".into());
    out.properties.timestamp = Some(1_800_000_000);
    out.with_header(DEAD_REASON_HEADER, text(reason))
        .with_header(DEAD_ATTEMPTS_HEADER, AMQPValue::LongLongInt(attempts))
        .with_header(DEAD_ERROR_HEADER, text(error))
        .with_header(DEAD_CLASS_HEADER, text(class))
        .with_header(DEAD_QUEUE_HEADER, text(queue))
        .with_header(
            DEAD_AT_HEADER,
            text(&chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
        )
        .with_header("x-tenant", AMQPValue::LongInt(7))
        .with_header(
            "traceparent",
            text("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        )
}

async fn publish_all(publisher: &Publisher, messages: &[Outgoing]) -> anyhow::Result<()> {
    for chunk in messages.chunks(200) {
        for (i, result) in publisher.publish_many(chunk).await.into_iter().enumerate() {
            result.with_context(|| format!("publishing {:?}", chunk[i]))?;
        }
    }
    Ok(())
}

async fn archived(pool: &PgPool) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar("SELECT count(*) FROM dead_letters")
        .fetch_one(pool)
        .await?)
}

/// Waits (bounded) until the archive holds `n` rows.
async fn wait_archived(pool: &PgPool, n: i64, within: Duration) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let have = archived(pool).await?;
        if have == n {
            return Ok(());
        }
        if have > n || tokio::time::Instant::now() > deadline {
            bail!("the archive holds {have} rows, expected {n} (within {within:?})");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Messages ready in `queue` (passive declare: exact, unlike the management API's sample).
async fn ready(conn: &Connection, queue: &str) -> anyhow::Result<u32> {
    let ch = conn.create_channel().await?;
    let q = ch
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await?;
    let _ = ch.close(200, "done".into()).await;
    Ok(q.message_count())
}

/// Takes every message from `queue` (acking each), bounded.
async fn drain(
    conn: &Connection,
    queue: &str,
) -> anyhow::Result<Vec<lapin::message::BasicGetMessage>> {
    let ch = conn.create_channel().await?;
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while let Some(m) = ch
        .basic_get(queue.into(), BasicGetOptions { no_ack: true })
        .await?
    {
        out.push(m);
        if tokio::time::Instant::now() > deadline {
            bail!("{queue} did not drain within 30 s");
        }
    }
    let _ = ch.close(200, "done".into()).await;
    Ok(out)
}

fn header<'a>(props: &'a BasicProperties, key: &str) -> Option<&'a AMQPValue> {
    props.headers().as_ref()?.inner().get(key)
}

fn actor() -> Actor {
    Actor::new("ops-test", "test-host")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_dead_letters_of_three_causes_are_listed_shown_and_replayed_once()
-> anyhow::Result<()> {
    let mut h = Harness::start(5).await?;
    let publisher = h.publisher();

    // Three causes, each with texts that differ only in ids, numbers and addresses:
    // A rejected (orders, 400), B gave-up (orders 150 + invoices 150), C malformed (invoices, 300).
    let mut messages = Vec::new();
    let mut cause_of: HashMap<String, char> = HashMap::new();
    for i in 0..1000u32 {
        let id = format!("m-{i:04}");
        let (queue, cause, reason, class, attempts, error) = match i {
            0..400 => (
                ORDERS,
                'A',
                "rejected",
                "permanent",
                1,
                format!(
                    "smtp 550: mailbox user{i}@example{}.com unavailable (message {})",
                    i % 7,
                    uuid::Uuid::new_v4()
                ),
            ),
            400..700 => (
                if i.is_multiple_of(2) {
                    ORDERS
                } else {
                    INVOICES
                },
                'B',
                "gave-up",
                "transient",
                5,
                format!(
                    "connection to 10.0.{}.{}:5432 timed out after {} ms",
                    i % 3,
                    i % 250,
                    1000 + i
                ),
            ),
            _ => (
                INVOICES,
                'C',
                "malformed",
                "malformed",
                1,
                format!(
                    "malformed: the body is not a valid Invoice: at line 1 column {}",
                    i
                ),
            ),
        };
        cause_of.insert(id.clone(), cause);
        messages.push(runner_dead_letter(
            queue, &id, reason, class, attempts, &error,
        ));
    }
    publish_all(&publisher, &messages).await?;

    h.start_archiver();
    wait_archived(h.pool(), 1000, Duration::from_secs(60)).await?;
    let conn = h.connection().await?;
    for dead in ["orders.dead", "invoices.dead"] {
        assert_eq!(ready(&conn, dead).await?, 0, "{dead} is emptied");
    }

    // dlq list: per queue, the counts and three fingerprints in all with the right counts.
    let queues = list(h.pool()).await?;
    let by_queue: BTreeMap<&str, &QueueSummary> =
        queues.iter().map(|q| (q.queue.as_str(), q)).collect();
    assert_eq!(by_queue.len(), 2, "{queues:#?}");
    assert_eq!(by_queue[ORDERS].dead, 550);
    assert_eq!(by_queue[INVOICES].dead, 450);
    assert!(by_queue[ORDERS].oldest <= by_queue[ORDERS].newest);
    let mut counts: BTreeMap<String, (i64, String)> = BTreeMap::new();
    for q in &queues {
        for fp in &q.top_fingerprints {
            let entry = counts
                .entry(fp.fingerprint.clone())
                .or_insert((0, fp.normalized.clone()));
            entry.0 += fp.count;
        }
    }
    assert_eq!(counts.len(), 3, "{counts:#?}");
    let fp_of = |needle: &str| -> (String, i64) {
        let (fp, (n, _)) = counts
            .iter()
            .find(|(_, (_, text))| text.contains(needle))
            .unwrap_or_else(|| panic!("no fingerprint for {needle}: {counts:#?}"));
        (fp.clone(), *n)
    };
    let (fp_a, n_a) = fp_of("mailbox <email> unavailable (message <uuid>)");
    let (fp_b, n_b) = fp_of("connection to <ip> timed out after <n> ms");
    let (fp_c, n_c) = fp_of("column <n>");
    assert_eq!((n_a, n_b, n_c), (400, 300, 300));
    assert_eq!(
        by_queue[ORDERS]
            .top_fingerprints
            .iter()
            .map(|f| (f.fingerprint.clone(), f.count))
            .collect::<Vec<_>>(),
        vec![(fp_a.clone(), 400), (fp_b.clone(), 150)],
        "most frequent first"
    );
    assert_eq!(
        by_queue[INVOICES]
            .top_fingerprints
            .iter()
            .map(|f| (f.fingerprint.clone(), f.count))
            .collect::<Vec<_>>(),
        vec![(fp_c, 300), (fp_b.clone(), 150)],
    );

    // dlq show --fingerprint: one cause's messages, each with its reason, attempts, error
    // and a bounded preview.
    let shown = show(
        h.pool(),
        &Filter {
            fingerprint: Some(fp_b.clone()),
            limit: Some(1000),
            ..Filter::default()
        },
    )
    .await?;
    assert_eq!(shown.len(), 300);
    for row in &shown {
        let id = row.message_id.clone().unwrap();
        assert_eq!(cause_of[&id], 'B', "{row:?}");
        assert_eq!(row.reason, "gave-up");
        assert_eq!(row.attempts, Some(5));
        assert_eq!(row.class.as_deref(), Some("transient"));
        assert!(row.error.as_deref().unwrap().contains("timed out"));
        assert_eq!(row.body_preview, format!(r#"{{"id":"{id}"}}"#));
        assert_eq!(row.message_type.as_deref(), Some("order.placed"));
    }
    let prefix = show(
        h.pool(),
        &Filter {
            fingerprint: Some(fp_a[..6].to_string()),
            queue: Some(ORDERS.into()),
            reason: Some("rejected".into()),
            since: Some(chrono::Utc::now() - chrono::Duration::hours(1)),
            limit: Some(10),
            ..Filter::default()
        },
    )
    .await?;
    assert_eq!(prefix.len(), 10, "a fingerprint prefix and a limit");

    // dlq show ID: whole, with every header and property.
    let one = show_one(h.pool(), shown[0].id).await?.context("show_one")?;
    assert_eq!(one.headers[DEAD_REASON_HEADER], "gave-up");
    assert_eq!(one.headers["x-tenant"], 7);
    assert_eq!(
        one.properties["correlation_id"],
        format!("c-{}", one.message_id.clone().unwrap())
    );
    assert_eq!(
        one.body_text.as_deref(),
        Some(shown[0].body_preview.as_str())
    );
    assert_eq!(one.source, "runner");
    assert_eq!(
        one.dead_queue.as_deref(),
        Some(format!("{}.dead", one.queue).as_str())
    );

    // dlq replay --fingerprint B --dry-run: lists them, moves nothing, is recorded as a dry run.
    let by_b = Filter {
        fingerprint: Some(fp_b.clone()),
        ..Filter::default()
    };
    let plan = replay(h.pool(), &publisher, &by_b, true, None, &actor()).await?;
    assert_eq!((plan.matched, plan.replayed, plan.failed), (300, 0, 0));
    assert_eq!(plan.items.len(), 300);
    assert!(
        plan.items
            .iter()
            .all(|i| i.outcome == ItemOutcome::WouldReplay)
    );

    assert_eq!(
        ready(&conn, ORDERS).await? + ready(&conn, INVOICES).await?,
        0
    );
    assert_eq!(
        count(h.pool(), &Filter::default()).await?,
        1000,
        "all still dead"
    );
    let recorded = actions(h.pool(), 10).await?;
    assert_eq!(recorded.len(), 1);
    assert_eq!(recorded[0].id, plan.action_id);
    assert!(recorded[0].dry_run);
    assert_eq!(
        (recorded[0].matched, recorded[0].succeeded),
        (300, 0),
        "what it would have moved"
    );

    // After "the fix": replay B at a bounded rate, then everything else.
    let started = std::time::Instant::now();
    let done = replay(h.pool(), &publisher, &by_b, false, Some(400), &actor()).await?;
    let took = started.elapsed();
    assert_eq!((done.matched, done.replayed, done.failed), (300, 300, 0));
    assert!(
        took >= Duration::from_millis(600),
        "300 messages at 400/s take about 0.75 s, took {took:?}"
    );
    let rest = replay(
        h.pool(),
        &publisher,
        &Filter::default(),
        false,
        None,
        &actor(),
    )
    .await?;
    assert_eq!((rest.matched, rest.replayed, rest.failed), (700, 700, 0));
    let again = replay(
        h.pool(),
        &publisher,
        &Filter::default(),
        false,
        None,
        &actor(),
    )
    .await?;
    assert_eq!(again.matched, 0, "a replayed row is never sent again");

    // Each message exactly once, in its original queue, attempt reset, with where it came from.
    let mut seen: HashMap<String, u32> = HashMap::new();
    for queue in [ORDERS, INVOICES] {
        let got = drain(&conn, queue).await?;
        for m in &got {
            let id = m
                .delivery
                .properties
                .message_id()
                .clone()
                .unwrap()
                .to_string();
            *seen.entry(id.clone()).or_default() += 1;
            let expected_queue = match cause_of[&id] {
                'A' => ORDERS,
                'C' => INVOICES,
                _ => {
                    let i: u32 = id[2..].parse()?;
                    if i.is_multiple_of(2) {
                        ORDERS
                    } else {
                        INVOICES
                    }
                }
            };
            assert_eq!(queue, expected_queue, "{id}");
            let props = &m.delivery.properties;
            assert!(matches!(
                header(props, REPLAYED_FROM_HEADER),
                Some(AMQPValue::LongLongInt(_))
            ));
            assert!(header(props, DEAD_REASON_HEADER).is_none());
            assert!(header(props, DEAD_ERROR_HEADER).is_none());
            assert!(header(props, "x-attempt").is_none());
            assert_eq!(header(props, "x-tenant"), Some(&AMQPValue::LongInt(7)));
            assert_eq!(
                props.kind().as_ref().map(|k| k.as_str()),
                Some("order.placed")
            );
            assert_eq!(props.timestamp(), &Some(1_800_000_000));
            assert_eq!(
                &m.delivery.data[..],
                serde_json::to_vec(&serde_json::json!({"id": id}))?.as_slice()
            );
        }
    }
    assert_eq!(seen.len(), 1000);
    assert!(
        seen.values().all(|&n| n == 1),
        "each delivered exactly once"
    );

    // Nothing left the archive: every row is still there, marked replayed.
    assert_eq!(archived(h.pool()).await?, 1000);
    let statuses: Vec<(String, i64)> =
        sqlx::query_as("SELECT status, count(*) FROM dead_letters GROUP BY status")
            .fetch_all(h.pool())
            .await?;
    assert_eq!(statuses, vec![("replayed".to_string(), 1000)]);
    assert_eq!(
        list(h.pool())
            .await?
            .iter()
            .map(|q| q.replayed)
            .sum::<i64>(),
        1000
    );

    // Each replay is recorded: who, where, which filter, how many.
    let recorded = actions(h.pool(), 10).await?;
    assert_eq!(recorded.len(), 4, "the dry run and three replays");
    let first = &recorded[recorded.len() - 2];
    assert!(!first.dry_run);
    assert_eq!(first.action, "replay");
    assert_eq!(
        (first.actor_user.as_str(), first.actor_host.as_str()),
        ("ops-test", "test-host")
    );
    assert_eq!(first.filter, serde_json::json!({"fingerprint": fp_b}));
    assert_eq!(
        (first.matched, first.succeeded, first.failed),
        (300, 300, 0)
    );
    assert_eq!(first.rate, Some(400));
    assert!(first.finished_at.is_some());
    assert_eq!(h.events.inserted.load(Ordering::SeqCst), 1000);
    h.stop().await
}

/// Panics in the archiver's own loop right after its first batch commits, before the ack:
/// the task dies as a killed process would, with the batch unacked.
#[derive(Debug, Default)]
struct CrashAfterCommit {
    crashed: AtomicBool,
}

impl ArchiveEvents for CrashAfterCommit {
    fn on_archived(&self, _dead_queue: &str, _report: &InsertReport) {
        if !self.crashed.swap(true, Ordering::SeqCst) {
            panic!("simulated crash between the commit and the ack");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_between_the_insert_and_the_ack_a_message_is_archived_once() -> anyhow::Result<()> {
    let mut h = Harness::start(5).await?;
    let publisher = h.publisher();
    let first: Vec<Outgoing> = (0..30)
        .map(|i| {
            runner_dead_letter(
                ORDERS,
                &format!("k-{i}"),
                "rejected",
                "permanent",
                1,
                &format!("order {i} refused"),
            )
        })
        .collect();
    publish_all(&publisher, &first).await?;
    let dead = DeadQueue::new("orders.dead", ORDERS);

    // 1. The real consume loop, on a connection of its own, crashes after its commit.
    let crash = Arc::new(CrashAfterCommit::default());
    let doomed = Archiver::observed(h.pool().clone(), fast_settings(), crash.clone());
    let own = Session::new(h.connection().await?);
    let task = {
        let (session, dead, token) = (own.clone(), dead.clone(), CancellationToken::new());
        tokio::spawn(async move { doomed.run_session(&session, &dead, &token).await })
    };
    let crashed = tokio::time::timeout(Duration::from_secs(20), task).await?;
    assert!(
        crashed.is_err_and(|e| e.is_panic()),
        "the archiver died after its commit"
    );
    let committed = archived(h.pool()).await?;
    assert!(committed > 0, "its batch was committed");
    // The process is gone: its connection closes and the broker requeues the unacked batch.
    own.connection().close(200, "killed".into()).await?;

    // 2. The step itself, driven by hand on a consumer that then goes away without acking.
    let more: Vec<Outgoing> = (30..40)
        .map(|i| {
            runner_dead_letter(
                ORDERS,
                &format!("k-{i}"),
                "rejected",
                "permanent",
                1,
                &format!("order {i} refused"),
            )
        })
        .collect();
    publish_all(&publisher, &more).await?;
    let conn = h.connection().await?;
    let ch = conn.create_channel().await?;
    ch.basic_qos(100, BasicQosOptions::default()).await?;
    let mut consumer = ch
        .basic_consume(
            "orders.dead".into(),
            "by-hand".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut got = Vec::new();
    while got.len() < 40 {
        let d = tokio::time::timeout(Duration::from_secs(10), consumer.next())
            .await
            .context("waiting for the redelivered dead letters")?
            .context("consumer ended")??;
        got.push(d);
    }
    assert!(
        got.iter().filter(|d| d.redelivered).count() as i64 >= 30,
        "the crashed batch came back"
    );
    let got: Vec<worker_broker::Delivery> = got.into_iter().map(Into::into).collect();
    let raw: Vec<RawMessage<'_>> = got.iter().map(RawMessage::from).collect();
    let step = h.archiver().archive_batch(&dead, &raw).await?;
    assert_eq!(
        step.inserted,
        40 - committed as u64,
        "only what the crash had not archived"
    );
    assert_eq!(step.duplicates, committed as u64);
    assert_eq!(archived(h.pool()).await?, 40);
    ch.close(200, "killed before the ack".into()).await?;

    // 3. The archiver that takes over sees all 40 redelivered and archives none twice.
    h.start_archiver();
    let conn2 = h.connection().await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while h.events.duplicates.load(Ordering::SeqCst) < 40 {
        if tokio::time::Instant::now() > deadline {
            bail!(
                "the redelivered dead letters were not settled: {:?}",
                h.events
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(h.events.inserted.load(Ordering::SeqCst), 0);
    assert_eq!(archived(h.pool()).await?, 40, "archived once, not twice");
    let keys: i64 = sqlx::query_scalar("SELECT count(DISTINCT message_id) FROM dead_letters")
        .fetch_one(h.pool())
        .await?;
    assert_eq!(keys, 40);
    assert_eq!(ready(&conn2, "orders.dead").await?, 0);

    // And it goes on archiving new ones.
    publish_all(
        &publisher,
        &[runner_dead_letter(
            ORDERS,
            "k-new",
            "gave-up",
            "transient",
            5,
            "x",
        )],
    )
    .await?;
    wait_archived(h.pool(), 41, Duration::from_secs(10)).await?;
    h.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_dead_letters_unknown_ones_and_failed_outbox_rows_are_archived_and_replayable()
-> anyhow::Result<()> {
    let mut h = Harness::start(1).await?;
    let publisher = h.publisher();
    let conn = h.connection().await?;
    let ch = conn.create_channel().await?;

    // A message the host could not settle: returned until the delivery limit dead-letters it.
    publish_all(
        &publisher,
        &[Outgoing::new("", ORDERS, b"poison".to_vec()).with_message_id("p-1")],
    )
    .await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    // (The archiver is not running yet, so the dead letter waits in orders.dead.)
    while ready(&conn, "orders.dead").await? == 0 {
        if let Some(m) = ch
            .basic_get(ORDERS.into(), BasicGetOptions::default())
            .await?
        {
            ch.basic_nack(
                m.delivery.delivery_tag,
                BasicNackOptions {
                    multiple: false,
                    requeue: true,
                },
            )
            .await?;
        }
        if tokio::time::Instant::now() > deadline {
            bail!("the delivery limit never dead-lettered the message");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(ready(&conn, ORDERS).await?, 0);
    // A message with no dead-letter headers at all: archived as unknown, never dropped.
    publish_all(
        &publisher,
        &[Outgoing::new("invoices.dead", "", b"\xff\xfe raw".to_vec())],
    )
    .await?;

    // Two failed outbox rows.
    for (id, err) in [
        (
            "o-1",
            "unroutable: no queue is bound to exchange 'commands' for routing key 'orders.v2'",
        ),
        (
            "o-2",
            "unroutable: no queue is bound to exchange 'commands' for routing key 'invoices.v9'",
        ),
    ] {
        sqlx::query(
            "INSERT INTO outbox (message_id, message_type, content_type, exchange, routing_key, headers, body, status, attempts, last_error) \
             VALUES ($1, 'order.placed', 'application/json', 'commands', 'orders', '{\"x-tenant\": 7}', '{}', 'failed', 10, $2)",
        )
        .bind(id)
        .bind(err)
        .execute(h.pool())
        .await?;
    }

    h.start_archiver();
    wait_archived(h.pool(), 2, Duration::from_secs(20)).await?;
    let maintenance = ArchiveMaintenance::new(h.pool().clone(), fast_settings());
    let ctx = worker_core::WorkContext::new(MAINTENANCE_JOB_NAME, CancellationToken::new());
    let report = maintenance.run(&ctx).await?;
    assert_eq!(report.outbox_archived, 2);
    assert_eq!(
        maintenance.run(&ctx).await?.outbox_archived,
        0,
        "idempotent per outbox id"
    );
    assert_eq!(
        archive_failed_outbox(h.pool(), 10).await?,
        InsertReport::default()
    );
    assert_eq!(archived(h.pool()).await?, 4);

    let broker = show(
        h.pool(),
        &Filter {
            reason: Some(DELIVERY_LIMIT.into()),
            ..Filter::default()
        },
    )
    .await?;
    assert_eq!(broker.len(), 1, "{broker:?}");
    assert_eq!(broker[0].queue, ORDERS);
    assert_eq!(broker[0].source, "broker");
    assert_eq!(broker[0].message_id.as_deref(), Some("p-1"));
    assert_eq!(broker[0].body_preview, "poison");
    assert!(
        broker[0]
            .error
            .as_deref()
            .unwrap()
            .contains("delivery_limit")
    );
    let unknown = show(
        h.pool(),
        &Filter {
            reason: Some(UNKNOWN.into()),
            ..Filter::default()
        },
    )
    .await?;
    assert_eq!(unknown.len(), 1);
    assert_eq!(
        unknown[0].queue, INVOICES,
        "the work queue of its dead queue"
    );
    assert_eq!(unknown[0].body_preview, "\u{FFFD}\u{FFFD} raw");
    let whole = show_one(h.pool(), unknown[0].id).await?.unwrap();
    assert_eq!(whole.body_hex.as_deref(), Some("fffe20726177"));
    let outbox = show(
        h.pool(),
        &Filter {
            queue: Some(OUTBOX_QUEUE.into()),
            ..Filter::default()
        },
    )
    .await?;
    assert_eq!(outbox.len(), 2);
    assert!(
        outbox
            .iter()
            .all(|r| r.reason == OUTBOX_FAILED && r.attempts == Some(10))
    );
    assert_eq!(outbox[0].fingerprint, outbox[1].fingerprint, "one cause");

    // Replays: the broker's dead letter back to its queue; the outbox rows to their exchange
    // and routing key; a row whose queue is gone fails and stays dead.
    let r = replay(
        h.pool(),
        &publisher,
        &Filter {
            reason: Some(DELIVERY_LIMIT.into()),
            ..Filter::default()
        },
        false,
        None,
        &actor(),
    )
    .await?;
    assert_eq!(r.replayed, 1);
    let back = drain(&conn, ORDERS).await?;
    assert_eq!(back.len(), 1);
    assert_eq!(&back[0].delivery.data[..], b"poison");
    assert!(
        header(&back[0].delivery.properties, "x-death").is_none(),
        "the broker's bookkeeping is gone"
    );
    let r = replay(
        h.pool(),
        &publisher,
        &Filter {
            queue: Some(OUTBOX_QUEUE.into()),
            ..Filter::default()
        },
        false,
        None,
        &actor(),
    )
    .await?;
    assert_eq!(r.replayed, 2);
    let back = drain(&conn, ORDERS).await?;
    assert_eq!(back.len(), 2, "commands/orders routes to the orders queue");
    assert_eq!(
        header(&back[0].delivery.properties, "x-tenant"),
        Some(&AMQPValue::LongLongInt(7))
    );

    let gone = DeadQueue::new("gone.dead", "gone");
    let props = Properties::from(&BasicProperties::default().with_message_id("g-1".into()));
    h.archiver()
        .archive_batch(
            &gone,
            &[RawMessage {
                routing_key: "gone",
                redelivered: false,
                properties: &props,
                body: b"{}",
            }],
        )
        .await?;
    let r = replay(
        h.pool(),
        &publisher,
        &Filter {
            queue: Some("gone".into()),
            ..Filter::default()
        },
        false,
        None,
        &actor(),
    )
    .await?;
    assert_eq!((r.matched, r.replayed, r.failed), (1, 0, 1));
    assert!(
        r.items[0].error.as_deref().unwrap().contains("unroutable"),
        "{r:?}"
    );
    assert_eq!(
        count(
            h.pool(),
            &Filter {
                queue: Some("gone".into()),
                ..Filter::default()
            }
        )
        .await?,
        1,
        "still dead"
    );
    let note = actions(h.pool(), 1)
        .await?
        .remove(0)
        .note
        .unwrap_or_default();
    assert!(note.contains("unroutable"), "{note}");

    // With the broker out of reach, a replay stops at its first batch instead of trying every
    // row in turn; what it did not send stays dead.
    let later = DeadQueue::new("later.dead", "later");
    let raws: Vec<Properties> = (0..3)
        .map(|i| {
            Properties::from(
                &BasicProperties::default().with_message_id(format!("l-{i}").as_str().into()),
            )
        })
        .collect();
    let raws: Vec<RawMessage<'_>> = raws
        .iter()
        .map(|p| RawMessage {
            routing_key: "later",
            redelivered: false,
            properties: p,
            body: b"{}",
        })
        .collect();
    h.archiver().archive_batch(&later, &raws).await?;
    let lost = Session::new(h.connection().await?);
    lost.connection().close(200, "gone".into()).await?;
    let unreachable = Publisher::new(
        lost.fixed(),
        PublisherSettings {
            connect_wait: Duration::ZERO,
            ..PublisherSettings::default()
        },
    );
    let later_only = Filter {
        queue: Some("later".into()),
        ..Filter::default()
    };
    let r = replay(
        h.pool(),
        &unreachable,
        &later_only,
        false,
        Some(1),
        &actor(),
    )
    .await?;
    assert_eq!((r.matched, r.replayed, r.failed), (1, 0, 1), "{r:?}");
    assert!(r.stopped.is_some(), "{r:?}");
    assert_eq!(count(h.pool(), &later_only).await?, 3, "all still dead");
    h.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_marks_the_sweep_deletes_only_settled_rows_and_the_metrics_count()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let pool = &db.pool;
    let archiver = Archiver::new(pool.clone(), fast_settings());
    let dead = DeadQueue::new("orders.dead", ORDERS);
    let before = chrono::Utc::now() - chrono::Duration::seconds(1);
    let mut props = Vec::new();
    for i in 0..10 {
        let mut h = FieldTable::default();
        h.insert(
            DEAD_REASON_HEADER.into(),
            text(if i < 6 { "rejected" } else { "gave-up" }),
        );
        h.insert(DEAD_ERROR_HEADER.into(), text(&format!("order {i} failed")));
        h.insert(
            DEAD_AT_HEADER.into(),
            text(&(chrono::Utc::now() - chrono::Duration::minutes(10 - i)).to_rfc3339()),
        );
        props.push(Properties::from(
            &BasicProperties::default()
                .with_message_id(format!("m-{i}").as_str().into())
                .with_headers(h),
        ));
    }
    let raw: Vec<RawMessage<'_>> = props
        .iter()
        .map(|p| RawMessage {
            routing_key: ORDERS,
            redelivered: false,
            properties: p,
            body: b"{}",
        })
        .collect();
    assert_eq!(archiver.archive_batch(&dead, &raw).await?.inserted, 10);
    // The very same content on a first delivery is a second message, not a redelivery.
    let twin = archiver.archive_batch(&dead, &raw[..1]).await?;
    assert_eq!((twin.inserted, twin.duplicates), (1, 0));
    let redelivered = RawMessage {
        redelivered: true,
        ..raw[1]
    };
    let dup = archiver.archive_batch(&dead, &[redelivered]).await?;
    assert_eq!((dup.inserted, dup.duplicates), (0, 1));

    let depth = depth_by_queue(pool).await?;
    assert_eq!(depth.len(), 1);
    assert_eq!((depth[0].queue.as_str(), depth[0].dead), (ORDERS, 11));
    assert!(depth[0].oldest.is_some());
    let age = oldest_age(pool).await?.unwrap();
    assert!(
        age >= Duration::from_secs(590) && age < Duration::from_secs(700),
        "{age:?}"
    );
    assert_eq!(inflow_since(pool, before).await?, 11);
    assert_eq!(
        inflow_since(pool, chrono::Utc::now() + chrono::Duration::minutes(1)).await?,
        0
    );

    let gave_up = Filter {
        reason: Some("gave-up".into()),
        ..Filter::default()
    };
    assert_eq!(count(pool, &gave_up).await?, 4);
    let purged = purge(pool, &gave_up, &actor()).await?;
    assert_eq!(purged.purged, 4);
    assert_eq!(count(pool, &gave_up).await?, 0);
    assert_eq!(count(pool, &Filter::default()).await?, 7);
    let limited = purge(
        pool,
        &Filter {
            limit: Some(2),
            ..Filter::default()
        },
        &actor(),
    )
    .await?;
    assert_eq!(limited.purged, 2);
    let recorded = actions(pool, 5).await?;
    assert_eq!(recorded.len(), 2);
    assert_eq!(recorded[1].action, "purge");
    assert_eq!(recorded[1].succeeded, 4);
    assert_eq!(recorded[1].filter, serde_json::json!({"reason": "gave-up"}));
    let shown = show(
        pool,
        &Filter {
            status: Some(Status::Purged),
            limit: Some(100),
            ..Filter::default()
        },
    )
    .await?;
    assert_eq!(shown.len(), 6);

    // The sweep: settled rows older than the window go; dead rows never do.
    assert_eq!(
        sweep(pool, Duration::from_secs(3600), 100).await?,
        0,
        "too young"
    );
    sqlx::query(
        "UPDATE dead_letters SET purged_at = now() - interval '2 hours' WHERE status = 'purged'",
    )
    .execute(pool)
    .await?;
    sqlx::query(
        "UPDATE dead_letters SET died_at = now() - interval '400 days' \
         WHERE id = (SELECT min(id) FROM dead_letters WHERE status = 'dead')",
    )
    .execute(pool)
    .await?;
    assert_eq!(
        sweep(pool, Duration::from_secs(3600), 4).await?,
        4,
        "bounded batches"
    );
    assert_eq!(sweep(pool, Duration::from_secs(3600), 4).await?, 2);
    assert_eq!(sweep(pool, Duration::from_secs(3600), 4).await?, 0);
    assert_eq!(
        archived(pool).await?,
        5,
        "the five dead rows stay, however old"
    );
    assert!(oldest_age(pool).await?.unwrap() > Duration::from_secs(399 * 86_400));

    // A filter an operator mistyped is refused with the flag's name.
    let bad = show(
        pool,
        &Filter {
            fingerprint: Some("zz".into()),
            ..Filter::default()
        },
    )
    .await;
    assert!(bad.is_err_and(|f: Failure| f.to_string().contains("--fingerprint")));
    Ok(())
}

/// Inserts one outbox row that gave up (`failed`, routed to the `orders` queue); its id.
async fn failed_outbox_row(pool: &PgPool, message_id: &str) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "INSERT INTO outbox (message_id, message_type, content_type, exchange, routing_key, body, status, attempts, last_error) \
         VALUES ($1, 'order.placed', 'application/json', 'commands', 'orders', '{}', 'failed', 10, 'first failure') \
         RETURNING id",
    )
    .bind(message_id)
    .fetch_one(pool)
    .await?)
}

/// A failed outbox row is archived and replayed from the archive: the replay settles the
/// outbox row, so `outbox retry --all-failed` finds nothing to publish a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_outbox_row_is_not_published_again_by_outbox_retry() -> anyhow::Result<()> {
    let h = Harness::start(1).await?;
    let publisher = h.publisher();
    let conn = h.connection().await?;
    let id = failed_outbox_row(h.pool(), "o-replayed").await?;
    assert_eq!(archive_failed_outbox(h.pool(), 10).await?.inserted, 1);

    let outbox_only = Filter {
        queue: Some(OUTBOX_QUEUE.into()),
        ..Filter::default()
    };
    let r = replay(h.pool(), &publisher, &outbox_only, false, None, &actor()).await?;
    assert_eq!(r.replayed, 1, "{r:?}");
    assert_eq!(drain(&conn, ORDERS).await?.len(), 1, "the replayed copy");

    let requeued = worker_store::outbox::retry_all_failed(h.pool()).await?;
    assert_eq!(
        requeued, 0,
        "outbox retry --all-failed would publish the replayed row again"
    );
    let status: String = sqlx::query_scalar("SELECT status FROM outbox WHERE id = $1")
        .bind(id)
        .fetch_one(h.pool())
        .await?;
    assert_eq!(status, "processed", "the replay settled the outbox row");
    h.stop().await
}

/// fail -> archived -> `outbox retry` -> fail again -> archived again: the second failure is a
/// dead letter of its own, waiting in `dlq list` with its own error, and the first one, which
/// the retry settled, no longer waits beside it.
#[tokio::test]
async fn an_outbox_row_that_fails_again_after_a_retry_is_archived_again() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let pool = &db.pool;
    let maintenance = ArchiveMaintenance::new(pool.clone(), fast_settings());
    let ctx = worker_core::WorkContext::new(MAINTENANCE_JOB_NAME, CancellationToken::new());
    let id = failed_outbox_row(pool, "o-twice").await?;
    assert_eq!(maintenance.run(&ctx).await?.outbox_archived, 1);

    assert_eq!(
        worker_store::outbox::retry(pool, id).await?,
        worker_store::outbox::RetryResult::Requeued
    );
    // The drain tries again and gives up again.
    let mut tx = pool.begin().await?;
    let counts = worker_store::outbox::record_failures(
        &mut tx,
        &[worker_store::outbox::PublishFailure {
            id,
            error: "second failure".into(),
            retry_in: Duration::ZERO,
        }],
        1,
    )
    .await?;
    tx.commit().await?;
    assert_eq!(counts.failed, 1);

    assert_eq!(
        maintenance.run(&ctx).await?.outbox_archived,
        1,
        "the second failure was not archived"
    );
    assert_eq!(
        maintenance.run(&ctx).await?.outbox_archived,
        0,
        "idempotent per failure"
    );
    let waiting = show(
        pool,
        &Filter {
            queue: Some(OUTBOX_QUEUE.into()),
            ..Filter::default()
        },
    )
    .await?;
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    assert_eq!(waiting[0].error.as_deref(), Some("second failure"));
    let listed = list(pool).await?;
    let outbox = listed
        .iter()
        .find(|q| q.queue == OUTBOX_QUEUE)
        .expect("the outbox in dlq list");
    assert_eq!((outbox.dead, outbox.replayed), (1, 1), "{outbox:?}");
    Ok(())
}

/// fail -> archived -> `outbox retry` (the drain will publish it again): a `dlq replay` that
/// runs before the maintenance settles the dead letter does not send a second copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_whose_outbox_row_was_retried_is_not_replayed() -> anyhow::Result<()> {
    let h = Harness::start(1).await?;
    let publisher = h.publisher();
    let conn = h.connection().await?;
    let id = failed_outbox_row(h.pool(), "o-retried").await?;
    assert_eq!(archive_failed_outbox(h.pool(), 10).await?.inserted, 1);
    assert_eq!(
        worker_store::outbox::retry(h.pool(), id).await?,
        worker_store::outbox::RetryResult::Requeued
    );
    let outbox_only = Filter {
        queue: Some(OUTBOX_QUEUE.into()),
        ..Filter::default()
    };
    let r = replay(h.pool(), &publisher, &outbox_only, false, None, &actor()).await?;
    assert_eq!(
        (r.matched, r.replayed),
        (0, 0),
        "replayed beside the retry: {r:?}"
    );
    assert_eq!(
        drain(&conn, ORDERS).await?.len(),
        0,
        "a second copy was sent"
    );
    h.stop().await
}
