//! The `outbound_emails` row's short transactions around a send: the claim (with the
//! guard's look), the record of an accepted mail (with the guard's mark), and the release
//! of a failed try. None is open while the mail is sent.

use std::future::Future;
use std::sync::LazyLock;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;
use worker_core::{Failure, RetryPolicy, truncate};
use worker_store::{ProcessedMessages, classify as classify_db};

use crate::{GUARD_SCOPE, JOB_NAME, LAST_ERROR_MAX};

/// The claim, one statement: the row locked, with the guard's mark read alongside, and
/// claimed when it is ours to send (neither marked, sent, expired nor superseded, and not under
/// a fresh claim of another try: [`ClaimRow::decide`] reads the same facts). A row past its
/// limit (`expires_at`, else `created_at` + `$6`, the job's `max_age`; no limit when both are
/// null) is recorded `expired` instead of claimed, with the limit it passed kept in
/// `expires_at` and named in `last_error` (`jobs.email_send.max_age`, or `the max_age of its automation`: a
/// row's own `expires_at` is written from its automation's `max_age`). The mail's columns come back with the claim, so the claim costs one round
/// trip and commits on its own.
static CLAIM_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH found AS ( \
             SELECT id, status, claimed_by, claimed_at, superseded_by, \
                    coalesce(claimed_at < now() - make_interval(secs => $2), true) AS stale, \
                    coalesce(coalesce(expires_at, created_at + make_interval(secs => $6)) \
                        < now(), false) AS expired, \
                    extract(epoch FROM now() - created_at)::float8 AS age_secs, \
                    extract(epoch FROM coalesce(expires_at - created_at, \
                        make_interval(secs => $6)))::float8 AS limit_secs, \
                    {marked} AS marked \
             FROM outbound_emails WHERE id = $1 FOR UPDATE), \
         claimed AS ( \
             UPDATE outbound_emails AS o SET \
                 status = CASE WHEN f.expired THEN 'expired' ELSE 'sending' END, \
                 claimed_by = CASE WHEN f.expired THEN NULL ELSE $5 END, \
                 claimed_at = CASE WHEN f.expired THEN NULL ELSE now() END, \
                 expires_at = CASE WHEN f.expired \
                     THEN coalesce(o.expires_at, o.created_at + make_interval(secs => $6)) \
                     ELSE o.expires_at END, \
                 last_error = CASE WHEN NOT f.expired THEN o.last_error \
                     WHEN o.expires_at IS NULL THEN 'jobs.email_send.max_age' \
                     ELSE 'the max_age of its automation' END, \
                 updated_at = now() \
             FROM found AS f \
             WHERE o.id = f.id AND NOT f.marked AND f.status NOT IN ('sent', 'expired', 'bounced') \
               AND f.superseded_by IS NULL AND (f.status <> 'sending' OR f.stale) \
             RETURNING o.claimed_at AS now_claimed_at, o.message_id, o.from_address, \
                 o.to_addresses, o.cc_addresses, o.subject, o.text_body, o.html_body, \
                 o.in_reply_to, o.reference_ids) \
         SELECT f.status, f.claimed_by, f.claimed_at, f.superseded_by, f.stale, f.marked, \
                f.expired, f.age_secs, f.limit_secs, c.* \
         FROM found AS f LEFT JOIN claimed AS c ON true",
        marked = ProcessedMessages::marked_sql("$3", "$4")
    )
});

/// The record of an accepted mail, one statement: the row locked and `sent`, whether the
/// claim was still ours, and the guard's mark (written even when the row is gone: the server
/// took the mail).
static RECORD_SENT_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH found AS ( \
             SELECT id, coalesce(claimed_by = $2 AND claimed_at = $3, false) AS ours \
             FROM outbound_emails WHERE id = $1 FOR UPDATE), \
         sent AS ( \
             UPDATE outbound_emails AS o SET status = 'sent', attempts = o.attempts + 1, \
                 smtp_response = $4, last_error = NULL, sent_at = now(), \
                 claimed_by = NULL, claimed_at = NULL, updated_at = now() \
             FROM found AS f WHERE o.id = f.id), \
         mark AS ({mark}) \
         SELECT ours FROM found",
        mark = ProcessedMessages::mark_sql("$5", "$6")
    )
});

/// The rows of one sender: its pool, and who its claims say they are.
#[derive(Clone)]
pub(crate) struct EmailStore {
    pub(crate) pool: PgPool,
    /// This process's claim owner, written in `claimed_by`.
    pub(crate) instance: Uuid,
    /// How long recording an outcome is retried on database errors.
    pub(crate) record_budget: Duration,
}

/// The row, as claimed.
#[derive(sqlx::FromRow)]
pub(crate) struct Email {
    pub(crate) message_id: String,
    pub(crate) from_address: Option<String>,
    pub(crate) to_addresses: Vec<String>,
    pub(crate) cc_addresses: Vec<String>,
    pub(crate) subject: String,
    pub(crate) text_body: Option<String>,
    pub(crate) html_body: Option<String>,
    pub(crate) in_reply_to: Option<String>,
    pub(crate) reference_ids: Vec<String>,
}

/// What the claim found about the row, and the mail when it claimed it.
#[derive(sqlx::FromRow)]
struct ClaimRow {
    status: String,
    claimed_by: Option<Uuid>,
    claimed_at: Option<DateTime<Utc>>,
    superseded_by: Option<Uuid>,
    stale: bool,
    marked: bool,
    /// Past its limit: recorded `expired` by the statement when it was claimable.
    expired: bool,
    /// Seconds since the row was queued.
    age_secs: f64,
    /// The row's limit in seconds, when it has one.
    limit_secs: Option<f64>,
    /// Set when the statement claimed the row.
    now_claimed_at: Option<DateTime<Utc>>,
    #[sqlx(flatten)]
    email: ClaimedEmail,
}

/// The mail's columns, all null unless the statement claimed the row.
#[derive(sqlx::FromRow)]
struct ClaimedEmail {
    message_id: Option<String>,
    from_address: Option<String>,
    to_addresses: Option<Vec<String>>,
    cc_addresses: Option<Vec<String>>,
    subject: Option<String>,
    text_body: Option<String>,
    html_body: Option<String>,
    in_reply_to: Option<String>,
    reference_ids: Option<Vec<String>>,
}

impl ClaimedEmail {
    /// The mail, when the statement returned it (`message_id` is `NOT NULL` in the table).
    fn into_email(self) -> Option<Email> {
        Some(Email {
            message_id: self.message_id?,
            from_address: self.from_address,
            to_addresses: self.to_addresses.unwrap_or_default(),
            cc_addresses: self.cc_addresses.unwrap_or_default(),
            subject: self.subject.unwrap_or_default(),
            text_body: self.text_body,
            html_body: self.html_body,
            in_reply_to: self.in_reply_to,
            reference_ids: self.reference_ids.unwrap_or_default(),
        })
    }
}

impl ClaimRow {
    /// What the claim means, by the same rules as the statement's: a row the statement
    /// claimed is [`Claim::Mine`].
    fn decide(self) -> Result<Claim, Failure> {
        if self.marked {
            return Ok(Claim::Duplicate("the guard has seen this email"));
        }
        if self.status == "sent" {
            return Ok(Claim::Duplicate("the email was sent already"));
        }
        if self.status == "expired" {
            return Ok(Claim::Duplicate("the email expired already"));
        }
        if let Some(by) = self.superseded_by {
            return Ok(Claim::Superseded(by));
        }
        if self.status == "sending" && !self.stale {
            return Ok(Claim::Busy {
                owner: self.claimed_by,
                since: self.claimed_at,
            });
        }
        if self.expired {
            return Ok(Claim::Expired {
                age: seconds(self.age_secs),
                limit: self.limit_secs.map(seconds),
            });
        }
        let took_over = (self.status == "sending").then_some((self.claimed_by, self.claimed_at));
        match (self.now_claimed_at, self.email.into_email()) {
            (Some(claimed_at), Some(email)) => Ok(Claim::Mine {
                email: Box::new(email),
                claimed_at,
                took_over,
            }),
            // The statement's rules and these disagree: a defect, not the row's fault.
            _ => Err(Failure::transient(
                "the claim's statement did not claim a row its rules say is claimable",
            )),
        }
    }
}

/// What the first short transaction decided.
pub(crate) enum Claim {
    /// Sent already: the guard is marked or the row is `sent`.
    Duplicate(&'static str),
    /// An operator edited it: the copy named here went out in its place, and this one is
    /// never sent (a replay of its dead letter, a late redelivery: ServicePulse#2424).
    Superseded(Uuid),
    /// Past its limit when its turn came: recorded `expired`, never to be sent. `age` is how
    /// long ago it was queued, `limit` the age it passed.
    Expired {
        age: Duration,
        limit: Option<Duration>,
    },
    /// Another try holds a fresh claim.
    Busy {
        owner: Option<Uuid>,
        since: Option<DateTime<Utc>>,
    },
    /// Ours to send, claimed at this time; `took_over` names a stale claim we replaced.
    Mine {
        email: Box<Email>,
        claimed_at: DateTime<Utc>,
        took_over: Option<(Option<Uuid>, Option<DateTime<Utc>>)>,
    },
}

impl EmailStore {
    /// The first short transaction, one statement: reads the row and the guard, and claims
    /// the row when it is ours to send.
    pub(crate) async fn claim(
        &self,
        id: Uuid,
        stale_after: Duration,
        max_age: Option<Duration>,
    ) -> Result<Claim, Failure> {
        let found: Option<ClaimRow> = sqlx::query_as(CLAIM_SQL.as_str())
            .bind(id)
            .bind(stale_after.as_secs_f64())
            .bind(GUARD_SCOPE)
            .bind(id.to_string())
            .bind(self.instance)
            .bind(max_age.map(|age| age.as_secs_f64()))
            .fetch_optional(&self.pool)
            .await
            .map_err(classify_db)?;
        match found {
            Some(found) => found.decide(),
            None => Err(Failure::permanent(
                "unknown-email",
                format!("no outbound email {id}"),
            )),
        }
    }

    /// The second short transaction after an accepted mail, one statement: the row `sent`
    /// with the server's answer and the guard's mark, together. Retried on any database error for the record
    /// budget: a mail the server accepted is never recorded `failed`. If it still cannot be
    /// recorded, the row stays `sending` and its claim goes stale.
    pub(crate) async fn record_sent(
        &self,
        id: Uuid,
        claimed_at: DateTime<Utc>,
        answer: &str,
    ) -> Result<(), Failure> {
        let recorded = self
            .with_db_retries("recording the sent mail", || async {
                // Whoever holds the claim now, the server took this mail: the row is `sent`.
                let ours: Option<bool> = sqlx::query_scalar(RECORD_SENT_SQL.as_str())
                    .bind(id)
                    .bind(self.instance)
                    .bind(claimed_at)
                    .bind(truncate(answer, LAST_ERROR_MAX))
                    .bind(GUARD_SCOPE)
                    .bind(id.to_string())
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(classify_db)?;
                Ok(ours)
            })
            .await;
        match recorded {
            Ok(Some(true)) => Ok(()),
            Ok(Some(false)) => {
                tracing::warn!(
                    "our claim had been taken over before the sent mail was recorded: the mail may go out twice"
                );
                Ok(())
            }
            Ok(None) => {
                tracing::warn!("the outbound email row is gone; the guard is marked");
                Ok(())
            }
            Err(failure) => {
                tracing::error!(
                    error = %failure,
                    smtp_response = %answer,
                    "the server accepted the mail but recording it failed: the row stays `sending`, and a try after its claim goes stale sends it again"
                );
                Err(Failure::transient(format!(
                    "the SMTP server accepted the mail ({answer}) but recording it failed for {}: {}",
                    humantime::format_duration(self.record_budget),
                    failure.detail()
                )))
            }
        }
    }

    /// Releases our claim after a failed try: `failed` for a permanent failure, `unknown`
    /// for an unknown outcome, back to `queued` otherwise; counts the try (not when the relay
    /// was out of service) and keeps the error. Retried like the record; if it cannot be written the claim goes stale.
    pub(crate) async fn release(&self, id: Uuid, claimed_at: DateTime<Utc>, failure: &Failure) {
        let status = if failure.is_unknown() {
            "unknown"
        } else if failure.is_permanent() {
            "failed"
        } else {
            "queued"
        };
        // A 5xx keeps the server's answer as is; anything else keeps the whole failure.
        let error = if failure.reason() == "smtp-5xx" {
            failure.detail().to_string()
        } else {
            failure.to_string()
        };
        let released = self
            .with_db_retries("releasing the claim", || async {
                sqlx::query(
                    "UPDATE outbound_emails SET status = $3, attempts = attempts + $6, \
                         last_error = $4, claimed_by = NULL, claimed_at = NULL, updated_at = now() \
                     WHERE id = $1 AND status = 'sending' AND claimed_by = $2 AND claimed_at = $5",
                )
                .bind(id)
                .bind(self.instance)
                .bind(status)
                .bind(truncate(&error, LAST_ERROR_MAX))
                .bind(claimed_at)
                // A reply its relay was out of service for was not tried.
                .bind(i32::from(!failure.is_unavailable()))
                .execute(&self.pool)
                .await
                .map_err(classify_db)
            })
            .await;
        match released {
            Ok(done) if done.rows_affected() == 1 => {}
            Ok(_) => tracing::warn!("the claim was taken over before the failed try was recorded"),
            Err(err) => tracing::warn!(
                error = %err,
                "could not record the failed try: the claim stays until it goes stale"
            ),
        }
    }

    /// Runs `op` until it succeeds or the record budget is spent ([`worker_core::persist`]):
    /// every database error is retried, whatever its class, since the outcome it records is
    /// already decided.
    async fn with_db_retries<T, F, Fut>(&self, what: &str, op: F) -> Result<T, Failure>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Failure>> + Send,
        T: Send,
    {
        let backoff = RetryPolicy {
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(2),
            ..RetryPolicy::default()
        };
        worker_core::persist(JOB_NAME, self.record_budget, &backoff, op)
            .await
            .map_err(|failure| failure.context(what))
    }
}

/// Whole seconds, never negative (a clock that stepped back makes no negative age).
fn seconds(secs: f64) -> Duration {
    Duration::try_from_secs_f64(secs.max(0.0).round()).unwrap_or(Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_keeps_whole_characters() {
        assert_eq!(truncate("aé", 2), "a");
        assert_eq!(truncate("abc", 5), "abc");
    }
}
