//! The oracle: what one scenario's figures are, counted from outside the host, and whether
//! they pass. Pure: the numbers come from IMAP, PostgreSQL, the management API and `/metrics`
//! (see `run.rs`); this module only counts and judges.

use std::collections::{BTreeMap, BTreeSet};

/// How the replies read from the sender's mailbox match the pings sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReplyCount {
    /// Pings with no reply.
    pub lost: u64,
    /// Replies beyond the first for one ping.
    pub duplicates: u64,
    /// Replies whose In-Reply-To names no ping of this scenario.
    pub strays: u64,
}

/// Matches replies to pings by In-Reply-To. `pings` are Message-IDs without angle brackets;
/// each reply gives the message ids its In-Reply-To header names (brackets are ignored).
pub fn count_replies(pings: &[String], replies: &[Vec<String>]) -> ReplyCount {
    let sent: BTreeSet<&str> = pings.iter().map(|p| bare(p)).collect();
    let mut answers: BTreeMap<&str, u64> = BTreeMap::new();
    let mut strays = 0;
    for in_reply_to in replies {
        match in_reply_to
            .iter()
            .map(|id| bare(id))
            .find(|id| sent.contains(id))
        {
            Some(id) => *answers.entry(id).or_default() += 1,
            None => strays += 1,
        }
    }
    ReplyCount {
        lost: sent.iter().filter(|id| !answers.contains_key(*id)).count() as u64,
        duplicates: answers.values().map(|n| n.saturating_sub(1)).sum(),
        strays,
    }
}

fn bare(id: &str) -> &str {
    id.trim().trim_start_matches('<').trim_end_matches('>')
}

/// One scenario's figures over all its repetitions.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Figures {
    pub scenario: String,
    pub repetitions: u32,
    /// Pings the SMTP server accepted (sent into the loop), plus the direct commands.
    pub messages: u64,
    /// Of `messages`, the direct `email.send` and `automation.action` commands the harness
    /// published (each must deliver one mail to the direct mailbox; its loss or duplicate
    /// counts in `lost` and `duplicate_mails`).
    pub direct_commands: u64,
    pub lost: u64,
    /// Rows that exist more than once for what must be one: inbound mails per Message-ID,
    /// action executions per (event, automation, action), outbound emails per execution.
    pub duplicate_db_effects: u64,
    pub duplicate_mails: u64,
    /// Replies matching no ping (should be 0; any is a defect to read).
    pub stray_mails: u64,
    /// Sends whose outcome the host could not know: `worker_email_unknown_outcomes_total`
    /// summed over the scenario's host processes.
    pub faults_in_send_window: u64,
    /// Dead letters archived plus messages still in the dead queues.
    pub dead_letters: u64,
    /// The dead letters the scenario's fault made on purpose (malformed messages, a panicking
    /// or throttled command); `None` where it says nothing.
    pub expected_dead_letters: Option<u64>,
    /// Messages dead-lettered more than once, or archived twice: `dead_letters` rows beyond
    /// the first per (queue, message id) (the body's hash where there is no message id).
    pub duplicate_dead_letters: u64,
    /// Messages still in a `*.dead` queue at the end, not archived.
    pub left_in_dead_queues: u64,
    /// Messages left in the work queues and pending outbox rows at the end.
    pub left_in_queues: u64,
    pub left_in_outbox: u64,
    /// The longest time until `/readyz` answered 200 again, per fault, in seconds.
    pub max_secs_to_ready: Option<f64>,
    /// Measured but never ready within the wait.
    pub never_ready: bool,
    /// SIGTERM stops that did not end in exit code 0 within the wait.
    pub unclean_exits: u64,
    /// Outages the host should have noticed (`/readyz` not 200 while its broker was silent or
    /// its database stalled) and did not: it said it was ready while it could not work.
    pub unnoticed_faults: u64,
    /// The longest time to ready again this scenario allows (two of its host's heartbeat
    /// intervals); `None`: the limit the caller of [`Figures::failures`] gives.
    pub ready_limit_secs: Option<f64>,
    /// The scenario's wall-clock duration, in seconds.
    pub duration_secs: f64,
    /// Something the harness itself could not do (set-up, a fault that could not be applied).
    pub harness_error: Option<String>,
    /// What a scenario promises beyond the common figures (skipped ticks, no overlapping
    /// ticks, a lease taken over in time), each read from outside and judged by the scenario.
    pub checks: Vec<Check>,
}

/// One of a scenario's own promises, read from outside: what was measured, and whether it
/// holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    /// The figure and its bound, for the table and the failure reasons, e.g.
    /// "overlapping ticks: 0 (must be 0)".
    pub what: String,
    pub passed: bool,
}

impl Check {
    pub fn new(what: impl Into<String>, passed: bool) -> Self {
        Self {
            what: what.into(),
            passed,
        }
    }
}

impl Figures {
    /// Why the scenario fails; empty when it passes. `ready_limit_secs` is two heartbeat
    /// intervals of the host under test, unless the figures carry their own limit.
    pub fn failures(&self, ready_limit_secs: f64) -> Vec<String> {
        let ready_limit_secs = self.ready_limit_secs.unwrap_or(ready_limit_secs);
        let mut why = Vec::new();
        if let Some(err) = &self.harness_error {
            why.push(format!("harness: {err}"));
        }
        if self.messages == 0 && self.harness_error.is_none() {
            why.push("no message was sent".into());
        }
        if self.lost > 0 {
            why.push(format!("{} lost", self.lost));
        }
        if self.duplicate_db_effects > 0 {
            why.push(format!(
                "{} duplicate database effects",
                self.duplicate_db_effects
            ));
        }
        if self.duplicate_mails > self.faults_in_send_window {
            why.push(format!(
                "{} duplicate mails, more than the {} faults in a send's window",
                self.duplicate_mails, self.faults_in_send_window
            ));
        }
        if self.stray_mails > 0 {
            why.push(format!("{} replies to no ping", self.stray_mails));
        }
        if self.left_in_queues > 0 || self.left_in_outbox > 0 {
            why.push(format!(
                "not drained: {} in the work queues, {} pending in the outbox",
                self.left_in_queues, self.left_in_outbox
            ));
        }
        if let Some(expected) = self.expected_dead_letters
            && expected != self.dead_letters
        {
            why.push(format!(
                "{} dead letters, {expected} expected",
                self.dead_letters
            ));
        }
        if self.duplicate_dead_letters > 0 {
            why.push(format!(
                "{} messages dead-lettered or archived twice",
                self.duplicate_dead_letters
            ));
        }
        if self.left_in_dead_queues > 0 {
            why.push(format!(
                "{} dead letters not archived",
                self.left_in_dead_queues
            ));
        }
        if self.unclean_exits > 0 {
            why.push(format!(
                "{} SIGTERM stops without exit 0",
                self.unclean_exits
            ));
        }
        if self.unnoticed_faults > 0 {
            why.push(format!(
                "{} faults unnoticed (/readyz stayed 200 through an outage the host could not work through)",
                self.unnoticed_faults
            ));
        }
        if self.never_ready {
            why.push("not ready again within the wait".into());
        }
        if let Some(secs) = self.max_secs_to_ready
            && secs > ready_limit_secs
        {
            why.push(format!(
                "ready again after {secs:.1} s, more than {ready_limit_secs:.0} s"
            ));
        }
        for check in self.checks.iter().filter(|c| !c.passed) {
            why.push(check.what.clone());
        }
        why
    }

    pub fn passed(&self, ready_limit_secs: f64) -> bool {
        self.failures(ready_limit_secs).is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn each_ping_answered_once_counts_nothing() {
        let pings = ids(&["a@x", "b@x"]);
        let replies = vec![ids(&["<a@x>"]), ids(&["b@x"])];
        assert_eq!(count_replies(&pings, &replies), ReplyCount::default());
    }

    #[test]
    fn a_missing_reply_is_lost_and_a_second_is_a_duplicate() {
        let pings = ids(&["a@x", "b@x", "c@x"]);
        let replies = vec![
            ids(&["<a@x>"]),
            ids(&["<a@x>"]),
            ids(&["<a@x>"]),
            ids(&["<c@x>"]),
        ];
        assert_eq!(
            count_replies(&pings, &replies),
            ReplyCount {
                lost: 1,
                duplicates: 2,
                strays: 0
            }
        );
    }

    #[test]
    fn a_reply_to_nothing_sent_is_a_stray() {
        let pings = ids(&["a@x"]);
        let replies = vec![ids(&["<a@x>"]), ids(&["<zzz@x>"]), Vec::new()];
        assert_eq!(count_replies(&pings, &replies).strays, 2);
    }

    fn clean() -> Figures {
        Figures {
            scenario: "s".into(),
            repetitions: 1,
            messages: 10,
            max_secs_to_ready: Some(3.0),
            ..Figures::default()
        }
    }

    #[test]
    fn the_expected_dead_letters_pass() {
        let mut f = clean();
        f.dead_letters = 300;
        f.expected_dead_letters = Some(300);
        assert!(f.passed(20.0));
        f.dead_letters = 301;
        assert!(!f.passed(20.0));
    }

    #[test]
    fn a_scenario_s_own_ready_limit_overrides_the_callers() {
        let mut f = clean();
        f.max_secs_to_ready = Some(12.0);
        assert!(f.passed(20.0));
        f.ready_limit_secs = Some(10.0);
        assert!(!f.passed(20.0));
    }

    #[test]
    fn clean_figures_pass() {
        assert!(clean().passed(20.0));
    }

    #[test]
    fn a_failed_check_is_a_reason_and_a_passed_one_is_not() {
        let mut f = clean();
        f.checks
            .push(Check::new("skipped ticks: 12 (must be > 0)", true));
        assert!(f.passed(20.0));
        f.checks.push(Check::new(
            "lease taken over after 9.0 s (limit 5.5 s)",
            false,
        ));
        assert_eq!(
            f.failures(20.0),
            vec!["lease taken over after 9.0 s (limit 5.5 s)".to_string()]
        );
    }

    #[test]
    fn duplicates_within_the_send_window_budget_pass_and_beyond_it_fail() {
        let mut f = clean();
        f.duplicate_mails = 2;
        f.faults_in_send_window = 2;
        assert!(f.passed(20.0));
        f.duplicate_mails = 3;
        assert!(!f.passed(20.0));
    }

    #[test]
    fn any_loss_db_duplicate_leftover_or_slow_readiness_fails() {
        for change in [
            (|f: &mut Figures| f.lost = 1) as fn(&mut Figures),
            |f| f.duplicate_db_effects = 1,
            |f| f.left_in_outbox = 1,
            |f| f.left_in_queues = 1,
            |f| f.max_secs_to_ready = Some(20.5),
            |f| f.never_ready = true,
            |f| f.unclean_exits = 1,
            |f| f.unnoticed_faults = 1,
            |f| f.harness_error = Some("boom".into()),
            |f| f.messages = 0,
            |f| f.expected_dead_letters = Some(1),
            |f| f.duplicate_dead_letters = 1,
            |f| f.left_in_dead_queues = 1,
            |f| {
                f.checks
                    .push(Check::new("overlapping ticks: 1 (must be 0)", false))
            },
        ] {
            let mut f = clean();
            change(&mut f);
            assert!(!f.passed(20.0), "{f:?}");
        }
    }
}
