//! How a dead letter of an outbox row is keyed, and which of them a replay must pass over.

/// The archive key of an outbox row's failure: `outbox:<id>` for the first, then
/// `outbox:<id>:<retries>` for each failure after an operator's `outbox retry`.
/// [`OUTBOX_KEY_SQL`] is the same in SQL, over an `outbox` aliased `o`.
pub fn outbox_dedup_key(id: i64, retries: i32) -> String {
    if retries == 0 {
        format!("outbox:{id}")
    } else {
        format!("outbox:{id}:{retries}")
    }
}

/// A condition on `dead_letters`: not a dead letter of an outbox row that an operator has
/// retried since (`outbox retry`; the drain publishes it again), which a replay must not send
/// a second time. The archive's maintenance settles such rows `replayed`
/// (`job_dead_letter_archive::archive_failed_outbox`); this keeps a replay that runs before it from sending them.
pub fn not_retried_in_outbox_sql() -> String {
    format!(
        " AND NOT EXISTS (SELECT 1 FROM outbox o WHERE dead_letters.source = 'outbox' \
             AND o.id = dead_letters.outbox_id AND dead_letters.dedup_key <> {OUTBOX_KEY_SQL})"
    )
}

/// [`outbox_dedup_key`] in SQL, over an `outbox` aliased `o`.
pub const OUTBOX_KEY_SQL: &str =
    "CASE WHEN o.retries = 0 THEN 'outbox:' || o.id ELSE 'outbox:' || o.id || ':' || o.retries END";
