//! The host and its service manager: systemd's notify protocol (through `sd-notify`), for the
//! packaged unit's `Type=notify` and `WatchdogSec=`.
//!
//! - `READY=1` once [`Readiness`] holds, the same condition as `/readyz`, so that `systemctl
//!   start` returns when the host can work, not when its process exists.
//! - `WATCHDOG=1` every half of the period systemd gives (`WATCHDOG_USEC`), but only while no
//!   unit of work is overdue ([`Liveness::overdue`]): a unit that its timeout could not end
//!   has wedged a thread, and a host that stops pinging is restarted by systemd. A host that
//!   is only busy keeps pinging: a slow unit is cancelled at its timeout and is never overdue.
//!   A runtime with every thread blocked pings nothing, which is right too.
//! - `STOPPING=1` when shutdown begins, and `STATUS=` lines throughout, which `systemctl
//!   status` shows.
//!
//! Without `NOTIFY_SOCKET` (not under systemd) nothing is sent and nothing is spawned.

use std::time::Duration;

use sd_notify::NotifyState;
use tokio_util::sync::CancellationToken;
use worker_core::liveness::Liveness;

use crate::readiness::Readiness;

/// How often readiness is looked at until it holds.
const READY_POLL: Duration = Duration::from_millis(250);

/// Sends notifications to the service manager, when there is one.
#[derive(Debug, Clone, Copy)]
pub struct Notifier {
    enabled: bool,
}

impl Notifier {
    /// A notifier for the service manager this process was started by (`NOTIFY_SOCKET`), if
    /// any.
    pub fn from_env() -> Self {
        Self {
            enabled: std::env::var_os("NOTIFY_SOCKET").is_some(),
        }
    }

    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// Shutdown has begun.
    pub fn stopping(&self, status: &str) {
        self.send(&[NotifyState::Stopping, NotifyState::Status(status)]);
    }

    fn send(&self, states: &[NotifyState<'_>]) {
        if !self.enabled {
            return;
        }
        if let Err(e) = sd_notify::notify(states) {
            tracing::warn!(error = %e, "a notification to the service manager failed");
        }
    }
}

/// Tells the service manager when the host is ready, then feeds its watchdog while no unit
/// of work is overdue, until `shutdown`. Returns at once without a service manager.
pub async fn supervise(
    notifier: Notifier,
    readiness: Readiness,
    liveness: Liveness,
    shutdown: CancellationToken,
) {
    if !notifier.is_enabled() {
        return;
    }
    let watchdog = sd_notify::watchdog_enabled();
    tokio::join!(
        announce_ready(notifier, readiness, &shutdown),
        feed_watchdog(notifier, watchdog, liveness, &shutdown),
    );
}

async fn announce_ready(notifier: Notifier, readiness: Readiness, shutdown: &CancellationToken) {
    let mut last_status = String::new();
    loop {
        let report = readiness.check().await;
        if report.ready {
            tracing::info!("ready; told the service manager");
            notifier.send(&[NotifyState::Ready, NotifyState::Status("ready")]);
            return;
        }
        let status = format!("waiting: {}", report.failures());
        if status != last_status {
            notifier.send(&[NotifyState::Status(&status)]);
            last_status = status;
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(READY_POLL) => {}
        }
    }
}

async fn feed_watchdog(
    notifier: Notifier,
    watchdog: Option<Duration>,
    liveness: Liveness,
    shutdown: &CancellationToken,
) {
    let Some(period) = watchdog else {
        return;
    };
    tracing::info!(period = ?period, "feeding the service manager's watchdog");
    let mut interval = tokio::time::interval(period / 2);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut withheld = false;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = interval.tick() => {}
        }
        let overdue = liveness.overdue();
        match (overdue.first(), withheld) {
            (None, false) => notifier.send(&[NotifyState::Watchdog]),
            (None, true) => {
                withheld = false;
                tracing::warn!("no unit of work is overdue any more; feeding the watchdog again");
                notifier.send(&[NotifyState::Watchdog, NotifyState::Status("ready")]);
            }
            (Some(longest), _) => {
                let status = format!(
                    "wedged: {longest} ({} overdue); not feeding the watchdog",
                    overdue.len()
                );
                if !withheld {
                    withheld = true;
                    tracing::error!(
                        job = %longest.job,
                        overdue = overdue.len(),
                        "{longest}: its thread is blocked out of the timeout's reach; \
                         the watchdog is no longer fed, so systemd restarts the host"
                    );
                }
                notifier.send(&[NotifyState::Status(&status)]);
            }
        }
    }
}
