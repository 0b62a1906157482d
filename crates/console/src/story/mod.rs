//! A mail's story: why a customer got an answer, or none. It reads what each job already
//! recorded (the poller's row, the event's publication, the automations' verdicts, the action
//! executions, the outbound mails with their tries, dead letters and replays) through the
//! readers of the crates that own those tables, and puts them on one timeline with the gaps
//! between steps and one end state in words. `worker-host mail show|find` and the console's
//! `/mail/{id}` and `/mail` show the same [`Story`] and [`Found`] rows.
//!
//! - `parts.rs`: what was recorded past the mail itself;
//! - `read.rs`: gathering those parts from the tables' owners;
//! - `state.rs`: the end state (answered, skipped and why, failed, expired, bounced, waiting,
//!   in progress); `expired.rs`: the words for a reply past its age limit; `bounced.rs`: what
//!   delivery reports said, and RFC 3463's status codes in words;
//! - `timeline.rs`: the steps in time order, with their gaps;
//! - `search.rs`: the search by sender, recipient, Message-ID, subject and time.

mod bounced;
mod expired;
mod parts;
mod read;
mod search;
mod state;
mod timeline;

pub use parts::Parts;
pub use read::{Retention, Story, read_story};
pub use search::{Found, Search, find};
pub use state::EndState;
pub use timeline::Step;

/// The stored inbound mail a command's message id leads back to: an action execution's id,
/// or an outbound mail's (through the mails an operator edited it from). `None` when the
/// message is neither, or its work did not start from a mail.
pub async fn mail_of_message(
    pool: &sqlx::PgPool,
    message_id: &str,
) -> Result<Option<uuid::Uuid>, worker_core::Failure> {
    let Ok(id) = message_id.parse::<uuid::Uuid>() else {
        return Ok(None);
    };
    let execution = match job_email_send::story::execution_of(pool, id).await? {
        Some(execution) => execution,
        None => id,
    };
    job_automation_action::story::inbound_mail_of(pool, execution).await
}
