//! Reading the archive: `dlq list`, `dlq show`, `dlq show ID`, and the numbers behind the
//! dead-letter metrics and alerts. Every result is a plain struct that serializes to the JSON
//! `--json` prints; the host lays the same out as a table.

use std::time::Duration;

use chrono::{DateTime, NaiveDateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::{PgPool, Postgres, QueryBuilder};
use worker_core::Failure;
use worker_store::classify;

/// How many characters of a body `show` previews.
pub const PREVIEW_CHARS: usize = 200;

/// The fingerprints `list` shows per queue.
pub const TOP_FINGERPRINTS: u32 = 5;

/// The rows `show` lists when no `--limit` is given.
pub const DEFAULT_SHOW_LIMIT: u32 = 50;

/// How much of each body a search reads: one huge body must not make every search slow.
pub const SEARCH_BODY_BYTES: i32 = 64 * 1024;

/// The longest text a search takes.
pub const SEARCH_MAX_CHARS: usize = 200;

/// `text` with LIKE's wildcards and escape character taken literally.
fn like_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Where an archived dead letter stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// In the archive, waiting for an operator.
    Dead,
    /// Published again to its queue (kept, never deleted by the replay).
    Replayed,
    /// Given up on by an operator (kept until the retention sweep).
    Purged,
}

impl Status {
    pub const fn as_str(&self) -> &'static str {
        match self {
            Self::Dead => "dead",
            Self::Replayed => "replayed",
            Self::Purged => "purged",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "dead" => Some(Self::Dead),
            "replayed" => Some(Self::Replayed),
            "purged" => Some(Self::Purged),
            _ => None,
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A time as an operator gives it for `since` or `until`, from the command line or the
/// console: RFC 3339, a browser's `datetime-local` value (taken as UTC), or an age before
/// `now` (`2h`, `30m`). The error names the text, not the parameter: each door names its own
/// (`--since`, `since:`).
pub fn parse_time(text: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>, String> {
    if let Ok(at) = DateTime::parse_from_rfc3339(text) {
        return Ok(at.with_timezone(&Utc));
    }
    for format in ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S"] {
        if let Ok(at) = NaiveDateTime::parse_from_str(text, format) {
            return Ok(at.and_utc());
        }
    }
    let age = humantime::parse_duration(text).map_err(|_| {
        format!("`{text}` is neither a time (2026-12-01T10:00:00Z) nor an age like `2h`")
    })?;
    // An age is anything humantime reads, up to hundreds of millennia: past chrono's range,
    // plain subtraction panics.
    TimeDelta::from_std(age)
        .ok()
        .and_then(|age| now.checked_sub_signed(age))
        .ok_or_else(|| format!("`{text}` reaches back further than any time that can be kept"))
}

/// Which dead letters a `show`, `replay` or `purge` is about. Every field narrows; an empty
/// filter is every dead letter.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Filter {
    /// One dead letter by its id (`dlq show ID`, `dlq replay --id ID`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<i64>,
    /// The queue it died in (`outbox` for failed outbox rows).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// `malformed`, `rejected`, `gave-up`, `delivery_limit`, `outbox-failed`, `unknown`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// An error fingerprint, or a prefix of one (at least 4 hex digits).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    /// Died at or after.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<DateTime<Utc>>,
    /// Died before.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub until: Option<DateTime<Utc>>,
    /// Text in the error, the message id or the body (see [`Filter::search`]'s rules in
    /// [`SEARCH_BODY_BYTES`] and [`SEARCH_MAX_CHARS`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub search: Option<String>,
    /// At most this many (oldest first for replay and purge, newest first for show).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// For `show` only: rows in this state (`dead` when not given). Replay and purge only
    /// ever act on dead rows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
}

impl Filter {
    /// Checks what an operator typed; the message names the flag.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(f) = &self.fingerprint
            && (f.len() < 4 || !f.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return Err(format!(
                "--fingerprint {f}: expected at least 4 hex digits of a fingerprint"
            ));
        }
        if self.limit == Some(0) {
            return Err("--limit must be at least 1".into());
        }
        if let Some(text) = &self.search {
            if text.trim().is_empty() {
                return Err("--search: expected some text to look for".into());
            }
            if text.chars().count() > SEARCH_MAX_CHARS {
                return Err(format!(
                    "--search: at most {SEARCH_MAX_CHARS} characters, found {}",
                    text.chars().count()
                ));
            }
        }
        if let (Some(since), Some(until)) = (self.since, self.until)
            && since >= until
        {
            return Err(format!(
                "--since {since} is not before --until {until}: no dead letter can match"
            ));
        }
        Ok(())
    }

    /// Appends ` AND …` for every field but `limit` and `status`.
    pub(crate) fn push_where<'a>(&'a self, q: &mut QueryBuilder<'a, Postgres>) {
        if let Some(id) = self.id {
            q.push(" AND id = ").push_bind(id);
        }
        if let Some(queue) = &self.queue {
            q.push(" AND queue = ").push_bind(queue);
        }
        if let Some(reason) = &self.reason {
            q.push(" AND reason = ").push_bind(reason);
        }
        if let Some(fp) = &self.fingerprint {
            q.push(" AND error_fingerprint LIKE ")
                .push_bind(format!("{}%", fp.to_ascii_lowercase()));
        }
        if let Some(since) = self.since {
            q.push(" AND died_at >= ").push_bind(since);
        }
        if let Some(until) = self.until {
            q.push(" AND died_at < ").push_bind(until);
        }
        if let Some(text) = &self.search {
            // Case-insensitive in the error and in the body's ASCII (escape-encoded, so that a
            // body that is not UTF-8 cannot fail the query); byte for byte in the body for
            // anything else; the message id exactly. Bodies are searched in their first
            // SEARCH_BODY_BYTES only, so that one huge body cannot make a search slow.
            let pattern = format!("%{}%", like_escape(text.trim()));
            q.push(" AND (last_error ILIKE ")
                .push_bind(pattern.clone())
                .push(" OR message_id = ")
                .push_bind(text.trim().to_string())
                .push(" OR encode(substring(body FROM 1 FOR ")
                .push_bind(SEARCH_BODY_BYTES)
                .push("), 'escape') ILIKE ")
                .push_bind(pattern)
                .push(" OR position(convert_to(")
                .push_bind(text.trim().to_string())
                .push(", 'UTF8') IN substring(body FROM 1 FOR ")
                .push_bind(SEARCH_BODY_BYTES)
                .push(")) > 0)");
        }
    }

    /// Whether any field narrows it (an empty filter is every dead letter).
    pub fn narrows(&self) -> bool {
        self.id.is_some()
            || self.queue.is_some()
            || self.reason.is_some()
            || self.fingerprint.is_some()
            || self.since.is_some()
            || self.until.is_some()
            || self.search.is_some()
    }
}

/// One fingerprint of a queue and how many dead letters carry it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, sqlx::FromRow)]
pub struct FingerprintCount {
    pub fingerprint: String,
    pub count: i64,
    /// The error as normalized: what the fingerprint stands for.
    pub normalized: String,
    /// The reasons among them (usually one).
    pub reasons: Vec<String>,
    /// The most recent dead letter with it, for `dlq show ID`.
    pub latest_id: i64,
}

/// One queue of `dlq list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueSummary {
    pub queue: String,
    /// Dead letters waiting (status `dead`).
    pub dead: i64,
    pub replayed: i64,
    pub purged: i64,
    /// When the oldest and newest waiting dead letters died.
    pub oldest: Option<DateTime<Utc>>,
    pub newest: Option<DateTime<Utc>>,
    /// The most frequent fingerprints among the waiting ones, most frequent first.
    pub top_fingerprints: Vec<FingerprintCount>,
}

/// `dlq list`: per queue, the waiting count, oldest, newest and top fingerprints
/// ([`TOP_FINGERPRINTS`] of them). Queues whose dead letters were all replayed or purged are
/// listed with `dead = 0` until the retention sweep removes their rows.
pub async fn list(pool: &PgPool) -> Result<Vec<QueueSummary>, Failure> {
    list_top(pool, TOP_FINGERPRINTS).await
}

/// [`list`] with `top` fingerprints per queue.
pub async fn list_top(pool: &PgPool, top: u32) -> Result<Vec<QueueSummary>, Failure> {
    #[derive(sqlx::FromRow)]
    struct Row {
        queue: String,
        dead: i64,
        replayed: i64,
        purged: i64,
        oldest: Option<DateTime<Utc>>,
        newest: Option<DateTime<Utc>>,
    }
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT queue, \
                count(*) FILTER (WHERE status = 'dead') AS dead, \
                count(*) FILTER (WHERE status = 'replayed') AS replayed, \
                count(*) FILTER (WHERE status = 'purged') AS purged, \
                min(died_at) FILTER (WHERE status = 'dead') AS oldest, \
                max(died_at) FILTER (WHERE status = 'dead') AS newest \
         FROM dead_letters GROUP BY queue ORDER BY queue",
    )
    .fetch_all(pool)
    .await
    .map_err(classify)?;
    #[derive(sqlx::FromRow)]
    struct Top {
        queue: String,
        #[sqlx(flatten)]
        fp: FingerprintCount,
    }
    let tops: Vec<Top> = sqlx::query_as(
        "SELECT queue, fingerprint, count, normalized, reasons, latest_id FROM ( \
             SELECT queue, error_fingerprint AS fingerprint, count(*) AS count, \
                    min(error_normalized) AS normalized, \
                    array_agg(DISTINCT reason ORDER BY reason) AS reasons, \
                    max(id) AS latest_id, \
                    row_number() OVER (PARTITION BY queue ORDER BY count(*) DESC, error_fingerprint) AS rank \
             FROM dead_letters WHERE status = 'dead' \
             GROUP BY queue, error_fingerprint) t \
         WHERE rank <= $1 ORDER BY queue, rank",
    )
    .bind(i64::from(top))
    .fetch_all(pool)
    .await
    .map_err(classify)?;
    let mut out: Vec<QueueSummary> = rows
        .into_iter()
        .map(|r| QueueSummary {
            queue: r.queue,
            dead: r.dead,
            replayed: r.replayed,
            purged: r.purged,
            oldest: r.oldest,
            newest: r.newest,
            top_fingerprints: Vec::new(),
        })
        .collect();
    for top in tops {
        if let Some(q) = out.iter_mut().find(|q| q.queue == top.queue) {
            q.top_fingerprints.push(top.fp);
        }
    }
    Ok(out)
}

/// One line of `dlq show`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct DeadLetterSummary {
    pub id: i64,
    pub queue: String,
    pub source: String,
    pub reason: String,
    pub class: Option<String>,
    pub attempts: Option<i32>,
    pub message_id: Option<String>,
    pub message_type: Option<String>,
    pub error: Option<String>,
    pub fingerprint: String,
    pub died_at: DateTime<Utc>,
    pub archived_at: DateTime<Utc>,
    pub status: String,
    /// The first [`PREVIEW_CHARS`] characters of the body, lossy UTF-8.
    pub body_preview: String,
    /// The whole body's size.
    pub body_bytes: i64,
}

/// `dlq show [filters]`: the matching dead letters, newest first, at most `filter.limit`
/// ([`DEFAULT_SHOW_LIMIT`] when not given), each with a bounded body preview.
pub async fn show(pool: &PgPool, filter: &Filter) -> Result<Vec<DeadLetterSummary>, Failure> {
    filter
        .validate()
        .map_err(|e| Failure::permanent("bad-filter", e))?;
    let mut q = summaries();
    q.push(" AND status = ");
    q.push_bind(filter.status.unwrap_or(Status::Dead).as_str());
    filter.push_where(&mut q);
    q.push(" ORDER BY died_at DESC, id DESC LIMIT ");
    q.push_bind(i64::from(filter.limit.unwrap_or(DEFAULT_SHOW_LIMIT)));
    fetch_summaries(pool, q).await
}

/// `SELECT` of [`DeadLetterSummary`] rows (plus the body's head) `FROM dead_letters WHERE
/// true`: the caller adds its conditions, order and limit, then calls [`fetch_summaries`].
pub(crate) fn summaries<'a>() -> QueryBuilder<'a, Postgres> {
    // Four bytes per character at most: enough bytes for the preview, never the whole body.
    let preview_bytes = i32::try_from(PREVIEW_CHARS * 4).unwrap_or(i32::MAX);
    let mut q = QueryBuilder::new(
        "SELECT id, queue, source, reason, class, attempts, message_id, message_type, \
                last_error AS error, error_fingerprint AS fingerprint, died_at, archived_at, \
                status, '' AS body_preview, octet_length(body)::bigint AS body_bytes, \
                substring(body FROM 1 FOR ",
    );
    q.push_bind(preview_bytes);
    q.push(") AS head FROM dead_letters WHERE true");
    q
}

/// Runs a [`summaries`] query and makes each body's head its preview.
pub(crate) async fn fetch_summaries(
    pool: &PgPool,
    mut q: QueryBuilder<'_, Postgres>,
) -> Result<Vec<DeadLetterSummary>, Failure> {
    #[derive(sqlx::FromRow)]
    struct Row {
        #[sqlx(flatten)]
        summary: DeadLetterSummary,
        head: Vec<u8>,
    }
    let rows: Vec<Row> = q.build_query_as().fetch_all(pool).await.map_err(classify)?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let mut s = r.summary;
            s.body_preview = preview(&r.head, PREVIEW_CHARS);
            let cut = usize::try_from(s.body_bytes).unwrap_or(0) > r.head.len();
            if cut && !s.body_preview.ends_with('…') {
                s.body_preview.push('…');
            }
            s
        })
        .collect())
}

/// The first `chars` characters of `body`, lossy UTF-8, with `…` when cut.
pub fn preview(body: &[u8], chars: usize) -> String {
    let text = String::from_utf8_lossy(body);
    let mut out: String = text.chars().take(chars).collect();
    if text.chars().nth(chars).is_some() {
        out.push('…');
    }
    out
}

/// `dlq show ID`: one dead letter, whole.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeadLetter {
    pub id: i64,
    pub status: String,
    pub source: String,
    pub queue: String,
    pub dead_queue: Option<String>,
    pub exchange: Option<String>,
    pub routing_key: Option<String>,
    pub message_id: Option<String>,
    pub message_type: Option<String>,
    pub reason: String,
    pub class: Option<String>,
    pub attempts: Option<i32>,
    pub last_error: Option<String>,
    pub fingerprint: String,
    pub normalized_error: String,
    pub died_at: DateTime<Utc>,
    pub archived_at: DateTime<Utc>,
    pub replayed_at: Option<DateTime<Utc>>,
    pub purged_at: Option<DateTime<Utc>>,
    /// The replay or purge that settled it.
    pub action_id: Option<i64>,
    pub outbox_id: Option<i64>,
    pub headers: Value,
    pub properties: Value,
    /// The body as text when it is UTF-8.
    pub body_text: Option<String>,
    /// The body in hex when it is not.
    pub body_hex: Option<String>,
    pub body_bytes: usize,
    #[serde(skip)]
    pub body: Vec<u8>,
}

/// `dlq show ID`: the dead letter with every header, its properties and its whole body, in
/// any state; `None` if there is no such id (or the sweep deleted it).
pub async fn show_one(pool: &PgPool, id: i64) -> Result<Option<DeadLetter>, Failure> {
    #[derive(sqlx::FromRow)]
    struct Row {
        id: i64,
        status: String,
        source: String,
        queue: String,
        dead_queue: Option<String>,
        exchange: Option<String>,
        routing_key: Option<String>,
        message_id: Option<String>,
        message_type: Option<String>,
        reason: String,
        class: Option<String>,
        attempts: Option<i32>,
        last_error: Option<String>,
        error_fingerprint: String,
        error_normalized: String,
        died_at: DateTime<Utc>,
        archived_at: DateTime<Utc>,
        replayed_at: Option<DateTime<Utc>>,
        purged_at: Option<DateTime<Utc>>,
        action_id: Option<i64>,
        outbox_id: Option<i64>,
        headers: Value,
        properties: Value,
        body: Vec<u8>,
    }
    let row: Option<Row> = sqlx::query_as(
        "SELECT id, status, source, queue, dead_queue, exchange, routing_key, message_id, \
                message_type, reason, class, attempts, last_error, error_fingerprint, \
                error_normalized, died_at, archived_at, replayed_at, purged_at, action_id, \
                outbox_id, headers, properties, body \
         FROM dead_letters WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(pool)
    .await
    .map_err(classify)?;
    Ok(row.map(|r| {
        let (body_text, body_hex) = match std::str::from_utf8(&r.body) {
            Ok(text) => (Some(text.to_string()), None),
            Err(_) => (None, Some(crate::fingerprint::hex(&r.body))),
        };
        DeadLetter {
            id: r.id,
            status: r.status,
            source: r.source,
            queue: r.queue,
            dead_queue: r.dead_queue,
            exchange: r.exchange,
            routing_key: r.routing_key,
            message_id: r.message_id,
            message_type: r.message_type,
            reason: r.reason,
            class: r.class,
            attempts: r.attempts,
            last_error: r.last_error,
            fingerprint: r.error_fingerprint,
            normalized_error: r.error_normalized,
            died_at: r.died_at,
            archived_at: r.archived_at,
            replayed_at: r.replayed_at,
            purged_at: r.purged_at,
            action_id: r.action_id,
            outbox_id: r.outbox_id,
            headers: r.headers,
            properties: r.properties,
            body_text,
            body_hex,
            body_bytes: r.body.len(),
            body: r.body,
        }
    }))
}

/// Waiting dead letters of one queue, for the depth metric.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, sqlx::FromRow)]
pub struct QueueDepth {
    pub queue: String,
    /// Rows with status `dead`.
    pub dead: i64,
    /// When the oldest of them died.
    pub oldest: Option<DateTime<Utc>>,
}

/// Waiting dead letters per queue (only queues with some).
pub async fn depth_by_queue(pool: &PgPool) -> Result<Vec<QueueDepth>, Failure> {
    sqlx::query_as(
        "SELECT queue, count(*) AS dead, min(died_at) AS oldest \
         FROM dead_letters WHERE status = 'dead' GROUP BY queue ORDER BY queue",
    )
    .fetch_all(pool)
    .await
    .map_err(classify)
}

/// The age of the oldest waiting dead letter, in seconds: one end of the index
/// `dead_letters_dead_by_age`, however many wait. Public so that a test can read its plan.
pub const OLDEST_AGE: &str = "SELECT extract(epoch FROM now() - min(died_at))::float8 \
     FROM dead_letters WHERE status = 'dead'";

/// The age of the oldest waiting dead letter (since it died), by the database's clock;
/// `None` when none waits.
pub async fn oldest_age(pool: &PgPool) -> Result<Option<Duration>, Failure> {
    let secs: Option<f64> = sqlx::query_scalar(OLDEST_AGE)
        .fetch_one(pool)
        .await
        .map_err(classify)?;
    Ok(secs.map(|s| Duration::from_secs_f64(s.max(0.0))))
}

/// Dead letters archived at or after `since` (whatever became of them since): the inflow.
/// Call it with the time of the previous scrape, or `now - 1 minute` for a per-minute rate.
pub async fn inflow_since(pool: &PgPool, since: DateTime<Utc>) -> Result<u64, Failure> {
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM dead_letters WHERE archived_at >= $1")
        .bind(since)
        .fetch_one(pool)
        .await
        .map_err(classify)?;
    Ok(u64::try_from(n).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn previews_are_bounded_and_lossy() {
        assert_eq!(preview(b"short", 200), "short");
        let long = "é".repeat(300);
        let p = preview(long.as_bytes(), 200);
        assert_eq!(p.chars().count(), 201);
        assert!(p.ends_with('…'));
        assert_eq!(preview(&[0xff, b'a'], 200), "\u{FFFD}a");
    }

    #[test]
    fn filters_are_checked() {
        assert!(Filter::default().validate().is_ok());
        let bad = Filter {
            fingerprint: Some("xyz".into()),
            ..Filter::default()
        };
        assert!(bad.validate().unwrap_err().contains("--fingerprint"));
        let zero = Filter {
            limit: Some(0),
            ..Filter::default()
        };
        assert!(zero.validate().is_err());
        let json = serde_json::to_value(Filter {
            queue: Some("q".into()),
            ..Filter::default()
        })
        .unwrap();
        assert_eq!(json, serde_json::json!({"queue": "q"}));
    }

    #[test]
    fn a_search_takes_like_wildcards_literally() {
        assert_eq!(like_escape("50%_off\\now"), "50\\%\\_off\\\\now");
    }

    #[test]
    fn a_search_must_say_something_and_not_too_much() {
        let search = |text: &str| Filter {
            search: Some(text.into()),
            ..Filter::default()
        };
        assert!(search("no such user").validate().is_ok());
        assert!(search("   ").validate().unwrap_err().contains("--search"));
        let long = "x".repeat(SEARCH_MAX_CHARS + 1);
        assert!(search(&long).validate().unwrap_err().contains("at most"));
    }

    #[test]
    fn a_time_window_must_be_open() {
        let at = |s: &str| DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc);
        let window = Filter {
            since: Some(at("2026-12-01T10:00:00Z")),
            until: Some(at("2026-12-01T09:00:00Z")),
            ..Filter::default()
        };
        assert!(window.validate().unwrap_err().contains("not before"));
    }

    #[test]
    fn times_come_as_rfc3339_browser_local_or_an_age() {
        let now = Utc::now();
        let rfc = parse_time("2026-12-01T10:00:00Z", now).unwrap();
        assert_eq!(parse_time("2026-12-01T10:00", now).unwrap(), rfc);
        assert_eq!(parse_time("2026-12-01T10:00:00", now).unwrap(), rfc);
        assert_eq!(
            parse_time("2h", now).unwrap(),
            now - TimeDelta::try_hours(2).unwrap()
        );
        let bad = parse_time("yesterday-ish", now).unwrap_err();
        assert!(bad.contains("`yesterday-ish`"), "{bad}");
    }

    #[test]
    fn an_age_past_the_range_of_time_is_an_error() {
        for age in ["300000y", "265000years", "100000000000000d"] {
            let bad = parse_time(age, Utc::now()).unwrap_err();
            assert!(bad.contains(age), "{bad}");
        }
        // The edge: the earliest time chrono keeps is still an answer.
        let now = DateTime::<Utc>::MIN_UTC + TimeDelta::try_hours(2).unwrap();
        assert_eq!(parse_time("2h", now).unwrap(), DateTime::<Utc>::MIN_UTC);
    }
}
