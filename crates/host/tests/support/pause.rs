//! A consumer job's pause as its tests watch it from outside: a queue's consumers and ready
//! messages by passive declare (exact, at once), and its redeliveries through the RabbitMQ
//! management API (sampled: read once its figures have caught up).

use std::time::{Duration, Instant};

use worker_testkit::TestVhost;

/// `email-send`'s queue.
pub const QUEUE: &str = "email.send";

/// A connection of the test's own to a vhost, to look at its queues.
pub struct QueueWatch {
    _connection: lapin::Connection,
    channel: lapin::Channel,
}

impl QueueWatch {
    pub async fn open(vhost: &TestVhost) -> anyhow::Result<Self> {
        let connection = worker_testkit::amqp::connect(vhost).await?;
        let channel = connection.create_channel().await?;
        Ok(Self {
            _connection: connection,
            channel,
        })
    }

    /// `queue`'s ready messages and consumers, as the broker says now.
    pub async fn counts(&self, queue: &str) -> anyhow::Result<(u32, u32)> {
        worker_testkit::amqp::counts(&self.channel, queue).await
    }

    /// Waits (up to `within`) until `queue` has `count` consumers; returns how long it took.
    pub async fn wait_consumers(
        &self,
        queue: &str,
        count: u32,
        within: Duration,
    ) -> anyhow::Result<Duration> {
        let start = Instant::now();
        loop {
            let (_, consumers) = self.counts(queue).await?;
            if consumers == count {
                return Ok(start.elapsed());
            }
            if start.elapsed() > within {
                anyhow::bail!("{queue} has {consumers} consumers, not {count}, after {within:?}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Watches `queue` from `start` until it has no consumer; returns when each of the
    /// `from` consumers went (in the order they went).
    pub async fn each_gone(
        &self,
        queue: &str,
        from: u32,
        start: Instant,
        within: Duration,
    ) -> anyhow::Result<Vec<Duration>> {
        let mut gone = Vec::new();
        let mut left = from;
        while left > 0 {
            let (_, consumers) = self.counts(queue).await?;
            let at = start.elapsed();
            while consumers < left {
                gone.push(at);
                left -= 1;
            }
            if at > within {
                anyhow::bail!("{consumers} consumers still on {queue} after {within:?}");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(gone)
    }
}

/// How many deliveries from `queue` were acked and how many redelivered (a nack with requeue,
/// or a channel closed with deliveries unacked), once the management API's sampled figures
/// show at least `acked` acks (up to `within`).
pub async fn acked_and_redelivered(
    vhost: &TestVhost,
    queue: &str,
    acked: u64,
    within: Duration,
) -> anyhow::Result<(u64, u64)> {
    let start = Instant::now();
    loop {
        let info = vhost
            .api(
                reqwest::Method::GET,
                &format!("queues/{{vhost}}/{queue}"),
                None,
            )
            .await?;
        let stats = &info["message_stats"];
        let seen = stats["ack"].as_u64().unwrap_or(0);
        if seen >= acked || start.elapsed() > within {
            return Ok((seen, stats["redeliver"].as_u64().unwrap_or(0)));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
