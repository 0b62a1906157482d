//! Probing an open circuit whose dependency no work reaches while it is open: the SMTP relay,
//! whose consumers stop on every replica while its circuit is open. One replica takes each
//! due probe (`worker_store::circuits`); its success closes the circuit everywhere, its
//! failure doubles the wait before the next.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use worker_core::circuit::Fault;
use worker_store::circuits::{Admission, Circuits};

/// How often a due probe is looked for, besides on every change of the open circuits.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// The longest one probe may take; one that takes longer failed.
const PROBE_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `probe` whenever `dependency`'s circuit is open and its probe due, until `shutdown`.
/// Spawn it through the host's tracker.
pub async fn probe_while_open<P, F>(
    circuits: Circuits,
    dependency: &'static str,
    probe: P,
    shutdown: CancellationToken,
) where
    P: Fn() -> F + Send + Sync + 'static,
    F: Future<Output = Result<(), String>> + Send,
{
    let mut changes = circuits.subscribe();
    loop {
        let due = circuits
            .open_circuit(dependency)
            .map(|open| open.probe_in(chrono::Utc::now()));
        let wait = match due {
            Some(wait) if wait.is_zero() => {
                probe_once(&circuits, dependency, &probe).await;
                continue_after(&circuits, dependency)
            }
            Some(wait) => wait.min(LOOK_EVERY),
            None => LOOK_EVERY,
        };
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = changes.changed() => {}
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// After a probe: look again soon, whether another replica's probe is still running or the
/// circuit stays open for its cool-down.
fn continue_after(circuits: &Circuits, dependency: &str) -> Duration {
    circuits
        .open_circuit(dependency)
        .map_or(LOOK_EVERY, |open| {
            open.probe_in(chrono::Utc::now())
                .clamp(LOOK_EVERY, LOOK_EVERY * 5)
        })
}

async fn probe_once<P, F>(circuits: &Circuits, dependency: &str, probe: &P)
where
    P: Fn() -> F,
    F: Future<Output = Result<(), String>>,
{
    let admission = circuits.admit(dependency).await;
    if admission != Admission::Probe {
        return;
    }
    let outcome = tokio::time::timeout(PROBE_TIMEOUT, probe())
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "the probe got no answer within {}",
                humantime::format_duration(PROBE_TIMEOUT)
            ))
        });
    match outcome {
        Ok(()) => circuits.succeeded(dependency, &admission).await,
        Err(why) => {
            circuits
                .failed(dependency, Fault::AtOnce, &why, &admission)
                .await;
        }
    }
}
