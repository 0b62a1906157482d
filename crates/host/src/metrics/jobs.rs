//! Gauges over the running jobs and the process, read at each collection: when each timer
//! job last ran, its schedule's period and whether it is paused, the units of work that are
//! overdue, and what this build is.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::KeyValue;
use worker_core::liveness::Liveness;

use super::{Metrics, names};
use crate::scheduler::TimerHandle;
use crate::settings::Settings;
use crate::status::{JobEntry, JobStats};

/// What `worker_build_info` says of this process.
#[derive(Debug, Clone)]
pub struct Build {
    pub version: String,
    pub revision: String,
    pub installation: String,
    pub replica: String,
}

impl Build {
    pub fn of(settings: &Settings) -> Self {
        Self {
            version: crate::version::VERSION.to_string(),
            revision: crate::version::REVISION.to_string(),
            installation: settings.installation.clone(),
            replica: settings.replica_name(),
        }
    }
}

/// Registers the gauges of this module on the host's meter.
pub fn register(metrics: &Metrics, jobs: &[JobEntry], liveness: &Liveness, build: &Build) {
    let meter = &metrics.meter;
    let timers: Vec<TimerHandle> = jobs
        .iter()
        .filter_map(|job| match &job.stats {
            JobStats::Timer(timer) => Some(timer.clone()),
            JobStats::Consumer { .. } => None,
        })
        .collect();
    let started = SystemTime::now();

    let last_run = timers.clone();
    meter
        .f64_observable_gauge(names::TIMER_LAST_RUN)
        .with_unit("s")
        .with_description("when a tick of the timer job last ran on this replica (Unix time)")
        .with_callback(move |o| {
            for timer in &last_run {
                let ran = timer
                    .stats
                    .snapshot()
                    .last
                    .last_run
                    .map(SystemTime::from)
                    .unwrap_or(started);
                o.observe(unix_seconds(ran), &[job_label(&timer.name)]);
            }
        })
        .build();

    let intervals: Vec<(String, f64)> = timers
        .iter()
        .filter_map(|t| Some((t.name.clone(), t.schedule.interval()?.as_secs_f64())))
        .collect();
    meter
        .f64_observable_gauge(names::TIMER_INTERVAL)
        .with_unit("s")
        .with_description("the nominal period of the timer job's schedule")
        .with_callback(move |o| {
            for (job, seconds) in &intervals {
                o.observe(*seconds, &[job_label(job)]);
            }
        })
        .build();

    let paused = timers;
    meter
        .u64_observable_gauge(names::TIMER_PAUSED)
        .with_description("1 while an operator has paused the timer job")
        .with_callback(move |o| {
            for timer in &paused {
                o.observe(
                    u64::from(timer.stats.is_paused()),
                    &[job_label(&timer.name)],
                );
            }
        })
        .build();

    let names_of_jobs: Vec<String> = jobs.iter().map(|job| job.name.clone()).collect();
    let units = liveness.clone();
    meter
        .u64_observable_gauge(names::OVERDUE_UNITS)
        .with_description("units of work running past their timeout, out of its reach")
        .with_callback(move |o| {
            for (job, count) in overdue_by_job(&names_of_jobs, &units) {
                o.observe(count, &[job_label(&job)]);
            }
        })
        .build();

    let build_labels = [
        KeyValue::new("version", build.version.clone()),
        KeyValue::new("revision", build.revision.clone()),
        KeyValue::new("installation", build.installation.clone()),
        KeyValue::new("replica", build.replica.clone()),
    ];
    meter
        .u64_observable_gauge(names::BUILD_INFO)
        .with_description("this process's version, revision, installation and replica")
        .with_callback(move |o| o.observe(1, &build_labels))
        .build();
}

fn job_label(job: &str) -> KeyValue {
    KeyValue::new(names::JOB_LABEL, job.to_string())
}

fn unix_seconds(at: SystemTime) -> f64 {
    at.duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs_f64()
}

/// Every job with its count of overdue units, 0 for most.
fn overdue_by_job(jobs: &[String], liveness: &Liveness) -> BTreeMap<String, u64> {
    let mut counts: BTreeMap<String, u64> = jobs.iter().map(|j| (j.clone(), 0)).collect();
    for unit in liveness.overdue() {
        *counts.entry(unit.job.to_string()).or_default() += 1;
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn every_job_has_an_overdue_count_and_a_wedged_unit_counts_for_its_own() {
        let liveness = Liveness::default();
        let jobs = ["email-send".to_string(), "draft-expiry".to_string()];
        let _wedged = liveness.begin("email-send", Duration::from_secs(1));
        let _fine = liveness.begin("draft-expiry", Duration::from_secs(60));
        tokio::time::advance(Duration::from_secs(10)).await;
        let counts = overdue_by_job(&jobs, &liveness);
        assert_eq!(counts.get("email-send"), Some(&1));
        assert_eq!(counts.get("draft-expiry"), Some(&0));
    }
}
