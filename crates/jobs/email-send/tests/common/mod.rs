//! What the email-send tests share: queueing a row, reading it back, a sender on a private
//! SMTP sink.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;
use worker_core::WorkContext;
use worker_messages::EmailSendCommand;
use worker_testkit::SmtpSink;

use job_email_send::{EmailSender, JOB_NAME, SmtpSettings};

pub fn ctx() -> WorkContext {
    WorkContext::new(JOB_NAME, CancellationToken::new())
}

pub fn command(id: Uuid) -> EmailSendCommand {
    EmailSendCommand {
        outbound_email_id: id,
    }
}

/// SMTP settings for a private sink, with `pool_size` connections.
pub fn smtp_for(sink: &SmtpSink, pool_size: u32) -> SmtpSettings {
    SmtpSettings {
        host: "127.0.0.1".into(),
        port: sink.port,
        security: worker_core::TlsMode::Plain,
        pool_size,
        connect_timeout: Duration::from_secs(5),
        ..SmtpSettings::default()
    }
}

/// A sender on `sink` with `pool_size` connections and every send bounded by `send_timeout`.
pub fn sender_for(
    pool: &PgPool,
    sink: &SmtpSink,
    pool_size: u32,
    send_timeout: Duration,
) -> EmailSender {
    EmailSender::new(
        pool.clone(),
        &smtp_for(sink, pool_size),
        "Worker Host <worker-host@localhost>",
        send_timeout,
    )
    .unwrap()
}

/// Queues a mail to `to`, as the action executor would; returns its id.
pub async fn queue(pool: &PgPool, to: &str, subject: &str) -> Uuid {
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO outbound_emails (id, message_id, to_addresses, subject, text_body) \
         VALUES ($1, $2, $3, $4, 'pong')",
    )
    .bind(id)
    .bind(format!("{id}@worker-host"))
    .bind(vec![to.to_string()])
    .bind(subject)
    .execute(pool)
    .await
    .unwrap();
    id
}

/// (status, attempts, last_error, smtp_response) of a row.
pub async fn row(pool: &PgPool, id: Uuid) -> (String, i32, Option<String>, Option<String>) {
    sqlx::query_as(
        "SELECT status, attempts, last_error, smtp_response FROM outbound_emails WHERE id = $1",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The sender under the real [`ConsumerRunner`] on the `email.send` queue of a vhost of the
/// test's own, and a publisher of commands.
pub struct Delivery {
    pub vhost: worker_testkit::TestVhost,
    pub queue: worker_broker::QueueTopology,
    publisher: worker_broker::Publisher,
    shutdown: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Delivery {
    /// Starts a supervisor and a runner for `sender`: `tries` in process, one retry tier of
    /// `tier`, handlers cut off after `timeout`.
    pub async fn start(
        sender: EmailSender,
        tries: u32,
        tier: Duration,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        use worker_broker::consumer::{ConsumerRunner, ConsumerSettings};
        use worker_broker::{
            ConnectionSettings, Publisher, PublisherSettings, QueueDefaults, QueueSettings,
            QueueTopology, Supervisor, Topology, TopologySettings,
        };
        let vhost = worker_testkit::TestVhost::create().await?;
        let topo = TopologySettings::default();
        let queue = QueueTopology::from_settings(
            &QueueSettings {
                retry_tiers: vec![tier],
                delivery_limit: 10,
                ..QueueSettings::default()
            },
            QueueDefaults::command(worker_messages::queues::EMAIL_SEND, &topo),
        )?;
        let topology = Topology::from_settings(&topo, [queue.clone()])?;
        let mut connection = ConnectionSettings::from_uri(&vhost.amqp_url())?;
        connection.reconnect_min = Duration::from_millis(100);
        connection.reconnect_max = Duration::from_secs(1);
        let supervisor = Supervisor::new(connection, topology);
        let shutdown = CancellationToken::new();
        let settings = ConsumerSettings {
            prefetch: 20,
            concurrency: 8,
            max_attempts: 5,
            timeout,
            retry: Some(worker_core::RetryPolicy {
                max_tries: tries,
                base_delay: Duration::from_millis(50),
                factor: 2.0,
                max_delay: Duration::from_millis(200),
                jitter: false,
            }),
            in_process_wait: Duration::from_secs(30),
            settle_deadline: Duration::from_secs(5),
            ack_interval: Duration::from_millis(10),
            publish_timeout: Duration::from_secs(5),
        };
        let runner = ConsumerRunner::new(sender, queue.clone(), settings);
        let sup_task = tokio::spawn(supervisor.clone().run(shutdown.clone()));
        let consumer_task = {
            let supervisor = supervisor.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move { runner.run(&supervisor, shutdown).await })
        };
        let mut status = supervisor.status();
        tokio::time::timeout(Duration::from_secs(15), status.wait_for(|s| s.is_ready())).await??;
        let publisher = Publisher::new(supervisor.sessions(), PublisherSettings::default());
        Ok(Self {
            vhost,
            queue,
            publisher,
            shutdown,
            tasks: vec![sup_task, consumer_task],
        })
    }

    /// Publishes the command to send email `id`.
    pub async fn publish(&self, id: Uuid) -> anyhow::Result<()> {
        let message =
            worker_broker::Outgoing::json("commands", worker_messages::EMAIL_SEND, &command(id))?
                .with_message_id(&id.to_string());
        self.publisher.publish(&message).await?;
        Ok(())
    }

    /// Publishes the command to send email `id` with the header `x-schema-version` set to
    /// `version`, as a publisher of another release would.
    pub async fn publish_version(&self, id: Uuid, version: i64) -> anyhow::Result<()> {
        let mut message =
            worker_broker::Outgoing::json("commands", worker_messages::EMAIL_SEND, &command(id))?
                .with_message_id(&id.to_string());
        message
            .properties
            .headers
            .insert(worker_messages::SCHEMA_VERSION_HEADER, version);
        self.publisher.publish(&message).await?;
        Ok(())
    }

    /// Takes the oldest message off the dead queue through the management API: its headers
    /// as JSON, or `None` when the queue is empty.
    pub async fn take_dead(&self) -> anyhow::Result<Option<serde_json::Value>> {
        let got = self
            .vhost
            .api(
                reqwest::Method::POST,
                &format!("queues/{{vhost}}/{}/get", self.queue.dead_queue),
                Some(serde_json::json!({
                    "count": 1, "ackmode": "ack_requeue_false", "encoding": "auto",
                })),
            )
            .await?;
        Ok(got
            .get(0)
            .map(|message| message["properties"]["headers"].clone()))
    }

    /// Messages waiting in the retry tier.
    pub async fn parked(&self) -> anyhow::Result<u64> {
        self.vhost.queue_depth(&self.queue.tiers[0].queue).await
    }

    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        for task in self.tasks.drain(..) {
            tokio::time::timeout(Duration::from_secs(20), task).await??;
        }
        Ok(())
    }
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
