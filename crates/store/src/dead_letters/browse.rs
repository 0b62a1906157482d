//! Browsing the archive a page at a time, as the console does: dead letters grouped by queue
//! and error fingerprint, the dead letters of a filter newest first, and one dead letter's
//! history. Every query runs in PostgreSQL with a limit, so that no page ever loads
//! thousands of rows; here a filter's `status` of `None` means every state.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgPool, Postgres, QueryBuilder};
use worker_core::Failure;

use super::filter::Filter;
use super::read::{DeadLetterSummary, fetch_summaries, summaries};
use super::row::REPLAYED_FROM_HEADER;
use super::show_one::DeadLetter;
use crate::audit::{self, Entry};
use crate::classify;

/// The most items one page holds.
pub const PAGE_MAX: u32 = 200;

/// One cause in one queue: the dead letters of a queue that share a fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct Group {
    pub queue: String,
    pub fingerprint: String,
    /// The error as normalized: what the fingerprint stands for.
    pub normalized: String,
    /// The reasons among them (usually one).
    pub reasons: Vec<String>,
    /// Dead letters in the group that match the filter, in any state, and per state.
    pub count: i64,
    pub dead: i64,
    pub replayed: i64,
    pub purged: i64,
    /// Settled by an operator's edit (issue 26).
    pub edited: i64,
    /// When the first and the last of them died.
    pub first_seen: DateTime<Utc>,
    pub last_seen: DateTime<Utc>,
    /// The newest one's error, as it was.
    pub sample_error: Option<String>,
    /// The newest one, to open.
    pub latest_id: i64,
}

impl Group {
    /// Where the group stands: `dead` while any of it waits, else `replayed`, `edited` or
    /// `purged` (whichever settled more of it).
    pub fn state(&self) -> &'static str {
        if self.dead > 0 {
            "dead"
        } else if self.replayed >= self.purged && self.replayed >= self.edited {
            "replayed"
        } else if self.edited >= self.purged {
            "edited"
        } else {
            "purged"
        }
    }
}

/// One page of something, and how many there are in all.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Page<T> {
    pub items: Vec<T>,
    /// How many match in all.
    pub total: u64,
    /// Where this page starts (groups), or `None` for keyset pages.
    pub offset: Option<u64>,
    /// The id to pass as `before` for the next page of dead letters, when there is one.
    pub next_before: Option<i64>,
}

fn status_having<'a>(filter: &'a Filter, q: &mut QueryBuilder<'a, Postgres>) {
    if let Some(status) = filter.status {
        q.push(" HAVING count(*) FILTER (WHERE status = ")
            .push_bind(status.as_str())
            .push(") > 0");
    }
}

/// The groups that have dead letters matching `filter` (in `filter.status`, any state when
/// `None`), the most recently seen first, `limit` of them from `offset`.
pub async fn groups(
    pool: &PgPool,
    filter: &Filter,
    offset: u64,
    limit: u32,
) -> Result<Page<Group>, Failure> {
    filter
        .validate()
        .map_err(|e| Failure::permanent("bad-filter", e))?;
    let limit = limit.clamp(1, PAGE_MAX);
    let mut q = QueryBuilder::new(
        "SELECT queue, error_fingerprint AS fingerprint, min(error_normalized) AS normalized, \
                array_agg(DISTINCT reason ORDER BY reason) AS reasons, count(*) AS count, \
                count(*) FILTER (WHERE status = 'dead') AS dead, \
                count(*) FILTER (WHERE status = 'replayed') AS replayed, \
                count(*) FILTER (WHERE status = 'purged') AS purged, \
                count(*) FILTER (WHERE status = 'edited') AS edited, \
                min(died_at) AS first_seen, max(died_at) AS last_seen, \
                (array_agg(last_error ORDER BY id DESC))[1] AS sample_error, \
                max(id) AS latest_id \
         FROM dead_letters WHERE true",
    );
    filter.push_where(&mut q);
    q.push(" GROUP BY queue, error_fingerprint");
    status_having(filter, &mut q);
    q.push(" ORDER BY max(died_at) DESC, queue, error_fingerprint LIMIT ")
        .push_bind(i64::from(limit))
        .push(" OFFSET ")
        .push_bind(i64::try_from(offset).unwrap_or(i64::MAX));
    let items: Vec<Group> = q.build_query_as().fetch_all(pool).await.map_err(classify)?;

    let mut count =
        QueryBuilder::new("SELECT count(*) FROM (SELECT 1 FROM dead_letters WHERE true");
    filter.push_where(&mut count);
    count.push(" GROUP BY queue, error_fingerprint");
    status_having(filter, &mut count);
    count.push(") t");
    let total: i64 = count
        .build_query_scalar()
        .fetch_one(pool)
        .await
        .map_err(classify)?;
    Ok(Page {
        items,
        total: u64::try_from(total).unwrap_or(0),
        offset: Some(offset),
        next_before: None,
    })
}

/// The dead letters matching `filter` (in `filter.status`, any state when `None`), newest
/// first, `limit` of them with an id below `before`.
pub async fn dead_letters(
    pool: &PgPool,
    filter: &Filter,
    before: Option<i64>,
    limit: u32,
) -> Result<Page<DeadLetterSummary>, Failure> {
    filter
        .validate()
        .map_err(|e| Failure::permanent("bad-filter", e))?;
    let limit = limit.clamp(1, PAGE_MAX);
    let mut q = summaries();
    push_status(filter, &mut q);
    filter.push_where(&mut q);
    if let Some(before) = before {
        q.push(" AND id < ").push_bind(before);
    }
    // One more than asked, to know whether there is a next page.
    q.push(" ORDER BY id DESC LIMIT ")
        .push_bind(i64::from(limit) + 1);
    let mut items = fetch_summaries(pool, q).await?;
    let next_before = if items.len() > limit as usize {
        items.truncate(limit as usize);
        items.last().map(|last| last.id)
    } else {
        None
    };

    let mut count = QueryBuilder::new("SELECT count(*) FROM dead_letters WHERE true");
    push_status(filter, &mut count);
    filter.push_where(&mut count);
    let total: i64 = count
        .build_query_scalar()
        .fetch_one(pool)
        .await
        .map_err(classify)?;
    Ok(Page {
        items,
        total: u64::try_from(total).unwrap_or(0),
        offset: None,
        next_before,
    })
}

fn push_status<'a>(filter: &'a Filter, q: &mut QueryBuilder<'a, Postgres>) {
    if let Some(status) = filter.status {
        q.push(" AND status = ").push_bind(status.as_str());
    }
}

/// Another dead letter, as a history names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct Related {
    pub id: i64,
    pub status: String,
    pub reason: String,
    pub died_at: DateTime<Utc>,
}

/// What became of one dead letter: the replay or purge that settled it (who, when), the one
/// it is a replay of, and the replays of it that died again.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct History {
    pub settled_by: Option<Entry>,
    /// The dead letter whose replay this one is (`x-replayed-from`).
    pub replay_of: Option<Related>,
    /// Dead letters that are replays of this one: each came back dead.
    pub replays: Vec<Related>,
}

/// The most replays of one dead letter a history lists.
const REPLAYS_MAX: i64 = 50;

/// [`History`] of `dead`.
pub async fn history(pool: &PgPool, dead: &DeadLetter) -> Result<History, Failure> {
    let settled_by = match dead.action_id {
        Some(id) => audit::get(pool, id).await?,
        None => None,
    };
    let replay_of = match replayed_from(dead) {
        Some(id) => {
            sqlx::query_as("SELECT id, status, reason, died_at FROM dead_letters WHERE id = $1")
                .bind(id)
                .fetch_optional(pool)
                .await
                .map_err(classify)?
        }
        None => None,
    };
    let replays = sqlx::query_as(
        "SELECT id, status, reason, died_at FROM dead_letters \
         WHERE headers ? $1 AND headers ->> $1 = $2 ORDER BY id LIMIT $3",
    )
    .bind(REPLAYED_FROM_HEADER)
    .bind(dead.id.to_string())
    .bind(REPLAYS_MAX)
    .fetch_all(pool)
    .await
    .map_err(classify)?;
    Ok(History {
        settled_by,
        replay_of,
        replays,
    })
}

/// The id in a dead letter's `x-replayed-from` header, when it is a replay.
pub fn replayed_from(dead: &DeadLetter) -> Option<i64> {
    match dead.headers.get(REPLAYED_FROM_HEADER)? {
        serde_json::Value::Number(n) => n.as_i64(),
        serde_json::Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// The W3C trace id of a dead letter (its `traceparent` header), to find its trace.
pub fn trace_id(dead: &DeadLetter) -> Option<String> {
    let traceparent = dead.headers.get("traceparent")?.as_str()?;
    let mut parts = traceparent.split('-');
    let (_version, trace) = (parts.next()?, parts.next()?);
    (trace.len() == 32 && trace.bytes().all(|b| b.is_ascii_hexdigit())).then(|| trace.into())
}

/// A dead letter's error as a chain of causes, outermost first: the parts of the error
/// between `": "`, the way the host writes a failure and its sources.
pub fn error_chain(error: &str) -> Vec<&str> {
    error
        .split(": ")
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(dead: i64, replayed: i64, purged: i64) -> Group {
        Group {
            queue: "email.send".into(),
            fingerprint: "abc".into(),
            normalized: String::new(),
            reasons: vec!["rejected".into()],
            count: dead + replayed + purged,
            dead,
            replayed,
            purged,
            edited: 0,
            first_seen: Utc::now(),
            last_seen: Utc::now(),
            sample_error: None,
            latest_id: 1,
        }
    }

    #[test]
    fn a_group_is_dead_while_any_of_it_waits() {
        assert_eq!(group(1, 5, 0).state(), "dead");
        assert_eq!(group(0, 5, 0).state(), "replayed");
        assert_eq!(group(0, 1, 2).state(), "purged");
        let edited = Group {
            edited: 1,
            ..group(0, 0, 0)
        };
        assert_eq!(edited.state(), "edited");
    }

    #[test]
    fn an_error_reads_as_a_chain_of_causes() {
        assert_eq!(
            error_chain("smtp-5xx: sending to x@y: 550 5.1.1 no such user"),
            vec!["smtp-5xx", "sending to x@y", "550 5.1.1 no such user"]
        );
        assert_eq!(
            error_chain("http://host:8080/x"),
            vec!["http://host:8080/x"]
        );
    }
}
