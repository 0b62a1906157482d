//! What the operator is shown of an open circuit, the same on `/status`, the console, the
//! command line and (through the overview) the fleet view: the dependency, why it opened in
//! its own words, since when and by which replica, its failed probes, when the next probe
//! runs, and the job it stops.

use chrono::{DateTime, Utc};
use serde::Serialize;
use worker_store::circuits::OpenCircuit;

/// The prefix of an IMAP account's dependency (`imap:<account>`).
const IMAP_PREFIX: &str = "imap:";
/// The prefix of a webhook host's dependency (`webhook:<host>`).
const WEBHOOK_PREFIX: &str = "webhook:";

/// The job whose work `dependency`'s open circuit stops: its page shows the circuit.
pub fn job_stopped_by(dependency: &str) -> Option<&'static str> {
    if dependency == job_email_send::relay::RELAY {
        Some(job_email_send::JOB_NAME)
    } else if dependency.starts_with(IMAP_PREFIX) {
        Some(job_inbound_email_poller::JOB_NAME)
    } else if dependency.starts_with(WEBHOOK_PREFIX) {
        Some(job_automation_action::JOB_NAME)
    } else {
        None
    }
}

/// One open circuit as shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ShownCircuit {
    pub dependency: String,
    /// Why it opened (or why its last probe failed), in the dependency's own words.
    pub reason: String,
    pub opened_at: DateTime<Utc>,
    /// The replica whose failure opened it.
    pub opened_by: String,
    pub failed_probes: i32,
    pub probe_at: DateTime<Utc>,
    /// Whole seconds until the next probe may run (0: it is due).
    pub next_probe_in_secs: u64,
    /// The job it stops, whose console page shows it.
    pub job: Option<&'static str>,
    /// The dependency as one segment of a URL path (`/circuits/{segment}/close`).
    pub path_segment: String,
}

impl ShownCircuit {
    pub fn of(circuit: &OpenCircuit, now: DateTime<Utc>) -> Self {
        Self {
            dependency: circuit.dependency.clone(),
            reason: circuit.reason.clone(),
            opened_at: circuit.opened_at,
            opened_by: circuit.opened_by.clone(),
            failed_probes: circuit.failed_probes,
            probe_at: circuit.probe_at,
            next_probe_in_secs: circuit.probe_in(now).as_secs(),
            job: job_stopped_by(&circuit.dependency),
            path_segment: path_segment(&circuit.dependency),
        }
    }

    /// Every one of `circuits`, at `now`.
    pub fn all(circuits: &[OpenCircuit], now: DateTime<Utc>) -> Vec<Self> {
        circuits.iter().map(|c| Self::of(c, now)).collect()
    }
}

/// `text` percent-encoded for one path segment: a webhook host's dependency may hold any
/// character its settings gave it, and none may end the segment or start a query.
fn path_segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~:@".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_of_dependency_stops_its_own_job() {
        assert_eq!(job_stopped_by("smtp-relay"), Some("email-send"));
        assert_eq!(job_stopped_by("imap:support"), Some("inbound-email-poller"));
        assert_eq!(
            job_stopped_by("webhook:hooks.example"),
            Some("automation-action")
        );
        assert_eq!(job_stopped_by("something-else"), None);
    }

    #[test]
    fn a_dependency_is_one_path_segment() {
        assert_eq!(
            path_segment("webhook:hooks.example"),
            "webhook:hooks.example"
        );
        assert_eq!(path_segment("imap:a/b c?"), "imap:a%2Fb%20c%3F");
    }
}
