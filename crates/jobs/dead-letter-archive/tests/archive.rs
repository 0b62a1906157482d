//! The dead-letter archive on the real services. Each test has a database of its own
//! (worker-testkit); those that need the broker also have a vhost with the topology of two
//! consumer queues (`orders`, `invoices`) declared by a real supervisor ([`Harness`]). The
//! `dlq` queries are tested on dead letters archived directly ([`archive_directly`]), the
//! archiver's own loop on dead letters that come through the broker. Bounded waits only.

// Test support: a failed expectation should fail the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use job_dead_letter_archive::*;
use lapin::options::{BasicConsumeOptions, BasicGetOptions, BasicNackOptions, BasicQosOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection};
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
use worker_testkit::amqp::{header, ready, take_all};
use worker_testkit::wait::eventually;
use worker_testkit::{TestDb, TestVhost};

const ORDERS: &str = "orders";
const INVOICES: &str = "invoices";

// ---------------------------------------------------------------------------------------------
// Set-up
// ---------------------------------------------------------------------------------------------

/// A database, a vhost with the two queues (and their dead queues) declared, and the tasks a
/// test starts (the supervisor, the archiver loops), stopped by [`Harness::stop`].
struct Harness {
    // Dropped last: the database and vhost outlive every task.
    db: TestDb,
    vhost: TestVhost,
    topology: Topology,
    supervisor: Supervisor,
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    events: Arc<Counts>,
    /// The connections behind [`Harness::channel`]'s channels.
    kept: std::sync::Mutex<Vec<Connection>>,
}

impl Harness {
    /// The queues dead-letter a message the `delivery_limit`th time it is returned.
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
            kept: std::sync::Mutex::new(Vec::new()),
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

    /// A connection of the test's own, beside the supervisor's.
    async fn connection(&self) -> anyhow::Result<Connection> {
        Ok(connection_settings(&self.vhost)?.connect().await?)
    }

    /// A channel on a connection of the test's own, kept open until the harness goes: a
    /// dropped lapin `Connection` starts closing, and its channels with it.
    async fn channel(&self) -> anyhow::Result<Channel> {
        let connection = self.connection().await?;
        let channel = connection.create_channel().await?;
        self.kept
            .lock()
            .map_err(|_| anyhow::anyhow!("the kept connections' lock is poisoned"))?
            .push(connection);
        Ok(channel)
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

fn actor() -> Actor {
    Actor::new("ops-test", "test-host")
}

fn text(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

// ---------------------------------------------------------------------------------------------
// Dead letters
// ---------------------------------------------------------------------------------------------

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

/// `rejected` dead letters of `orders`, with ids `{prefix}-{i}` for `i` in `ids`.
fn rejected_orders(prefix: &str, ids: std::ops::Range<u32>) -> Vec<Outgoing> {
    ids.map(|i| {
        runner_dead_letter(
            ORDERS,
            &format!("{prefix}-{i}"),
            "rejected",
            "permanent",
            1,
            &format!("order {i} refused"),
        )
    })
    .collect()
}

/// `total` dead letters of three causes, each with error texts that differ only in ids,
/// numbers and addresses: the first 40 % A (`rejected`, orders), the next 30 % B (`gave-up`,
/// orders and invoices in turn), the last 30 % C (`malformed`, invoices).
struct ThreeCauses {
    messages: Vec<Outgoing>,
    /// A message id's cause and the queue it died in.
    of: HashMap<String, (char, &'static str)>,
}

impl ThreeCauses {
    fn new(total: u32) -> Self {
        let (a_end, b_end) = (total * 4 / 10, total * 7 / 10);
        let mut messages = Vec::new();
        let mut of = HashMap::new();
        for i in 0..total {
            let id = format!("m-{i:04}");
            let (queue, cause, reason, class, attempts, error) = if i < a_end {
                (
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
                )
            } else if i < b_end {
                (
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
                )
            } else {
                (
                    INVOICES,
                    'C',
                    "malformed",
                    "malformed",
                    1,
                    format!("malformed: the body is not a valid Invoice: at line 1 column {i}"),
                )
            };
            of.insert(id.clone(), (cause, queue));
            messages.push(runner_dead_letter(
                queue, &id, reason, class, attempts, &error,
            ));
        }
        Self { messages, of }
    }

    fn count(&self, cause: char) -> usize {
        self.of.values().filter(|(c, _)| *c == cause).count()
    }
}

/// Archives dead letters as the archiver would on taking them from their dead queue, without
/// the broker: for tests of what is done with the archive.
async fn archive_directly(pool: &PgPool, messages: &[Outgoing]) -> anyhow::Result<()> {
    let archiver = Archiver::new(pool.clone(), fast_settings());
    let mut by_dead_queue: BTreeMap<(&str, &str), Vec<RawMessage<'_>>> = BTreeMap::new();
    for m in messages {
        by_dead_queue
            .entry((m.exchange.as_str(), m.routing_key.as_str()))
            .or_default()
            .push(RawMessage {
                routing_key: &m.routing_key,
                redelivered: false,
                properties: &m.properties,
                body: &m.body,
            });
    }
    for ((dead_queue, queue), raws) in by_dead_queue {
        let dead = DeadQueue::new(dead_queue, queue);
        for chunk in raws.chunks(100) {
            archiver.archive_batch(&dead, chunk).await?;
        }
    }
    Ok(())
}

/// Archives a bare message (a message id, no dead-letter headers) of `queue`.
async fn archive_bare(archiver: &Archiver, queue: &str, ids: &[&str]) -> anyhow::Result<()> {
    let dead = DeadQueue::new(format!("{queue}.dead"), queue);
    let props: Vec<Properties> = ids
        .iter()
        .map(|id| Properties::from(&BasicProperties::default().with_message_id((*id).into())))
        .collect();
    let raws: Vec<RawMessage<'_>> = props
        .iter()
        .map(|p| RawMessage {
            routing_key: queue,
            redelivered: false,
            properties: p,
            body: b"{}",
        })
        .collect();
    archiver.archive_batch(&dead, &raws).await?;
    Ok(())
}

async fn publish_all(publisher: &Publisher, messages: &[Outgoing]) -> anyhow::Result<()> {
    for chunk in messages.chunks(200) {
        for (i, result) in publisher.publish_many(chunk).await.into_iter().enumerate() {
            result.with_context(|| format!("publishing {:?}", chunk[i]))?;
        }
    }
    Ok(())
}

/// `dlq replay` of what `filter` matches, at once (no dry run, no rate), through the harness.
async fn replay_now(h: &Harness, filter: &Filter) -> anyhow::Result<ReplayReport> {
    Ok(replay(h.pool(), &h.publisher(), filter, false, None, &actor()).await?)
}

/// The audit row `id`.
async fn audit_row(pool: &PgPool, id: i64) -> anyhow::Result<Entry> {
    audit_entries(pool, 100)
        .await?
        .into_iter()
        .find(|a| a.id == id)
        .context("no such audit row")
}

/// Inserts one outbox row that gave up (`failed`, routed to the `orders` queue); its id.
async fn failed_outbox_row(pool: &PgPool, message_id: &str) -> anyhow::Result<i64> {
    failed_outbox_row_with(pool, message_id, "first failure").await
}

/// [`failed_outbox_row`] with an `x-tenant` header and the last error `error`.
async fn failed_outbox_row_with(
    pool: &PgPool,
    message_id: &str,
    error: &str,
) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "INSERT INTO outbox (message_id, message_type, content_type, exchange, routing_key, headers, body, status, attempts, last_error) \
         VALUES ($1, 'order.placed', 'application/json', 'commands', 'orders', '{\"x-tenant\": 7}', '{}', 'failed', 10, $2) \
         RETURNING id",
    )
    .bind(message_id)
    .bind(error)
    .fetch_one(pool)
    .await?)
}

// ---------------------------------------------------------------------------------------------
// Reading the archive
// ---------------------------------------------------------------------------------------------

async fn archived(pool: &PgPool) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar("SELECT count(*) FROM dead_letters")
        .fetch_one(pool)
        .await?)
}

/// Waits (bounded) until the archive holds `n` rows; fails at once on more.
async fn wait_archived(pool: &PgPool, n: i64, within: Duration) -> anyhow::Result<()> {
    eventually(&format!("{n} rows in the archive"), within, || async move {
        let have = archived(pool).await?;
        anyhow::ensure!(have <= n, "the archive holds {have} rows, more than {n}");
        Ok((have == n).then_some(()))
    })
    .await
}

fn by_queue(queue: &str) -> Filter {
    Filter {
        queue: Some(queue.into()),
        ..Filter::default()
    }
}

fn by_reason(reason: &str) -> Filter {
    Filter {
        reason: Some(reason.into()),
        ..Filter::default()
    }
}

fn by_fingerprint(fingerprint: &str) -> Filter {
    Filter {
        fingerprint: Some(fingerprint.into()),
        ..Filter::default()
    }
}

/// The fingerprint of the one cause whose normalized text contains `needle`, and how many
/// dead letters it has across the queues.
fn fingerprint_of(queues: &[QueueSummary], needle: &str) -> (String, i64) {
    let mut counts: BTreeMap<String, (i64, String)> = BTreeMap::new();
    for fp in queues.iter().flat_map(|q| &q.top_fingerprints) {
        let entry = counts
            .entry(fp.fingerprint.clone())
            .or_insert((0, fp.normalized.clone()));
        entry.0 += fp.count;
    }
    let (fp, (n, _)) = counts
        .iter()
        .find(|(_, (_, text))| text.contains(needle))
        .unwrap_or_else(|| panic!("no fingerprint for {needle}: {counts:#?}"));
    (fp.clone(), *n)
}

const CAUSE_A: &str = "mailbox <email> unavailable (message <uuid>)";
const CAUSE_B: &str = "connection to <ip> timed out after <n> ms";
const CAUSE_C: &str = "column <n>";

// ---------------------------------------------------------------------------------------------
// The archiver's loop
// ---------------------------------------------------------------------------------------------

/// One expensive set-up, a thousand dead letters through the broker both ways, serves the
/// whole round trip; the steps are named. The queries on the archive are tested apart, on
/// dead letters archived directly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_dead_letters_are_archived_once_and_replayed_once_each_to_their_own_queue()
-> anyhow::Result<()> {
    let mut h = Harness::start(5).await?;
    let publisher = h.publisher();
    let causes = ThreeCauses::new(1000);
    publish_all(&publisher, &causes.messages).await?;

    // Archived: every dead letter in the archive, the dead queues emptied.
    h.start_archiver();
    wait_archived(h.pool(), 1000, Duration::from_secs(60)).await?;
    let ch = h.channel().await?;
    for dead in ["orders.dead", "invoices.dead"] {
        assert_eq!(ready(&ch, dead).await?, 0, "{dead} is emptied");
    }
    assert_eq!(h.events.inserted.load(Ordering::SeqCst), 1000);

    // Replayed: all of them, and never a second time.
    let all = replay_now(&h, &Filter::default()).await?;
    assert_eq!((all.matched, all.replayed, all.failed), (1000, 1000, 0));
    let again = replay_now(&h, &Filter::default()).await?;
    assert_eq!(again.matched, 0, "a replayed row is never sent again");

    // Delivered: each message exactly once, in its original queue.
    let mut seen: HashMap<String, u32> = HashMap::new();
    for queue in [ORDERS, INVOICES] {
        for m in take_all(&ch, queue, 2000).await? {
            let id = m
                .delivery
                .properties
                .message_id()
                .clone()
                .unwrap()
                .to_string();
            *seen.entry(id.clone()).or_default() += 1;
            assert_eq!(queue, causes.of[&id].1, "{id}");
        }
    }
    assert_eq!(seen.len(), 1000);
    assert!(
        seen.values().all(|&n| n == 1),
        "each delivered exactly once"
    );

    // Kept: nothing left the archive; every row is still there, marked replayed.
    assert_eq!(archived(h.pool()).await?, 1000);
    let statuses: Vec<(String, i64)> =
        sqlx::query_as("SELECT status, count(*) FROM dead_letters GROUP BY status")
            .fetch_all(h.pool())
            .await?;
    assert_eq!(statuses, vec![("replayed".to_string(), 1000)]);
    let replayed: i64 = list(h.pool()).await?.iter().map(|q| q.replayed).sum();
    assert_eq!(replayed, 1000);
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

/// One scenario in three numbered steps: each step starts from the broker's state the one
/// before left (the unacked batch redelivered), which no shorter set-up can make.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_between_the_insert_and_the_ack_a_message_is_archived_once() -> anyhow::Result<()> {
    let mut h = Harness::start(5).await?;
    let publisher = h.publisher();
    publish_all(&publisher, &rejected_orders("k", 0..30)).await?;
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
    publish_all(&publisher, &rejected_orders("k", 30..40)).await?;
    let ch = h.channel().await?;
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
    let events = h.events.clone();
    eventually(
        "the redelivered dead letters settled",
        Duration::from_secs(20),
        || {
            let events = events.clone();
            async move { Ok((events.duplicates.load(Ordering::SeqCst) >= 40).then_some(())) }
        },
    )
    .await
    .with_context(|| format!("{:?}", h.events))?;
    assert_eq!(h.events.inserted.load(Ordering::SeqCst), 0);
    assert_eq!(archived(h.pool()).await?, 40, "archived once, not twice");
    let keys: i64 = sqlx::query_scalar("SELECT count(DISTINCT message_id) FROM dead_letters")
        .fetch_one(h.pool())
        .await?;
    assert_eq!(keys, 40);
    assert_eq!(ready(&h.channel().await?, "orders.dead").await?, 0);

    // And it goes on archiving new ones.
    let new = runner_dead_letter(ORDERS, "k-new", "gave-up", "transient", 5, "x");
    publish_all(&publisher, &[new]).await?;
    wait_archived(h.pool(), 41, Duration::from_secs(10)).await?;
    h.stop().await
}

/// Returns a message to `orders` until the queue's delivery limit dead-letters it into
/// `orders.dead` (the archiver is not running, so it waits there).
async fn dead_letter_at_the_delivery_limit(h: &Harness, id: &str) -> anyhow::Result<()> {
    let out = Outgoing::new("", ORDERS, b"poison".to_vec()).with_message_id(id);
    publish_all(&h.publisher(), &[out]).await?;
    let ch = h.channel().await?;
    eventually(
        "the delivery limit dead-lettering the message",
        Duration::from_secs(20),
        || {
            let ch = ch.clone();
            async move {
                if ready(&ch, "orders.dead").await? > 0 {
                    return Ok(Some(()));
                }
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
                Ok(None)
            }
        },
    )
    .await?;
    assert_eq!(ready(&ch, ORDERS).await?, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_dead_letter_is_archived_as_such_and_replayed_without_the_brokers_bookkeeping()
-> anyhow::Result<()> {
    let mut h = Harness::start(1).await?;
    dead_letter_at_the_delivery_limit(&h, "p-1").await?;
    h.start_archiver();
    wait_archived(h.pool(), 1, Duration::from_secs(20)).await?;

    let broker = show(h.pool(), &by_reason(DELIVERY_LIMIT)).await?;
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

    let r = replay_now(&h, &by_reason(DELIVERY_LIMIT)).await?;
    assert_eq!(r.replayed, 1);
    let back = take_all(&h.channel().await?, ORDERS, 10).await?;
    assert_eq!(back.len(), 1);
    assert_eq!(&back[0].delivery.data[..], b"poison");
    assert!(
        header(&back[0].delivery.properties, "x-death").is_none(),
        "the broker's bookkeeping is gone"
    );
    h.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_without_headers_is_archived_as_unknown_never_dropped() -> anyhow::Result<()>
{
    let mut h = Harness::start(1).await?;
    let bare = Outgoing::new("invoices.dead", "", b"\xff\xfe raw".to_vec());
    publish_all(&h.publisher(), &[bare]).await?;
    h.start_archiver();
    wait_archived(h.pool(), 1, Duration::from_secs(20)).await?;

    let unknown = show(h.pool(), &by_reason(UNKNOWN)).await?;
    assert_eq!(unknown.len(), 1);
    assert_eq!(
        unknown[0].queue, INVOICES,
        "the work queue of its dead queue"
    );
    assert_eq!(unknown[0].body_preview, "\u{FFFD}\u{FFFD} raw");
    let whole = show_one(h.pool(), unknown[0].id).await?.unwrap();
    assert_eq!(whole.body_hex.as_deref(), Some("fffe20726177"));
    h.stop().await
}

// ---------------------------------------------------------------------------------------------
// dlq list and show
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn dlq_list_counts_each_queue_and_its_causes_most_frequent_first() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    archive_directly(&db.pool, &ThreeCauses::new(100).messages).await?;

    let queues = list(&db.pool).await?;
    let by_name: BTreeMap<&str, &QueueSummary> =
        queues.iter().map(|q| (q.queue.as_str(), q)).collect();
    assert_eq!(by_name.len(), 2, "{queues:#?}");
    assert_eq!(by_name[ORDERS].dead, 55);
    assert_eq!(by_name[INVOICES].dead, 45);
    assert!(by_name[ORDERS].oldest <= by_name[ORDERS].newest);

    // Three causes in all, whatever ids, numbers and addresses their texts carry.
    let causes: std::collections::BTreeSet<&str> = queues
        .iter()
        .flat_map(|q| &q.top_fingerprints)
        .map(|f| f.fingerprint.as_str())
        .collect();
    assert_eq!(causes.len(), 3, "{queues:#?}");
    let (fp_a, n_a) = fingerprint_of(&queues, CAUSE_A);
    let (fp_b, n_b) = fingerprint_of(&queues, CAUSE_B);
    let (fp_c, n_c) = fingerprint_of(&queues, CAUSE_C);
    assert_eq!((n_a, n_b, n_c), (40, 30, 30));
    let top = |q: &str| -> Vec<(String, i64)> {
        by_name[q]
            .top_fingerprints
            .iter()
            .map(|f| (f.fingerprint.clone(), f.count))
            .collect()
    };
    assert_eq!(
        top(ORDERS),
        vec![(fp_a, 40), (fp_b.clone(), 15)],
        "most frequent first"
    );
    assert_eq!(top(INVOICES), vec![(fp_c, 30), (fp_b, 15)]);
    Ok(())
}

#[tokio::test]
async fn dlq_show_by_fingerprint_lists_one_cause_with_its_reason_attempts_error_and_preview()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let causes = ThreeCauses::new(100);
    archive_directly(&db.pool, &causes.messages).await?;
    let (fp_b, _) = fingerprint_of(&list(&db.pool).await?, CAUSE_B);

    let shown = show(
        &db.pool,
        &Filter {
            limit: Some(1000),
            ..by_fingerprint(&fp_b)
        },
    )
    .await?;
    assert_eq!(shown.len(), causes.count('B'));
    for row in &shown {
        let id = row.message_id.clone().unwrap();
        assert_eq!(causes.of[&id].0, 'B', "{row:?}");
        assert_eq!(row.reason, "gave-up");
        assert_eq!(row.attempts, Some(5));
        assert_eq!(row.class.as_deref(), Some("transient"));
        assert!(row.error.as_deref().unwrap().contains("timed out"));
        assert_eq!(row.body_preview, format!(r#"{{"id":"{id}"}}"#));
        assert_eq!(row.message_type.as_deref(), Some("order.placed"));
    }
    Ok(())
}

#[tokio::test]
async fn dlq_show_takes_a_fingerprint_prefix_and_a_limit_beside_the_other_filters()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    archive_directly(&db.pool, &ThreeCauses::new(100).messages).await?;
    let (fp_a, _) = fingerprint_of(&list(&db.pool).await?, CAUSE_A);

    let prefix = show(
        &db.pool,
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
    Ok(())
}

#[tokio::test]
async fn dlq_show_one_gives_a_dead_letter_whole_with_every_header_and_property()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    archive_directly(&db.pool, &ThreeCauses::new(100).messages).await?;
    let (fp_b, _) = fingerprint_of(&list(&db.pool).await?, CAUSE_B);
    let shown = show(&db.pool, &by_fingerprint(&fp_b)).await?;

    let one = show_one(&db.pool, shown[0].id).await?.context("show_one")?;
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
    Ok(())
}

#[tokio::test]
async fn a_mistyped_fingerprint_is_refused_naming_the_flag() -> anyhow::Result<()> {
    // Refused before any query: a pool that never connects is enough.
    let never_connected = PgPool::connect_lazy("postgres://nobody@127.0.0.1:1/none")?;
    let bad = show(&never_connected, &by_fingerprint("zz")).await;
    assert!(bad.is_err_and(|f: Failure| f.to_string().contains("--fingerprint")));
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// dlq replay
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_replay_lists_the_matches_moves_nothing_and_is_recorded_as_a_dry_run()
-> anyhow::Result<()> {
    let h = Harness::start(5).await?;
    let causes = ThreeCauses::new(100);
    archive_directly(h.pool(), &causes.messages).await?;
    let (fp_b, _) = fingerprint_of(&list(h.pool()).await?, CAUSE_B);

    let plan = replay(
        h.pool(),
        &h.publisher(),
        &by_fingerprint(&fp_b),
        true,
        None,
        &actor(),
    )
    .await?;
    assert_eq!((plan.matched, plan.replayed, plan.failed), (30, 0, 0));
    assert_eq!(plan.items.len(), 30);
    assert!(
        plan.items
            .iter()
            .all(|i| i.outcome == ItemOutcome::WouldReplay)
    );

    let ch = h.channel().await?;
    assert_eq!(ready(&ch, ORDERS).await? + ready(&ch, INVOICES).await?, 0);
    assert_eq!(
        count(h.pool(), &Filter::default()).await?,
        100,
        "all still dead"
    );
    let recorded = audit_entries(h.pool(), 10).await?;
    assert_eq!(recorded.len(), 1);
    assert_eq!(recorded[0].id, plan.action_id);
    assert!(recorded[0].dry_run);
    assert_eq!(
        (recorded[0].matched, recorded[0].succeeded),
        (30, 0),
        "what it would have moved"
    );
    h.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_is_paced_by_its_rate_and_recorded_with_who_where_which_filter_and_how_many()
-> anyhow::Result<()> {
    let h = Harness::start(5).await?;
    archive_directly(h.pool(), &ThreeCauses::new(100).messages).await?;
    let (fp_b, _) = fingerprint_of(&list(h.pool()).await?, CAUSE_B);

    let started = std::time::Instant::now();
    let done = replay(
        h.pool(),
        &h.publisher(),
        &by_fingerprint(&fp_b),
        false,
        Some(40),
        &actor(),
    )
    .await?;
    let took = started.elapsed();
    assert_eq!((done.matched, done.replayed, done.failed), (30, 30, 0));
    assert!(
        took >= Duration::from_millis(600),
        "30 messages at 40/s take about 0.75 s, took {took:?}"
    );

    let recorded = audit_entries(h.pool(), 10).await?;
    assert_eq!(recorded.len(), 1);
    let first = &recorded[0];
    assert!(!first.dry_run);
    assert_eq!(first.action, "replay");
    assert_eq!(
        (first.actor_user.as_str(), first.actor_host.as_str()),
        ("ops-test", "test-host")
    );
    assert_eq!(first.filter, serde_json::json!({"fingerprint": fp_b}));
    assert_eq!((first.matched, first.succeeded, first.failed), (30, 30, 0));
    assert_eq!(first.rate, Some(40));
    assert!(first.finished_at.is_some());
    h.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_replay_sends_no_more_than_the_operator_was_shown() -> anyhow::Result<()> {
    let h = Harness::start(5).await?;
    let archiver = h.archiver();
    archive_bare(&archiver, ORDERS, &["p-1", "p-2", "p-3"]).await?;
    let orders = by_queue(ORDERS);
    let plan = replay(h.pool(), &h.publisher(), &orders, true, None, &actor()).await?;
    assert_eq!(plan.matched, 3);
    // Between the dry run and the confirmation, two more die.
    archive_bare(&archiver, ORDERS, &["p-4", "p-5"]).await?;

    let run = Run::new(actor()).planned(Some(plan.matched));
    let done = replay_run(h.pool(), &h.publisher(), &orders, &run).await?;
    assert_eq!((done.replayed, done.failed), (3, 0));
    let ch = h.channel().await?;
    assert_eq!(ready(&ch, ORDERS).await?, 3);
    let left: Vec<Option<String>> = show(h.pool(), &orders)
        .await?
        .into_iter()
        .map(|d| d.message_id)
        .collect();
    assert_eq!(
        left,
        [Some("p-5".to_string()), Some("p-4".to_string())],
        "the oldest went, as the dry run listed them; the newer two stay dead"
    );
    let recorded = audit_row(h.pool(), done.action_id).await?;
    assert_eq!((recorded.planned, recorded.succeeded), (Some(3), 3));
    let note = recorded.note.unwrap_or_default();
    assert!(
        note.contains("at the 3 confirmed") && note.contains("2 more"),
        "{note}"
    );
    h.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_message_keeps_its_body_and_properties_and_says_where_it_came_from()
-> anyhow::Result<()> {
    let h = Harness::start(5).await?;
    let message = runner_dead_letter(ORDERS, "r-1", "gave-up", "transient", 5, "timed out");
    archive_directly(h.pool(), std::slice::from_ref(&message)).await?;

    let r = replay_now(&h, &Filter::default()).await?;
    assert_eq!(r.replayed, 1);
    let back = take_all(&h.channel().await?, ORDERS, 10).await?;
    assert_eq!(back.len(), 1);
    let props = &back[0].delivery.properties;
    assert!(matches!(
        header(props, REPLAYED_FROM_HEADER),
        Some(AMQPValue::LongLongInt(_))
    ));
    assert!(header(props, DEAD_REASON_HEADER).is_none());
    assert!(header(props, DEAD_ERROR_HEADER).is_none());
    assert!(
        header(props, "x-attempt").is_none(),
        "the attempt starts again"
    );
    assert_eq!(header(props, "x-tenant"), Some(&AMQPValue::LongInt(7)));
    assert_eq!(
        props.kind().as_ref().map(|k| k.as_str()),
        Some("order.placed")
    );
    assert_eq!(props.timestamp(), &Some(1_800_000_000));
    assert_eq!(&back[0].delivery.data[..], message.body.as_slice());
    h.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_whose_queue_is_gone_fails_and_leaves_the_row_dead() -> anyhow::Result<()> {
    let h = Harness::start(1).await?;
    archive_bare(&h.archiver(), "gone", &["g-1"]).await?;

    let r = replay_now(&h, &by_queue("gone")).await?;
    assert_eq!((r.matched, r.replayed, r.failed), (1, 0, 1));
    assert!(
        r.items[0].error.as_deref().unwrap().contains("unroutable"),
        "{r:?}"
    );
    assert_eq!(count(h.pool(), &by_queue("gone")).await?, 1, "still dead");
    let note = audit_entries(h.pool(), 1)
        .await?
        .remove(0)
        .note
        .unwrap_or_default();
    assert!(note.contains("unroutable"), "{note}");
    h.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_with_the_broker_out_of_reach_stops_at_its_first_batch() -> anyhow::Result<()> {
    let h = Harness::start(1).await?;
    archive_bare(&h.archiver(), "later", &["l-0", "l-1", "l-2"]).await?;
    let lost = Session::new(h.connection().await?);
    lost.connection().close(200, "gone".into()).await?;
    let unreachable = Publisher::new(
        lost.fixed(),
        PublisherSettings {
            connect_wait: Duration::ZERO,
            ..PublisherSettings::default()
        },
    );

    let r = replay(
        h.pool(),
        &unreachable,
        &by_queue("later"),
        false,
        Some(1),
        &actor(),
    )
    .await?;
    assert_eq!((r.matched, r.replayed, r.failed), (1, 0, 1), "{r:?}");
    assert!(r.stopped.is_some(), "{r:?}");
    assert_eq!(
        count(h.pool(), &by_queue("later")).await?,
        3,
        "what it did not send stays dead"
    );
    h.stop().await
}

// ---------------------------------------------------------------------------------------------
// Failed outbox rows
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn failed_outbox_rows_are_archived_once_by_the_maintenance() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let pool = &db.pool;
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
        failed_outbox_row_with(pool, id, err).await?;
    }
    let maintenance = ArchiveMaintenance::new(pool.clone(), fast_settings());
    let ctx =
        worker_core::WorkContext::new(job_dead_letter_archive::JOB_NAME, CancellationToken::new());

    assert_eq!(maintenance.run(&ctx).await?.outbox_archived, 2);
    assert_eq!(
        maintenance.run(&ctx).await?.outbox_archived,
        0,
        "idempotent per outbox id"
    );
    assert_eq!(
        archive_failed_outbox(pool, 10).await?,
        InsertReport::default()
    );
    assert_eq!(archived(pool).await?, 2);
    let outbox = show(pool, &by_queue(OUTBOX_QUEUE)).await?;
    assert_eq!(outbox.len(), 2);
    assert!(
        outbox
            .iter()
            .all(|r| r.reason == OUTBOX_FAILED && r.attempts == Some(10))
    );
    assert_eq!(outbox[0].fingerprint, outbox[1].fingerprint, "one cause");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_outbox_row_goes_to_its_exchange_and_routing_key_with_its_headers()
-> anyhow::Result<()> {
    let h = Harness::start(1).await?;
    failed_outbox_row(h.pool(), "o-1").await?;
    failed_outbox_row(h.pool(), "o-2").await?;
    assert_eq!(archive_failed_outbox(h.pool(), 10).await?.inserted, 2);

    let r = replay_now(&h, &by_queue(OUTBOX_QUEUE)).await?;
    assert_eq!(r.replayed, 2);
    let back = take_all(&h.channel().await?, ORDERS, 10).await?;
    assert_eq!(back.len(), 2, "commands/orders routes to the orders queue");
    assert_eq!(
        header(&back[0].delivery.properties, "x-tenant"),
        Some(&AMQPValue::LongLongInt(7))
    );
    h.stop().await
}

/// A failed outbox row is archived and replayed from the archive: the replay deletes the
/// outbox row (published, as the drain deletes what it publishes), so `outbox retry --all-failed` finds nothing to publish a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_outbox_row_is_not_published_again_by_outbox_retry() -> anyhow::Result<()> {
    let h = Harness::start(1).await?;
    let id = failed_outbox_row(h.pool(), "o-replayed").await?;
    assert_eq!(archive_failed_outbox(h.pool(), 10).await?.inserted, 1);

    let r = replay_now(&h, &by_queue(OUTBOX_QUEUE)).await?;
    assert_eq!(r.replayed, 1, "{r:?}");
    let replayed = take_all(&h.channel().await?, ORDERS, 10).await?;
    assert_eq!(replayed.len(), 1, "the replayed copy");

    let requeued = worker_store::outbox::retry_all_failed(
        h.pool(),
        &worker_store::audit::Actor::new("test", "test-host"),
    )
    .await?;
    assert_eq!(
        requeued, 0,
        "outbox retry --all-failed would publish the replayed row again"
    );
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox WHERE id = $1")
        .bind(id)
        .fetch_one(h.pool())
        .await?;
    assert_eq!(left, 0, "the replay deleted the outbox row it published");
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
    let ctx =
        worker_core::WorkContext::new(job_dead_letter_archive::JOB_NAME, CancellationToken::new());
    let id = failed_outbox_row(pool, "o-twice").await?;
    assert_eq!(maintenance.run(&ctx).await?.outbox_archived, 1);

    assert_eq!(
        worker_store::outbox::retry(
            pool,
            id,
            &worker_store::audit::Actor::new("test", "test-host")
        )
        .await?,
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
    let waiting = show(pool, &by_queue(OUTBOX_QUEUE)).await?;
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
    let id = failed_outbox_row(h.pool(), "o-retried").await?;
    assert_eq!(archive_failed_outbox(h.pool(), 10).await?.inserted, 1);
    assert_eq!(
        worker_store::outbox::retry(
            h.pool(),
            id,
            &worker_store::audit::Actor::new("test", "test-host")
        )
        .await?,
        worker_store::outbox::RetryResult::Requeued
    );

    let r = replay_now(&h, &by_queue(OUTBOX_QUEUE)).await?;
    assert_eq!(
        (r.matched, r.replayed),
        (0, 0),
        "replayed beside the retry: {r:?}"
    );
    assert_eq!(
        take_all(&h.channel().await?, ORDERS, 10).await?.len(),
        0,
        "a second copy was sent"
    );
    h.stop().await
}

// ---------------------------------------------------------------------------------------------
// Duplicates, readings, purge and the sweep
// ---------------------------------------------------------------------------------------------

/// Ten dead letters of `orders`, died one a minute from ten minutes ago: six `rejected`
/// (m-0..m-5), four `gave-up` (m-6..m-9).
fn ten_orders() -> Vec<Properties> {
    (0..10)
        .map(|i| {
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
            Properties::from(
                &BasicProperties::default()
                    .with_message_id(format!("m-{i}").as_str().into())
                    .with_headers(h),
            )
        })
        .collect()
}

fn raw_orders(props: &[Properties]) -> Vec<RawMessage<'_>> {
    props
        .iter()
        .map(|p| RawMessage {
            routing_key: ORDERS,
            redelivered: false,
            properties: p,
            body: b"{}",
        })
        .collect()
}

/// A database with [`ten_orders`] archived, its archiver, and the ten as archived.
async fn ten_archived() -> anyhow::Result<(TestDb, Archiver, Vec<Properties>)> {
    let db = TestDb::create().await?;
    let archiver = Archiver::new(db.pool.clone(), fast_settings());
    let props = ten_orders();
    let dead = DeadQueue::new("orders.dead", ORDERS);
    assert_eq!(
        archiver
            .archive_batch(&dead, &raw_orders(&props))
            .await?
            .inserted,
        10
    );
    Ok((db, archiver, props))
}

#[tokio::test]
async fn the_same_content_on_a_first_delivery_is_a_second_dead_letter_and_a_redelivery_a_duplicate()
-> anyhow::Result<()> {
    let (_db, archiver, props) = ten_archived().await?;
    let dead = DeadQueue::new("orders.dead", ORDERS);
    let raw = raw_orders(&props);

    let twin = archiver.archive_batch(&dead, &raw[..1]).await?;
    assert_eq!((twin.inserted, twin.duplicates), (1, 0));
    let redelivered = RawMessage {
        redelivered: true,
        ..raw[1]
    };
    let dup = archiver.archive_batch(&dead, &[redelivered]).await?;
    assert_eq!((dup.inserted, dup.duplicates), (0, 1));
    Ok(())
}

#[tokio::test]
async fn the_oldest_age_reads_one_row_however_many_wait() -> anyhow::Result<()> {
    let (db, _, _) = ten_archived().await?;
    // A backlog: 5,000 more waiting, older and newer ones mixed, and some settled.
    sqlx::query(
        "INSERT INTO dead_letters (dedup_key, source, queue, reason, error_fingerprint, \
             error_normalized, died_at, body, status, replayed_at) \
         SELECT 'backlog-' || g, 'runner', 'orders', 'rejected', 'fp', 'an error', \
                now() - make_interval(secs => (g * 7919) % 86400), '\\x00', \
                CASE WHEN g % 4 = 0 THEN 'replayed' ELSE 'dead' END, \
                CASE WHEN g % 4 = 0 THEN now() END \
         FROM generate_series(1, 5000) g",
    )
    .execute(&db.pool)
    .await?;
    sqlx::query("ANALYZE dead_letters")
        .execute(&db.pool)
        .await?;
    let plan: serde_json::Value = sqlx::query_scalar(&format!(
        "EXPLAIN (ANALYZE, FORMAT JSON) {}",
        job_dead_letter_archive::query::OLDEST_AGE
    ))
    .fetch_one(&db.pool)
    .await?;
    let read = worker_testkit::plan::rows_read(&plan[0]["Plan"]);
    // The sampler reads it on every round, on every replica: it must not grow with the backlog.
    assert!(read <= 5.0, "the oldest age read {read} rows:\n{plan:#}");
    assert!(oldest_age(&db.pool).await?.unwrap() > Duration::from_secs(80_000));
    Ok(())
}

#[tokio::test]
async fn the_depth_age_and_inflow_readings_count_the_dead_letters() -> anyhow::Result<()> {
    let before = chrono::Utc::now() - chrono::Duration::seconds(1);
    let (db, _, _) = ten_archived().await?;
    let pool = &db.pool;

    let depth = depth_by_queue(pool).await?;
    assert_eq!(depth.len(), 1);
    assert_eq!((depth[0].queue.as_str(), depth[0].dead), (ORDERS, 10));
    assert!(depth[0].oldest.is_some());
    let age = oldest_age(pool).await?.unwrap();
    assert!(
        age >= Duration::from_secs(590) && age < Duration::from_secs(700),
        "{age:?}"
    );
    assert_eq!(inflow_since(pool, before).await?, 10);
    let later = chrono::Utc::now() + chrono::Duration::minutes(1);
    assert_eq!(inflow_since(pool, later).await?, 0);
    Ok(())
}

#[tokio::test]
async fn purge_marks_the_matching_rows_purged_and_records_each_purge() -> anyhow::Result<()> {
    let (db, _, _) = ten_archived().await?;
    let pool = &db.pool;
    let gave_up = by_reason("gave-up");

    assert_eq!(count(pool, &gave_up).await?, 4);
    assert_eq!(purge(pool, &gave_up, &actor()).await?.purged, 4);
    assert_eq!(count(pool, &gave_up).await?, 0);
    assert_eq!(count(pool, &Filter::default()).await?, 6);
    let limited = Filter {
        limit: Some(2),
        ..Filter::default()
    };
    assert_eq!(purge(pool, &limited, &actor()).await?.purged, 2);

    let recorded = audit_entries(pool, 5).await?;
    assert_eq!(recorded.len(), 2);
    assert_eq!(recorded[1].action, "purge");
    assert_eq!(recorded[1].succeeded, 4);
    assert_eq!(recorded[1].filter, serde_json::json!({"reason": "gave-up"}));
    let purged = Filter {
        status: Some(Status::Purged),
        limit: Some(100),
        ..Filter::default()
    };
    assert_eq!(
        show(pool, &purged).await?.len(),
        6,
        "purged rows stay, marked"
    );
    Ok(())
}

#[tokio::test]
async fn a_confirmed_purge_marks_no_more_than_the_operator_was_shown() -> anyhow::Result<()> {
    let (db, _, _) = ten_archived().await?;
    let pool = &db.pool;
    let gave_up = by_reason("gave-up");
    // The dry run showed 3; a fourth matches by the time it is confirmed.
    let run = Run::new(actor()).planned(Some(3));
    let done = purge_run(pool, &gave_up, &run).await?;
    assert_eq!(done.purged, 3);
    let left: Vec<Option<String>> = show(pool, &gave_up)
        .await?
        .into_iter()
        .map(|d| d.message_id)
        .collect();
    assert_eq!(left, [Some("m-9".to_string())], "the oldest three went");
    let recorded = audit_row(pool, done.action_id).await?;
    assert_eq!((recorded.planned, recorded.succeeded), (Some(3), 3));
    let note = recorded.note.unwrap_or_default();
    assert!(
        note.contains("at the 3 confirmed") && note.contains("1 more"),
        "{note}"
    );

    // When no more match than were confirmed, nothing is said.
    let run = Run::new(actor()).planned(Some(5));
    let done = purge_run(pool, &gave_up, &run).await?;
    assert_eq!(done.purged, 1);
    assert_eq!(audit_row(pool, done.action_id).await?.note, None);
    Ok(())
}

#[tokio::test]
async fn the_sweep_deletes_settled_rows_past_the_window_in_bounded_batches_never_a_dead_one()
-> anyhow::Result<()> {
    let (db, _, _) = ten_archived().await?;
    let pool = &db.pool;
    purge(pool, &by_reason("gave-up"), &actor()).await?;
    let two = Filter {
        limit: Some(2),
        ..Filter::default()
    };
    purge(pool, &two, &actor()).await?;
    let window = Duration::from_secs(3600);

    assert_eq!(sweep(pool, window, 100).await?, 0, "too young");
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
    assert_eq!(sweep(pool, window, 4).await?, 4, "bounded batches");
    assert_eq!(sweep(pool, window, 4).await?, 2);
    assert_eq!(sweep(pool, window, 4).await?, 0);
    assert_eq!(
        archived(pool).await?,
        4,
        "the four dead rows stay, however old"
    );
    assert!(oldest_age(pool).await?.unwrap() > Duration::from_secs(399 * 86_400));
    Ok(())
}
