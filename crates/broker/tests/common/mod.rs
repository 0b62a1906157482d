//! Shared support for the broker's integration tests: a vhost of the test's own with the
//! topology of one consumer queue (`orders`, bound to `commands`), a scripted job, an event
//! recorder and helpers to publish and read raw messages.
#![allow(dead_code)]
// Test support: a poisoned lock or a missing fixture should fail the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicGetOptions, BasicPublishOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use worker_broker::consumer::{
    ConsumerEvents, ConsumerRunner, ConsumerSettings, DeliveryReport, Outcome,
};
use worker_broker::{
    ConnectionSettings, QueueDefaults, QueueSettings, QueueTopology, Supervisor, Topology,
    TopologySettings,
};
use worker_core::{ConsumerJob, Failure, Handled, RetryPolicy, TryRecord, WorkContext};
use worker_testkit::TestVhost;

pub const QUEUE: &str = "orders";

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Queue settings with short tiers, for tests.
pub fn queue_settings(tiers: &[u64], delivery_limit: u32) -> QueueSettings {
    QueueSettings {
        retry_tiers: tiers.iter().map(|&t| ms(t)).collect(),
        delivery_limit,
        ..QueueSettings::default()
    }
}

pub fn topology(settings: &QueueSettings) -> anyhow::Result<Topology> {
    let topo = TopologySettings::default();
    let queue = QueueTopology::from_settings(settings, QueueDefaults::command(QUEUE, &topo))?;
    Ok(Topology::from_settings(&topo, [queue])?)
}

/// Consumer settings that keep tests fast: quick in-process retries, short timeouts.
pub fn consumer_settings(max_attempts: u32) -> ConsumerSettings {
    ConsumerSettings {
        prefetch: 20,
        concurrency: 4,
        max_attempts,
        timeout: Duration::from_secs(5),
        retry: Some(RetryPolicy {
            max_tries: 2,
            base_delay: ms(10),
            factor: 2.0,
            max_delay: ms(50),
            jitter: false,
        }),
        settle_deadline: Duration::from_secs(5),
        in_process_wait: Duration::from_secs(30),
        ack_interval: ms(5),
        publish_timeout: Duration::from_secs(5),
    }
}

pub fn connection_settings(vhost: &TestVhost) -> anyhow::Result<ConnectionSettings> {
    let mut settings = ConnectionSettings::from_uri(&vhost.amqp_url())?;
    settings.reconnect_min = ms(100);
    settings.reconnect_max = Duration::from_secs(1);
    settings.heartbeat = Duration::from_secs(5);
    settings.connection_name = format!("worker-broker-test {}", vhost.name);
    Ok(settings)
}

/// A running supervisor and consumer on a fresh vhost.
pub struct Harness {
    pub vhost: TestVhost,
    pub topology: Topology,
    pub supervisor: Supervisor,
    pub events: Arc<Recorder>,
    pub job: ScriptedJob,
    pub shutdown: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Harness {
    pub async fn start(queue: QueueSettings, consumer: ConsumerSettings) -> anyhow::Result<Self> {
        let vhost = TestVhost::create().await?;
        Self::start_on(vhost, queue, consumer).await
    }

    pub async fn start_on(
        vhost: TestVhost,
        queue: QueueSettings,
        consumer: ConsumerSettings,
    ) -> anyhow::Result<Self> {
        let topology = topology(&queue)?;
        let supervisor = Supervisor::new(connection_settings(&vhost)?, topology.clone());
        let shutdown = CancellationToken::new();
        let events = Arc::new(Recorder::default());
        let job = ScriptedJob::default();
        let runner = ConsumerRunner::observed(
            job.clone(),
            topology.queues[0].clone(),
            consumer,
            events.clone(),
        );
        let sup_task = tokio::spawn(supervisor.clone().run(shutdown.clone()));
        let consumer_task = {
            let supervisor = supervisor.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move { runner.run(&supervisor, shutdown).await })
        };
        let harness = Self {
            vhost,
            topology,
            supervisor,
            events,
            job,
            shutdown,
            tasks: vec![sup_task, consumer_task],
        };
        harness.wait_connected(Duration::from_secs(15)).await?;
        Ok(harness)
    }

    pub async fn wait_connected(&self, within: Duration) -> anyhow::Result<()> {
        let mut status = self.supervisor.status();
        tokio::time::timeout(within, status.wait_for(|s| s.is_ready()))
            .await
            .context("the supervisor did not connect in time")?
            .context("supervisor gone")?;
        Ok(())
    }

    pub fn queue(&self) -> &QueueTopology {
        &self.topology.queues[0]
    }

    /// A plain connection for the test's own publishing and reading.
    pub async fn connection(&self) -> anyhow::Result<Connection> {
        Ok(connection_settings(&self.vhost)?.connect().await?)
    }

    /// Shuts the consumer and the supervisor down; the vhost stays until the harness drops.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        for task in self.tasks.drain(..) {
            tokio::time::timeout(Duration::from_secs(20), task)
                .await
                .context("a task did not stop in time")??;
        }
        Ok(())
    }
}

/// What the scripted job does with a message.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Behaviour {
    #[default]
    Ok,
    Permanent,
    /// Fails transiently until the message's attempt reaches `until_attempt` (never if absent).
    Transient {
        until_attempt: Option<u32>,
    },
    Throttled {
        ms: u64,
    },
    /// Takes `ms` to succeed, unless cancelled.
    Sleep {
        ms: u64,
    },
}

#[derive(Debug, Clone, Deserialize)]
pub struct Order {
    pub id: String,
    #[serde(default)]
    pub behaviour: Behaviour,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub id: String,
    pub attempt: u32,
    pub try_number: u32,
}

#[derive(Debug, Clone, Default)]
pub struct ScriptedJob {
    pub calls: Arc<Mutex<Vec<Call>>>,
}

impl ScriptedJob {
    pub fn calls_for(&self, id: &str) -> Vec<Call> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.id == id)
            .cloned()
            .collect()
    }
}

impl ConsumerJob for ScriptedJob {
    type Input = Order;

    fn name(&self) -> &str {
        "orders"
    }

    async fn handle(&self, ctx: &WorkContext, input: &Order) -> Result<Handled, Failure> {
        self.calls.lock().unwrap().push(Call {
            id: input.id.clone(),
            attempt: ctx.attempt,
            try_number: ctx.try_number,
        });
        match &input.behaviour {
            Behaviour::Ok => Ok(Handled::Done),
            Behaviour::Permanent => Err(Failure::permanent(
                "bad-order",
                format!("order {} is refused", input.id),
            )),
            Behaviour::Transient { until_attempt } => match until_attempt {
                Some(n) if ctx.attempt >= *n => Ok(Handled::Done),
                _ => Err(Failure::transient(format!(
                    "order {} hit a flaky dependency",
                    input.id
                ))),
            },
            Behaviour::Throttled { ms } => {
                Err(Failure::throttled(Duration::from_millis(*ms), "slow down"))
            }
            Behaviour::Sleep { ms } => tokio::select! {
                () = ctx.cancel.cancelled() => Err(Failure::transient("cancelled")),
                () = tokio::time::sleep(Duration::from_millis(*ms)) => Ok(Handled::Done),
            },
        }
    }
}

#[derive(Debug, Clone)]
pub struct Event {
    pub message_id: Option<String>,
    pub attempt: u32,
    pub tries: u32,
    pub outcome: Outcome,
}

/// Records every settled delivery.
#[derive(Debug, Default)]
pub struct Recorder {
    pub settled: Mutex<Vec<Event>>,
    pub tries: Mutex<u64>,
}

impl ConsumerEvents for Recorder {
    fn on_try(&self, _queue: &str, _record: &TryRecord<'_>) {
        *self.tries.lock().unwrap() += 1;
    }

    fn on_settled(&self, s: &DeliveryReport<'_>) {
        self.settled.lock().unwrap().push(Event {
            message_id: s.message_id.map(str::to_string),
            attempt: s.attempt,
            tries: s.tries,
            outcome: s.outcome.clone(),
        });
    }
}

impl Recorder {
    pub fn for_message(&self, id: &str) -> Vec<Event> {
        self.settled
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.message_id.as_deref() == Some(id))
            .cloned()
            .collect()
    }

    /// Waits until `cond` holds for the events of message `id`.
    pub async fn wait_for(
        &self,
        id: &str,
        within: Duration,
        cond: impl Fn(&[Event]) -> bool,
    ) -> anyhow::Result<Vec<Event>> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let events = self.for_message(id);
            if cond(&events) {
                return Ok(events);
            }
            if tokio::time::Instant::now() > deadline {
                bail!("message {id}: condition not met within {within:?}; events: {events:?}");
            }
            tokio::time::sleep(ms(20)).await;
        }
    }
}

/// Publishes a raw message (no confirms needed: the test checks what arrives).
pub async fn publish_raw(
    channel: &Channel,
    exchange: &str,
    routing_key: &str,
    body: &[u8],
    properties: BasicProperties,
) -> anyhow::Result<()> {
    let confirm = channel
        .basic_publish(
            exchange.into(),
            routing_key.into(),
            BasicPublishOptions {
                mandatory: true,
                immediate: false,
            },
            body,
            properties,
        )
        .await?
        .await?;
    if confirm.take_message().is_some() {
        bail!("test publish to {exchange}/{routing_key} was returned unroutable");
    }
    Ok(())
}

/// Properties as a well-behaved publisher sets them, plus an application header and a trace.
pub fn properties(id: &str) -> BasicProperties {
    let mut headers = FieldTable::default();
    headers.insert("app-header".into(), AMQPValue::LongString("kept".into()));
    headers.insert(
        "traceparent".into(),
        AMQPValue::LongString("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
    );
    BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type("application/json".into())
        .with_message_id(id.into())
        .with_correlation_id(format!("corr-{id}").as_str().into())
        .with_type("order.placed".into())
        .with_timestamp(1_700_000_000)
        .with_headers(headers)
}

pub fn with_header(props: BasicProperties, key: &str, value: AMQPValue) -> BasicProperties {
    let mut headers = props.headers().clone().unwrap_or_default();
    headers.insert(key.into(), value);
    props.with_headers(headers)
}

/// Takes the next message of `queue` (acking it), waiting up to `within` for one.
pub async fn get_one(channel: &Channel, queue: &str, within: Duration) -> anyhow::Result<Delivery> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(message) = channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: false })
            .await?
        {
            let delivery = message.delivery;
            channel
                .basic_ack(delivery.delivery_tag, BasicAckOptions::default())
                .await?;
            return Ok(delivery);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("no message in {queue} within {within:?}");
        }
        tokio::time::sleep(ms(25)).await;
    }
}

/// Takes every message of `queue` that arrives within `within`, stopping early at `expected`.
pub async fn get_all(
    channel: &Channel,
    queue: &str,
    expected: usize,
    within: Duration,
) -> anyhow::Result<Vec<Delivery>> {
    let deadline = tokio::time::Instant::now() + within;
    let mut out = Vec::new();
    while out.len() < expected && tokio::time::Instant::now() < deadline {
        match channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: false })
            .await?
        {
            Some(message) => {
                channel
                    .basic_ack(message.delivery.delivery_tag, BasicAckOptions::default())
                    .await?;
                out.push(message.delivery);
            }
            None => tokio::time::sleep(ms(25)).await,
        }
    }
    Ok(out)
}

pub fn header<'a>(delivery: &'a Delivery, key: &str) -> Option<&'a AMQPValue> {
    delivery.properties.headers().as_ref()?.inner().get(key)
}

pub fn header_str(delivery: &Delivery, key: &str) -> Option<String> {
    match header(delivery, key)? {
        AMQPValue::LongString(s) => Some(s.to_string()),
        AMQPValue::ShortString(s) => Some(s.to_string()),
        _ => None,
    }
}

pub fn header_int(delivery: &Delivery, key: &str) -> Option<i64> {
    match header(delivery, key)? {
        AMQPValue::LongLongInt(v) => Some(*v),
        AMQPValue::LongInt(v) => Some(i64::from(*v)),
        AMQPValue::ShortInt(v) => Some(i64::from(*v)),
        AMQPValue::LongUInt(v) => Some(i64::from(*v)),
        _ => None,
    }
}

/// Runs `rabbitmqctl` with `args`; the broker is local in these tests.
pub fn rabbitmqctl(args: &[&str]) -> anyhow::Result<()> {
    let output = std::process::Command::new("rabbitmqctl")
        .args(args)
        .output()
        .context("running rabbitmqctl")?;
    if !output.status.success() {
        bail!(
            "rabbitmqctl {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}
