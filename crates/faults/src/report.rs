//! The run's table (Markdown, printed and written to `docs/RELIABILITY.md`) and the document
//! around it: when, on what machine, against which service versions, and what each scenario
//! does and how each figure is counted.

use std::fmt::Write as _;

use crate::oracle::Figures;
use crate::scenarios::Scenario;

/// Where and against what the run happened.
#[derive(Debug, Clone, Default)]
pub struct Environment {
    pub date: String,
    pub cores: String,
    pub memory: String,
    pub postgres: String,
    pub rabbitmq: String,
    pub dovecot: String,
    pub command: String,
    pub total_secs: f64,
}

/// The table: one row a scenario, pass/fail with the reasons.
pub fn table(rows: &[Figures], ready_limit_secs: f64) -> String {
    let mut out = String::from(
        "| scenario | repetitions | messages | lost | duplicate DB effects | duplicate mails | \
         faults in a send's window | dead letters | max s to ready | duration s | result |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for f in rows {
        let ready = match (f.never_ready, f.max_secs_to_ready) {
            (true, _) => "never".to_string(),
            (false, Some(secs)) => format!("{secs:.1}"),
            (false, None) => "–".to_string(),
        };
        let messages = if f.direct_commands > 0 {
            format!("{} ({} direct)", f.messages, f.direct_commands)
        } else {
            f.messages.to_string()
        };
        let failures = f.failures(ready_limit_secs);
        let mut result = if failures.is_empty() {
            "pass".to_string()
        } else {
            format!("**FAIL**: {}", failures.join("; "))
        };
        // The scenario's own figures that held are shown too: they are what it measured.
        let held: Vec<&str> = f
            .checks
            .iter()
            .filter(|c| c.passed)
            .map(|c| c.what.as_str())
            .collect();
        if !held.is_empty() {
            result.push_str(&format!(" ({})", held.join("; ")));
        }
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} | {} |",
            f.scenario,
            f.repetitions,
            messages,
            f.lost,
            f.duplicate_db_effects,
            f.duplicate_mails,
            f.faults_in_send_window,
            f.dead_letters,
            ready,
            f.duration_secs,
            result.replace('|', "\\|"),
        );
    }
    out
}

/// The whole `docs/RELIABILITY.md`.
pub fn document(
    env: &Environment,
    rows: &[Figures],
    scenarios: &[Scenario],
    ready_limit_secs: f64,
) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        r#"# Reliability: the fault suite's last recorded run

The host's promises (lose nothing; do nothing twice that must not happen twice; be ready
again soon after a fault) measured from outside, with the real release `worker-host` binary
on the real local services. Rerun it with `scripts/faults.sh` (`--quick` for one repetition
of each with a small load, which CI runs after the test suite; `--scenario NAME` for some
scenarios only; `--parallel N` to run N scenarios at once). No scenario stops, kills or
reconfigures the shared services: process faults of RabbitMQ and PostgreSQL are applied to a
private node or cluster the scenario starts, and traffic faults through a TCP proxy
(`worker_testkit::FaultProxy`) in front of the shared ones.

## The run

- date: {date}
- command: `{command}`, {total:.0} s in all
- machine: {cores} cores, {memory} memory
- PostgreSQL: {pg}; RabbitMQ: {rabbit}; Dovecot: {dovecot}; SMTP: the project's aiosmtpd sink

"#,
        date = env.date,
        command = env.command,
        total = env.total_secs,
        cores = env.cores,
        memory = env.memory,
        pg = env.postgres,
        rabbit = env.rabbitmq,
        dovecot = env.dovecot,
    );
    out.push_str(&table(rows, ready_limit_secs));
    let _ = write!(
        out,
        r#"
A scenario passes when lost = 0, duplicate DB effects = 0, duplicate mails ≤ faults in a
send's window, no reply matches no ping, the work queues, the dead queues and the outbox
are empty at the end, no message is dead-lettered or archived twice, the dead letters are
exactly those the scenario makes on purpose (where it says how many), and every fault was followed by `/readyz` 200 within two heartbeat intervals of the host under
test ({ready_limit_secs:.0} s: `broker.heartbeat` is 10 s, unless the scenario's description
says it sets a shorter one).
A scenario may promise more (the timer scenarios: skipped ticks counted, no two ticks of one
job overlapping, a lease taken over in time): each such figure is shown in brackets in the
result column, and one that does not hold fails the scenario.

## How each figure is counted

Every scenario has a database (`worker_testkit::TestDb`), a RabbitMQ vhost (`TestVhost`), an
IMAP account the host polls (every second) and a sender's mailbox of its own, and runs the
release binary with a settings file of its own (the demo automation: a reply to every mail
whose subject contains `ping`; retry tiers of 2 s, 5 s, 10 s with 30 attempts, so the retry
ladder outlasts an email's stale claim, `jobs.email_send.claim_stale_after` 45 s; a 10 s send timeout).

- **messages**: pings the SMTP server (127.0.0.1:2525) accepted, each with a unique
  Message-ID, sent at a steady rate from the sender to the polled account while the fault is
  applied. A ping the server refused is not counted (it never entered the loop). Besides
  the pings, one direct `email.send` and one direct `automation.action` command (a
  `send_email` action) for every 10 pings, published into the scenario's vhost through the
  management API (the harness holds no AMQP connection there) after the row each names
  (an `outbound_emails` row; an `action_executions` row of a disabled automation of the
  harness's own): "120 (20 direct)" is 100 pings and 20 direct commands. Each direct
  command must deliver one mail to a third mailbox of the scenario, matched by its
  Message-ID; a missing one counts as lost, a second one as a duplicate mail.
- **lost**: pings with no reply in the sender's mailbox, read over IMAP and matched by
  In-Reply-To, after the settle wait (until every ping has a reply and the queues and the
  outbox are empty, at most a bound per scenario, then 3 s more to catch late duplicates).
- **duplicate mails**: replies beyond the first for one ping. A reply that matches no ping
  fails the scenario as well.
- **duplicate DB effects**: groups with more than one row where there must be one: inbound
  mails recorded as new per (account, Message-ID) (a mail seen again under another UID gets a
  row naming the first as its `duplicate_of`, which announces nothing and is not counted),
  action executions per (event, automation, action), action executions per inbound mail's
  event, outbound emails per action execution.
- **faults in a send's window**: `worker_email_unknown_outcomes_total` from `/metrics`,
  summed over the scenario's host processes (each scraped just before it is killed or stopped,
  and at the end): the sends whose outcome the host could not know (no answer after the final
  "."), and the stale `sending` claims a later try took over (the try died between the
  server's acceptance and the record). Each may cost one duplicate mail, by design.
- **dead letters**: rows in `dead_letters` plus messages still in a `*.dead` queue. The
  archive (`jobs.dead_letter_archive`) empties the dead queues continuously (its maintenance,
  which archives failed outbox rows, runs every 2 s here); the settle wait also waits for the
  dead queues to be empty, and a message left in one fails the scenario. A message
  dead-lettered or archived twice (two rows for one (queue, message id), or for one body
  where there is no message id; the archive's own key, `dedup_key`, is a hash of the whole
  message, so a second dead-lettering with a new `x-dead-at` would escape it) fails it too.
- **max s to ready**: for a fault on a running host, from the moment the fault was applied
  until `/readyz` answered 200 again (polled every 100 ms after a 2 s watch for it to leave
  200; if it never left 200 in those 2 s, the figure is about 2 s, an upper bound, not a
  measured outage); for the host's own restart, from the new process's start. `–` where no
  fault was applied.
- **drained** (in the result column when not): messages ready or unacked in the work queues
  (`automation.trigger`, `automation.action`, `email.send`, and their retry tiers) and
  `pending` outbox rows at the end.

## The scenarios
"#
    );
    for scenario in scenarios {
        let _ = write!(
            out,
            "\n### `{}`\n\n{}\n\nRepetitions: {} (full), {} (`--quick`); pings per repetition: {} (full), {} (`--quick`), at {} a second.\n",
            scenario.name,
            scenario.about,
            scenario.full.repetitions,
            scenario.quick.repetitions,
            scenario.full.per_repetition,
            scenario.quick.per_repetition,
            scenario.rate_per_sec,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str) -> Figures {
        Figures {
            scenario: name.into(),
            repetitions: 2,
            messages: 40,
            max_secs_to_ready: Some(1.25),
            duration_secs: 12.4,
            ..Figures::default()
        }
    }

    #[test]
    fn the_table_has_a_row_a_scenario_with_its_verdict() {
        let mut bad = row("host-kill9");
        bad.lost = 3;
        let text = table(&[row("baseline"), bad], 20.0);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert_eq!(
            lines[2],
            "| baseline | 2 | 40 | 0 | 0 | 0 | 0 | 0 | 1.2 | 12 | pass |"
        );
        assert!(
            lines[3].starts_with("| host-kill9 | 2 | 40 | 3 |"),
            "{text}"
        );
        assert!(lines[3].ends_with("| **FAIL**: 3 lost |"), "{text}");
    }

    #[test]
    fn a_scenarios_own_checks_show_in_the_result() {
        let mut f = row("timer-overrun");
        f.checks = vec![
            crate::oracle::Check::new("skipped ticks: 12 (must be > 0)", true),
            crate::oracle::Check::new("overlapping ticks: 1 (must be 0)", false),
        ];
        let text = table(&[f], 20.0);
        assert!(
            text.contains(
                "| **FAIL**: overlapping ticks: 1 (must be 0) (skipped ticks: 12 (must be > 0)) |"
            ),
            "{text}"
        );
    }

    #[test]
    fn no_fault_shows_a_dash_and_never_ready_says_so() {
        let mut a = row("baseline");
        a.max_secs_to_ready = None;
        let mut b = row("x");
        b.never_ready = true;
        let text = table(&[a, b], 20.0);
        assert!(text.contains("| 0 | – | 12 | pass |"), "{text}");
        assert!(text.contains("| never |"), "{text}");
    }

    #[test]
    fn the_document_names_the_machine_and_every_scenario() {
        let env = Environment {
            date: "2026-12-01".into(),
            cores: "2".into(),
            ..Environment::default()
        };
        let text = document(&env, &[row("baseline")], &crate::scenarios::all(), 20.0);
        assert!(text.contains("- date: 2026-12-01"));
        assert!(text.contains("2 cores"));
        for scenario in crate::scenarios::all() {
            assert!(text.contains(&format!("### `{}`", scenario.name)));
        }
    }
}
