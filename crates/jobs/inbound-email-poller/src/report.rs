//! What one tick did, per account and in total: the tick's report.

use std::time::Duration;

use worker_core::Failure;

/// What happened to the messages of one account in one tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MessageCounts {
    /// Stored and announced (parse errors included).
    pub stored: u64,
    /// Of `stored`, those that did not parse.
    pub parse_errors: u64,
    /// Recorded as skipped because of their size.
    pub too_large: u64,
    /// Recorded as skipped, unparsed, because their structure passed a [`MailLimits`] bound.
    pub too_complex: u64,
    /// Recorded as skipped after failing `max_message_attempts` times.
    pub gave_up: u64,
    /// Already stored under their UID, or (after a UIDVALIDITY change) their Message-ID.
    pub duplicates: u64,
    /// Gone from the mailbox between the search and the fetch.
    pub vanished: u64,
    /// Delivery status notifications, recorded with what they report and not announced.
    pub reports: u64,
}

impl MessageCounts {
    /// Messages that got a row this tick.
    pub fn recorded(&self) -> u64 {
        self.stored + self.too_large + self.too_complex + self.gave_up + self.reports
    }
}

/// One account's part of a tick.
#[derive(Debug, Clone, PartialEq)]
pub struct AccountReport {
    pub account: String,
    pub counts: MessageCounts,
    /// Why the account's poll ended early; the counts say what was done before.
    pub failure: Option<Failure>,
    /// More new messages were waiting than one tick handles.
    pub more_waiting: bool,
    /// The UIDVALIDITY changed and the mailbox was started over.
    pub rescanned: bool,
    /// Not polled: the account's circuit is open (see [`crate::circuit`]).
    pub circuit_open: Option<crate::CircuitOpen>,
}

/// What one tick did, account by account.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PollReport {
    pub accounts: Vec<AccountReport>,
    /// The tick's token fired before every account was done.
    pub cancelled: bool,
}

impl PollReport {
    /// The accounts whose poll failed, with why.
    pub fn failed(&self) -> impl Iterator<Item = (&str, &Failure)> {
        self.accounts
            .iter()
            .filter_map(|a| a.failure.as_ref().map(|f| (a.account.as_str(), f)))
    }

    /// The accounts skipped for their open circuit, with why.
    pub fn skipped(&self) -> impl Iterator<Item = (&str, &crate::CircuitOpen)> {
        self.accounts
            .iter()
            .filter_map(|a| a.circuit_open.as_ref().map(|c| (a.account.as_str(), c)))
    }

    /// How many accounts this tick tried (those not skipped for their open circuit).
    pub fn tried(&self) -> usize {
        self.accounts.len() - self.skipped().count()
    }

    /// The counts of all accounts together.
    pub fn totals(&self) -> MessageCounts {
        self.accounts
            .iter()
            .fold(MessageCounts::default(), |mut t, a| {
                t.stored += a.counts.stored;
                t.parse_errors += a.counts.parse_errors;
                t.too_large += a.counts.too_large;
                t.too_complex += a.counts.too_complex;
                t.gave_up += a.counts.gave_up;
                t.duplicates += a.counts.duplicates;
                t.vanished += a.counts.vanished;
                t.reports += a.counts.reports;
                t
            })
    }

    /// One line for the tick's log: the counts and each failed account.
    pub fn summary(&self) -> String {
        let t = self.totals();
        let failed: Vec<String> = self
            .failed()
            .map(|(name, f)| format!("{name} ({}: {f})", f.class()))
            .collect();
        let mut line = format!(
            "{} accounts: stored {} ({} unparsed), skipped {} too large, {} too complex and {} failing, {} duplicates, {} delivery reports",
            self.accounts.len(),
            t.stored,
            t.parse_errors,
            t.too_large,
            t.too_complex,
            t.gave_up,
            t.duplicates,
            t.reports
        );
        if !failed.is_empty() {
            line.push_str(&format!("; {} failed: {}", failed.len(), failed.join(", ")));
        }
        let skipped: Vec<String> = self
            .skipped()
            .map(|(name, open)| {
                let whole_seconds = Duration::from_secs(open.probe_in.as_secs());
                let probe_in = humantime::format_duration(whole_seconds);
                format!("{name} (probed in {probe_in}: {})", open.reason)
            })
            .collect();
        if !skipped.is_empty() {
            line.push_str(&format!(
                "; {} skipped, their circuit open: {}",
                skipped.len(),
                skipped.join(", ")
            ));
        }
        line
    }
}
