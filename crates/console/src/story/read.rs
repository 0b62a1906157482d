//! Gathering a mail's parts from the tables' owners.

use std::collections::BTreeSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use job_automation_action::story::ExecutionRecord;
use job_email_send::story::OutboundRecord;
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
    let mut parts = read_parts_of(pool, std::slice::from_ref(mail)).await?;
    Ok(parts.pop().unwrap_or_default())
}

/// The parts of each of `mails`' stories, in their order: the same reads as one story's, each
/// over the whole page at once, so a page of a search costs a handful of statements.
pub async fn read_parts_of(pool: &PgPool, mails: &[StoredMail]) -> Result<Vec<Parts>, Failure> {
    let events: Vec<_> = mails.iter().filter_map(StoredMail::event).collect();
    let event_ids: Vec<Uuid> = events.iter().map(|e| e.id).collect();
    let verdicts = job_automation_trigger::story::verdicts_of(pool, &events).await?;
    let executions = job_automation_action::story::executions(pool, &event_ids).await?;
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
    let hops: Vec<String> = event_ids
        .iter()
        .map(Uuid::to_string)
        .chain(execution_keys.iter().cloned())
        .chain(outbound_keys.iter().cloned())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let publications = worker_store::outbox::publications(pool, &hops).await?;
    let command_keys: Vec<String> = execution_keys.into_iter().chain(outbound_keys).collect();
    let dead_letters = worker_store::dead_letters::of_messages(pool, &command_keys).await?;
    let outbound_ids: Vec<Uuid> = outbound.iter().map(|o| o.id).collect();
    let bounces = job_inbound_email_poller::bounce::story::bounces_of(pool, &outbound_ids).await?;
    let mail_ids: Vec<Uuid> = mails.iter().map(|m| m.id).collect();
    let reported = job_inbound_email_poller::bounce::story::reported_by(pool, &mail_ids).await?;
    let mut verdicts = verdicts.into_iter();
    Ok(mails
        .iter()
        .map(|mail| {
            let Some(event_id) = mail.event_id else {
                return Parts {
                    reported: reported
                        .iter()
                        .filter(|b| b.inbound_email_id == mail.id)
                        .cloned()
                        .collect(),
                    ..Parts::default()
                };
            };
            let executions: Vec<_> = executions
                .iter()
                .filter(|x| x.event_id == event_id)
                .cloned()
                .collect();
            let outbound = answers(&outbound, &executions);
            let keys: BTreeSet<String> = executions
                .iter()
                .map(|x| x.id.to_string())
                .chain(outbound.iter().map(|o| o.id.to_string()))
                .collect();
            let event_key = event_id.to_string();
            Parts {
                publications: publications
                    .iter()
                    .filter(|p| p.message_id == event_key || keys.contains(&p.message_id))
                    .cloned()
                    .collect(),
                verdicts: verdicts.next().unwrap_or_default(),
                attempts: attempts
                    .iter()
                    .filter(|a| a.message_id.as_ref().is_some_and(|m| keys.contains(m)))
                    .cloned()
                    .collect(),
                dead_letters: dead_letters
                    .iter()
                    .filter(|d| d.message_id.as_ref().is_some_and(|m| keys.contains(m)))
                    .cloned()
                    .collect(),
                bounces: bounces
                    .iter()
                    .filter(|b| outbound.iter().any(|o| b.outbound_email_id == Some(o.id)))
                    .cloned()
                    .collect(),
                reported: Vec::new(),
                executions,
                outbound,
            }
        })
        .collect())
}

/// The outbound mails queued by `executions`, and the copies operators edited them into.
fn answers(all: &[OutboundRecord], executions: &[ExecutionRecord]) -> Vec<OutboundRecord> {
    let mut mine: Vec<OutboundRecord> = all
        .iter()
        .filter(|o| {
            o.action_execution_id
                .is_some_and(|x| executions.iter().any(|e| e.id == x))
        })
        .cloned()
        .collect();
    // Copies name the mail they supersede; follow each edit from the mails found so far.
    let mut from = 0;
    while from < mine.len() {
        let edited: Vec<OutboundRecord> = all
            .iter()
            .filter(|o| {
                o.supersedes
                    .is_some_and(|s| mine[from..].iter().any(|m| m.id == s))
            })
            .cloned()
            .collect();
        from = mine.len();
        mine.extend(edited);
    }
    mine.sort_by_key(|o| o.created_at);
    mine
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

    fn outbound(id: u128, execution: Option<u128>, supersedes: Option<u128>) -> OutboundRecord {
        let at = Utc::now() + chrono::Duration::milliseconds(i64::try_from(id).unwrap());
        OutboundRecord {
            id: Uuid::from_u128(id),
            action_execution_id: execution.map(Uuid::from_u128),
            message_id: format!("{id}@worker-host"),
            to_addresses: vec!["ann@example.com".into()],
            cc_addresses: vec![],
            subject: "Re: ping".into(),
            status: "sent".into(),
            attempts: 1,
            last_error: None,
            smtp_response: None,
            created_at: at,
            updated_at: at,
            sent_at: None,
            expires_at: None,
            supersedes: supersedes.map(Uuid::from_u128),
            superseded_by: None,
        }
    }

    fn execution(id: u128) -> ExecutionRecord {
        ExecutionRecord {
            id: Uuid::from_u128(id),
            event_id: Uuid::from_u128(900),
            automation_id: Uuid::from_u128(901),
            action_index: 0,
            action_type: Some("send_email".into()),
            status: "succeeded".into(),
            skip_kind: None,
            skip_reason: None,
            attempts: 1,
            last_error: None,
            created_at: Utc::now(),
            finished_at: None,
        }
    }

    #[test]
    fn a_mails_answers_are_its_executions_mails_and_their_edited_copies() {
        // 1 queued by execution 10, edited into 2, edited again into 3; 4 is another mail's.
        let all = [
            outbound(3, None, Some(2)),
            outbound(1, Some(10), None),
            outbound(4, Some(11), None),
            outbound(2, None, Some(1)),
        ];
        let mine: Vec<Uuid> = answers(&all, &[execution(10)])
            .iter()
            .map(|o| o.id)
            .collect();
        assert_eq!(mine, [1, 2, 3].map(Uuid::from_u128));
    }

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
