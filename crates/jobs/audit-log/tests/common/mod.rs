//! What the audit-log tests share: the audit-log consumer (and, when asked, the automation
//! trigger beside it on the same events exchange) under the real runner, on a vhost of the
//! test's own, with every settled delivery recorded.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{TimeZone, Utc};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;
use worker_broker::consumer::{ConsumerRunner, ConsumerSettings};
use worker_broker::{
    ConnectionSettings, ConsumerEvents, ConsumerSection, DeliveryReport, Outgoing, Publisher,
    PublisherSettings, QueueTopology, Supervisor, Topology, TopologySettings,
};
use worker_messages::{AUDIT_ENTRY, AuditEntry};
use worker_testkit::TestVhost;

use job_audit_log::{AuditLog, AuditLogSettings};
use job_automation_trigger::{AutomationTrigger, AutomationTriggerSettings};

/// The `n`th entry of a test: its own id, an actor and an entity that depend on `n`.
pub fn entry(n: u32) -> AuditEntry {
    AuditEntry {
        id: Uuid::new_v4(),
        occurred_at: Utc.with_ymd_and_hms(2026, 12, 4, 9, 0, n % 60).unwrap(),
        actor: format!("user-{}", n % 3),
        action: "shipment.rerouted".into(),
        entity_type: "shipment".into(),
        entity_id: format!("SHP-{n:04}"),
        data: serde_json::json!({"n": n}).as_object().unwrap().clone(),
    }
}

/// `entry` as its publishers send it: on the events exchange, key and type `audit.entry`,
/// `message_id` its id.
pub fn outgoing(entry: &AuditEntry) -> Outgoing {
    Outgoing::json("events", AUDIT_ENTRY, entry)
        .unwrap()
        .with_message_id(&entry.id.to_string())
        .with_type(AUDIT_ENTRY)
}

/// Every settled delivery: (queue, outcome, skip reason).
#[derive(Default)]
pub struct Settled(Mutex<Vec<(String, String, Option<&'static str>)>>);

impl Settled {
    pub fn count(&self, queue: &str, outcome: &str) -> usize {
        let settled = self.0.lock().unwrap();
        settled
            .iter()
            .filter(|(q, o, _)| q == queue && o == outcome)
            .count()
    }

    pub fn skip_reasons(&self, queue: &str) -> Vec<&'static str> {
        let settled = self.0.lock().unwrap();
        settled
            .iter()
            .filter(|(q, _, _)| q == queue)
            .filter_map(|(_, _, reason)| *reason)
            .collect()
    }
}

impl ConsumerEvents for Settled {
    fn on_settled(&self, settled: &DeliveryReport<'_>) {
        let reason = match settled.outcome {
            worker_broker::Outcome::Skipped { reason } => Some(*reason),
            _ => None,
        };
        self.0.lock().unwrap().push((
            settled.queue.to_string(),
            settled.outcome.as_str().to_string(),
            reason,
        ));
    }
}

/// The runner's settings of the tests: the job's default retry (3 tries, 200 ms doubling)
/// without jitter, short waits.
fn runner_settings() -> ConsumerSettings {
    ConsumerSettings {
        prefetch: 20,
        concurrency: 4,
        max_attempts: 10,
        timeout: Duration::from_secs(5),
        retry: Some(worker_core::RetryPolicy {
            jitter: false,
            ..worker_core::RetryPolicy::default()
        }),
        settle_deadline: Duration::from_secs(5),
        publish_timeout: Duration::from_secs(5),
        ..ConsumerSettings::default()
    }
}

/// A queue as the job's settings section declares it by default, with one short retry tier.
fn queue_of(section: &impl ConsumerSection, topology: &TopologySettings) -> QueueTopology {
    let mut settings = section.queue().clone();
    settings.retry_tiers = vec![Duration::from_secs(1)];
    settings.delivery_limit = 20;
    QueueTopology::from_settings(&settings, section.queue_defaults(topology)).unwrap()
}

/// The topology declared and a publisher ready; the consumers start with [`Self::consume`]
/// and [`Self::trigger`].
pub struct Harness {
    pub vhost: TestVhost,
    pub audit_queue: QueueTopology,
    pub trigger_queue: QueueTopology,
    pub settled: Arc<Settled>,
    supervisor: Supervisor,
    publisher: Publisher,
    shutdown: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Harness {
    /// Both queues declared (`audit.log` and `automation.trigger`, each bound as its
    /// section's defaults say), nobody consuming yet.
    pub async fn start() -> anyhow::Result<Self> {
        let vhost = TestVhost::create().await?;
        let topo = TopologySettings::default();
        let audit_queue = queue_of(&AuditLogSettings::default(), &topo);
        let trigger_queue = queue_of(&AutomationTriggerSettings::default(), &topo);
        let topology =
            Topology::from_settings(&topo, [audit_queue.clone(), trigger_queue.clone()])?;
        let mut connection = ConnectionSettings::from_uri(&vhost.amqp_url())?;
        connection.reconnect_min = Duration::from_millis(100);
        connection.reconnect_max = Duration::from_secs(1);
        let supervisor = Supervisor::new(connection, topology);
        let shutdown = CancellationToken::new();
        let sup_task = tokio::spawn(supervisor.clone().run(shutdown.clone()));
        let mut status = supervisor.status();
        tokio::time::timeout(Duration::from_secs(15), status.wait_for(|s| s.is_ready())).await??;
        let publisher = Publisher::new(supervisor.sessions(), PublisherSettings::default());
        Ok(Self {
            vhost,
            audit_queue,
            trigger_queue,
            settled: Arc::new(Settled::default()),
            supervisor,
            publisher,
            shutdown,
            tasks: vec![sup_task],
        })
    }

    /// Starts the audit-log consumer on `pool`.
    pub fn consume(&mut self, pool: &PgPool) {
        let runner = ConsumerRunner::observed(
            AuditLog::new(pool.clone()),
            self.audit_queue.clone(),
            runner_settings(),
            self.settled.clone(),
        );
        self.spawn(runner);
    }

    /// Starts the automation trigger on `pool`, on its queue bound `#` as by default.
    pub fn trigger(&mut self, pool: &PgPool) {
        let runner = ConsumerRunner::observed(
            AutomationTrigger::new(pool.clone(), "commands"),
            self.trigger_queue.clone(),
            runner_settings(),
            self.settled.clone(),
        );
        self.spawn(runner);
    }

    fn spawn<J: worker_core::ConsumerJob>(&mut self, runner: ConsumerRunner<J>) {
        let supervisor = self.supervisor.clone();
        let shutdown = self.shutdown.clone();
        self.tasks.push(tokio::spawn(async move {
            runner.run(&supervisor, shutdown).await;
        }));
    }

    pub async fn publish(&self, message: &Outgoing) -> anyhow::Result<()> {
        self.publisher.publish(message).await?;
        Ok(())
    }

    /// Messages in `queue` now, as the management API last sampled them.
    pub async fn depth(&self, queue: &str) -> u64 {
        self.vhost.queue_depth(queue).await.unwrap()
    }

    /// Takes the oldest message off `dead_queue` through the management API: its headers as
    /// JSON, or `None` when the queue is empty.
    pub async fn take_dead(&self, dead_queue: &str) -> anyhow::Result<Option<serde_json::Value>> {
        let got = self
            .vhost
            .api(
                reqwest::Method::POST,
                &format!("queues/{{vhost}}/{dead_queue}/get"),
                Some(serde_json::json!({
                    "count": 1, "ackmode": "ack_requeue_false", "encoding": "auto",
                })),
            )
            .await?;
        Ok(got
            .get(0)
            .map(|message| message["properties"]["headers"].clone()))
    }

    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        for task in self.tasks.drain(..) {
            tokio::time::timeout(Duration::from_secs(20), task).await??;
        }
        Ok(())
    }
}

/// How many rows `audit_log_entries` holds.
pub async fn stored(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM audit_log_entries")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Waits until `check` holds, for at most `within`.
pub async fn eventually<F, Fut>(within: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
