//! The transactional outbox: a message is written into a row inside the caller's
//! transaction, so that it is published if and only if that transaction commits.
//!
//! A job that changes the database and must also publish a message calls [`enqueue`] with the
//! transaction that makes its change. The row carries the message id, type, content type,
//! headers (with the W3C trace context of the enqueuing span) and body. The table's trigger
//! (migration `20261209000100_outbox_notify_trigger.sql`) sends a `NOTIFY` on [`CHANNEL`] for
//! every statement that inserted rows, at no round trip of the writer's; PostgreSQL delivers notifications only on commit, so the
//! drain is woken exactly when there is something to publish, and never by a rollback.
//!
//! The outbox drain job (crate `job-outbox-drain`) runs the other half, through this module
//! (`drain.rs`), so that every statement on the outbox is written here:
//!
//! 1. [`begin_batch`] begins the batch's transaction, and [`claim`] locks up to `limit` due rows (`status = 'pending'` and
//!    `next_attempt_at <= now()`) in id order with `FOR UPDATE SKIP LOCKED`, so that replicas
//!    draining together take disjoint batches without a lease;
//! 2. it publishes them with confirms;
//! 3. [`delete_published`] deletes the confirmed ones by id and records their
//!    [`publications`] (for a mail's story), in one statement, and
//!    [`record_failures`] adds an attempt to the others with a backoff, or marks them
//!    `failed` with their last error once they have had their maximum attempts;
//! 4. it commits. A crash between the publish and the commit leaves the rows pending, so they
//!    are published again (at least once); consumers dedup on the message id.
//!
//! So the outbox holds only what waits (`pending`) and what gave up (`failed`): what was
//! published is counted by the metrics and the history's rollups, not by rows kept here.
//!
//! For operators (`operators.rs`): [`status`] (pending, due, failed, age of the oldest pending row),
//! [`failed`] and [`pending`] (the rows, with their errors), [`retry`], [`retry_failed`] and
//! [`retry_all_failed`] (make failed rows pending again, with fresh attempts, recorded in the
//! [`audit`](crate::audit) trail; [`retry_all_failed_dry_run`] counts and lists what a retry of
//! them all would put back, recorded as a dry run), and [`sweep_processed_batch`] (the
//! retention job's sweep of rows earlier releases marked `processed` and kept).

mod drain;
mod enqueue;
mod operators;
mod publications;

pub use drain::{
    FailureCounts, LAST_ERROR_MAX, OutboxRow, PublishFailure, begin_batch, claim, delete_published,
    record_failures,
};
pub use enqueue::{
    CHANNEL, INSERT_INTO, OutboxMessage, TRACEPARENT, current_trace_context, enqueue, enqueue_many,
};
pub use operators::{
    FailedRow, OutboxStatus, PendingRow, RETRY_PREVIEW_ROWS, RetryAllReport, RetryResult, failed,
    pending, retry, retry_all_failed, retry_all_failed_dry_run, retry_failed, status,
    sweep_processed_batch,
};
pub use publications::{Publication, publications, sweep_publications};

/// A condition, for another crate's statement, that a command whose message id is the SQL
/// expression `message_id` still waits in the outbox to be published.
pub fn pending_command_sql(message_id: &str) -> String {
    format!(
        "EXISTS (SELECT 1 FROM outbox o WHERE o.status = 'pending' AND o.message_id = {message_id})"
    )
}
