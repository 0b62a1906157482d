//! Which dead letters a reading, a replay or a purge is about: the [`Filter`] an operator
//! gives (from the command line or the console), checked, and its SQL conditions.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{Postgres, QueryBuilder};

use super::row::Status;

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
    pub fn push_where<'a>(&'a self, q: &mut QueryBuilder<'a, Postgres>) {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
