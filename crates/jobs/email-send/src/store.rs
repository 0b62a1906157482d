//! The `outbound_emails` row's short transactions around a send: the claim (with the
//! guard's look), the record of an accepted mail (with the guard's mark), and the release
//! of a failed try. None is open while the mail is sent.

use std::future::Future;
use std::sync::LazyLock;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;
use worker_core::{Failure, ProcessedGuard as _, RetryPolicy, truncate};
use worker_store::{ProcessedMessages, classify as classify_db};

use crate::{GUARD_SCOPE, JOB_NAME, LAST_ERROR_MAX};

/// The claim's first statement: the row, locked, with the guard's mark read alongside in
/// the same round trip.
static CLAIM_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT status, claimed_by, claimed_at, superseded_by, \
                coalesce(claimed_at < now() - make_interval(secs => $2), true) AS stale, \
                {} AS marked \
         FROM outbound_emails WHERE id = $1 FOR UPDATE",
        ProcessedMessages::marked_sql("$3", "$4")
    )
});

/// The rows of one sender: its pool, the guard, and who its claims say they are.
#[derive(Clone)]
pub(crate) struct EmailStore {
    pub(crate) pool: PgPool,
    pub(crate) guard: ProcessedMessages,
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

/// What the claim found about the row.
#[derive(sqlx::FromRow)]
struct ClaimRow {
    status: String,
    claimed_by: Option<Uuid>,
    claimed_at: Option<DateTime<Utc>>,
    superseded_by: Option<Uuid>,
    stale: bool,
    marked: bool,
}

/// What the first short transaction decided.
pub(crate) enum Claim {
    /// Sent already: the guard is marked or the row is `sent`.
    Duplicate(&'static str),
    /// An operator edited it: the copy named here went out in its place, and this one is
    /// never sent (a replay of its dead letter, a late redelivery: ServicePulse#2424).
    Superseded(Uuid),
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
    /// The first short transaction: reads the row and the guard, and claims the row when it
    /// is ours to send.
    pub(crate) async fn claim(&self, id: Uuid, stale_after: Duration) -> Result<Claim, Failure> {
        let mut tx = self.pool.begin().await.map_err(classify_db)?;
        let found: Option<ClaimRow> = sqlx::query_as(CLAIM_SQL.as_str())
            .bind(id)
            .bind(stale_after.as_secs_f64())
            .bind(GUARD_SCOPE)
            .bind(id.to_string())
            .fetch_optional(&mut *tx)
            .await
            .map_err(classify_db)?;
        let Some(found) = found else {
            return Err(Failure::permanent(
                "unknown-email",
                format!("no outbound email {id}"),
            ));
        };
        if found.marked {
            return Ok(Claim::Duplicate("the guard has seen this email"));
        }
        if found.status == "sent" {
            return Ok(Claim::Duplicate("the email was sent already"));
        }
        if let Some(by) = found.superseded_by {
            return Ok(Claim::Superseded(by));
        }
        let took_over = if found.status == "sending" {
            if !found.stale {
                return Ok(Claim::Busy {
                    owner: found.claimed_by,
                    since: found.claimed_at,
                });
            }
            Some((found.claimed_by, found.claimed_at))
        } else {
            None
        };
        let claimed_at: DateTime<Utc> = sqlx::query_scalar(
            "UPDATE outbound_emails SET status = 'sending', claimed_by = $2, claimed_at = now(), \
                 updated_at = now() \
             WHERE id = $1 RETURNING claimed_at",
        )
        .bind(id)
        .bind(self.instance)
        .fetch_one(&mut *tx)
        .await
        .map_err(classify_db)?;
        let email: Email = sqlx::query_as(
            "SELECT message_id, from_address, to_addresses, cc_addresses, subject, text_body, \
                    html_body, in_reply_to, reference_ids \
             FROM outbound_emails WHERE id = $1",
        )
        .bind(id)
        .fetch_one(&mut *tx)
        .await
        .map_err(classify_db)?;
        tx.commit().await.map_err(classify_db)?;
        Ok(Claim::Mine {
            email: Box::new(email),
            claimed_at,
            took_over,
        })
    }

    /// The second short transaction after an accepted mail: the row `sent` with the server's
    /// answer and the guard's mark, together. Retried on any database error for the record
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
                let mut tx = self.pool.begin().await.map_err(classify_db)?;
                // Whoever holds the claim now, the server took this mail: the row is `sent`.
                let ours: Option<bool> = sqlx::query_scalar(
                    "SELECT coalesce(claimed_by = $2 AND claimed_at = $3, false) \
                     FROM outbound_emails WHERE id = $1 FOR UPDATE",
                )
                .bind(id)
                .bind(self.instance)
                .bind(claimed_at)
                .fetch_optional(&mut *tx)
                .await
                .map_err(classify_db)?;
                sqlx::query(
                    "UPDATE outbound_emails SET status = 'sent', attempts = attempts + 1, \
                         smtp_response = $2, last_error = NULL, sent_at = now(), \
                         claimed_by = NULL, claimed_at = NULL, updated_at = now() \
                     WHERE id = $1",
                )
                .bind(id)
                .bind(truncate(answer, LAST_ERROR_MAX))
                .execute(&mut *tx)
                .await
                .map_err(classify_db)?;
                self.guard
                    .try_mark_processed(&mut tx, GUARD_SCOPE, &id.to_string())
                    .await?;
                tx.commit().await.map_err(classify_db)?;
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
    /// for an unknown outcome, back to `queued` otherwise; counts the try and keeps the
    /// error. Retried like the record; if it cannot be written the claim goes stale.
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
                    "UPDATE outbound_emails SET status = $3, attempts = attempts + 1, \
                         last_error = $4, claimed_by = NULL, claimed_at = NULL, updated_at = now() \
                     WHERE id = $1 AND status = 'sending' AND claimed_by = $2 AND claimed_at = $5",
                )
                .bind(id)
                .bind(self.instance)
                .bind(status)
                .bind(truncate(&error, LAST_ERROR_MAX))
                .bind(claimed_at)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_keeps_whole_characters() {
        assert_eq!(truncate("aé", 2), "a");
        assert_eq!(truncate("abc", 5), "abc");
    }
}
