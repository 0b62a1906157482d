//! Delivery status notifications ("bounces"), tied back to the mail the host sent (issue 39).
//!
//! A report is read where the mail is parsed ([`read::report_of`], into
//! [`crate::ParsedEmail::report`]), in the three shapes servers write: RFC 3464's
//! `multipart/report` with a `message/delivery-status` part; Google's, whose delivery-status
//! part may be empty, with `X-Failed-Recipients` and the original attached whole; Microsoft's,
//! whose text says the recipient, the status and the original's header. A mail that is a
//! report is recorded as what it is: its row is `skipped` (never announced, so never answered,
//! whatever the automations say) and each recipient it reports on is a row of
//! `outbound_bounces` ([`record`]), written in the batch's transaction, linked to the
//! outbound mail by the report's `Original-Envelope-Id` (the `ENVID` the sender gives a relay
//! that offers DSN: the mail's Message-ID), the Message-ID of the original, else the
//! report's In-Reply-To or References. A permanent failure (`5.x.x`) makes that mail `bounced`; a delay or a `4.x.x`
//! is noted and changes nothing. A report on a mail the host did not send is kept unlinked.

pub mod read;
pub mod record;
pub mod story;
mod text;

use chrono::{DateTime, Utc};

/// The `skip_reason` of a report's own row: what it is, and why it is not announced.
pub fn skip_reason(report: &Report) -> String {
    let said: Vec<String> = report
        .recipients
        .iter()
        .take(5)
        .map(|r| match &r.status {
            Some(status) => format!("{} {} {status}", r.recipient, r.action),
            None => format!("{} {}", r.recipient, r.action),
        })
        .collect();
    let more = report.recipients.len().saturating_sub(said.len());
    let more = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    format!(
        "a delivery status report ({}{more}): recorded against the mail it reports on, never announced",
        said.join(", ")
    )
}

/// What one delivery status notification says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// One entry per recipient, each recipient once.
    pub recipients: Vec<RecipientReport>,
    /// `Original-Envelope-Id`: the `ENVID` the host's mail carried (its Message-ID, sent where
    /// the relay offers DSN).
    pub envelope_id: Option<String>,
    /// The Message-ID of the mail reported on (the attached original, its returned header, or
    /// the header quoted in the text), without angle brackets.
    pub original_message_id: Option<String>,
    /// The report's own In-Reply-To and References, which some servers point at the original.
    pub in_reply_to: Option<String>,
    pub references: Vec<String>,
}

impl Report {
    /// The Message-IDs that may name the mail reported on, the surest first: the envelope
    /// id, the original's, then the report's In-Reply-To, then its References, newest first.
    pub fn link_candidates(&self) -> Vec<String> {
        let mut candidates: Vec<String> = Vec::new();
        let ids = self
            .envelope_id
            .iter()
            .chain(self.original_message_id.iter())
            .chain(self.in_reply_to.iter())
            .chain(self.references.iter().rev());
        for id in ids {
            if !candidates.contains(id) {
                candidates.push(id.clone());
            }
        }
        candidates
    }
}

/// What a report says of one recipient.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecipientReport {
    pub recipient: String,
    /// RFC 3464's Action in lower case: `failed`, `delayed`, `delivered`, `relayed` or
    /// `expanded`.
    pub action: String,
    /// The RFC 3463 status code (`5.1.1`); `None` when the report gave none.
    pub status: Option<String>,
    /// What the remote server said (Diagnostic-Code, or the report's words).
    pub diagnostic: Option<String>,
    /// When the report says it happened (Last-Attempt-Date, Arrival-Date, else its Date).
    pub at: Option<DateTime<Utc>>,
}

impl RecipientReport {
    pub fn class(&self) -> Class {
        Class::of(&self.action, self.status.as_deref())
    }
}

/// How a recipient's report counts: the `class` of `worker_bounces_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// `5.x.x`, or `failed` with no status: the mail will not arrive; it becomes `bounced`.
    Permanent,
    /// `4.x.x`, or `delayed`: the remote side is still trying; noted only.
    Transient,
    /// `delivered`, `relayed` or `expanded` (`2.x.x`): not a failure; noted only.
    Other,
}

impl Class {
    pub fn of(action: &str, status: Option<&str>) -> Self {
        match status.and_then(|s| s.chars().next()) {
            Some('5') => Self::Permanent,
            Some('4') => Self::Transient,
            Some('2') => Self::Other,
            _ => match action {
                "failed" => Self::Permanent,
                "delayed" => Self::Transient,
                _ => Self::Other,
            },
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Permanent => "permanent",
            Self::Transient => "transient",
            Self::Other => "other",
        }
    }

    pub fn parse(word: &str) -> Option<Self> {
        [Self::Permanent, Self::Transient, Self::Other]
            .into_iter()
            .find(|c| c.as_str() == word)
    }
}
