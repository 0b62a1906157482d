//! A circuit per dependency (the SMTP relay, an IMAP account, a webhook host): when to open it
//! and how long to wait before probing it again. Pure: the open circuits themselves are kept
//! where every replica sees them (the store's `circuits`), and each job counts its own calls.
//!
//! A failure counts only when it is the dependency's own: no connection, a TLS failure, a
//! refused login, a 421 greeting. A recipient's refusal, a template that does not render or a
//! webhook's 4xx for one payload is that work's, and never counts. A refused login opens the
//! circuit at once ([`Fault::AtOnce`]): trying again with the same settings cannot succeed.
//!
//! The circuit opens after [`CircuitSettings::failures`] of the dependency's failures in a row,
//! or when they are at least [`CircuitSettings::failure_share`] of the calls in the last
//! [`CircuitSettings::window`] (with at least [`CircuitSettings::min_calls`] calls in it). Open,
//! it is probed after its cool-down: [`CircuitSettings::cool_down`] first, doubled after each
//! failed probe up to [`CircuitSettings::max_cool_down`].
//!
//! ```
//! use std::time::{Duration, Instant};
//! use worker_core::circuit::{CircuitSettings, Counter, Fault};
//!
//! let settings = CircuitSettings::default();
//! let mut counter = Counter::default();
//! let now = Instant::now();
//! for _ in 1..settings.failures {
//!     assert!(!counter.failed(&settings, Fault::Counted, now));
//! }
//! assert!(counter.failed(&settings, Fault::Counted, now), "the fifth in a row opens it");
//! assert!(counter.failed(&settings, Fault::AtOnce, now), "a refused login opens it at once");
//! assert_eq!(settings.cool_down_after(0), Duration::from_secs(30));
//! assert_eq!(settings.cool_down_after(1), Duration::from_secs(60));
//! assert_eq!(settings.cool_down_after(20), Duration::from_secs(600));
//! ```

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// When a circuit opens and how it is probed (`[circuits]` in the settings).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CircuitSettings {
    /// The dependency's failures in a row that open its circuit.
    pub failures: u32,
    /// The share of calls in the window that, failed, opens the circuit.
    pub failure_share: f64,
    /// How far back the share looks.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// The fewest calls in the window for the share to count.
    pub min_calls: u32,
    /// The wait before the first probe of an open circuit.
    #[serde(with = "humantime_serde")]
    pub cool_down: Duration,
    /// The longest wait between probes: each failed probe doubles the wait up to this.
    #[serde(with = "humantime_serde")]
    pub max_cool_down: Duration,
}

impl Default for CircuitSettings {
    /// Five in a row: a reset connection or two is not an outage, but five refused connections
    /// in a row are (at a prefetch of ten they come within a second of each other). Half the
    /// calls of a minute, at least ten of them: a relay that fails every other mail is down
    /// for half the mail. A first probe after 30 s, before the first retry tier ends twice,
    /// doubling to ten minutes: an hour's outage costs the relay about ten probes.
    fn default() -> Self {
        Self {
            failures: 5,
            failure_share: 0.5,
            window: Duration::from_secs(60),
            min_calls: 10,
            cool_down: Duration::from_secs(30),
            max_cool_down: Duration::from_secs(600),
        }
    }
}

impl CircuitSettings {
    /// The wait before the next probe, after `failed_probes` probes failed in a row.
    pub fn cool_down_after(&self, failed_probes: u32) -> Duration {
        let factor = 2u32.saturating_pow(failed_probes.min(31));
        self.cool_down
            .checked_mul(factor)
            .unwrap_or(self.max_cool_down)
            .min(self.max_cool_down.max(self.cool_down))
    }

    /// What is wrong with these settings, if anything.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.failures == 0 {
            problems.push("circuits.failures must be at least 1".to_string());
        }
        if !(self.failure_share > 0.0 && self.failure_share <= 1.0) {
            problems.push(format!(
                "circuits.failure_share must be above 0 and at most 1, not {}",
                self.failure_share
            ));
        }
        if self.window.is_zero() || self.cool_down.is_zero() {
            problems.push("circuits.window and circuits.cool_down must be above zero".into());
        }
        if self.max_cool_down < self.cool_down {
            problems.push("circuits.max_cool_down must be at least circuits.cool_down".into());
        }
        problems
    }
}

/// How a dependency's failure counts toward opening its circuit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Counted toward the failures in a row and the share (no connection, TLS, a 421).
    Counted,
    /// Opens the circuit at once (a refused login: the same settings cannot succeed).
    AtOnce,
}

/// One replica's count of a dependency's calls: its failures in a row, and the calls of the
/// window in buckets of a [`BUCKET`] each. It holds at most a window's worth of buckets, however
/// many calls a second go through. Cheap; keep one per dependency.
#[derive(Debug, Default, Clone)]
pub struct Counter {
    in_a_row: u32,
    buckets: VecDeque<Bucket>,
}

/// How finely the window is counted: a call is forgotten with the others of its second, so the
/// share may count up to a second more than the window.
pub const BUCKET: Duration = Duration::from_secs(1);

/// The calls that began a bucket or came within [`BUCKET`] after it.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    began: Instant,
    calls: u32,
    failed: u32,
}

impl Counter {
    /// A call that succeeded.
    pub fn succeeded(&mut self, settings: &CircuitSettings, now: Instant) {
        self.in_a_row = 0;
        self.count(settings, now, false);
    }

    /// A call that failed with the dependency's own `fault`: whether the circuit should open.
    pub fn failed(&mut self, settings: &CircuitSettings, fault: Fault, now: Instant) -> bool {
        self.in_a_row = self.in_a_row.saturating_add(1);
        self.count(settings, now, true);
        fault == Fault::AtOnce
            || self.in_a_row >= settings.failures.max(1)
            || self.share_exceeded(settings)
    }

    /// Starts counting afresh (after the circuit opened or closed).
    pub fn reset(&mut self) {
        self.in_a_row = 0;
        self.buckets.clear();
    }

    /// The calls in the window, as last counted.
    pub fn calls(&self) -> u64 {
        self.buckets.iter().map(|b| u64::from(b.calls)).sum()
    }

    // Forgetting on every call, successes included: a healthy dependency fails rarely, and a
    // count trimmed only on failures grew by every call it ever made.
    fn count(&mut self, settings: &CircuitSettings, now: Instant, failed: bool) {
        self.forget_before(now, settings.window);
        let bucket = match self.buckets.back_mut() {
            Some(last) if now.saturating_duration_since(last.began) < BUCKET => last,
            _ => {
                self.buckets.push_back(Bucket {
                    began: now,
                    calls: 0,
                    failed: 0,
                });
                let Some(last) = self.buckets.back_mut() else {
                    return;
                };
                last
            }
        };
        bucket.calls = bucket.calls.saturating_add(1);
        bucket.failed = bucket.failed.saturating_add(u32::from(failed));
    }

    fn forget_before(&mut self, now: Instant, window: Duration) {
        while let Some(first) = self.buckets.front() {
            if now.saturating_duration_since(first.began) <= window {
                break;
            }
            self.buckets.pop_front();
        }
    }

    fn share_exceeded(&self, settings: &CircuitSettings) -> bool {
        let calls = self.calls();
        if calls < u64::from(settings.min_calls.max(1)) {
            return false;
        }
        let failed: u64 = self.buckets.iter().map(|b| u64::from(b.failed)).sum();
        failed as f64 / calls as f64 >= settings.failure_share
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_success_between_failures_keeps_the_circuit_closed() {
        let settings = CircuitSettings {
            min_calls: 100,
            ..CircuitSettings::default()
        };
        let mut counter = Counter::default();
        let now = Instant::now();
        for _ in 0..20 {
            for _ in 0..4 {
                assert!(!counter.failed(&settings, Fault::Counted, now));
            }
            counter.succeeded(&settings, now);
        }
    }

    #[test]
    fn half_the_calls_of_the_window_failed_opens_it() {
        let settings = CircuitSettings::default();
        let mut counter = Counter::default();
        let now = Instant::now();
        let mut opened = false;
        for _ in 0..5 {
            counter.succeeded(&settings, now);
            opened = counter.failed(&settings, Fault::Counted, now);
        }
        assert!(opened, "5 of 10 calls failed");
    }

    #[test]
    fn calls_older_than_the_window_no_longer_count() {
        let settings = CircuitSettings::default();
        let mut counter = Counter::default();
        let then = Instant::now();
        for _ in 0..9 {
            counter.succeeded(&settings, then);
        }
        counter.failed(&settings, Fault::Counted, then);
        let later = then + settings.window + Duration::from_secs(1);
        counter.succeeded(&settings, later);
        assert!(!counter.failed(&settings, Fault::Counted, later));
        assert_eq!(counter.calls(), 2, "the old calls are forgotten");
    }

    #[test]
    fn a_healthy_dependency_is_counted_in_no_more_than_its_window() {
        let settings = CircuitSettings::default();
        let mut counter = Counter::default();
        let start = Instant::now();
        // Ten minutes of 100 calls a second, none failed: the soak hour's growth (24 bytes a
        // call) until the count was trimmed on successes too.
        for call in 0..60_000u64 {
            counter.succeeded(&settings, start + Duration::from_millis(call * 10));
        }
        assert!(
            counter.calls() <= 6_100,
            "{} calls counted",
            counter.calls()
        );
        assert!(
            counter.buckets.len() <= 61,
            "{} buckets held",
            counter.buckets.len()
        );
    }

    #[test]
    fn the_cool_down_doubles_up_to_its_longest() {
        let settings = CircuitSettings {
            cool_down: Duration::from_secs(1),
            max_cool_down: Duration::from_secs(5),
            ..CircuitSettings::default()
        };
        let waits: Vec<u64> = (0..5)
            .map(|n| settings.cool_down_after(n).as_secs())
            .collect();
        assert_eq!(waits, [1, 2, 4, 5, 5]);
        assert_eq!(settings.cool_down_after(u32::MAX).as_secs(), 5);
    }

    #[test]
    fn settings_that_cannot_work_are_named() {
        let settings = CircuitSettings {
            failures: 0,
            failure_share: 1.5,
            max_cool_down: Duration::from_secs(1),
            ..CircuitSettings::default()
        };
        let problems = settings.problems().join("; ");
        assert!(problems.contains("circuits.failures"), "{problems}");
        assert!(problems.contains("circuits.failure_share"), "{problems}");
        assert!(problems.contains("circuits.max_cool_down"), "{problems}");
        assert!(CircuitSettings::default().problems().is_empty());
    }
}
