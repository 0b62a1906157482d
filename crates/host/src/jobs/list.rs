//! The jobs by name, as an operator names them: which are timers, which may be paused, and
//! which job an older name (a pause row, an attempt-log row) belongs to.

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

/// The job an operator may pause as `job` (any timer job but the database probe, which drives
/// readiness: paused, it would take the host out of its load balancer), or why not. An older
/// name of a job is taken for the job.
pub fn pausable(job: &str) -> Result<&'static JobSpec, String> {
    let timers = timer_names();
    let spec = find(job).filter(|spec| spec.is_timer()).ok_or_else(|| {
        format!(
            "no timer job is called `{job}`; the timer jobs are {}",
            timers.join(", ")
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
    fn the_database_probe_and_consumers_cannot_be_paused() {
        assert!(pausable("db-health").unwrap_err().contains("readiness"));
        let why = pausable("email-send").unwrap_err();
        assert!(why.contains("no timer job is called `email-send`"), "{why}");
    }
}
