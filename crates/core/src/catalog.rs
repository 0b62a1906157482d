//! What the host needs to know of a job, exported by the job's crate as `JOB`: its one name,
//! whether it consumes a queue or ticks on a schedule, whether its ticks take the shared lease,
//! and the names it had before. The host lists these once; its settings sections, budget,
//! scheduler, console and command line are derived from that list.
//!
//! A job has one name, hyphenated (`draft-expiry`), as the console, the command line, metrics,
//! logs and lease keys show it. Its settings section is the same name in snake case
//! (`[jobs.draft_expiry]`), made by [`section_name`] where TOML and environment variables need
//! it, never written by hand.
//!
//! ```
//! use worker_core::catalog::{JobSpec, Lease};
//!
//! const JOB: JobSpec = JobSpec::timer("dead-letter-archive", Lease::OneReplica)
//!     .formerly(&["dead-letter-maintenance"]);
//! assert_eq!(JOB.section(), "dead_letter_archive");
//! assert!(JOB.answers_to("dead-letter-maintenance"));
//! // Two releases side by side take the same lease: the key is the job's first name.
//! assert_eq!(JOB.lease_key(), Some("dead-letter-maintenance"));
//! ```

/// One job, as its crate describes it to the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobSpec {
    /// The one name (`email-send`).
    pub name: &'static str,
    pub kind: JobKind,
    /// Names this job had in earlier releases, oldest first. Its lease key, pause rows and
    /// attempt-log rows under them are carried over, so a rename loses no pause and two
    /// releases side by side never both tick it.
    pub formerly: &'static [&'static str],
}

/// How the host runs a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobKind {
    /// Takes deliveries from its queue through the recoverability pipeline.
    Consumer,
    /// Ticks on its section's schedule.
    Timer(Lease),
}

/// Whether a timer job's ticks hold the shared lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lease {
    /// One tick across all replicas at a time (an advisory lock for the tick).
    OneReplica,
    /// Every replica ticks: its own readiness depends on it, or the job shares its rows with
    /// the other replicas by itself (`FOR UPDATE SKIP LOCKED`).
    EveryReplica,
}

impl JobSpec {
    pub const fn consumer(name: &'static str) -> Self {
        Self {
            name,
            kind: JobKind::Consumer,
            formerly: &[],
        }
    }

    pub const fn timer(name: &'static str, lease: Lease) -> Self {
        Self {
            name,
            kind: JobKind::Timer(lease),
            formerly: &[],
        }
    }

    /// The same job, known by `names` in earlier releases (oldest first).
    pub const fn formerly(self, names: &'static [&'static str]) -> Self {
        Self {
            formerly: names,
            ..self
        }
    }

    /// Its settings section under `[jobs]`.
    pub fn section(&self) -> String {
        section_name(self.name)
    }

    pub fn is_timer(&self) -> bool {
        matches!(self.kind, JobKind::Timer(_))
    }

    /// Whether its ticks take the shared lease (one replica at a time).
    pub fn leased(&self) -> bool {
        self.kind == JobKind::Timer(Lease::OneReplica)
    }

    /// The key of its lease, for a leased timer: its first name, so that a release that
    /// renamed it and one that did not hold the same lock.
    pub fn lease_key(&self) -> Option<&'static str> {
        self.leased()
            .then(|| self.formerly.first().copied().unwrap_or(self.name))
    }

    /// Its name and every name it had, the current one first.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        std::iter::once(self.name).chain(self.formerly.iter().rev().copied())
    }

    /// Whether `name` is this job's name, now or in an earlier release.
    pub fn answers_to(&self, name: &str) -> bool {
        self.names().any(|n| n == name)
    }
}

/// A job's settings section from its name: `draft-expiry` → `draft_expiry`.
pub fn section_name(job: &str) -> String {
    job.replace('-', "_")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_section_is_the_name_in_snake_case() {
        assert_eq!(section_name("inbound-email-poller"), "inbound_email_poller");
        assert_eq!(JobSpec::consumer("email-send").section(), "email_send");
    }

    #[test]
    fn only_a_leased_timer_has_a_lease_key() {
        assert_eq!(JobSpec::consumer("email-send").lease_key(), None);
        let every = JobSpec::timer("outbox-drain", Lease::EveryReplica);
        assert_eq!(every.lease_key(), None);
        let one = JobSpec::timer("retention", Lease::OneReplica);
        assert_eq!(one.lease_key(), Some("retention"));
    }

    #[test]
    fn a_renamed_job_keeps_its_first_lease_key_and_answers_to_every_name() {
        let job = JobSpec::timer("c", Lease::OneReplica).formerly(&["a", "b"]);
        assert_eq!(job.lease_key(), Some("a"));
        assert_eq!(job.names().collect::<Vec<_>>(), ["c", "b", "a"]);
        assert!(job.answers_to("b"));
        assert!(!job.answers_to("d"));
    }
}
