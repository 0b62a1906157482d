//! Gathering a mail's parts from the tables' owners.

use std::collections::BTreeSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use job_inbound_email_poller::story::StoredMail;
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;
use worker_core::Failure;

use super::parts::Parts;
use super::state::EndState;
use super::timeline::{Step, timeline};

/// How long the tables a story reads keep their rows, to say when a story is incomplete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub attempt_log: Duration,
    pub publications: Duration,
}

/// One mail's story.
#[derive(Debug, Clone, Serialize)]
pub struct Story {
    pub mail: StoredMail,
    pub end: EndState,
    pub steps: Vec<Step>,
    #[serde(flatten)]
    pub parts: Parts,
    /// What may be missing because it is past its table's retention.
    pub incomplete: Vec<String>,
}

/// The story of the stored inbound mail `id`, or `None` when there is no such mail.
pub async fn read_story(
    pool: &PgPool,
    id: Uuid,
    retention: Retention,
) -> Result<Option<Story>, Failure> {
    let Some(mail) = job_inbound_email_poller::story::stored_mail(pool, id).await? else {
        return Ok(None);
    };
    let parts = read_parts(pool, &mail).await?;
    let end = EndState::of(&mail, &parts);
    let steps = timeline(&mail, &parts);
    let incomplete = incomplete(mail.received_at, Utc::now(), retention);
    Ok(Some(Story {
        mail,
        end,
        steps,
        parts,
        incomplete,
    }))
}

/// The parts of `mail`'s story.
pub async fn read_parts(pool: &PgPool, mail: &StoredMail) -> Result<Parts, Failure> {
    let Some(event) = mail.event() else {
        return Ok(Parts::default());
    };
    let verdicts = job_automation_trigger::story::verdicts(pool, &event).await?;
    let executions = job_automation_action::story::executions(pool, &[event.id]).await?;
    let execution_ids: Vec<Uuid> = executions.iter().map(|x| x.id).collect();
    let outbound = job_email_send::story::outbound_of(pool, &execution_ids).await?;
    let execution_keys: Vec<String> = execution_ids.iter().map(Uuid::to_string).collect();
    let outbound_keys: Vec<String> = outbound.iter().map(|o| o.id.to_string()).collect();
    let mut attempts = worker_store::attempt_log::for_messages(
        pool,
        job_automation_action::JOB_NAME,
        &execution_keys,
    )
    .await?;
    attempts.extend(
        worker_store::attempt_log::for_messages(pool, job_email_send::JOB_NAME, &outbound_keys)
            .await?,
    );
    attempts.sort_by_key(|a| a.at);
    let hops: Vec<String> = std::iter::once(event.id.to_string())
        .chain(execution_keys.iter().cloned())
        .chain(outbound_keys.iter().cloned())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let publications = worker_store::outbox::publications(pool, &hops).await?;
    let command_keys: Vec<String> = execution_keys.into_iter().chain(outbound_keys).collect();
    let dead_letters = worker_store::dead_letters::of_messages(pool, &command_keys).await?;
    Ok(Parts {
        publications,
        verdicts,
        executions,
        outbound,
        attempts,
        dead_letters,
    })
}

/// The notes for a mail received at `received` whose older parts may be gone by `now`.
fn incomplete(received: DateTime<Utc>, now: DateTime<Utc>, retention: Retention) -> Vec<String> {
    let age = (now - received).to_std().unwrap_or_default();
    let mut notes = Vec::new();
    for (what, kept, key) in [
        (
            "failed tries and their errors",
            retention.attempt_log,
            "jobs.retention.attempt_log",
        ),
        (
            "publish times and trace ids",
            retention.publications,
            "jobs.retention.publications",
        ),
    ] {
        if age > kept {
            notes.push(format!(
                "{what} older than {} are no longer kept ({key}): this story may miss some",
                humantime::format_duration(kept)
            ));
        }
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_story_older_than_a_tables_retention_says_what_it_may_miss() {
        let retention = Retention {
            attempt_log: Duration::from_secs(14 * 86400),
            publications: Duration::from_secs(30 * 86400),
        };
        let now = Utc::now();
        assert!(incomplete(now - chrono::Duration::days(3), now, retention).is_empty());
        let notes = incomplete(now - chrono::Duration::days(20), now, retention);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].contains("jobs.retention.attempt_log"), "{notes:?}");
    }
}
