//! The attempt log, a row per try: every failed try and every final outcome of a consumer
//! message or a timer tick, with the job, the message id or tick, the attempt, the
//! outcome, the failure class, the error, the duration and when.
//!
//! Successful tries, and final outcomes that are plain first-try successes, are written only
//! when [`AttemptLogSettings::log_successes`] asks for them, so that the hot path stays fast.
//!
//! ## Writing without blocking the retry loop
//!
//! [`worker_core::AttemptObserver::on_try`] is called synchronously from inside the retry
//! loop, so it must never wait on the database. [`AttemptLog`] (cheap to clone) turns each
//! record into an owned [`AttemptRecord`] and hands it to a bounded channel with `try_send`;
//! an [`AttemptLogWriter`] task, which the host spawns through its task tracker, writes the
//! records in batches: every [`AttemptLogSettings::batch_size`] records or every
//! [`AttemptLogSettings::flush_interval`], whichever comes first, one `INSERT` per batch.
//!
//! **When the channel is full** (the database is slow or down and
//! [`AttemptLogSettings::capacity`] records are waiting), a record is **dropped**, not waited
//! for: the work goes on, the drop is counted ([`AttemptLog::dropped`]) and the writer logs one
//! warning per flush with how many were lost. A batch the database refuses is also dropped,
//! with a warning, after one retry. The attempt log is for operators; it never holds back or
//! fails the work it describes.
//!
//! ## What the host wires
//!
//! * consumers: from the runner's event hook, each try through [`AttemptLog::record_try`]
//!   (`ConsumerEvents::on_delivery_try` gives the message id and the delivery attempt) and the
//!   settled outcome through [`AttemptLog::record_outcome`]; where a [`WorkContext`](worker_core::WorkContext) is at
//!   hand, `log.for_unit(&ctx)` is an observer for [`worker_core::Retry::observer`];
//! * timer jobs: [`AttemptLog::record_tick`] after each [`worker_core::tick_once`];
//! * retention: the host's retention job calls [`sweep_batch`] on a schedule, in bounded
//!   batches.

mod handle;
mod read;
mod record;
mod settings;
mod store;
mod writer;

pub use handle::{AttemptLog, UnitObserver};
pub use read::{AttemptSummary, RECENT, for_message, for_messages, recent, summary};
pub use record::{AttemptRecord, ERROR_MAX, UnitInfo};
pub use settings::AttemptLogSettings;
pub use store::{insert_batch, record, sweep, sweep_batch};
pub use writer::AttemptLogWriter;
