//! Finding mails by sender, the recipient of their answer, Message-ID, subject or time, each
//! with its end state.

use chrono::{DateTime, Utc};
use job_inbound_email_poller::story::MailSearch;
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;
use worker_core::Failure;

use super::read::read_parts_of;
use super::state::EndState;

/// What a search asks; every field narrows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Search {
    pub from: Option<String>,
    /// The recipient of an answer (to or cc).
    pub to: Option<String>,
    pub message_id: Option<String>,
    pub subject: Option<String>,
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
    /// The page after this mail (the last one of the previous page).
    pub after: Option<(DateTime<Utc>, Uuid)>,
    pub limit: u32,
}

/// One mail a search found, with its end state.
#[derive(Debug, Clone, Serialize)]
pub struct Found {
    pub id: Uuid,
    pub received_at: DateTime<Utc>,
    pub account: String,
    pub from: Option<String>,
    pub subject: Option<String>,
    pub message_id: Option<String>,
    pub end: EndState,
}

/// The mails `search` finds, newest first, a page at a time.
pub async fn find(pool: &PgPool, search: &Search) -> Result<Vec<Found>, Failure> {
    let limit = search.limit.clamp(1, 200);
    let event_ids = match &search.to {
        Some(address) => Some(
            job_automation_action::story::events_answering(
                pool,
                address,
                search.since,
                search.until,
                limit.saturating_mul(10),
            )
            .await?,
        ),
        None => None,
    };
    let mails = job_inbound_email_poller::story::find(
        pool,
        &MailSearch {
            from: search.from.clone(),
            message_id: search.message_id.clone(),
            subject: search.subject.clone(),
            event_ids,
            since: search.since,
            until: search.until,
            after: search.after,
            limit,
        },
    )
    .await?;
    let parts = read_parts_of(pool, &mails).await?;
    Ok(mails
        .into_iter()
        .zip(parts)
        .map(|(mail, parts)| Found {
            end: EndState::of(&mail, &parts),
            id: mail.id,
            received_at: mail.received_at,
            account: mail.account,
            from: mail.from_address,
            subject: mail.subject,
            message_id: mail.message_id,
        })
        .collect())
}
