//! A mail's end state, in words an operator understands.

use job_email_send::story::OutboundRecord;
use job_inbound_email_poller::story::StoredMail;
use serde::Serialize;

use super::bounced::{bounced_detail, noted, report_detail};
use super::expired::expired_detail;
use super::parts::Parts;

/// Where a mail's handling ended, or stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "state")]
pub enum EndState {
    /// An answer was accepted by the SMTP server.
    Answered { detail: String },
    /// Every action ran and none of them was a mail (a webhook, say).
    Done { detail: String },
    /// Nothing was sent, by decision: `reason` is `not-announced`, `no-match`, `disabled`,
    /// `loop-guard`, `recipient-cap` or `reply-limit`.
    Skipped { reason: String, detail: String },
    /// A step failed for good; its dead letter waits for an operator.
    Failed { detail: String },
    /// The reply was past its age limit when its turn came, and was not sent.
    Expired { detail: String },
    /// The relay accepted the reply, and a delivery report then said it failed for good.
    Bounced { detail: String },
    /// A step failed and waits to be tried again (a retry tier, a backoff).
    Waiting { detail: String },
    /// Still on its way.
    InProgress { detail: String },
}

impl EndState {
    /// `answered`, `done`, `skipped`, `failed`, `expired`, `bounced`, `waiting` or
    /// `in-progress`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Answered { .. } => "answered",
            Self::Done { .. } => "done",
            Self::Skipped { .. } => "skipped",
            Self::Failed { .. } => "failed",
            Self::Expired { .. } => "expired",
            Self::Bounced { .. } => "bounced",
            Self::Waiting { .. } => "waiting",
            Self::InProgress { .. } => "in-progress",
        }
    }

    /// The state in one sentence.
    pub fn sentence(&self) -> String {
        match self {
            Self::Answered { detail } => format!("Answered: {detail}"),
            Self::Done { detail } => format!("Done: {detail}"),
            Self::Skipped { reason, detail } => {
                format!("Not answered ({}): {detail}", skip_words(reason))
            }
            Self::Failed { detail } => format!("Failed: {detail}"),
            Self::Expired { detail } => format!("Not sent: {detail}"),
            Self::Bounced { detail } => format!("Bounced: {detail}"),
            Self::Waiting { detail } => format!("Waiting: {detail}"),
            Self::InProgress { detail } => format!("In progress: {detail}"),
        }
    }

    /// Works out the end state of `mail` from its story's `parts`.
    pub fn of(mail: &StoredMail, parts: &Parts) -> Self {
        if !parts.reported.is_empty() {
            return Self::Skipped {
                reason: "delivery-report".into(),
                detail: report_detail(&parts.reported),
            };
        }
        if mail.status == "skipped" {
            return Self::Skipped {
                reason: "not-announced".into(),
                detail: mail.skip_reason.clone().unwrap_or_default(),
            };
        }
        if let Some(state) = from_outbound(parts) {
            return state;
        }
        if let Some(state) = from_executions(parts) {
            return state;
        }
        from_verdicts(mail, parts)
    }
}

/// The words for a skip reason.
pub fn skip_words(reason: &str) -> &'static str {
    match reason {
        "not-announced" => "the poller did not announce it",
        "no-match" => "no automation matched",
        "disabled" => "the automation that matches is disabled",
        "loop-guard" => "the loop guard: automatic or list mail is not answered",
        "recipient-cap" => "too many recipients",
        "reply-limit" => "the reply limit: the address had its replies for the hour",
        "delivery-report" => {
            "a delivery report: recorded against the mail it reports on, never answered"
        }
        _ => "skipped",
    }
}

fn from_outbound(parts: &Parts) -> Option<EndState> {
    if let Some(sent) = parts.outbound.iter().find(|o| o.status == "sent") {
        let replayed = parts.dead_letters.iter().any(|d| d.status == "replayed");
        let after = if sent.supersedes.is_some() {
            " after an operator edited it"
        } else if replayed {
            " after an operator's replay"
        } else {
            ""
        };
        return Some(EndState::Answered {
            detail: format!(
                "a reply to {} was accepted{after}: {}{}",
                sent.to_addresses.join(", "),
                sent.smtp_response.as_deref().unwrap_or("(no answer kept)"),
                noted(sent, &parts.bounces)
            ),
        });
    }
    let mail = parts.outbound.last()?;
    let error = mail.last_error.as_deref().unwrap_or("");
    // A refusal for good has its own words below; a reply whose tries ran out is still
    // `queued` in its row, and only its dead letter tells.
    if !matches!(
        mail.status.as_str(),
        "failed" | "unknown" | "expired" | "bounced"
    ) && let Some(state) = given_up(parts, mail)
    {
        return Some(state);
    }
    Some(match mail.status.as_str() {
        "failed" => EndState::Failed {
            detail: format!(
                "the SMTP server refused the reply to {} for good: {error}; its dead letter waits for an operator",
                mail.to_addresses.join(", ")
            ),
        },
        "expired" => EndState::Expired {
            detail: expired_detail(mail),
        },
        "bounced" => EndState::Bounced {
            detail: bounced_detail(mail, &parts.bounces),
        },
        "unknown" => EndState::Failed {
            detail: format!(
                "the reply to {} may or may not have been sent (the server's answer was lost): {error}",
                mail.to_addresses.join(", ")
            ),
        },
        _ if mail.attempts > 0 && !error.is_empty() => EndState::Waiting {
            detail: format!(
                "{} of the reply to {} was refused for now ({error}); it waits in a retry tier to be tried again",
                tries_and_deliveries(parts, mail),
                mail.to_addresses.join(", ")
            ),
        },
        _ => EndState::InProgress {
            detail: format!(
                "a reply to {} is queued to send",
                mail.to_addresses.join(", ")
            ),
        },
    })
}

/// The end of a reply whose send command was dead-lettered (its tries given up, or refused):
/// the newest of its dead letters decides, by when it died and then by its id, never by the
/// order rows of one millisecond come back. `None` while it has none, or when an operator
/// replayed the newest (the mail is on its way again).
fn given_up(parts: &Parts, mail: &OutboundRecord) -> Option<EndState> {
    let key = mail.id.to_string();
    let dead = parts
        .dead_letters
        .iter()
        .filter(|d| d.message_id.as_deref() == Some(key.as_str()))
        .max_by_key(|d| (d.died_at, d.id))?;
    let to = mail.to_addresses.join(", ");
    let error = dead.error.as_deref().unwrap_or("(no error kept)");
    let deliveries = dead
        .attempts
        .map(|n| format!(" after {n} deliver{}", if n == 1 { "y" } else { "ies" }))
        .unwrap_or_default();
    let tries = plural(mail.attempts, "try", "tries");
    match dead.status.as_str() {
        "replayed" | "edited" => None,
        "purged" => Some(EndState::Failed {
            detail: format!(
                "the reply to {to} was given up ({}){deliveries} and {tries}: {error}; an operator purged dead letter {}",
                dead.reason, dead.id
            ),
        }),
        _ => Some(EndState::Failed {
            detail: format!(
                "the reply to {to} was given up ({}){deliveries} and {tries}: {error}; dead letter {} waits for an operator",
                dead.reason, dead.id
            ),
        }),
    }
}

/// `try 15 (delivery 5)`: the in-process tries a reply took in all, and the delivery the
/// newest was part of, each named, since a dead letter counts deliveries.
fn tries_and_deliveries(parts: &Parts, mail: &OutboundRecord) -> String {
    let key = mail.id.to_string();
    let delivery = parts
        .attempts
        .iter()
        .filter(|a| a.message_id.as_deref() == Some(key.as_str()))
        .map(|a| a.attempt)
        .max();
    match delivery {
        Some(n) => format!("try {} (delivery {n})", mail.attempts),
        None => format!("try {}", mail.attempts),
    }
}

fn plural(n: i32, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn from_executions(parts: &Parts) -> Option<EndState> {
    if parts.executions.is_empty() {
        return None;
    }
    if let Some(failed) = parts.executions.iter().find(|x| x.status == "failed") {
        return Some(EndState::Failed {
            detail: format!(
                "an action failed for good: {}",
                failed.last_error.as_deref().unwrap_or("(no error kept)")
            ),
        });
    }
    if let Some(open) = parts
        .executions
        .iter()
        .find(|x| x.status == "pending" || x.status == "running")
    {
        return Some(match open.last_error.as_deref() {
            Some(error) if open.attempts > 0 => EndState::Waiting {
                detail: format!(
                    "an action's try {} failed ({error}); it will be tried again",
                    open.attempts
                ),
            },
            _ => EndState::InProgress {
                detail: "an action is queued to run".into(),
            },
        });
    }
    if parts.executions.iter().all(|x| x.status == "skipped") {
        let first = &parts.executions[0];
        return Some(EndState::Skipped {
            reason: first.skip_kind.clone().unwrap_or_else(|| "skipped".into()),
            detail: first.skip_reason.clone().unwrap_or_default(),
        });
    }
    Some(EndState::Done {
        detail: "every action ran; none of them sends a mail".into(),
    })
}

fn from_verdicts(mail: &StoredMail, parts: &Parts) -> EndState {
    let published = parts
        .publications
        .iter()
        .any(|p| Some(p.message_id.as_str()) == mail.event_id.map(|e| e.to_string()).as_deref());
    if let Some(v) = parts.verdicts.iter().find(|v| v.enabled && v.would_match()) {
        let detail = if published {
            format!(
                "automation {} matches; the trigger has not acted on the event yet",
                v.automation
            )
        } else {
            format!(
                "automation {} matches; the event waits in the outbox to be published",
                v.automation
            )
        };
        return EndState::InProgress { detail };
    }
    if let Some(v) = parts
        .verdicts
        .iter()
        .find(|v| !v.enabled && v.would_match())
    {
        return EndState::Skipped {
            reason: "disabled".into(),
            detail: format!(
                "automation {} would answer it, but it is disabled",
                v.automation
            ),
        };
    }
    let detail = if parts.verdicts.is_empty() {
        "there is no automation for received mail".to_string()
    } else {
        parts
            .verdicts
            .iter()
            .filter(|v| v.enabled)
            .map(|v| match &v.unusable {
                Some(problem) => format!(
                    "{}: its conditions cannot be used ({problem})",
                    v.automation
                ),
                None => format!(
                    "{}: {} does not hold",
                    v.automation,
                    v.failed_conditions.join(", ")
                ),
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    EndState::Skipped {
        reason: "no-match".into(),
        detail,
    }
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
