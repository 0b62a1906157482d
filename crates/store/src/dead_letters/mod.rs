//! The dead-letter archive's table, `dead_letters`: the row's shape, written once
//! ([`NewDeadLetter`], [`insert`]), the error fingerprint every row carries ([`mod@fingerprint`]),
//! and the readings the command line and the console page through ([`list`], [`show`],
//! [`show_one`], [`groups`], [`browse::dead_letters`], [`history`]).
//!
//! Who writes rows: the archiver (`job-dead-letter-archive`, from the dead queues and from
//! failed outbox rows) and the reconciler (work it gave up on); both build a [`NewDeadLetter`]
//! and call [`insert`] or [`insert_in`]. How a broker message becomes a row is the archive's
//! (it knows the broker's headers); this module knows no broker type.

pub mod browse;
pub mod edited;
mod filter;
pub mod fingerprint;
mod insert;
mod of_messages;
mod outbox_rows;
mod read;
mod row;
mod show_one;
mod status;

pub use browse::{
    Group, History, PAGE_MAX, Page, Related, dead_letters, error_chain, groups, history,
    replayed_from, trace_id,
};
pub use filter::{Filter, SEARCH_BODY_BYTES, SEARCH_MAX_CHARS};
pub use fingerprint::{fingerprint, fingerprint_of_normalized, hex, normalize};
pub use insert::{InsertReport, insert, insert_in, sweep};
pub use of_messages::of_messages;
pub use outbox_rows::{
    FailedOutboxRow, OUTBOX_KEY_SQL, failed_unarchived, not_retried_in_outbox_sql,
    outbox_dedup_key, settle_replayed_outbox, settle_retried,
};
pub use read::{
    DEFAULT_SHOW_LIMIT, DeadLetterSummary, FingerprintCount, OLDEST_AGE, PREVIEW_CHARS, QueueDepth,
    QueueSummary, TOP_FINGERPRINTS, count, depth_by_queue, fetch_summaries, inflow_since, list,
    list_top, oldest_age, preview, show, summaries,
};
pub use row::{
    DELIVERY_LIMIT, NewDeadLetter, OUTBOX_FAILED, OUTBOX_QUEUE, REPLAYED_FROM_HEADER, Source,
    Status, UNKNOWN,
};
pub use show_one::{DeadLetter, show_one};
pub use status::{Replayable, mark_purged, mark_replayed, replayable_batch};
