//! A mail's steps in time order, each with the gap since the one before.

use chrono::{DateTime, Utc};
use job_inbound_email_poller::story::StoredMail;
use serde::Serialize;

use super::parts::Parts;

/// One step of a mail's story.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Step {
    pub at: DateTime<Utc>,
    /// What kind of step: `received`, `published`, `matched`, `executed`, `queued`, `try`,
    /// `parked`, `dead-lettered`, `replayed`, `sent`, `bounced` (a delivery report's failure)
    /// or `report` (a delivery report's delay or success).
    pub kind: &'static str,
    pub text: String,
    /// The W3C trace id of the hop, where it was kept.
    pub trace_id: Option<String>,
    /// Milliseconds since the step before (none for the first).
    pub gap_ms: Option<i64>,
}

fn step(at: DateTime<Utc>, kind: &'static str, text: String) -> Step {
    Step {
        at,
        kind,
        text,
        trace_id: None,
        gap_ms: None,
    }
}

/// The steps of `mail`'s story, oldest first.
pub fn timeline(mail: &StoredMail, parts: &Parts) -> Vec<Step> {
    let mut steps = vec![step(
        mail.received_at,
        "received",
        format!(
            "Stored from {} ({} UID {}): from {}, subject \"{}\"{}",
            mail.account,
            mail.mailbox,
            mail.uid,
            mail.from_address.as_deref().unwrap_or("(no sender)"),
            mail.subject.as_deref().unwrap_or(""),
            match (&mail.status[..], &mail.skip_reason) {
                ("skipped", Some(reason)) => format!("; not announced: {reason}"),
                _ => String::new(),
            }
        ),
    )];
    let hop = |id: &str| -> &'static str {
        if mail.event_id.map(|e| e.to_string()).as_deref() == Some(id) {
            "the email.received event"
        } else if parts.executions.iter().any(|x| x.id.to_string() == id) {
            "the action's command"
        } else {
            "the send command"
        }
    };
    for p in &parts.publications {
        let mut s = step(
            p.published_at,
            "published",
            format!("{} was published ({})", hop(&p.message_id), p.routing_key),
        );
        s.trace_id = p.trace_id.clone();
        steps.push(s);
    }
    for v in &parts.verdicts {
        if let Some(at) = v.matched_at {
            steps.push(step(
                at,
                "matched",
                format!("Automation {} matched", v.automation),
            ));
        }
    }
    for x in &parts.executions {
        let what = x.action_type.as_deref().unwrap_or("action");
        steps.push(step(
            x.created_at,
            "queued",
            format!("Action {} ({what}) queued", x.action_index),
        ));
        if let Some(at) = x.finished_at {
            let text = match x.status.as_str() {
                "skipped" => format!(
                    "Action {} ({what}) skipped{}: {}",
                    x.action_index,
                    x.skip_kind
                        .as_deref()
                        .map(|k| format!(" ({k})"))
                        .unwrap_or_default(),
                    x.skip_reason.as_deref().unwrap_or("")
                ),
                "failed" => format!(
                    "Action {} ({what}) failed: {}",
                    x.action_index,
                    x.last_error.as_deref().unwrap_or("")
                ),
                status => format!("Action {} ({what}) {status}", x.action_index),
            };
            steps.push(step(at, "executed", text));
        }
    }
    for o in &parts.outbound {
        steps.push(step(
            o.created_at,
            "queued",
            format!(
                "Reply <{}> queued to {}: \"{}\"{}",
                o.message_id,
                o.to_addresses.join(", "),
                o.subject,
                o.supersedes
                    .map(|original| format!(" (an operator's edit of mail {original})"))
                    .unwrap_or_default()
            ),
        ));
        if let Some(at) = o.sent_at {
            steps.push(step(
                at,
                "sent",
                format!(
                    "Reply sent after {} tr{}: {}",
                    o.attempts,
                    if o.attempts == 1 { "y" } else { "ies" },
                    o.smtp_response.as_deref().unwrap_or("")
                ),
            ));
        }
    }
    for a in &parts.attempts {
        let who = if a.job == job_email_send::JOB_NAME {
            "Sending the reply"
        } else {
            "The action"
        };
        let error = a.error.as_deref().unwrap_or("");
        let (kind, text) = match (a.is_final, a.outcome.as_str()) {
            (false, outcome) => (
                "try",
                format!("{who}: try {} {outcome}: {error}", a.try_number),
            ),
            (true, "parked") => (
                "parked",
                format!("{who}: delivery {} parked in a retry tier", a.attempt),
            ),
            (true, outcome) => ("try", format!("{who}: delivery {} {outcome}", a.attempt)),
        };
        steps.push(step(a.at, kind, text));
    }
    for d in &parts.dead_letters {
        steps.push(step(
            d.died_at,
            "dead-lettered",
            format!(
                "Dead letter {} ({}, {}): {}",
                d.id,
                d.queue,
                d.reason,
                d.error.as_deref().unwrap_or("")
            ),
        ));
        if let Some(at) = d.replayed_at {
            steps.push(step(
                at,
                "replayed",
                format!("Dead letter {} replayed by an operator", d.id),
            ));
        }
    }
    for b in &parts.bounces {
        let kind = if b.class == "permanent" {
            "bounced"
        } else {
            "report"
        };
        steps.push(step(
            b.recorded_at,
            kind,
            format!(
                "A delivery report on the reply: {}",
                super::bounced::said(b)
            ),
        ));
    }
    // Steps of one millisecond in the order they happen: a try, then what its delivery
    // became, then an operator's replay; not the order their rows came back in.
    steps.sort_by_key(|s| (s.at, within_a_millisecond(s.kind)));
    let mut previous: Option<DateTime<Utc>> = None;
    for s in &mut steps {
        s.gap_ms = previous.map(|p| (s.at - p).num_milliseconds());
        previous = Some(s.at);
    }
    steps
}

/// Where a step of `kind` goes among steps of the same time.
fn within_a_millisecond(kind: &str) -> u8 {
    match kind {
        "try" => 1,
        "parked" | "sent" => 2,
        "dead-lettered" => 3,
        "replayed" => 4,
        "bounced" | "report" => 5,
        _ => 0,
    }
}
