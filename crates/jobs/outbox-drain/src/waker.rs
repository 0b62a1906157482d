//! The wake-up: `LISTEN outbox` on a connection of its own, and a [`Notify`] signalled for
//! every notification, so that the host ticks the drain as soon as a row commits.
//!
//! Notifications sent while the listener is not connected are lost, which is why the host
//! also ticks the drain on its schedule. To shorten the gap, the listener signals once each
//! time it (re)connects: whatever was committed meanwhile is drained at once. It reconnects
//! by itself, with a growing delay, until its token fires.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use sqlx::postgres::{PgListener, PgPoolOptions};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// How the listener reconnects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ListenerSettings {
    /// The channel to listen on ([`worker_store::outbox::CHANNEL`]).
    pub channel: String,
    /// The wait before the first reconnect; doubles on each failure.
    #[serde(with = "humantime_serde")]
    pub reconnect_min: Duration,
    /// The longest wait between reconnects.
    #[serde(with = "humantime_serde")]
    pub reconnect_max: Duration,
}

impl Default for ListenerSettings {
    fn default() -> Self {
        Self {
            channel: worker_store::outbox::CHANNEL.to_string(),
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(30),
        }
    }
}

/// Listens on the outbox channel and signals `wake` (with [`Notify::notify_one`], so that a
/// signal sent while the drain is busy is kept for its next wait) for every notification and
/// after every (re)connection. Returns when `shutdown` fires.
///
/// It uses a connection of its own, opened with `pool`'s connect options (a listening
/// connection is held for good, and must not starve the pool); `pool` itself is not used. Spawn it through the host's
/// task tracker; it never returns an error, it reconnects.
pub async fn listen(
    pool: PgPool,
    settings: ListenerSettings,
    wake: Arc<Notify>,
    shutdown: CancellationToken,
) {
    let options = (*pool.connect_options())
        .clone()
        .application_name("worker-host outbox listener");
    // A pool of one that never expires its connection: PgListener reconnects through it.
    let own = PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .max_lifetime(None)
        .idle_timeout(None)
        .acquire_timeout(Duration::from_secs(10))
        .connect_lazy_with(options);
    // Reconnects go where `pool` points: to the primary it follows, after a failover too.
    worker_store::primary::keep_in_step(&pool, &own);
    let mut backoff = worker_core::Backoff::doubling(
        settings.reconnect_min.max(Duration::from_millis(10)),
        settings.reconnect_max,
    );
    let mut failures = 0u32;
    while !shutdown.is_cancelled() {
        let connected = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            connected = subscribe(&own, &settings.channel) => connected,
        };
        let mut listener = match connected {
            Ok(listener) => listener,
            Err(err) => {
                failures += 1;
                // The first failure is worth a warning; a long outage is not worth one a try.
                if failures == 1 || failures.is_power_of_two() {
                    tracing::warn!(
                        channel = %settings.channel,
                        failures,
                        retry_in = %humantime::format_duration(backoff.current()),
                        error = %worker_core::error_chain(&err),
                        "cannot LISTEN for outbox rows; the drain runs on its schedule meanwhile"
                    );
                }
                if sleep_or_stop(backoff.next_wait(), &shutdown).await {
                    break;
                }
                continue;
            }
        };
        if failures > 0 {
            tracing::info!(channel = %settings.channel, "listening for outbox rows again");
        }
        failures = 0;
        backoff.reset();
        // Rows committed while nobody listened: drain them now.
        wake.notify_one();
        loop {
            let received = tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                received = listener.try_recv() => received,
            };
            match received {
                Ok(Some(_)) => wake.notify_one(),
                Ok(None) => {
                    // The connection was lost and sqlx has reconnected and subscribed again;
                    // what was sent in between is lost.
                    tracing::info!(channel = %settings.channel, "outbox listener reconnected");
                    wake.notify_one();
                }
                Err(err) => {
                    tracing::warn!(
                        channel = %settings.channel,
                        error = %worker_core::error_chain(&err),
                        "the outbox listener lost its connection; reconnecting"
                    );
                    failures = 1;
                    break;
                }
            }
        }
        drop(listener);
        if shutdown.is_cancelled() || sleep_or_stop(backoff.current(), &shutdown).await {
            break;
        }
    }
    own.close().await;
}

async fn subscribe(pool: &PgPool, channel: &str) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    // The pool is ours alone: waiting on it must not end because it was closed elsewhere.
    listener.ignore_pool_close_event(true);
    listener.listen(channel).await?;
    Ok(listener)
}

/// Sleeps `wait`; true when `shutdown` fired first.
async fn sleep_or_stop(wait: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        biased;
        () = shutdown.cancelled() => true,
        () = tokio::time::sleep(wait) => false,
    }
}
