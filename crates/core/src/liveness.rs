//! Units of work in progress, each with the limit its timeout sets: what a watchdog reads to
//! tell a host that is busy from one that is wedged.
//!
//! A unit's timeout cancels it by dropping its future, which works only while the future
//! yields. Work that blocks its thread (a synchronous call that never returns, a spin) is out
//! of the timeout's reach: it stays in progress past its limit. [`Liveness::overdue`] lists
//! such units once they have run [`OVERDUE_SLACK`] past their limit; a host that finds one
//! withholds its watchdog ping, so that its supervisor restarts it.
//!
//! ```
//! use std::time::Duration;
//! use worker_core::liveness::Liveness;
//!
//! let liveness = Liveness::default();
//! let unit = liveness.begin("email-send", Duration::from_secs(60));
//! assert!(liveness.overdue().is_empty(), "a unit within its limit is not overdue");
//! drop(unit);
//! assert_eq!(liveness.running(), 0);
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// How long past its limit a unit may still be running before it counts as overdue: room for
/// a busy runtime to get round to the timeout, far less than a watchdog's period.
pub const OVERDUE_SLACK: Duration = Duration::from_secs(5);

/// The units of work in progress. Cheap to clone; clones share the same units.
#[derive(Debug, Clone, Default)]
pub struct Liveness {
    units: Arc<Mutex<Units>>,
}

#[derive(Debug, Default)]
struct Units {
    next: u64,
    running: HashMap<u64, Unit>,
}

#[derive(Debug, Clone)]
struct Unit {
    job: Arc<str>,
    started: Instant,
    limit: Duration,
}

/// A unit in progress; it ends when this is dropped.
#[derive(Debug)]
#[must_use = "the unit ends when its guard is dropped"]
pub struct UnitGuard {
    id: u64,
    units: Arc<Mutex<Units>>,
}

impl Drop for UnitGuard {
    fn drop(&mut self) {
        if let Ok(mut units) = self.units.lock() {
            units.running.remove(&self.id);
        }
    }
}

/// A unit running past its limit by more than [`OVERDUE_SLACK`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overdue {
    pub job: Arc<str>,
    pub running_for: Duration,
    pub limit: Duration,
}

impl std::fmt::Display for Overdue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a unit of job `{}` has run {} past its {} timeout",
            self.job,
            humantime::format_duration(Duration::from_secs(
                self.running_for.saturating_sub(self.limit).as_secs()
            )),
            humantime::format_duration(self.limit)
        )
    }
}

impl Liveness {
    /// Records a unit of `job` that its timeout should end within `limit`.
    pub fn begin(&self, job: impl Into<Arc<str>>, limit: Duration) -> UnitGuard {
        let mut units = self
            .units
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let id = units.next;
        units.next = units.next.wrapping_add(1);
        units.running.insert(
            id,
            Unit {
                job: job.into(),
                started: Instant::now(),
                limit,
            },
        );
        UnitGuard {
            id,
            units: self.units.clone(),
        }
    }

    /// The units in progress now.
    pub fn running(&self) -> usize {
        self.units.lock().map(|u| u.running.len()).unwrap_or(0)
    }

    /// The units running past their limit by more than [`OVERDUE_SLACK`], the longest first.
    pub fn overdue(&self) -> Vec<Overdue> {
        let now = Instant::now();
        let Ok(units) = self.units.lock() else {
            return Vec::new();
        };
        let mut overdue: Vec<Overdue> = units
            .running
            .values()
            .filter_map(|unit| {
                let running_for = now.saturating_duration_since(unit.started);
                (running_for > unit.limit + OVERDUE_SLACK).then(|| Overdue {
                    job: unit.job.clone(),
                    running_for,
                    limit: unit.limit,
                })
            })
            .collect();
        overdue.sort_by_key(|o| std::cmp::Reverse(o.running_for));
        overdue
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_unit_is_overdue_only_past_its_limit_and_the_slack() {
        let liveness = Liveness::default();
        let _unit = liveness.begin("email-send", Duration::from_secs(10));
        tokio::time::advance(Duration::from_secs(10) + OVERDUE_SLACK).await;
        assert!(liveness.overdue().is_empty(), "at the limit plus the slack");
        tokio::time::advance(Duration::from_millis(1)).await;
        let overdue = liveness.overdue();
        assert_eq!(overdue.len(), 1);
        assert_eq!(&*overdue[0].job, "email-send");
        assert_eq!(overdue[0].limit, Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn a_unit_that_ended_is_never_overdue() {
        let liveness = Liveness::default();
        drop(liveness.begin("retention", Duration::from_secs(1)));
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(liveness.overdue().is_empty());
        assert_eq!(liveness.running(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_longest_overdue_unit_comes_first_and_says_by_how_much() {
        let liveness = Liveness::default();
        let _first = liveness.begin("draft-expiry", Duration::from_secs(1));
        tokio::time::advance(Duration::from_secs(30)).await;
        let _second = liveness.begin("email-send", Duration::from_secs(1));
        tokio::time::advance(Duration::from_secs(10)).await;
        let overdue = liveness.overdue();
        let jobs: Vec<&str> = overdue.iter().map(|o| &*o.job).collect();
        assert_eq!(jobs, ["draft-expiry", "email-send"]);
        assert_eq!(
            overdue[0].to_string(),
            "a unit of job `draft-expiry` has run 39s past its 1s timeout"
        );
    }
}
