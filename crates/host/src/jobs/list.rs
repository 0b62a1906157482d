//! The jobs by name, as an operator names them: which are timers, which may be paused (every
//! timer but the database probe, and every consumer), and which job an older name (a pause
//! row, an attempt-log row) belongs to.

use worker_core::JobSpec;

pub use crate::settings::{all, find};

/// The timer jobs, by name, in the list's order: what `jobs pause` and the console take.
pub fn timer_names() -> Vec<&'static str> {
    all()
        .into_iter()
        .filter(|spec| spec.is_timer())
        .map(|spec| spec.name)
        .collect()
}

/// Every job, by name, in the list's order: what `jobs list` shows.
pub fn job_names() -> Vec<&'static str> {
    all().into_iter().map(|spec| spec.name).collect()
}

/// The job an operator may pause as `job` (any consumer job, whose consumers stop on every
/// replica; any timer job but the database probe, which drives readiness: paused, it would
/// take the host out of its load balancer), or why not. An older name of a job is taken for
/// the job.
pub fn pausable(job: &str) -> Result<&'static JobSpec, String> {
    let spec = find(job).ok_or_else(|| {
        format!(
            "no job is called `{job}`; the jobs are {}",
            job_names().join(", ")
        )
    })?;
    if spec.name == job_db_health::JOB_NAME {
        return Err(format!(
            "{job} drives readiness (/readyz) and cannot be paused"
        ));
    }
    Ok(spec)
}

/// The pause of `job` among `pauses`, under its name or an earlier one.
pub fn pause_of<'a>(
    pauses: &'a [worker_store::pauses::Pause],
    job: &str,
) -> Option<&'a worker_store::pauses::Pause> {
    pauses
        .iter()
        .find(|p| find(&p.job).is_some_and(|spec| spec.name == job))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timers_are_the_listed_timer_jobs_in_order() {
        let listed: Vec<&str> = all()
            .into_iter()
            .filter(|spec| spec.is_timer())
            .map(|spec| spec.name)
            .collect();
        assert_eq!(timer_names(), listed);
        assert!(timer_names().contains(&"dead-letter-archive"));
        assert!(!timer_names().contains(&"email-send"));
    }

    #[test]
    fn a_former_name_finds_the_renamed_job() {
        let spec = pausable("dead-letter-maintenance").unwrap();
        assert_eq!(spec.name, "dead-letter-archive");
    }

    #[test]
    fn the_database_probe_cannot_be_paused() {
        assert!(pausable("db-health").unwrap_err().contains("readiness"));
        let why = pausable("no-such-job").unwrap_err();
        assert!(why.contains("no job is called `no-such-job`"), "{why}");
    }

    #[test]
    fn consumer_jobs_can_be_paused() {
        for job in ["email-send", "automation-trigger", "automation-action"] {
            assert_eq!(pausable(job).map(|spec| spec.name), Ok(job));
        }
    }
}
