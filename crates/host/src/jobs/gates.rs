//! Consumer jobs' pauses on this replica: a [`Gate`] per consumer job, closed while an operator
//! has paused it (`job_pauses`, shared by every replica), which its consume loop obeys (see
//! `worker_broker::consumer::gate`).
//!
//! Every replica reacts to a pause or a resume in two ways: at once, on the notice the change
//! sends on commit (`LISTEN job_pauses`, on a connection of its own), and at the latest within
//! `workers.pause_poll`, by reading the pauses again, for a notice that was lost (sent while
//! its listener reconnected). A reading that fails keeps the gates as they were: a pause an
//! operator set is not undone by a database that is slow to answer.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use worker_broker::Gate;
use worker_store::pauses::{self, Pause};

/// How long one reading of the pauses may take before it is given up (until the next).
const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// The wait before listening again after the listener failed.
const RELISTEN_WAIT: Duration = Duration::from_secs(2);

/// A gate per consumer job of the list, by its name.
#[derive(Debug)]
pub struct ConsumerGates {
    gates: BTreeMap<&'static str, watch::Sender<bool>>,
}

impl ConsumerGates {
    /// Gates for every consumer job, closed for those `paused` names (under any of their names).
    pub fn new(paused: &[Pause]) -> Self {
        let gates = crate::settings::all()
            .into_iter()
            .filter(|spec| !spec.is_timer())
            .map(|spec| {
                let closed = super::pause_of(paused, spec.name).is_some();
                (spec.name, watch::channel(closed).0)
            })
            .collect();
        Self { gates }
    }

    /// The gate of consumer job `job`.
    pub fn gate(&self, job: &str) -> Option<Gate> {
        self.gates.get(job).map(|tx| Gate::new(tx.subscribe()))
    }

    /// Whether this replica holds `job`'s consumers stopped now.
    pub fn is_closed(&self, job: &str) -> bool {
        self.gates.get(job).is_some_and(|tx| *tx.borrow())
    }

    /// Closes the gates of the `paused` jobs and opens the others.
    pub fn apply(&self, paused: &[Pause]) {
        for (job, tx) in &self.gates {
            let closed = super::pause_of(paused, job).is_some();
            tx.send_if_modified(|was| {
                let changed = *was != closed;
                *was = closed;
                if changed {
                    tracing::info!(
                        job,
                        paused = closed,
                        "consumer job {}",
                        if closed {
                            "paused: stopping its consumers"
                        } else {
                            "resumed: consuming again"
                        }
                    );
                }
                changed
            });
        }
    }
}

/// Keeps `gates` in step with the database until `shutdown`: on every notice, and every
/// `poll`. Spawn it through the host's tracker.
pub async fn watch(
    gates: std::sync::Arc<ConsumerGates>,
    pool: sqlx::PgPool,
    poll: Duration,
    shutdown: CancellationToken,
) {
    let mut listener = None;
    let mut listen_after = tokio::time::Instant::now();
    let mut ticks = tokio::time::interval(poll);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if listener.is_none() && tokio::time::Instant::now() >= listen_after {
            match tokio::time::timeout(READ_TIMEOUT * 5, pauses::listen(&pool)).await {
                Ok(Ok(listening)) => listener = Some(listening),
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, every = ?poll, "cannot LISTEN for pauses; reading them on the poll only");
                    listen_after = tokio::time::Instant::now() + RELISTEN_WAIT;
                }
                Err(_) => {
                    tracing::warn!(every = ?poll, "LISTEN for pauses got no answer; reading them on the poll only");
                    listen_after = tokio::time::Instant::now() + RELISTEN_WAIT;
                }
            }
        }
        tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            received = notice(listener.as_mut()) => {
                if let Err(e) = received {
                    tracing::warn!(error = %worker_core::error_chain(&e), "the pause listener lost its connection; listening again");
                    listener = None;
                    listen_after = tokio::time::Instant::now() + RELISTEN_WAIT;
                }
            }
            _ = ticks.tick() => {}
        }
        match tokio::time::timeout(READ_TIMEOUT, pauses::list(&pool)).await {
            Ok(Ok(paused)) => gates.apply(&paused),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "reading the paused jobs failed; keeping the consumers as they are");
            }
            Err(_) => tracing::debug!(
                "reading the paused jobs took too long; keeping the consumers as they are"
            ),
        }
    }
}

/// The next notice (`Ok(None)` after sqlx reconnected it, when notices may have been lost:
/// the pauses are read again either way); never, without a listener.
async fn notice(
    listener: Option<&mut sqlx::postgres::PgListener>,
) -> Result<Option<sqlx::postgres::PgNotification>, sqlx::Error> {
    match listener {
        Some(listener) => listener.try_recv().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use chrono::Utc;

    use super::*;

    fn pause(job: &str) -> Pause {
        Pause {
            job: job.into(),
            paused_at: Utc::now(),
            action_id: 1,
            actor_user: "u".into(),
            actor_host: "h".into(),
            actor: None,
            account: None,
            via: None,
            reason: None,
        }
    }

    #[test]
    fn every_consumer_has_a_gate_closed_while_paused_and_timers_have_none() {
        let gates = ConsumerGates::new(&[pause("email-send")]);
        assert!(gates.gate("draft-expiry").is_none());
        let send = gates.gate("email-send").unwrap();
        let action = gates.gate("automation-action").unwrap();
        assert!(send.is_closed());
        assert!(!action.is_closed());
        gates.apply(&[pause("automation-action")]);
        assert!(!send.is_closed(), "resumed");
        assert!(action.is_closed());
        assert!(gates.is_closed("automation-action"));
    }
}
