//! Why a `send_email` action sent nothing, as a kind: stored beside the reason's words
//! (`action_executions.skip_kind`), counted per delivery (`worker_messages_total{outcome=
//! "skipped", reason}`) and read back over a window for the host's alert on the reply limit.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use worker_core::Failure;
use worker_store::classify;

/// Why a `send_email` action sent nothing: stored as `action_executions.skip_kind` and counted
/// as the delivery's skip reason (`worker_messages_total{outcome="skipped", reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipKind {
    /// An automatic, bulk or list mail, a bounce, or the host's own (RFC 3834).
    LoopGuard,
    /// More recipients than `recipients_max`.
    RecipientCap,
    /// Every recipient had its replies for the hour.
    ReplyLimit,
}

impl SkipKind {
    /// The stored and counted name: `loop-guard`, `recipient-cap`, `reply-limit`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::LoopGuard => "loop-guard",
            Self::RecipientCap => "recipient-cap",
            Self::ReplyLimit => "reply-limit",
        }
    }
}

/// Executions skipped since `since`, by kind, over every automation (rows skipped before
/// kinds were stored are left out).
pub async fn skips_since(
    pool: &PgPool,
    since: DateTime<Utc>,
) -> Result<BTreeMap<String, u64>, Failure> {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT skip_kind, count(*) FROM action_executions \
         WHERE status = 'skipped' AND finished_at >= $1 AND skip_kind IS NOT NULL \
         GROUP BY skip_kind",
    )
    .bind(since)
    .fetch_all(pool)
    .await
    .map_err(classify)?;
    Ok(rows
        .into_iter()
        .map(|(kind, count)| (kind, u64::try_from(count).unwrap_or_default()))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_has_its_stored_name() {
        let names: Vec<&str> = [
            SkipKind::LoopGuard,
            SkipKind::RecipientCap,
            SkipKind::ReplyLimit,
        ]
        .into_iter()
        .map(SkipKind::as_str)
        .collect();
        // The migration's CHECK allows exactly these.
        assert_eq!(names, ["loop-guard", "recipient-cap", "reply-limit"]);
    }
}
