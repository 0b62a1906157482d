//! The two kinds of job and their single-step entries.
//!
//! A [`ConsumerJob`] handles one decoded message; a [`TimerJob`] runs one tick. Each is
//! written once against these traits and knows nothing of how it is scheduled, bounded or
//! observed: the host wraps it. [`execute_once`] and [`tick_once`] drive exactly one unit of
//! work, for the host and for tests alike.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use crate::busy::{Busy, SkipIfBusy};
use crate::failure::{Failure, FailureClass};
use crate::lease::SingletonLease;
use crate::timeout::{UnitError, run_unit};

/// What a unit of work knows about itself: which job, which message or tick, which try, and
/// the token that says "stop now".
#[derive(Debug, Clone)]
pub struct WorkContext {
    pub job: Arc<str>,
    /// Cancelled when the unit must stop: its deadline passed or the host is shutting down.
    pub cancel: CancellationToken,
    /// The message's attempt across parks (the `x-attempt` header), or 1 for a tick.
    pub attempt: u32,
    /// The in-process try within this delivery or tick, set by [`Retry::run`](crate::Retry::run).
    pub try_number: u32,
    pub message_id: Option<String>,
    pub correlation_id: Option<String>,
    /// The tick's sequence number, for timer jobs.
    pub tick: Option<u64>,
    /// Where each try of this unit is recorded while it runs, for the host's watchdog
    /// ([`crate::liveness`]); `None` records nothing.
    pub liveness: Option<crate::liveness::Liveness>,
}

impl WorkContext {
    /// A context for `job` on attempt 1, try 1, with no message or tick.
    pub fn new(job: impl Into<Arc<str>>, cancel: CancellationToken) -> Self {
        Self {
            job: job.into(),
            cancel,
            attempt: 1,
            try_number: 1,
            message_id: None,
            correlation_id: None,
            tick: None,
            liveness: None,
        }
    }

    /// Records each try of the unit in `liveness` while it runs.
    #[must_use]
    pub fn with_liveness(mut self, liveness: crate::liveness::Liveness) -> Self {
        self.liveness = Some(liveness);
        self
    }

    /// Records one try of this unit, which its timeout should end within `limit`, until the
    /// guard is dropped.
    pub fn begin_try(&self, limit: Duration) -> Option<crate::liveness::UnitGuard> {
        self.liveness
            .as_ref()
            .map(|liveness| liveness.begin(self.job.clone(), limit))
    }

    #[must_use]
    pub fn with_attempt(mut self, attempt: u32) -> Self {
        self.attempt = attempt;
        self
    }

    #[must_use]
    pub fn with_try_number(mut self, try_number: u32) -> Self {
        self.try_number = try_number;
        self
    }

    #[must_use]
    pub fn with_message_id(mut self, message_id: impl Into<String>) -> Self {
        self.message_id = Some(message_id.into());
        self
    }

    #[must_use]
    pub fn with_correlation_id(mut self, correlation_id: impl Into<String>) -> Self {
        self.correlation_id = Some(correlation_id.into());
        self
    }

    #[must_use]
    pub fn with_tick(mut self, tick: u64) -> Self {
        self.tick = Some(tick);
        self
    }

    /// The same context under another token (a child with a deadline, typically).
    #[must_use]
    pub fn with_cancel(mut self, cancel: CancellationToken) -> Self {
        self.cancel = cancel;
        self
    }
}

/// How a consumer settled a message it understood.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    /// The effect happened (or, for a job that is deliberately not deduped, happened again).
    Done,
    /// The processed-message guard had already seen this message; nothing was done.
    Duplicate,
    /// Understood and settled, but by decision there was nothing to do: no automation matched
    /// an event, or a mail is not to be answered. The reason is a stable kebab-case word
    /// (`no-match`, `reply-limit`, ...), counted by reason so that "we stopped answering"
    /// shows as a rate.
    Skipped(&'static str),
}

impl Handled {
    /// `done`, `duplicate` or `skipped`.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Self::Done => "done",
            Self::Duplicate => "duplicate",
            Self::Skipped(_) => "skipped",
        }
    }
}

/// A job fed by a queue: one decoded message in, a classified outcome out.
pub trait ConsumerJob: Send + Sync + 'static {
    /// The message body, decoded from JSON.
    type Input: DeserializeOwned + Send + Sync + 'static;

    fn name(&self) -> &str;

    /// The newest schema version of a message of `message_type` (its AMQP `type`, else its
    /// routing key) that this job reads. A delivery that says it is newer is refused before
    /// it is decoded ([`refuse_newer`]): a later release's message may decode and mean
    /// something else. A job that says nothing reads version 1, the version of a message
    /// without one.
    fn reads_version(&self, message_type: &str) -> u32 {
        let _ = message_type;
        1
    }

    /// Why a message of `message_type` (its AMQP `type`, else its routing key) is not this
    /// job's to read, if it is not: such a delivery is acked and counted `skipped` with that
    /// reason before its headers or body are read. For a queue bound to a shared exchange with
    /// a wide pattern (`#`), where another job owns some of the types that arrive: read as this
    /// job's input, they would be dead-lettered `malformed`. A job that says nothing reads all.
    fn skips(&self, message_type: &str) -> Option<&'static str> {
        let _ = message_type;
        None
    }

    /// Handles one message. May be called more than once for the same message (redelivery,
    /// in-process retry), so the effect must be idempotent or guarded.
    fn handle(
        &self,
        ctx: &WorkContext,
        input: &Self::Input,
    ) -> impl Future<Output = Result<Handled, Failure>> + Send;
}

/// A message body that is not the JSON the job expects. Malformed: dead-lettered at once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the body is not a valid {expected}: {detail}")]
pub struct DecodeError {
    /// The type that was expected, without its module path.
    pub expected: &'static str,
    /// What was wrong, prefixed with the JSON path of the bad field when known.
    pub detail: String,
}

impl DecodeError {
    pub fn class(&self) -> FailureClass {
        FailureClass::Malformed
    }
}

/// Decodes a JSON body into `T`, naming the path of the offending field on failure
/// (``"at `to.address`: invalid type: integer `5`, expected a string at line 1 column 20"``).
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, DecodeError> {
    let expected = short_type_name(std::any::type_name::<T>());
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        let detail = if path.is_empty() || path == "." {
            inner.to_string()
        } else {
            format!("at `{path}`: {inner}")
        };
        DecodeError { expected, detail }
    })?;
    de.end().map_err(|err| DecodeError {
        expected,
        detail: err.to_string(),
    })?;
    Ok(value)
}

/// `my_crate::email::SendEmail` -> `SendEmail`, `alloc::vec::Vec<my::Item>` -> `Vec<Item>`.
fn short_type_name(full: &'static str) -> &'static str {
    // Only the outermost path is trimmed: generic arguments keep their paths, which is rare
    // enough for message bodies not to matter and keeps this free of allocation.
    let outer_end = full.find('<').unwrap_or(full.len());
    match full[..outer_end].rfind("::") {
        Some(at) => &full[at + 2..],
        None => full,
    }
}

/// The reason tag of [`refuse_newer`]'s failure, in logs and dead letters.
pub const SCHEMA_TOO_NEW: &str = "schema-too-new";

/// Refuses a message of `message_type` whose schema `version` is newer than the `reads` this
/// release knows: a permanent failure (retries and later attempts would meet the same release,
/// or replicas of it), so that it is dead-lettered with a reason an operator can act on (replay
/// it once the newer release runs here) and never misread.
pub fn refuse_newer(message_type: &str, version: u32, reads: u32) -> Result<(), Failure> {
    if version <= reads {
        return Ok(());
    }
    Err(Failure::permanent(
        SCHEMA_TOO_NEW,
        format!(
            "{message_type} schema version {version} is newer than this release reads (up to {reads})"
        ),
    ))
}

/// Why [`execute_once`] did not settle the message as handled.
#[derive(Debug, thiserror::Error)]
pub enum ExecuteError {
    #[error(transparent)]
    Malformed(#[from] DecodeError),
    #[error(transparent)]
    Failed(#[from] Failure),
}

impl ExecuteError {
    /// `Malformed` for a body that does not decode, otherwise the failure's own class.
    pub fn class(&self) -> FailureClass {
        match self {
            Self::Malformed(_) => FailureClass::Malformed,
            Self::Failed(failure) => failure.class(),
        }
    }
}

/// Decodes `body` and handles it once: no retry, no timeout, no broker. The single step a
/// test uses to drive one message through a consumer.
pub async fn execute_once<J: ConsumerJob>(
    job: &J,
    ctx: &WorkContext,
    body: &[u8],
) -> Result<Handled, ExecuteError> {
    let input: J::Input = decode(body)?;
    Ok(job.handle(ctx, &input).await?)
}

/// What one tick did, for the log line and the metrics.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TickReport {
    /// Items handled (rows drained, messages fetched, drafts expired...).
    pub items: u64,
    pub detail: Option<String>,
}

impl TickReport {
    pub fn items(items: u64) -> Self {
        Self {
            items,
            detail: None,
        }
    }

    #[must_use]
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }
}

/// A job run on a schedule. A tick never overlaps the previous one, in this process
/// ([`SkipIfBusy`]) or across replicas ([`SingletonLease`]).
pub trait TimerJob: Send + Sync + 'static {
    fn name(&self) -> &str;

    /// One tick. Must be safe to re-run: a tick cut short by its timeout is simply run
    /// again at the next one.
    fn tick(&self, ctx: &WorkContext) -> impl Future<Output = Result<TickReport, Failure>> + Send;
}

/// How one [`tick_once`] ended.
#[derive(Debug, Clone, PartialEq)]
pub enum TickOutcome {
    Ran(TickReport),
    /// The tick failed, overran its timeout or panicked; or the lease could not be asked for.
    Failed(Failure),
    /// The previous tick in this process was still running.
    SkippedBusy,
    /// Another replica holds the job's lease.
    SkippedLease,
    /// The context's token fired.
    Cancelled,
}

impl TickOutcome {
    /// `ran`, `failed`, `skipped-busy`, `skipped-lease` or `cancelled`.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Self::Ran(_) => "ran",
            Self::Failed(_) => "failed",
            Self::SkippedBusy => "skipped-busy",
            Self::SkippedLease => "skipped-lease",
            Self::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for TickOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One tick's outcome from [`tick_once_timed`], with the moments its work began and ended.
#[derive(Debug)]
pub struct TimedTick {
    pub outcome: TickOutcome,
    /// After the busy guard and, for a leased job, once the lease was held. `None` when no
    /// work began (skipped, cancelled, or the lease could not be asked for).
    pub began: Option<tokio::time::Instant>,
    /// When the work ended, before the lease was given back: a span from `began` to here lies
    /// within the time the lease was held, so two replicas' spans of one job never overlap,
    /// however late the record is stamped after the release. `None` when no work began.
    pub ended: Option<tokio::time::Instant>,
}

/// Runs one tick of `job`: busy guard, then the lease if there is one, then the tick under
/// [`run_unit`] with `timeout` and a child of `ctx.cancel`.
///
/// Asking for the lease is bounded by the same `timeout` and gives way to cancellation. The
/// lease is held for the whole tick and watched meanwhile ([`SingletonLease::watch`]): once the
/// watch finds it lost (its database session ended), the tick is cancelled (its future
/// dropped, its token fired) and fails, so that it does not go on beside a tick another replica
/// starts under the freed lease; the lost guard is dropped. Otherwise the lease is given back in order ([`SingletonLease::release`]) right
/// after the tick, whatever its outcome. Pass `None::<&NoLease>` (see
/// [`NoLease`](crate::lease::NoLease)) for a job without a lease.
pub async fn tick_once<J: TimerJob, L: SingletonLease>(
    job: &J,
    busy: &SkipIfBusy,
    lease: Option<&L>,
    timeout: Duration,
    ctx: &WorkContext,
) -> TickOutcome {
    tick_once_timed(job, busy, lease, timeout, ctx)
        .await
        .outcome
}

/// [`tick_once`], also saying when the tick's work began ([`TimedTick::began`]): a record of
/// the tick's span that starts there shows when the job really ran, not the wait for a
/// connection to ask for its lease (so two replicas' records of a leased job never seem to
/// overlap).
pub async fn tick_once_timed<J: TimerJob, L: SingletonLease>(
    job: &J,
    busy: &SkipIfBusy,
    lease: Option<&L>,
    timeout: Duration,
    ctx: &WorkContext,
) -> TimedTick {
    let name = job.name();
    let mut began = None;
    let mut ended = None;
    let guarded = busy.try_run(async {
        if ctx.cancel.is_cancelled() {
            return TickOutcome::Cancelled;
        }
        // The unit is recorded for as long as its future runs, not only while it is built.
        let run = || async {
            let _unit = ctx.begin_try(timeout);
            run_unit(name, timeout, &ctx.cancel, |token| {
                let ctx = ctx.clone().with_cancel(token);
                async move { job.tick(&ctx).await }
            })
            .await
        };
        let Some(lease) = lease else {
            began = Some(tokio::time::Instant::now());
            let ran = run().await;
            ended = Some(tokio::time::Instant::now());
            return outcome(ran);
        };
        let mut guard = match acquire(lease, name, timeout, &ctx.cancel).await {
            Ok(Some(guard)) => guard,
            Ok(None) => {
                tracing::debug!(
                    job = name,
                    "another replica holds the lease; skipping this tick"
                );
                return TickOutcome::SkippedLease;
            }
            Err(None) => return TickOutcome::Cancelled,
            Err(Some(failure)) => return TickOutcome::Failed(failure),
        };
        began = Some(tokio::time::Instant::now());
        let watched = tokio::select! {
            biased;
            ran = run() => Ok(ran),
            // Dropping the tick's future here cancels it (and `run_unit` cancels its token).
            lost = lease.watch(&mut guard) => Err(lost),
        };
        ended = Some(tokio::time::Instant::now());
        match watched {
            Ok(ran) => {
                lease.release(guard).await;
                outcome(ran)
            }
            Err(lost) => {
                drop(guard);
                tracing::error!(job = name, error = %lost, "the lease was lost mid-tick; the tick was cancelled");
                TickOutcome::Failed(lost.context(format!("job `{name}` lost its lease mid-tick")))
            }
        }
    });
    let outcome = match guarded.await {
        Busy::Ran(outcome) => outcome,
        Busy::Skipped => TickOutcome::SkippedBusy,
    };
    TimedTick {
        outcome,
        began,
        ended,
    }
}

fn outcome(ran: Result<TickReport, UnitError>) -> TickOutcome {
    match ran {
        Ok(report) => TickOutcome::Ran(report),
        Err(UnitError::Failed(failure)) => TickOutcome::Failed(failure),
        Err(UnitError::Cancelled) => TickOutcome::Cancelled,
    }
}

/// Asks for the lease, bounded by `limit`; `Err(None)` when cancelled.
async fn acquire<L: SingletonLease>(
    lease: &L,
    job: &str,
    limit: Duration,
    cancel: &CancellationToken,
) -> Result<Option<L::Guard>, Option<Failure>> {
    tokio::select! {
        biased;
        () = cancel.cancelled() => Err(None),
        asked = tokio::time::timeout(limit, lease.try_acquire(job)) => match asked {
            Ok(Ok(guard)) => Ok(guard),
            Ok(Err(failure)) => Err(Some(failure.context(format!("acquiring the lease of job `{job}`")))),
            Err(_elapsed) => Err(Some(Failure::transient(format!(
                "job `{job}` could not acquire its lease within {}",
                humantime::format_duration(limit)
            )))),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, Ordering};

    use serde::Deserialize;
    use tokio::time::Instant;

    use super::*;
    use crate::lease::NoLease;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct SendEmail {
        id: String,
        to: Address,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    struct Address {
        address: String,
    }

    #[test]
    fn a_newer_schema_version_is_refused_permanently_and_by_name() {
        assert_eq!(refuse_newer("email.send", 1, 1), Ok(()));
        assert_eq!(
            refuse_newer("email.send", 1, 2),
            Ok(()),
            "older versions are read"
        );
        let refused = refuse_newer("email.send", 3, 1).unwrap_err();
        assert_eq!(refused.class(), FailureClass::Permanent);
        assert_eq!(
            refused.to_string(),
            "schema-too-new: email.send schema version 3 is newer than this release reads (up to 1)"
        );
    }

    /// A consumer that records what it handled and dedups on the id in memory.
    #[derive(Debug, Default)]
    struct Mailer {
        seen: Mutex<HashSet<String>>,
    }

    impl ConsumerJob for Mailer {
        type Input = SendEmail;

        fn name(&self) -> &str {
            "outbound-email"
        }

        async fn handle(&self, ctx: &WorkContext, input: &SendEmail) -> Result<Handled, Failure> {
            assert_eq!(&*ctx.job, "outbound-email");
            if input.to.address.ends_with("@invalid") {
                return Err(Failure::permanent("smtp-5xx", "550 no such domain"));
            }
            if self.seen.lock().unwrap().insert(input.id.clone()) {
                Ok(Handled::Done)
            } else {
                Ok(Handled::Duplicate)
            }
        }
    }

    fn ctx(job: &str) -> WorkContext {
        WorkContext::new(job, CancellationToken::new())
    }

    #[test]
    fn work_context_builders_set_their_fields() {
        let token = CancellationToken::new();
        let c = WorkContext::new("j", token.clone());
        assert_eq!(
            (c.attempt, c.try_number, c.message_id.as_deref(), c.tick),
            (1, 1, None, None)
        );
        let c = c
            .with_attempt(4)
            .with_try_number(2)
            .with_message_id("m")
            .with_correlation_id("c")
            .with_tick(9);
        assert_eq!(
            (
                c.attempt,
                c.try_number,
                c.message_id.as_deref(),
                c.correlation_id.as_deref(),
                c.tick
            ),
            (4, 2, Some("m"), Some("c"), Some(9))
        );
        token.cancel();
        assert!(
            c.cancel.is_cancelled(),
            "the context carries the given token"
        );
    }

    #[test]
    fn decode_reads_json_and_names_the_bad_field() {
        let ok: SendEmail = decode(br#"{"id":"e1","to":{"address":"a@b"}}"#).unwrap();
        assert_eq!(
            ok,
            SendEmail {
                id: "e1".into(),
                to: Address {
                    address: "a@b".into()
                }
            }
        );

        let bad = decode::<SendEmail>(br#"{"id":"e1","to":{"address":5}}"#).unwrap_err();
        assert_eq!(bad.expected, "SendEmail");
        assert!(
            bad.detail
                .starts_with("at `to.address`: invalid type: integer `5`"),
            "{}",
            bad.detail
        );
        assert!(
            bad.to_string()
                .starts_with("the body is not a valid SendEmail: at `to.address`"),
            "{bad}"
        );
        assert_eq!(bad.class(), FailureClass::Malformed);

        let missing = decode::<SendEmail>(br#"{"id":"e1"}"#).unwrap_err();
        assert!(
            missing.detail.contains("missing field `to`"),
            "{}",
            missing.detail
        );

        let not_json = decode::<SendEmail>(b"hello").unwrap_err();
        assert!(
            not_json.detail.contains("expected value"),
            "{}",
            not_json.detail
        );

        let trailing = decode::<SendEmail>(br#"{"id":"e1","to":{"address":"a"}} x"#).unwrap_err();
        assert!(
            trailing.detail.contains("trailing characters"),
            "{}",
            trailing.detail
        );

        assert_eq!(decode::<Vec<u32>>(b"[1,2]").unwrap(), [1, 2]);
        assert!(
            decode::<Vec<u32>>(b"[1,\"2\"]")
                .unwrap_err()
                .detail
                .starts_with("at `[1]`")
        );
    }

    #[test]
    fn short_type_names_drop_the_module_path() {
        assert_eq!(short_type_name("my_crate::email::SendEmail"), "SendEmail");
        assert_eq!(short_type_name("alloc::vec::Vec<u32>"), "Vec<u32>");
        assert_eq!(short_type_name("u32"), "u32");
    }

    #[tokio::test]
    async fn execute_once_decodes_then_handles() {
        let job = Mailer::default();
        let c = ctx("outbound-email");
        let body = br#"{"id":"e1","to":{"address":"a@b"}}"#;
        assert_eq!(execute_once(&job, &c, body).await.unwrap(), Handled::Done);
        assert_eq!(
            execute_once(&job, &c, body).await.unwrap(),
            Handled::Duplicate
        );

        let malformed = execute_once(&job, &c, br#"{"id":7}"#).await.unwrap_err();
        assert!(
            matches!(malformed, ExecuteError::Malformed(ref e) if e.detail.starts_with("at `id`")),
            "{malformed:?}"
        );
        assert_eq!(malformed.class(), FailureClass::Malformed);

        let failed = execute_once(&job, &c, br#"{"id":"e2","to":{"address":"x@invalid"}}"#)
            .await
            .unwrap_err();
        assert_eq!(failed.class(), FailureClass::Permanent);
        assert_eq!(failed.to_string(), "smtp-5xx: 550 no such domain");
        assert_eq!(
            job.seen.lock().unwrap().len(),
            1,
            "nothing else was handled"
        );
    }

    /// A timer job whose tick waits `hold`, then reports the tick number; it panics when told to.
    #[derive(Debug)]
    struct Drain {
        hold: Duration,
        panic_on: Option<u64>,
        runs: AtomicU64,
        lease: Option<Arc<FakeLease>>,
    }

    impl Drain {
        fn new(hold: Duration) -> Self {
            Self {
                hold,
                panic_on: None,
                runs: AtomicU64::new(0),
                lease: None,
            }
        }
    }

    impl TimerJob for Drain {
        fn name(&self) -> &str {
            "outbox-drain"
        }

        async fn tick(&self, ctx: &WorkContext) -> Result<TickReport, Failure> {
            self.runs.fetch_add(1, Ordering::SeqCst);
            if let Some(lease) = &self.lease {
                assert!(
                    lease.held.lock().unwrap().contains("outbox-drain"),
                    "the lease is held during the tick"
                );
            }
            let tick = ctx.tick.unwrap_or_default();
            if self.panic_on == Some(tick) {
                panic!("tick {tick} blew up");
            }
            tokio::time::sleep(self.hold).await;
            Ok(TickReport::items(tick).with_detail("drained"))
        }
    }

    /// An in-memory lease table shared by "replicas".
    #[derive(Debug, Default)]
    struct FakeLease {
        held: Mutex<HashSet<String>>,
        down: bool,
        /// A held lease is lost this long after its watch starts.
        lose_after: Option<Duration>,
        /// Guards given back through `release` (not merely dropped).
        released: AtomicU64,
        /// How long asking for the lease takes (a pooled connection to wait for, say).
        acquire_delay: Duration,
        /// How long giving it back takes (the unlock's round trip, say).
        release_delay: Duration,
    }

    #[derive(Debug)]
    struct FakeGuard {
        lease: Arc<FakeLease>,
        job: String,
    }

    impl Drop for FakeGuard {
        fn drop(&mut self) {
            self.lease.held.lock().unwrap().remove(&self.job);
        }
    }

    impl SingletonLease for Arc<FakeLease> {
        type Guard = FakeGuard;

        async fn try_acquire(&self, job: &str) -> Result<Option<FakeGuard>, Failure> {
            tokio::time::sleep(self.acquire_delay).await;
            if self.down {
                return Err(Failure::transient("database unreachable"));
            }
            let fresh = self.held.lock().unwrap().insert(job.to_string());
            Ok(fresh.then(|| FakeGuard {
                lease: Arc::clone(self),
                job: job.to_string(),
            }))
        }

        async fn watch(&self, _guard: &mut FakeGuard) -> Failure {
            match self.lose_after {
                Some(after) => {
                    tokio::time::sleep(after).await;
                    Failure::transient("the session ended")
                }
                None => std::future::pending().await,
            }
        }

        async fn release(&self, guard: FakeGuard) {
            tokio::time::sleep(self.release_delay).await;
            self.released.fetch_add(1, Ordering::SeqCst);
            drop(guard);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn tick_once_runs_and_reports() {
        let job = Drain::new(Duration::from_secs(1));
        let busy = SkipIfBusy::new("outbox-drain");
        let out = tick_once(
            &job,
            &busy,
            None::<&NoLease>,
            Duration::from_secs(5),
            &ctx("outbox-drain").with_tick(4),
        )
        .await;
        assert_eq!(
            out,
            TickOutcome::Ran(TickReport {
                items: 4,
                detail: Some("drained".into())
            })
        );
        assert_eq!(out.as_str(), "ran");
        let out = tick_once(
            &job,
            &busy,
            Some(&NoLease),
            Duration::from_secs(5),
            &ctx("outbox-drain").with_tick(5),
        )
        .await;
        assert_eq!(
            out,
            TickOutcome::Ran(TickReport {
                items: 5,
                detail: Some("drained".into())
            })
        );
        assert_eq!(job.runs.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_tick_is_in_progress_in_its_liveness_while_it_runs_and_not_after() {
        let job = Drain::new(Duration::from_secs(2));
        let busy = SkipIfBusy::new("outbox-drain");
        let liveness = crate::liveness::Liveness::default();
        let c = ctx("outbox-drain").with_liveness(liveness.clone());
        let tick = tick_once(&job, &busy, None::<&NoLease>, Duration::from_secs(5), &c);
        let watch = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            liveness.running()
        };
        let (out, during) = tokio::join!(tick, watch);
        assert!(matches!(out, TickOutcome::Ran(_)), "{out:?}");
        assert_eq!(during, 1, "the tick is recorded while it runs");
        assert_eq!(liveness.running(), 0, "and not once it has ended");
    }

    #[tokio::test(start_paused = true)]
    async fn tick_once_skips_when_the_previous_tick_still_runs() {
        let job = Drain::new(Duration::from_secs(10));
        let busy = SkipIfBusy::new("outbox-drain");
        let c = ctx("outbox-drain");
        let begin = Instant::now();
        let first = tick_once(&job, &busy, None::<&NoLease>, Duration::from_secs(30), &c);
        let second = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let at = Instant::now();
            let out = tick_once(&job, &busy, None::<&NoLease>, Duration::from_secs(30), &c).await;
            assert_eq!(at.elapsed(), Duration::ZERO);
            out
        };
        let (first, second) = tokio::join!(first, second);
        assert!(matches!(first, TickOutcome::Ran(_)), "{first:?}");
        assert_eq!(second, TickOutcome::SkippedBusy);
        assert_eq!(begin.elapsed(), Duration::from_secs(10));
        assert_eq!(job.runs.load(Ordering::SeqCst), 1);
        assert_eq!(busy.skipped(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_timed_tick_began_once_its_lease_was_held_not_when_it_asked() {
        let lease = Arc::new(FakeLease {
            acquire_delay: Duration::from_millis(300),
            ..FakeLease::default()
        });
        let mut job = Drain::new(Duration::from_millis(100));
        job.lease = Some(Arc::clone(&lease));
        let busy = SkipIfBusy::new("outbox-drain");
        let c = ctx("outbox-drain");
        let asked = Instant::now();
        let tick = tick_once_timed(&job, &busy, Some(&lease), Duration::from_secs(5), &c).await;
        assert!(
            matches!(tick.outcome, TickOutcome::Ran(_)),
            "{:?}",
            tick.outcome
        );
        let began = tick.began.expect("the tick ran");
        assert_eq!(began - asked, Duration::from_millis(300));

        let other_replica = lease.try_acquire("outbox-drain").await.unwrap().unwrap();
        let skipped = tick_once_timed(&job, &busy, Some(&lease), Duration::from_secs(5), &c).await;
        assert!(matches!(skipped.outcome, TickOutcome::SkippedLease));
        assert!(skipped.began.is_none(), "a skipped tick did no work");
        assert!(skipped.ended.is_none(), "a skipped tick did no work");
        drop(other_replica);
    }

    #[tokio::test(start_paused = true)]
    async fn a_timed_tick_ended_before_its_lease_was_given_back() {
        let lease = Arc::new(FakeLease {
            release_delay: Duration::from_millis(200),
            ..FakeLease::default()
        });
        let mut job = Drain::new(Duration::from_millis(100));
        job.lease = Some(Arc::clone(&lease));
        let busy = SkipIfBusy::new("outbox-drain");
        let c = ctx("outbox-drain");
        let tick = tick_once_timed(&job, &busy, Some(&lease), Duration::from_secs(5), &c).await;
        let returned = Instant::now();
        let (began, ended) = (tick.began.expect("ran"), tick.ended.expect("ran"));
        assert_eq!(ended - began, Duration::from_millis(100));
        assert_eq!(returned - ended, Duration::from_millis(200), "the release");
        assert_eq!(lease.released.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn tick_once_skips_when_another_replica_holds_the_lease() {
        let lease = Arc::new(FakeLease::default());
        let mut job = Drain::new(Duration::from_secs(1));
        job.lease = Some(Arc::clone(&lease));
        let busy = SkipIfBusy::new("outbox-drain");
        let c = ctx("outbox-drain");

        let other_replica = lease.try_acquire("outbox-drain").await.unwrap().unwrap();
        let out = tick_once(&job, &busy, Some(&lease), Duration::from_secs(5), &c).await;
        assert_eq!(out, TickOutcome::SkippedLease);
        assert_eq!(job.runs.load(Ordering::SeqCst), 0);
        assert_eq!(busy.skipped(), 0, "a lease skip is not a busy skip");

        drop(other_replica);
        let out = tick_once(&job, &busy, Some(&lease), Duration::from_secs(5), &c).await;
        assert!(matches!(out, TickOutcome::Ran(_)), "{out:?}");
        assert!(
            lease.held.lock().unwrap().is_empty(),
            "the lease is given back after the tick"
        );
        assert_eq!(job.runs.load(Ordering::SeqCst), 1);
        assert_eq!(
            lease.released.load(Ordering::SeqCst),
            1,
            "the lease is released in order, not merely dropped"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn tick_once_releases_the_lease_after_a_failed_tick_too() {
        let lease = Arc::new(FakeLease::default());
        let mut job = Drain::new(Duration::from_secs(60));
        job.lease = Some(Arc::clone(&lease));
        let busy = SkipIfBusy::new("outbox-drain");
        let out = tick_once(
            &job,
            &busy,
            Some(&lease),
            Duration::from_secs(5),
            &ctx("outbox-drain"),
        )
        .await;
        assert!(matches!(out, TickOutcome::Failed(_)), "{out:?}");
        assert_eq!(lease.released.load(Ordering::SeqCst), 1);
        assert!(lease.held.lock().unwrap().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn tick_once_cancels_the_tick_when_the_lease_is_lost() {
        let lease = Arc::new(FakeLease {
            lose_after: Some(Duration::from_secs(2)),
            ..FakeLease::default()
        });
        let job = Drain::new(Duration::from_secs(3_600));
        let busy = SkipIfBusy::new("outbox-drain");
        let begin = Instant::now();
        let out = tick_once(
            &job,
            &busy,
            Some(&lease),
            Duration::from_secs(30),
            &ctx("outbox-drain"),
        )
        .await;
        assert_eq!(
            begin.elapsed(),
            Duration::from_secs(2),
            "cancelled when lost"
        );
        assert_eq!(
            out,
            TickOutcome::Failed(Failure::transient(
                "job `outbox-drain` lost its lease mid-tick: the session ended"
            ))
        );
        assert_eq!(
            lease.released.load(Ordering::SeqCst),
            0,
            "a lost lease is dropped, not released"
        );
        assert!(lease.held.lock().unwrap().is_empty());
        assert!(!busy.is_busy());
    }

    #[tokio::test(start_paused = true)]
    async fn tick_once_reports_a_lease_that_cannot_be_asked_for() {
        let lease = Arc::new(FakeLease {
            down: true,
            ..FakeLease::default()
        });
        let job = Drain::new(Duration::ZERO);
        let busy = SkipIfBusy::new("outbox-drain");
        let out = tick_once(
            &job,
            &busy,
            Some(&lease),
            Duration::from_secs(5),
            &ctx("outbox-drain"),
        )
        .await;
        assert_eq!(
            out,
            TickOutcome::Failed(Failure::transient(
                "acquiring the lease of job `outbox-drain`: database unreachable"
            ))
        );
        assert_eq!(job.runs.load(Ordering::SeqCst), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn tick_once_times_out_and_survives_a_panic() {
        let mut job = Drain::new(Duration::from_secs(3_600));
        job.panic_on = Some(1);
        let busy = SkipIfBusy::new("outbox-drain");
        let begin = Instant::now();
        let out = tick_once(
            &job,
            &busy,
            None::<&NoLease>,
            Duration::from_secs(30),
            &ctx("outbox-drain").with_tick(0),
        )
        .await;
        assert_eq!(
            out,
            TickOutcome::Failed(Failure::transient(
                "job `outbox-drain` exceeded its 30s timeout"
            ))
        );
        assert_eq!(begin.elapsed(), Duration::from_secs(30));

        let out = tick_once(
            &job,
            &busy,
            None::<&NoLease>,
            Duration::from_secs(30),
            &ctx("outbox-drain").with_tick(1),
        )
        .await;
        assert_eq!(
            out,
            TickOutcome::Failed(Failure::transient(
                "job `outbox-drain` panicked: tick 1 blew up"
            ))
        );
        assert!(!busy.is_busy(), "the busy guard is free after a panic");

        job.hold = Duration::ZERO;
        let out = tick_once(
            &job,
            &busy,
            None::<&NoLease>,
            Duration::from_secs(30),
            &ctx("outbox-drain").with_tick(2),
        )
        .await;
        assert_eq!(
            out,
            TickOutcome::Ran(TickReport {
                items: 2,
                detail: Some("drained".into())
            })
        );
    }

    #[tokio::test(start_paused = true)]
    async fn tick_once_is_cancelled_with_its_context() {
        let job = Drain::new(Duration::from_secs(3_600));
        let busy = SkipIfBusy::new("outbox-drain");
        let c = ctx("outbox-drain");
        let begin = Instant::now();
        let stop = async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            c.cancel.cancel();
        };
        let ((), out) = tokio::join!(
            stop,
            tick_once(&job, &busy, None::<&NoLease>, Duration::from_secs(30), &c)
        );
        assert_eq!(out, TickOutcome::Cancelled);
        assert_eq!(begin.elapsed(), Duration::from_secs(2));
        assert_eq!(
            tick_once(&job, &busy, None::<&NoLease>, Duration::from_secs(30), &c).await,
            TickOutcome::Cancelled,
            "nothing starts under a cancelled context"
        );
        assert_eq!(job.runs.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn tick_once_future_is_send() {
        fn assert_send<T: Send>(_: &T) {}
        let job = Drain::new(Duration::ZERO);
        let busy = SkipIfBusy::new("outbox-drain");
        let lease = Arc::new(FakeLease::default());
        let c = ctx("outbox-drain");
        assert_send(&tick_once(
            &job,
            &busy,
            Some(&lease),
            Duration::from_secs(1),
            &c,
        ));
        let mailer = Mailer::default();
        assert_send(&execute_once(&mailer, &c, b"{}"));
    }
}
