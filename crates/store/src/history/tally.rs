//! What this replica finished since its last flush, counted in memory on the hot path: a
//! unit is an atomic add and a bucket's atomic add; a failure also takes a short lock on its
//! job's few reasons. Nothing is written per unit; the host flushes once a minute.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::buckets::{BUCKETS, bucket_of};

/// Every job's counts in this replica, by name; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    jobs: Arc<Mutex<Vec<Arc<JobTally>>>>,
}

/// One job's counts since the last flush. The host holds one per job, made once at its start,
/// so that counting looks nothing up.
#[derive(Debug)]
pub struct JobTally {
    name: String,
    units: AtomicU64,
    durations: [AtomicU64; BUCKETS],
    /// Failures by reason; the reasons are the runner's fixed names, so this stays short.
    failures: Mutex<Vec<(&'static str, u64)>>,
}

/// One job's counts, taken out of its tally by a flush.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct JobCounts {
    pub job: String,
    pub units: i64,
    pub failures: BTreeMap<String, i64>,
    pub durations: Vec<i64>,
}

impl Tally {
    /// The tally of job `name`: the one already made for it, or a new one.
    pub fn job(&self, name: &str) -> Arc<JobTally> {
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(job) = jobs.iter().find(|j| j.name == name) {
            return job.clone();
        }
        let job = Arc::new(JobTally {
            name: name.to_string(),
            units: AtomicU64::new(0),
            durations: std::array::from_fn(|_| AtomicU64::new(0)),
            failures: Mutex::new(Vec::new()),
        });
        jobs.push(job.clone());
        job
    }

    /// Takes every job's counts out, leaving zeros; jobs that finished nothing are left out.
    pub fn drain(&self) -> Vec<JobCounts> {
        let jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner()).clone();
        jobs.iter().filter_map(|job| job.drain()).collect()
    }

    /// Puts counts a flush could not write back, to be written with the next one.
    pub fn restore(&self, counts: &[JobCounts]) {
        for counts in counts {
            self.job(&counts.job).add(counts);
        }
    }
}

fn to_u64(n: i64) -> u64 {
    u64::try_from(n).unwrap_or_default()
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl JobTally {
    /// One unit of work finished after `duration`; `failure` names why it failed, if it did
    /// (e.g. `parked:transient`, `dead-lettered:gave-up`, `failed:permanent`).
    pub fn record(&self, duration: Duration, failure: Option<&'static str>) {
        self.units.fetch_add(1, Ordering::Relaxed);
        self.durations[bucket_of(duration)].fetch_add(1, Ordering::Relaxed);
        if let Some(reason) = failure {
            let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
            match failures.iter_mut().find(|(r, _)| *r == reason) {
                Some((_, count)) => *count += 1,
                None => failures.push((reason, 1)),
            }
        }
    }

    fn drain(&self) -> Option<JobCounts> {
        let units = self.units.swap(0, Ordering::Relaxed);
        let durations: Vec<i64> = self
            .durations
            .iter()
            .map(|b| to_i64(b.swap(0, Ordering::Relaxed)))
            .collect();
        let failures: BTreeMap<String, i64> =
            std::mem::take(&mut *self.failures.lock().unwrap_or_else(|e| e.into_inner()))
                .into_iter()
                .map(|(reason, count)| (reason.to_string(), to_i64(count)))
                .collect();
        (units > 0 || !failures.is_empty()).then(|| JobCounts {
            job: self.name.clone(),
            units: to_i64(units),
            failures,
            durations,
        })
    }

    fn add(&self, counts: &JobCounts) {
        self.units
            .fetch_add(to_u64(counts.units), Ordering::Relaxed);
        for (slot, count) in self.durations.iter().zip(&counts.durations) {
            slot.fetch_add(to_u64(*count), Ordering::Relaxed);
        }
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        for (reason, count) in &counts.failures {
            // Restored reasons are owned strings; keep them under a name the runner uses.
            let reason: &'static str = super::reason::known(reason);
            match failures.iter_mut().find(|(r, _)| *r == reason) {
                Some((_, n)) => *n += to_u64(*count),
                None => failures.push((reason, to_u64(*count))),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drain_takes_the_counts_and_leaves_zeros() {
        let tally = Tally::default();
        let mailer = tally.job("email-send");
        mailer.record(Duration::from_millis(3), None);
        mailer.record(Duration::from_millis(40), Some("parked:transient"));
        mailer.record(Duration::from_millis(45), Some("parked:transient"));
        tally.job("email-send").record(Duration::from_secs(1), None);
        let drained = tally.drain();
        assert_eq!(drained.len(), 1);
        let counts = &drained[0];
        assert_eq!(counts.units, 4);
        assert_eq!(counts.failures.get("parked:transient"), Some(&2));
        assert_eq!(counts.durations.iter().sum::<i64>(), 4);
        assert_eq!(counts.durations[bucket_of(Duration::from_millis(40))], 2);
        assert!(tally.drain().is_empty(), "nothing new since");
    }

    #[test]
    fn restored_counts_come_out_with_the_next_drain() {
        let tally = Tally::default();
        tally
            .job("drain")
            .record(Duration::ZERO, Some("failed:transient"));
        let first = tally.drain();
        tally.restore(&first);
        tally.job("drain").record(Duration::ZERO, None);
        let again = tally.drain();
        assert_eq!(again[0].units, 2);
        assert_eq!(again[0].failures.get("failed:transient"), Some(&1));
    }
}
