//! # job-dead-letter-archive: every dead letter, searchable and replayable
//!
//! Operators must see what failed, why and how often, and put it right after a fix, without a
//! broker console and without losing anything. This crate moves every dead letter into
//! PostgreSQL and is the library behind `worker-host dlq list|show|replay|purge`.
//!
//! ## The parts
//!
//! * [`archiver`] — the [`Archiver`]: a handler on the broker's consume loop
//!   ([`ConsumeLoop`](worker_broker::ConsumeLoop), the runner's own) per `Q.dead` queue that
//!   inserts a row per message, in batches, and acks only after the rows commit. Idempotent: `INSERT … ON CONFLICT
//!   (dedup_key) DO NOTHING` on a hash of what survives a redelivery, so a message archived
//!   and redelivered (the archiver killed between commit and ack) is archived once.
//! * [`record`] — what a dead letter becomes ([`NewDeadLetter`], read by [`FromMessage`]): the
//!   runner's `x-dead-*` headers, or the broker's `x-death` (reason `delivery_limit`), or
//!   reason `unknown` — a message is never dropped for saying nothing.
//! * [`store`] — failed outbox rows (reason `outbox-failed`, idempotent per outbox id and
//!   operator retry: a row that fails again after `outbox retry` is archived again, and its
//!   earlier dead letter is settled `replayed`).
//! * [`maintenance`] — [`ArchiveMaintenance`], a [`worker_core::TimerJob`] that runs the
//!   outbox archiving and the sweep on a schedule.
//! * [`query`] — `dlq list` ([`list`]), `dlq show` ([`show`], [`show_one`]) and the numbers
//!   for metrics and alerts ([`depth_by_queue`], [`oldest_age`], [`inflow_since`]), and how an
//!   operator writes a time ([`parse_time`]).
//! * [`bulk`], [`mod@replay`] and [`mod@purge`] — `dlq replay` ([`replay()`]) and `dlq purge`
//!   ([`purge()`]), both recorded in the operators' audit trail ([`worker_store::audit`],
//!   listed by [`actions`]) with the [`Actor`] who ran them; [`replay_run`] and [`purge_run`]
//!   take a [`Run`] (in `bulk`): dry or real, a rate, what the operator confirmed, and a
//!   [`Control`].
//!
//! The table itself is [`worker_store::dead_letters`]'s, which owns it: the row and its
//! columns, the idempotent insert and the retention sweep ([`insert`](store::insert),
//! [`sweep`]), the error fingerprint ([`mod@fingerprint`]: the error with ids, numbers,
//! addresses and quoted strings replaced by placeholders, hashed to 12 hex digits: one cause,
//! one fingerprint), the filter and the readings, and [`browse`], what the console pages
//! through: [`groups`] (by queue and fingerprint), [`dead_letters`] (newest first, keyset
//! pages) and one dead letter's [`history`]. They are re-exported here under the paths they
//! had, as the command line and the console call them.
//!
//! ## What the host does
//!
//! ```no_run
//! # async fn host(pool: sqlx::PgPool, supervisor: worker_broker::Supervisor) -> Result<(), worker_core::Failure> {
//! use job_dead_letter_archive::*;
//! use tokio_util::sync::CancellationToken;
//!
//! let root = CancellationToken::new();
//! let tracker = tokio_util::task::TaskTracker::new();
//! let settings = ArchiverSettings::default(); // [jobs.dead_letter_archive]
//! settings.validate().map_err(|e| worker_core::Failure::permanent("settings", e))?;
//!
//! // `worker-host run`: one archiver task per dead queue of the topology.
//! let archiver = Archiver::new(pool.clone(), settings.clone());
//! for dead in dead_queues(supervisor.topology()) {
//!     let (archiver, supervisor, token) = (archiver.clone(), supervisor.clone(), root.child_token());
//!     tracker.spawn(async move { archiver.run(&supervisor, dead, token).await });
//! }
//! // ... and ArchiveMaintenance::new(pool.clone(), settings) as a timer job (with a lease).
//!
//! // `worker-host dlq ...`
//! let queues = list(&pool).await?;
//! let filter = Filter { fingerprint: Some("3fa9c2e01b7d".into()), ..Filter::default() };
//! let rows = show(&pool, &filter).await?;
//! let publisher = supervisor.publisher(worker_broker::PublisherSettings::default());
//! // The operating-system user and the host name, read by the host, and `--actor`.
//! let actor = Actor::new("ops", "host-1").with_name(Some("alice".into()));
//! let plan = replay(&pool, &publisher, &filter, true, None, &actor).await?; // --dry-run
//! let done = replay(&pool, &publisher, &filter, false, Some(50), &actor).await?; // --rate 50
//! # let _ = (queues, rows, plan, done); Ok(()) }
//! ```
//!
//! ## Invariants
//!
//! * **Nothing is acked before its row commits**, and nothing is nacked: a batch the database
//!   does not take is held and tried again; on shutdown it returns to the queue.
//! * **Nothing is dropped**: not for lack of room (no cap on the table), not for lack of
//!   headers (reason `unknown`), not for a value PostgreSQL cannot store (NUL bytes are
//!   replaced; a row refused still is stored without its headers).
//! * **A replay never deletes**: a row becomes `replayed` only after its publish is confirmed
//!   (or, for an outbox row, once an operator's `outbox retry` republished it), and `purged`
//!   rows stay until the retention sweep.
//! * **A replayed outbox row is settled in the outbox too** (`processed`, in the replay's
//!   transaction): `outbox retry --all-failed` does not publish it a second time. The other
//!   way round, a dead letter of an outbox row retried since is never replayed.
//! * **Every replay and purge is recorded**, dry runs too, with its actor (the
//!   operating-system user, the host, the name given with `--actor`, the database role),
//!   filter and counts; the database refuses to change a row's who, what and when, to
//!   change a finished row at all, and to delete or truncate any (migration
//!   `20261201000500_dead_letter_audit`).

pub mod archiver;
pub mod bulk;
pub mod drain;
mod headers;
pub mod maintenance;
mod pacer;
pub mod purge;
pub mod query;
pub mod record;
pub mod replay;
pub mod settings;
pub mod store;

pub use archiver::{
    ArchiveEvents, Archiver, ArchiverSettings, JOB_NAME, NoEvents, SessionEnd, dead_queues,
};
pub use browse::{
    Group, History, PAGE_MAX, Page, Related, dead_letters, error_chain, groups, history,
    replayed_from, trace_id,
};
pub use bulk::{Control, Run};
pub use maintenance::{ArchiveMaintenance, MaintenanceReport};

/// What the host needs to know of this job: its archivers and its maintenance tick are one
/// job, whose tick was called `dead-letter-maintenance` until this release (its lease key
/// still is).
pub const JOB: worker_core::JobSpec =
    worker_core::catalog::JobSpec::timer(JOB_NAME, worker_core::catalog::Lease::OneReplica)
        .formerly(&["dead-letter-maintenance"]);
pub use purge::{PurgeReport, count, purge, purge_dry_run, purge_run};
pub use query::{
    DeadLetter, DeadLetterSummary, Filter, FingerprintCount, QueueDepth, QueueSummary, Status,
    depth_by_queue, inflow_since, list, list_top, oldest_age, parse_time, show, show_one,
};
pub use record::{
    DELIVERY_LIMIT, DeadQueue, FromMessage, MessageProperties, NewDeadLetter, OUTBOX_FAILED,
    OUTBOX_QUEUE, REPLAYED_FROM_HEADER, RawMessage, Source, UNKNOWN,
};
pub use replay::{ItemOutcome, ReplayItem, ReplayReport, replay, replay_run};
pub use settings::DeadLetterArchiveSettings;
pub use store::{InsertReport, archive_failed_outbox, outbox_dedup_key, sweep};
pub use worker_store::audit::{Actor, Entry, recent as audit_entries};
/// The console's pages over the archive: the store's, which owns `dead_letters`.
pub use worker_store::dead_letters::browse;
/// Error fingerprints: the store's, beside the row that carries them.
pub use worker_store::dead_letters::{fingerprint, normalize};
