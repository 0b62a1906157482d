//! The connection budget of the shared database pool: what every job can ask of it at once,
//! against `database.max_connections`. Settings the pool cannot serve are refused at start,
//! rather than found out as pool timeouts under load (and, before the health probe had a
//! connection of its own, as a `/readyz` that said the database was down).
//!
//! What draws on the pool, at most, at one time:
//!
//! * each consumer: one connection per handler in flight (`jobs.X.concurrency`); a handler
//!   holds one connection at a time, never one across an SMTP send or a webhook call;
//! * each timer job: what its section says a tick holds (`TimerSection::pool_need`: one for
//!   the tick's work unless the job says otherwise: the outbox drain two per lane, the poller
//!   one per account polled at once and its idle lease), and its lease's connection when it
//!   takes the lease;
//! * one archiver per dead queue, the attempt-log writer, the sampler and the pause watch
//!   (its reading of the paused jobs): one each;
//! * the history's writer: two (its lease's, and its writes under the lease).
//!
//! The outbox and pause listeners (`LISTEN`) and the health probe hold connections of their
//! own, outside the pool ([`DEDICATED`]): the server sees `max_connections + DEDICATED` from
//! each replica.

use super::Settings;

/// Connections the host opens outside the pool: the outbox and pause listeners and the health
/// probe.
pub const DEDICATED: u32 = 3;

/// One user of the pool and how many connections it may hold at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Need {
    /// The keys behind it, as the refusal names them (`jobs.email_send.concurrency 8`).
    pub what: String,
    pub connections: u32,
}

impl Settings {
    /// Every user of the shared pool and its most connections at once (see the module docs).
    pub fn pool_needs(&self) -> Vec<Need> {
        let mut needs = Vec::new();
        let mut need = |what: String, connections: u32| needs.push(Need { what, connections });
        for job in self.jobs.consumers() {
            let concurrency = job.section.runner().concurrency;
            need(
                format!("jobs.{}.concurrency {concurrency}", job.spec.section()),
                u32::try_from(concurrency).unwrap_or(u32::MAX),
            );
        }
        for (spec, section) in self.jobs.timers() {
            let own = section.pool_need();
            let lease = u32::from(spec.leased());
            if own.connections + lease == 0 {
                continue;
            }
            let leased = match lease {
                0 => "",
                _ => " + 1 for its lease",
            };
            let why = match own.keyed {
                true => format!("jobs.{}.{}{leased}", spec.section(), own.why),
                false => format!("jobs.{} ({}{leased})", spec.section(), own.why),
            };
            need(why, own.connections.saturating_add(lease));
        }
        let dead_queues = self.jobs.consumers().len() as u32;
        need(
            format!("the dead-letter archivers {dead_queues} (one per dead queue)"),
            dead_queues,
        );
        need("the attempt-log writer 1".into(), 1);
        need("the sampler 1".into(), 1);
        need(
            "the history's writer 2 (its lease and its writes)".into(),
            2,
        );
        need("the pause watch 1".into(), 1);
        needs
    }

    /// `Err(why)` when the pool's users could ask for more than `database.max_connections`.
    pub fn check_pool_budget(&self) -> Result<(), String> {
        let needs = self.pool_needs();
        let total = needs
            .iter()
            .fold(0u32, |sum, n| sum.saturating_add(n.connections));
        let max = self.database.max_connections;
        if total <= max {
            return Ok(());
        }
        let parts: Vec<&str> = needs.iter().map(|n| n.what.as_str()).collect();
        Err(format!(
            "database.max_connections = {max} cannot serve what the jobs may ask of the pool at \
             once: {} = {total}; raise it or lower those (the outbox and pause listeners and the health \
             probe have {DEDICATED} connections of their own besides)",
            parts.join(" + ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_fit_with_room_to_spare() {
        let settings = Settings::default();
        let total: u32 = settings.pool_needs().iter().map(|n| n.connections).sum();
        assert!(
            (40..=56).contains(&total),
            "the defaults need {total}: keep database.max_connections and the docs in step"
        );
        assert!(total + 8 <= settings.database.max_connections);
        assert_eq!(settings.check_pool_budget(), Ok(()));
    }

    #[test]
    fn the_refusal_names_every_key_and_the_sum() {
        let mut settings = Settings::default();
        settings.database.max_connections = 20;
        let why = settings.check_pool_budget().unwrap_err();
        assert!(
            why.starts_with("database.max_connections = 20 cannot serve"),
            "{why}"
        );
        assert!(
            why.contains("jobs.automation_action.concurrency 8 + "),
            "{why}"
        );
        let total: u32 = settings.pool_needs().iter().map(|n| n.connections).sum();
        assert!(
            why.contains(&format!("= {total}; raise it or lower those")),
            "{why}"
        );
    }
}
