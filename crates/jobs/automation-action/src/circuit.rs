//! Each webhook host as a dependency with a circuit (`worker_store::circuits`), named
//! `webhook:<host>` (`webhook:<host>:<port>` when the URL names a port): which calls say
//! something of the host ([`verdict`]) and what an action met while its host's circuit is
//! open ends with ([`unavailable`]).
//!
//! Only no connection counts toward opening it: refused, not made within the timeout, a TLS
//! handshake that failed, a name that does not resolve. Any answer, a 4xx or a 5xx too, is
//! the answer to that action (its payload, its endpoint) and stays that action's: as far as
//! the circuit goes the host is there. A connection that broke once it stood, or an answer
//! not given in time, says nothing either way.
//!
//! While a host's circuit is open its actions are not tried and charged no attempt: each is
//! parked in the first retry tier that waits until its next probe, attempt unchanged, and its
//! execution row is left as it was. Other hosts' actions go on. After the cool-down the next
//! action for the host is the probe: an answer closes the circuit on every replica.

use std::time::Duration;

use worker_core::Failure;
use worker_core::circuit::Fault;

use crate::webhook::CallResult;

/// The shortest wait an action parked for an open circuit is given: a probe due now is
/// being taken by another try, whose outcome comes within a call.
pub const MIN_WAIT: Duration = Duration::from_secs(1);

/// The host's name among the dependencies, from the action's URL; none for a URL that does
/// not read (its call fails as invalid, touching no host).
pub fn dependency(url: &str) -> Option<String> {
    let url = reqwest::Url::parse(url).ok()?;
    let host = url.host_str()?.to_ascii_lowercase();
    Some(match url.port() {
        Some(port) => format!("webhook:{host}:{port}"),
        None => format!("webhook:{host}"),
    })
}

/// What one call says of its host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// It answered (whatever it answered): a success of the host.
    Answered,
    /// The host's own failure.
    Failed(Fault),
    /// Nothing: the connection broke once it stood, the answer did not come in time, or no
    /// call was made.
    Silent,
}

/// What `result` says of its host (see the module docs).
pub fn verdict(result: &CallResult) -> Verdict {
    match result {
        CallResult::Answered { .. } => Verdict::Answered,
        CallResult::NoConnection(_) => Verdict::Failed(Fault::Counted),
        CallResult::TimedOut(_)
        | CallResult::Unreachable(_)
        | CallResult::Invalid(_)
        | CallResult::Refused(_) => Verdict::Silent,
    }
}

/// The failure of an action met while `dependency`'s circuit is open, probed in `probe_in`:
/// not tried, charged nothing, parked until the probe.
pub fn unavailable(
    dependency: &str,
    detail: impl std::fmt::Display,
    probe_in: Duration,
) -> Failure {
    Failure::unavailable(dependency, detail, Some(probe_in.max(MIN_WAIT)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_is_named_with_the_port_its_url_names() {
        assert_eq!(
            dependency("https://Hooks.Example/x?token=t").as_deref(),
            Some("webhook:hooks.example")
        );
        assert_eq!(
            dependency("http://127.0.0.1:8080/hook").as_deref(),
            Some("webhook:127.0.0.1:8080")
        );
        assert_eq!(
            dependency("http://[::1]:9/hook").as_deref(),
            Some("webhook:[::1]:9")
        );
        assert_eq!(dependency("not a url"), None);
    }

    #[test]
    fn only_no_connection_counts_against_the_host() {
        let answered = |status| CallResult::Answered {
            status,
            retry_after: None,
            excerpt: String::new(),
        };
        assert_eq!(verdict(&answered(503)), Verdict::Answered);
        assert_eq!(verdict(&answered(404)), Verdict::Answered);
        assert_eq!(
            verdict(&CallResult::NoConnection("connection refused".into())),
            Verdict::Failed(Fault::Counted)
        );
        assert_eq!(
            verdict(&CallResult::TimedOut(Duration::from_secs(1))),
            Verdict::Silent
        );
        assert_eq!(
            verdict(&CallResult::Unreachable("reset".into())),
            Verdict::Silent
        );
    }

    #[test]
    fn an_action_waits_at_least_a_beat() {
        let failure = unavailable("webhook:h", "open", Duration::ZERO);
        assert!(failure.is_unavailable());
        assert_eq!(failure.retry_after(), Some(MIN_WAIT));
    }
}
