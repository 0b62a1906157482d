//! What the two relay outages share (`smtp-login-refused`, `smtp-relay-down`): retry tiers
//! that a reply works through within seconds (three tries: 2 s and 5 s apart), an outage
//! longer than all of them, short circuit cool-downs, and the checks that the relay's circuit
//! opened and closed and that nothing was dead-lettered.

use std::time::Duration;

use super::{Load, Scenario};
use crate::oracle::Check;
use crate::run::Run;

/// How long the relay is out: longer than a reply's every try (2 s + 5 s of tiers and three
/// sends), so that without the circuit every reply met in it would give up.
pub const OUTAGE: Duration = Duration::from_secs(30);

/// The settings both give every host process: three tries, a probe after 2 s, at most 5 s
/// apart.
pub fn env() -> Vec<(String, String)> {
    [
        ("WORKER_HOST__JOBS__EMAIL_SEND__MAX_ATTEMPTS", "3"),
        ("WORKER_HOST__CIRCUITS__COOL_DOWN", "2s"),
        ("WORKER_HOST__CIRCUITS__MAX_COOL_DOWN", "5s"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// The scenario's shape, with its own name, description and fault.
pub fn scenario(name: &'static str, about: &'static str, fault: super::MakeFault) -> Scenario {
    Scenario {
        name,
        about,
        fault: Some(fault),
        full: Load {
            repetitions: 3,
            per_repetition: 20,
        },
        quick: Load {
            repetitions: 1,
            per_repetition: 20,
        },
        rate_per_sec: 2.0,
        settle: Duration::from_secs(180),
        heartbeat: super::DEFAULT_HEARTBEAT,
    }
}

/// The relay's circuit opened and closed again, as the host's log says.
pub fn circuit_checks(run: &Run) -> anyhow::Result<Vec<Check>> {
    let log = std::fs::read_to_string(run.log_path())?;
    let opened = log.matches("circuit opened").count();
    let closed = log.matches("circuit closed").count();
    Ok(vec![
        Check::new(
            format!("relay circuit opened: {opened} times (must be at least 1)"),
            opened >= 1,
        ),
        Check::new(
            format!("relay circuit closed: {closed} times (must be at least 1)"),
            closed >= 1,
        ),
    ])
}
