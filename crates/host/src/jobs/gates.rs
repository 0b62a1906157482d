//! Consumer jobs' pauses on this replica: a [`Gate`] per consumer job, closed while an operator
//! has paused it (`job_pauses`, shared by every replica) or while the circuit of the dependency
//! it cannot work without is open (`dependency_circuits`: the SMTP relay for `email-send`),
//! which its consume loop obeys (see `worker_broker::consumer::gate`).
//!
//! Every replica reacts to a pause or a resume, and to a circuit opening or closing, in two
//! ways: at once, on the notice the change sends on commit (`LISTEN job_pauses`, on a
//! connection of its own), and at the latest within `workers.pause_poll`, by reading the pauses
//! and circuits again, for a notice that was lost (sent while its listener reconnected). A
//! circuit this replica opened or closed itself applies at once, before its notice returns. A
//! reading that fails keeps the gates as they were: a pause an operator set is not undone by a
//! database that is slow to answer.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use worker_broker::Gate;
use worker_store::circuits::{self, Circuits, OpenCircuit};
use worker_store::pauses::{self, Pause};

/// The dependency a consumer job cannot work without, whose open circuit stops it as a pause
/// does. (The action executor's webhook hosts each stop only their own actions, and are not
/// here.)
fn gating_dependency(job: &str) -> Option<&'static str> {
    (job == job_email_send::JOB_NAME).then_some(job_email_send::relay::RELAY)
}

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
    /// Gates for every consumer job, closed for those `paused` (under any of their names) and
    /// those whose dependency's circuit is `open`.
    pub fn new(paused: &[Pause], open: &[OpenCircuit]) -> Self {
        let gates = crate::settings::all()
            .into_iter()
            .filter(|spec| !spec.is_timer())
            .map(|spec| (spec.name, watch::channel(false).0))
            .collect();
        let gates = Self { gates };
        gates.apply(paused, open);
        gates
    }

    /// The gate of consumer job `job`.
    pub fn gate(&self, job: &str) -> Option<Gate> {
        self.gates.get(job).map(|tx| Gate::new(tx.subscribe()))
    }

    /// Whether this replica holds `job`'s consumers stopped now.
    pub fn is_closed(&self, job: &str) -> bool {
        self.gates.get(job).is_some_and(|tx| *tx.borrow())
    }

    /// Closes the gates of the `paused` jobs and of those whose dependency's circuit is `open`,
    /// and opens the others.
    pub fn apply(&self, paused: &[Pause], open: &[OpenCircuit]) {
        for (job, tx) in &self.gates {
            let circuit = gating_dependency(job)
                .and_then(|dependency| open.iter().find(|c| c.dependency == dependency));
            let closed = super::pause_of(paused, job).is_some() || circuit.is_some();
            tx.send_if_modified(|was| {
                let changed = *was != closed;
                *was = closed;
                if changed {
                    let why = match (closed, circuit) {
                        (true, Some(c)) => format!(
                            "stopping its consumers while the circuit of {} is open",
                            c.dependency
                        ),
                        (true, None) => "paused: stopping its consumers".into(),
                        (false, _) => "consuming again".into(),
                    };
                    tracing::info!(job, stopped = closed, "consumer job {why}");
                }
                changed
            });
        }
    }
}

/// Keeps `gates` and `circuits` in step with the database until `shutdown`: on every notice,
/// every `poll`, and at once when this replica's view of the circuits changes. Spawn it
/// through the host's tracker.
pub async fn watch(
    gates: std::sync::Arc<ConsumerGates>,
    circuits: Circuits,
    pool: sqlx::PgPool,
    poll: Duration,
    shutdown: CancellationToken,
) {
    let mut changes = circuits.subscribe();
    let mut paused: Vec<Pause> = Vec::new();
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
            changed = changes.changed() => {
                if changed.is_ok() {
                    gates.apply(&paused, &circuits.open_circuits());
                    continue;
                }
            }
        }
        let read = async {
            let paused = pauses::list(&pool).await?;
            let open = circuits::list(&pool).await?;
            Ok::<_, worker_core::Failure>((paused, open))
        };
        match tokio::time::timeout(READ_TIMEOUT, read).await {
            Ok(Ok((read_paused, open))) => {
                paused = read_paused;
                circuits.apply(open);
                changes.borrow_and_update();
                gates.apply(&paused, &circuits.open_circuits());
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "reading the paused jobs and open circuits failed; keeping the consumers as they are");
            }
            Err(_) => tracing::debug!(
                "reading the paused jobs and open circuits took too long; keeping the consumers as they are"
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
        let gates = ConsumerGates::new(&[pause("email-send")], &[]);
        assert!(gates.gate("draft-expiry").is_none());
        let send = gates.gate("email-send").unwrap();
        let action = gates.gate("automation-action").unwrap();
        assert!(send.is_closed());
        assert!(!action.is_closed());
        gates.apply(&[pause("automation-action")], &[]);
        assert!(!send.is_closed(), "resumed");
        assert!(action.is_closed());
        assert!(gates.is_closed("automation-action"));
    }

    #[test]
    fn the_relays_open_circuit_stops_the_sender_alone() {
        let gates = ConsumerGates::new(&[], &[]);
        let relay = OpenCircuit {
            dependency: "smtp-relay".into(),
            opened_at: Utc::now(),
            reason: "535 5.7.8 Authentication credentials invalid".into(),
            opened_by: "wh-1".into(),
            failed_probes: 0,
            probe_at: Utc::now(),
            probed_by: None,
            last_probe_at: None,
        };
        let webhook = OpenCircuit {
            dependency: "webhook:hooks.example".into(),
            ..relay.clone()
        };
        gates.apply(&[], &[relay, webhook]);
        assert!(gates.is_closed("email-send"));
        assert!(
            !gates.is_closed("automation-action"),
            "a webhook host stops only its actions"
        );
        gates.apply(&[], &[]);
        assert!(!gates.is_closed("email-send"));
    }
}
