//! # worker-core: the primitives every job is built on
//!
//! This crate holds what is written once and wrapped around every job: how failures are
//! classified, how long a unit of work may run, how it is retried, how timer ticks are kept
//! from overlapping, and the two job traits with their single-step entries. The adapters
//! (broker, store) implement its traits; the job crates code against them; the host composes
//! them. Nothing here spawns tasks, reads settings files or talks to the network.
//!
//! ## The pieces
//!
//! * [`failure`] — [`Failure`] is the error of every job: [`Transient`](Failure::Transient)
//!   (try again), [`Permanent`](Failure::Permanent) (dead-letter with a reason) or
//!   [`Throttled`](Failure::Throttled) (try again, but not before `retry_after`). A job
//!   classifies its errors once, where it understands them; everything downstream decides
//!   from [`FailureClass`] alone. [`error_chain`] renders an error with its causes.
//! * [`timeout`] — [`run_unit`] runs one unit of work under a child cancellation token with a
//!   deadline. Work that ignores its token is dropped at the deadline anyway, and a panic
//!   becomes a transient failure of that unit rather than a crash of the host.
//! * [`retry`] — [`RetryPolicy`] (settings: tries, exponential delay with cap and jitter)
//!   and [`Retry`], the bounded in-process loop for micro-failures. It stops early on a
//!   permanent failure, honours a throttled failure's `retry_after`, can be bounded by a total
//!   budget, stops at once when its parent token fires, and reports every try to an
//!   [`AttemptObserver`].
//! * [`backoff`] — [`Backoff`]: the doubling wait of a loop that keeps trying until it
//!   succeeds or is stopped (reconnects, listeners), on the same formula as [`RetryPolicy`].
//! * [`busy`] — [`SkipIfBusy`]: a tick that finds the previous tick still running is skipped
//!   with a warning, never queued and never run beside it.
//! * [`lease`] — [`SingletonLease`]: the same guarantee across replicas (implemented by the
//!   store crate on PostgreSQL advisory locks), watched during the tick (a lost lease cancels
//!   it) and released in order after it. [`NoLease`] for jobs that do not need one.
//! * [`settings`] — what every job's settings section shares: [`Section::validate`], which
//!   names each problem by its key relative to the section ([`SettingError`]), the
//!   [`TimerSection`] the host puts a schedule around, and [`TlsMode`], the one way a mail
//!   connection is secured. Reading files and the environment stays in the host.
//! * [`dedup`] — [`ProcessedGuard`]: the one processed-message guard, marked inside the
//!   caller's transaction so the effect and the mark commit together.
//! * [`liveness`] — [`Liveness`](liveness::Liveness): the units of work in progress and the
//!   limit each one's timeout sets, so that a watchdog can tell a busy host from one whose
//!   work blocks a thread past the reach of its timeout.
//! * [`job`] — [`ConsumerJob`] (one decoded message in, [`Handled`] out) and [`TimerJob`]
//!   (one tick in, [`TickReport`] out), the [`WorkContext`] each unit of work receives, and the
//!   single-step entries [`execute_once`] and [`tick_once`] that drive exactly one unit of work
//!   for the host and for tests.
//!
//! ## The layer order
//!
//! The order in which the host wraps these around a unit of work is written once, in
//! ARCHITECTURE.md under "The layer order". The host owns the root
//! [`CancellationToken`](tokio_util::sync::CancellationToken); each job gets a child and each
//! unit of work a grandchild carrying its deadline, so stopping the host cancels work in flight.
//!
//! ## Invariants
//!
//! * **Core knows no broker or database types.** No `lapin`, no `sqlx`: adapters map their
//!   errors into [`Failure`] and implement [`SingletonLease`] and [`ProcessedGuard`].
//! * **No unit of work runs unbounded**: every path into a handler goes through [`run_unit`].
//! * **Nothing here panics on bad settings**: [`RetryPolicy::delay_for`] is total, and
//!   [`RetryPolicy::validate`] tells an operator which field is wrong.
//!
//! ## A consumer, driven one step in a test
//!
//! ```
//! use tokio_util::sync::CancellationToken;
//! use worker_core::{ConsumerJob, Failure, Handled, WorkContext, execute_once};
//!
//! #[derive(serde::Deserialize)]
//! struct Ping {
//!     id: String,
//! }
//!
//! struct PingJob;
//!
//! impl ConsumerJob for PingJob {
//!     type Input = Ping;
//!     fn name(&self) -> &str {
//!         "ping"
//!     }
//!     async fn handle(&self, _ctx: &WorkContext, input: &Ping) -> Result<Handled, Failure> {
//!         if input.id.is_empty() { Err(Failure::permanent("empty-id", "the id is empty")) } else { Ok(Handled::Done) }
//!     }
//! }
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let ctx = WorkContext::new("ping", CancellationToken::new());
//! assert_eq!(execute_once(&PingJob, &ctx, br#"{"id":"p1"}"#).await.unwrap(), Handled::Done);
//! assert!(execute_once(&PingJob, &ctx, b"not json").await.is_err());
//! # });
//! ```

pub mod backoff;
pub mod busy;
pub mod catalog;
pub mod circuit;
pub mod dedup;
pub mod failure;
pub mod host_port;
pub mod job;
pub mod lease;
pub mod liveness;
pub mod retry;
pub mod secret;
pub mod settings;
pub mod settings_file;
pub mod text;
pub mod timeout;

pub use backoff::Backoff;
pub use busy::{Busy, SkipIfBusy};
pub use catalog::{JobKind, JobSpec, Lease};
pub use dedup::ProcessedGuard;
pub use failure::{Failure, FailureClass, error_chain};
pub use job::{
    ConsumerJob, DecodeError, ExecuteError, Handled, SCHEMA_TOO_NEW, TickOutcome, TickReport,
    TimedTick, TimerJob, WorkContext, decode, execute_once, refuse_newer, tick_once,
    tick_once_timed,
};
pub use lease::{NoLease, SingletonLease};
pub use retry::{
    AttemptObserver, NoObserver, Retry, RetryOutcome, RetryPolicy, TryOutcome, TryRecord, persist,
};
pub use secret::Secret;
pub use settings::{
    PoolNeed, Problems, Section, SettingError, TimerSection, TlsMode, certificate_advice,
};
pub use text::{truncate, visible, visible_json};
pub use timeout::{UnitError, run_unit};
