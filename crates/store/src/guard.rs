use std::sync::LazyLock;
use std::time::Duration;

use sqlx::{PgConnection, PgPool, Postgres};
use worker_core::{Failure, ProcessedGuard};

use crate::classify;

/// [`ProcessedMessages::is_marked`]'s statement, built once from the one text of the look.
static IS_MARKED: LazyLock<String> =
    LazyLock::new(|| format!("SELECT {}", ProcessedMessages::marked_sql("$1", "$2")));

/// The one shared processed-message guard, on the `processed_messages` table.
///
/// A mark is written inside the caller's transaction, so that it commits together with the
/// effect it guards, or not at all. Marks are taken through core's
/// [`ProcessedGuard`]; looking without marking is this type's own ([`Self::is_marked`],
/// [`Self::marked_sql`]), since the trait only marks.
#[derive(Debug, Clone, Default)]
pub struct ProcessedMessages;

impl ProcessedMessages {
    pub fn new() -> Self {
        Self
    }

    /// The SQL expression that is true when `(scope, id)` is marked, over the statement's
    /// placeholders `scope` and `id` (`"$3"`, `"$4"`): for a caller that reads the mark in the
    /// statement that locks the row it guards, so that the look costs no round trip of its own.
    pub fn marked_sql(scope: &str, id: &str) -> String {
        format!("EXISTS (SELECT 1 FROM processed_messages WHERE scope = {scope} AND id = {id})")
    }

    /// The statement that marks `(scope, id)`, over the statement's placeholders, `RETURNING
    /// true` when it made the mark and no row when the mark was there already: for a caller
    /// that writes the mark in a CTE of the statement that writes the effect it guards, so
    /// that the two commit together at the cost of one round trip.
    pub fn mark_sql(scope: &str, id: &str) -> String {
        format!(
            "INSERT INTO processed_messages (scope, id) VALUES ({scope}, {id}) \
             ON CONFLICT DO NOTHING RETURNING true"
        )
    }

    /// Whether `id` in `scope` is marked, read inside `tx`. Only a look: a caller that marks
    /// with its effect later looks first to skip the work a duplicate would do.
    pub async fn is_marked(
        &self,
        tx: &mut PgConnection,
        scope: &str,
        id: &str,
    ) -> Result<bool, Failure> {
        sqlx::query_scalar(IS_MARKED.as_str())
            .bind(scope)
            .bind(id)
            .fetch_one(tx)
            .await
            .map_err(classify)
    }

    /// Marks `id` in `scope` as processed inside `tx`; `true` when this call made the mark,
    /// `false` when it was already there (a duplicate).
    pub async fn mark(
        &self,
        tx: &mut sqlx::PgConnection,
        scope: &str,
        id: &str,
    ) -> Result<bool, Failure> {
        let done = sqlx::query(
            "INSERT INTO processed_messages (scope, id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        )
        .bind(scope)
        .bind(id)
        .execute(tx)
        .await
        .map_err(classify)?;
        Ok(done.rows_affected() == 1)
    }

    /// Marks many ids in one statement, for a consumer whose only write is the mark.
    /// Returns, in input order, whether each id was new. An id repeated within `ids` is new
    /// only at its first position.
    pub async fn mark_many(
        &self,
        tx: &mut sqlx::PgConnection,
        scope: &str,
        ids: &[String],
    ) -> Result<Vec<bool>, Failure> {
        let inserted: Vec<String> = sqlx::query_scalar(
            "INSERT INTO processed_messages (scope, id) SELECT $1, unnest($2::text[]) ON CONFLICT DO NOTHING RETURNING id",
        )
        .bind(scope)
        .bind(ids)
        .fetch_all(tx)
        .await
        .map_err(classify)?;
        let mut fresh: std::collections::HashSet<String> = inserted.into_iter().collect();
        Ok(ids.iter().map(|id| fresh.remove(id)).collect())
    }

    /// Deletes at most `batch` marks older than `retention`, oldest first, in one statement;
    /// returns how many went. The retention must outlast every retry tier and any replay of a
    /// dead letter. The retention job calls this in bounded batches.
    pub async fn sweep_batch(
        &self,
        pool: &PgPool,
        retention: Duration,
        batch: u32,
    ) -> Result<u64, Failure> {
        let done = sqlx::query(
            "DELETE FROM processed_messages WHERE (scope, id) IN ( \
                 SELECT scope, id FROM processed_messages \
                 WHERE processed_at < now() - make_interval(secs => $1) \
                 ORDER BY processed_at LIMIT $2)",
        )
        .bind(retention.as_secs_f64())
        .bind(i64::from(batch.max(1)))
        .execute(pool)
        .await
        .map_err(classify)?;
        Ok(done.rows_affected())
    }

    /// Deletes every mark older than `retention` in one statement; returns how many went.
    /// For tests and one-off maintenance: the host sweeps with [`sweep_batch`](Self::sweep_batch).
    pub async fn sweep(&self, pool: &PgPool, retention: Duration) -> Result<u64, Failure> {
        let seconds = retention.as_secs_f64();
        let done = sqlx::query(
            "DELETE FROM processed_messages WHERE processed_at < now() - make_interval(secs => $1)",
        )
        .bind(seconds)
        .execute(pool)
        .await
        .map_err(classify)?;
        Ok(done.rows_affected())
    }
}

impl ProcessedGuard for ProcessedMessages {
    type Tx = sqlx::Transaction<'static, Postgres>;

    async fn try_mark_processed(
        &self,
        tx: &mut Self::Tx,
        scope: &str,
        id: &str,
    ) -> Result<bool, Failure> {
        self.mark(tx, scope, id).await
    }
}
