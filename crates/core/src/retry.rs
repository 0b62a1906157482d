//! Bounded in-process retry: a few quick tries on a growing delay for micro-failures
//! (a dropped connection, a lock timeout) before the caller gives the work back to the
//! broker's retry tier or to the next tick.
//!
//! [`RetryPolicy`] is the settings half (how many tries, which delays) and is plain data;
//! [`Retry`] is the loop that runs a unit of work under it, each try under its own timeout and
//! cancellation token, reporting every try to an [`AttemptObserver`].

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::failure::Failure;
use crate::job::WorkContext;
use crate::timeout::{UnitError, run_unit};

/// How many times to try a unit of work in process and how long to wait between tries.
///
/// The delay before try `n` (for `n >= 2`) is `base_delay * factor^(n-2)`, capped at
/// `max_delay`; with `jitter` on, the actual wait is drawn from `[d/2, d]` ("equal jitter")
/// so that replicas failing together do not retry in lock step.
///
/// "Tries" are in-process runs of one unit of work; "attempts" are deliveries of a message
/// across parks (`ConsumerSettings::max_attempts`). In TOML: `max_tries = 3`,
/// `base_delay = "200ms"`, `factor = 2.0`, `max_delay = "30s"`, `jitter = true`; every key is
/// optional and unknown keys are rejected (`max_attempts`, this key's old name, still reads).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryPolicy {
    /// Tries in all, the first included. Zero is read as one (see [`RetryPolicy::tries`]).
    #[serde(alias = "max_attempts")]
    pub max_tries: u32,
    /// The wait before the second try.
    #[serde(with = "humantime_serde")]
    pub base_delay: Duration,
    /// How much each wait grows over the previous one; at least 1.
    pub factor: f64,
    /// No wait is longer than this.
    #[serde(with = "humantime_serde")]
    pub max_delay: Duration,
    /// Spread each wait over `[d/2, d]`.
    pub jitter: bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_tries: 3,
            base_delay: Duration::from_millis(200),
            factor: 2.0,
            max_delay: Duration::from_secs(30),
            jitter: true,
        }
    }
}

impl RetryPolicy {
    /// A policy that tries once and never waits.
    pub fn no_retry() -> Self {
        Self {
            max_tries: 1,
            ..Self::default()
        }
    }

    /// Tries in all: `max_tries`, with a floor of one.
    pub fn tries(&self) -> u32 {
        self.max_tries.max(1)
    }

    /// The wait before try `try_number` (1-based), without jitter: zero for the first try, then
    /// `base_delay * factor^(try_number-2)` capped at `max_delay`.
    ///
    /// Total for every input: a factor below one, NaN or infinite, a huge try number or
    /// a base above the cap never panic; the result never decreases as `try_number` grows and
    /// never exceeds `max_delay`. A factor that is not a number, or below one, counts as one.
    pub fn delay_for(&self, try_number: u32) -> Duration {
        if try_number <= 1 {
            return Duration::ZERO;
        }
        let cap = self.max_delay;
        let base = self.base_delay.min(cap);
        // `f64::max` returns the other operand for NaN, so NaN and anything below one become one.
        let factor = self.factor.max(1.0);
        let exponent = try_number - 2;
        if base.is_zero() || exponent == 0 || factor == 1.0 {
            return base;
        }
        let nanos = base.as_nanos() as f64 * factor.powf(f64::from(exponent));
        let cap_nanos = cap.as_nanos() as f64;
        if !nanos.is_finite() || nanos >= cap_nanos {
            return cap;
        }
        // `as` from a finite, non-negative f64 saturates; the result is below the cap here.
        let nanos = nanos.round() as u128;
        let secs = u64::try_from(nanos / 1_000_000_000).unwrap_or(u64::MAX);
        let subsec = (nanos % 1_000_000_000) as u32;
        Duration::new(secs, subsec).min(cap)
    }

    /// The wait before try `try_number` as actually slept: with `jitter` on, uniformly drawn
    /// from `[d/2, d]` where `d = delay_for(try_number)`; otherwise exactly `d`.
    pub fn jittered_delay_for(&self, try_number: u32) -> Duration {
        let delay = self.delay_for(try_number);
        if !self.jitter || delay.is_zero() {
            return delay;
        }
        let half = delay / 2;
        let spread = delay - half;
        let fraction: f64 = rand::random();
        let extra = Duration::try_from_secs_f64(spread.as_secs_f64() * fraction).unwrap_or(spread);
        (half + extra.min(spread)).min(delay)
    }

    /// Checks the settings an operator wrote: `factor` finite and at least one, `base_delay`
    /// no longer than `max_delay`. The message names the offending field.
    pub fn validate(&self) -> Result<(), String> {
        if !self.factor.is_finite() || self.factor < 1.0 {
            return Err(format!(
                "`factor` must be a finite number of at least 1, got {}",
                self.factor
            ));
        }
        if self.base_delay > self.max_delay {
            return Err(format!(
                "`base_delay` ({}) must not be longer than `max_delay` ({})",
                humantime::format_duration(self.base_delay),
                humantime::format_duration(self.max_delay)
            ));
        }
        Ok(())
    }
}

/// How one try ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TryOutcome {
    Succeeded,
    Failed,
    /// The parent token fired while the try ran; not a failure of the work.
    Cancelled,
}

impl TryOutcome {
    /// `succeeded`, `failed` or `cancelled`: stable names for logs and metrics.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for TryOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One try, as reported to an [`AttemptObserver`].
#[derive(Debug, Clone, Copy)]
pub struct TryRecord<'a> {
    pub job: &'a str,
    /// The try number within this run, from 1.
    pub try_number: u32,
    pub outcome: TryOutcome,
    /// Set when `outcome` is [`TryOutcome::Failed`].
    pub failure: Option<&'a Failure>,
    /// How long the try ran (waits excluded).
    pub duration: Duration,
    /// Whether another try follows this one.
    pub will_retry: bool,
}

/// Sees every try [`Retry::run`] makes: the hook for attempt logs and metrics.
pub trait AttemptObserver: Send + Sync {
    fn on_try(&self, record: &TryRecord<'_>);
}

/// An observer that ignores every try.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoObserver;

impl AttemptObserver for NoObserver {
    fn on_try(&self, _record: &TryRecord<'_>) {}
}

static NO_OBSERVER: NoObserver = NoObserver;

/// How a [`Retry::run`] ended; `tries` counts the tries made.
#[derive(Debug)]
pub enum RetryOutcome<T> {
    Succeeded {
        value: T,
        tries: u32,
    },
    /// The last failure: permanent, the tries ran out, or the budget had no room for another.
    Failed {
        failure: Failure,
        tries: u32,
    },
    /// The parent token fired, during a try or a wait.
    Cancelled {
        tries: u32,
    },
}

impl<T> RetryOutcome<T> {
    /// The number of tries made.
    pub fn tries(&self) -> u32 {
        match self {
            Self::Succeeded { tries, .. }
            | Self::Failed { tries, .. }
            | Self::Cancelled { tries } => *tries,
        }
    }
}

/// The retry loop for one unit of work: a policy, a per-try timeout, an optional total budget,
/// the parent cancellation token and an observer.
pub struct Retry<'a> {
    job: &'a str,
    policy: &'a RetryPolicy,
    per_try_timeout: Duration,
    budget: Option<Duration>,
    wait_budget: Option<Duration>,
    parent: &'a CancellationToken,
    observer: &'a dyn AttemptObserver,
}

impl fmt::Debug for Retry<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Retry")
            .field("job", &self.job)
            .field("policy", self.policy)
            .field("per_try_timeout", &self.per_try_timeout)
            .field("budget", &self.budget)
            .field("wait_budget", &self.wait_budget)
            .field("parent_cancelled", &self.parent.is_cancelled())
            .finish_non_exhaustive()
    }
}

impl<'a> Retry<'a> {
    /// A loop for `job` under `policy`, each try bounded by `per_try_timeout` and cancelled
    /// with `parent`.
    pub fn new(
        job: &'a str,
        policy: &'a RetryPolicy,
        per_try_timeout: Duration,
        parent: &'a CancellationToken,
    ) -> Self {
        Self {
            job,
            policy,
            per_try_timeout,
            budget: None,
            wait_budget: None,
            parent,
            observer: &NO_OBSERVER,
        }
    }

    /// Bounds the whole run, tries and waits together, to `total`. A try never runs past the
    /// budget (its timeout is shortened to what is left), and no wait starts that would
    /// leave no time for the try after it.
    #[must_use]
    pub fn budget(mut self, total: Duration) -> Self {
        self.budget = Some(total);
        self
    }

    /// Bounds the time spent waiting between tries to `total`, all waits together: a wait
    /// that would cross it (a throttled failure asking for an hour, say) is not waited out in
    /// memory; the run ends with that failure instead, so that the caller can hand the work
    /// back (a consumer parks it in a retry tier) without holding it.
    #[must_use]
    pub fn wait_budget(mut self, total: Duration) -> Self {
        self.wait_budget = Some(total);
        self
    }

    /// Reports every try to `observer`.
    #[must_use]
    pub fn observer(mut self, observer: &'a dyn AttemptObserver) -> Self {
        self.observer = observer;
        self
    }

    /// Tries `op` up to `policy.tries()` times.
    ///
    /// Each try gets a copy of `base` whose `cancel` is a child of the parent token, cancelled
    /// at the try's deadline, and whose `try_number` is the try's number; it runs through
    /// [`run_unit`], so a try that overruns is dropped and a panic becomes a transient failure.
    /// Between tries the loop waits `jittered_delay_for(next)`, or the throttled failure's
    /// `retry_after` when that is longer. A permanent failure and an unknown outcome
    /// ([`Failure::retries_in_process`]) stop at once; the parent firing,
    /// during a try or a wait, ends the run as [`RetryOutcome::Cancelled`] without delay.
    pub async fn run<T, F, Fut>(&self, base: &WorkContext, mut op: F) -> RetryOutcome<T>
    where
        F: FnMut(WorkContext) -> Fut,
        Fut: Future<Output = Result<T, Failure>> + Send,
        T: Send,
    {
        let started = Instant::now();
        let max_tries = self.policy.tries();
        let mut try_number = 0;
        let mut waited = Duration::ZERO;
        loop {
            if self.parent.is_cancelled() {
                return RetryOutcome::Cancelled { tries: try_number };
            }
            try_number += 1;
            let limit = match self.budget {
                Some(total) => self
                    .per_try_timeout
                    .min(total.saturating_sub(started.elapsed())),
                None => self.per_try_timeout,
            };
            let try_started = Instant::now();
            let unit = base.begin_try(limit);
            let result = run_unit(self.job, limit, self.parent, |token| {
                let mut ctx = base.clone();
                ctx.cancel = token;
                ctx.try_number = try_number;
                op(ctx)
            })
            .await;
            drop(unit);
            let duration = try_started.elapsed();
            let failure = match result {
                Ok(value) => {
                    self.report(try_number, TryOutcome::Succeeded, None, duration, false);
                    return RetryOutcome::Succeeded {
                        value,
                        tries: try_number,
                    };
                }
                Err(UnitError::Cancelled) => {
                    self.report(try_number, TryOutcome::Cancelled, None, duration, false);
                    return RetryOutcome::Cancelled { tries: try_number };
                }
                Err(UnitError::Failed(failure)) => failure,
            };
            let wait = if !failure.retries_in_process() || try_number >= max_tries {
                None
            } else {
                let wait = self.wait_before(try_number + 1, &failure);
                (self.fits_budget(started, wait) && self.fits_wait_budget(waited, wait))
                    .then_some(wait)
            };
            self.report(
                try_number,
                TryOutcome::Failed,
                Some(&failure),
                duration,
                wait.is_some(),
            );
            let Some(wait) = wait else {
                return RetryOutcome::Failed {
                    failure,
                    tries: try_number,
                };
            };
            tracing::warn!(
                job = self.job,
                try_number,
                class = failure.class().as_str(),
                error = %failure,
                retry_in = %humantime::format_duration(wait),
                "try failed; retrying"
            );
            tokio::select! {
                biased;
                () = self.parent.cancelled() => return RetryOutcome::Cancelled { tries: try_number },
                () = tokio::time::sleep(wait) => {}
            }
            waited += wait;
        }
    }

    fn wait_before(&self, next_try: u32, failure: &Failure) -> Duration {
        let backoff = self.policy.jittered_delay_for(next_try);
        failure
            .retry_after()
            .map_or(backoff, |least| backoff.max(least))
    }

    /// Whether, after waiting `wait`, some of the budget is left for a try.
    fn fits_budget(&self, started: Instant, wait: Duration) -> bool {
        match self.budget {
            None => true,
            Some(total) => started
                .elapsed()
                .checked_add(wait)
                .is_some_and(|resume_at| resume_at < total),
        }
    }

    /// Whether waiting `wait` more keeps all the waits within the wait budget.
    fn fits_wait_budget(&self, waited: Duration, wait: Duration) -> bool {
        self.wait_budget
            .is_none_or(|total| waited.saturating_add(wait) <= total)
    }

    fn report(
        &self,
        try_number: u32,
        outcome: TryOutcome,
        failure: Option<&Failure>,
        duration: Duration,
        will_retry: bool,
    ) {
        self.observer.on_try(&TryRecord {
            job: self.job,
            try_number,
            outcome,
            failure,
            duration,
            will_retry,
        });
    }
}

/// Runs `op` until it succeeds or `budget` is spent, retrying every failure whatever its
/// class, on `policy`'s growing delays (its `max_tries` is ignored).
///
/// For recording an outcome that is already decided (the SMTP server accepted the mail, the
/// webhook answered 2xx): giving up early, or on a "permanent" database error, would record
/// the wrong thing. Returns the last failure, as transient, once the budget is spent. Not
/// cancelled by shutdown: the budget bounds it.
pub async fn persist<T, F, Fut>(
    job: &str,
    budget: Duration,
    policy: &RetryPolicy,
    mut op: F,
) -> Result<T, Failure>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Failure>> + Send,
    T: Send,
{
    let policy = RetryPolicy {
        max_tries: u32::MAX,
        ..policy.clone()
    };
    let never = CancellationToken::new();
    let ctx = WorkContext::new(job.to_string(), never.clone());
    let outcome = Retry::new(job, &policy, budget, &never)
        .budget(budget)
        .run(&ctx, |_| {
            let this_try = op();
            async move {
                this_try.await.map_err(|failure| match failure {
                    Failure::Transient { .. } => failure,
                    other => Failure::transient(other),
                })
            }
        })
        .await;
    match outcome {
        RetryOutcome::Succeeded { value, .. } => Ok(value),
        RetryOutcome::Failed { failure, .. } => Err(failure),
        RetryOutcome::Cancelled { .. } => Err(Failure::transient(format!(
            "{job}: cancelled while persisting"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn steady(max_tries: u32, base: Duration) -> RetryPolicy {
        RetryPolicy {
            max_tries,
            base_delay: base,
            factor: 2.0,
            max_delay: Duration::from_secs(30),
            jitter: false,
        }
    }

    /// One reported try: try_number, outcome, failure text, will_retry, duration.
    type Seen = (u32, TryOutcome, Option<String>, bool, Duration);

    /// Records what the observer saw, in order.
    #[derive(Debug, Default)]
    struct Recorder {
        tries: Mutex<Vec<Seen>>,
    }

    impl AttemptObserver for Recorder {
        fn on_try(&self, r: &TryRecord<'_>) {
            assert_eq!(r.job, "mailer");
            self.tries.lock().unwrap().push((
                r.try_number,
                r.outcome,
                r.failure.map(ToString::to_string),
                r.will_retry,
                r.duration,
            ));
        }
    }

    fn ctx(token: &CancellationToken) -> WorkContext {
        WorkContext::new("mailer", token.clone()).with_message_id("m-1")
    }

    #[test]
    fn defaults_match_the_documented_policy() {
        let p = RetryPolicy::default();
        assert_eq!(
            (p.max_tries, p.base_delay, p.factor, p.max_delay, p.jitter),
            (3, ms(200), 2.0, Duration::from_secs(30), true)
        );
        assert_eq!(p.validate(), Ok(()));
        assert_eq!(RetryPolicy::no_retry().tries(), 1);
    }

    #[test]
    fn delay_schedule_doubles_from_the_base_and_stops_at_the_cap() {
        let p = steady(12, ms(200));
        let schedule: Vec<Duration> = (1..=11).map(|a| p.delay_for(a)).collect();
        assert_eq!(
            schedule,
            [
                Duration::ZERO,
                ms(200),
                ms(400),
                ms(800),
                ms(1_600),
                ms(3_200),
                ms(6_400),
                ms(12_800),
                ms(25_600),
                Duration::from_secs(30),
                Duration::from_secs(30),
            ]
        );
        assert_eq!(p.delay_for(0), Duration::ZERO);
        assert_eq!(p.delay_for(u32::MAX), Duration::from_secs(30));
    }

    #[test]
    fn delay_for_survives_hostile_settings() {
        let cap = Duration::from_secs(10);
        let mut p = RetryPolicy {
            max_tries: 0,
            base_delay: ms(100),
            factor: f64::NAN,
            max_delay: cap,
            jitter: false,
        };
        assert_eq!(p.tries(), 1);
        assert_eq!(p.delay_for(50), ms(100), "NaN factor counts as one");
        p.factor = f64::INFINITY;
        assert_eq!(p.delay_for(2), ms(100));
        assert_eq!(p.delay_for(3), cap);
        p.factor = 0.5;
        assert_eq!(p.delay_for(9), ms(100), "a shrinking factor counts as one");
        p.factor = f64::MAX;
        assert_eq!(p.delay_for(u32::MAX), cap);
        p.base_delay = Duration::MAX;
        assert_eq!(p.delay_for(2), cap, "a base above the cap is capped");
        p.max_delay = Duration::MAX;
        assert_eq!(p.delay_for(3), Duration::MAX);
        p.base_delay = Duration::ZERO;
        assert_eq!(p.delay_for(u32::MAX), Duration::ZERO);
    }

    #[test]
    fn jitter_stays_within_half_to_full_delay() {
        let p = RetryPolicy {
            max_tries: 10,
            ..RetryPolicy::default()
        };
        let mut seen_below_full = false;
        for _ in 0..200 {
            let d = p.delay_for(4);
            let j = p.jittered_delay_for(4);
            assert!(j >= d / 2 && j <= d, "{j:?} outside [{:?}, {d:?}]", d / 2);
            seen_below_full |= j < d;
        }
        assert!(seen_below_full, "jitter never moved the delay");
        assert_eq!(p.jittered_delay_for(1), Duration::ZERO);
        let fixed = RetryPolicy { jitter: false, ..p };
        assert_eq!(fixed.jittered_delay_for(4), ms(800));
    }

    #[test]
    fn validate_names_the_field() {
        let bad_factor = RetryPolicy {
            factor: 0.5,
            ..RetryPolicy::default()
        };
        assert!(bad_factor.validate().unwrap_err().contains("`factor`"));
        let nan = RetryPolicy {
            factor: f64::NAN,
            ..RetryPolicy::default()
        };
        assert!(nan.validate().unwrap_err().contains("`factor`"));
        let inverted = RetryPolicy {
            base_delay: Duration::from_secs(60),
            ..RetryPolicy::default()
        };
        let msg = inverted.validate().unwrap_err();
        assert!(
            msg.contains("`base_delay` (1m)") && msg.contains("`max_delay` (30s)"),
            "{msg}"
        );
    }

    #[test]
    fn the_old_key_max_attempts_still_reads_as_max_tries() {
        let p: RetryPolicy = serde_json::from_str(r#"{"max_attempts": 7}"#).unwrap();
        assert_eq!(p.max_tries, 7);
    }

    #[test]
    fn policy_reads_humane_durations_and_rejects_unknown_keys() {
        let p: RetryPolicy =
            serde_json::from_str(r#"{"max_tries": 5, "base_delay": "1s 500ms"}"#).unwrap();
        assert_eq!(
            p,
            RetryPolicy {
                max_tries: 5,
                base_delay: ms(1_500),
                ..RetryPolicy::default()
            }
        );
        let err = serde_json::from_str::<RetryPolicy>(r#"{"max_atempts": 5}"#).unwrap_err();
        assert!(err.to_string().contains("max_atempts"), "{err}");
        let round_trip: RetryPolicy =
            serde_json::from_value(serde_json::to_value(&p).unwrap()).unwrap();
        assert_eq!(round_trip, p);
    }

    #[tokio::test(start_paused = true)]
    async fn each_try_is_in_progress_in_the_liveness_only_while_it_runs() {
        let parent = CancellationToken::new();
        let policy = steady(2, ms(500));
        let liveness = crate::liveness::Liveness::default();
        let during = Mutex::new(Vec::new());
        let outcome = Retry::new("mailer", &policy, Duration::from_secs(5), &parent)
            .run(&ctx(&parent).with_liveness(liveness.clone()), |_| {
                during.lock().unwrap().push(liveness.running());
                async { Err::<(), _>(Failure::transient("connection reset")) }
            })
            .await;
        assert!(matches!(outcome, RetryOutcome::Failed { tries: 2, .. }));
        assert_eq!(*during.lock().unwrap(), [1, 1], "one unit a try");
        assert_eq!(liveness.running(), 0, "none after the last try");
    }

    #[tokio::test(start_paused = true)]
    async fn waits_follow_the_schedule_between_tries() {
        let parent = CancellationToken::new();
        let policy = steady(4, ms(200));
        let starts = Mutex::new(Vec::new());
        let begin = Instant::now();
        let outcome = Retry::new("mailer", &policy, Duration::from_secs(5), &parent)
            .run(&ctx(&parent), |c| {
                starts.lock().unwrap().push((c.try_number, begin.elapsed()));
                async { Err::<(), _>(Failure::transient("connection reset")) }
            })
            .await;
        assert!(
            matches!(outcome, RetryOutcome::Failed { tries: 4, ref failure } if failure.detail() == "connection reset")
        );
        assert_eq!(
            *starts.lock().unwrap(),
            [(1, ms(0)), (2, ms(200)), (3, ms(600)), (4, ms(1_400))]
        );
        assert_eq!(begin.elapsed(), ms(1_400), "no wait after the last try");
    }

    #[tokio::test(start_paused = true)]
    async fn succeeds_on_a_later_try_with_the_value() {
        let parent = CancellationToken::new();
        let policy = steady(3, ms(200));
        let calls = AtomicU32::new(0);
        let outcome = Retry::new("mailer", &policy, Duration::from_secs(5), &parent)
            .run(&ctx(&parent), |c| {
                calls.fetch_add(1, Ordering::SeqCst);
                async move {
                    assert_eq!(
                        c.message_id.as_deref(),
                        Some("m-1"),
                        "the base context is carried"
                    );
                    if c.try_number < 2 {
                        Err(Failure::transient("busy"))
                    } else {
                        Ok(c.try_number * 10)
                    }
                }
            })
            .await;
        assert!(
            matches!(
                outcome,
                RetryOutcome::Succeeded {
                    value: 20,
                    tries: 2
                }
            ),
            "{outcome:?}"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn cancellation_during_a_wait_returns_at_once() {
        let parent = CancellationToken::new();
        let policy = steady(5, Duration::from_secs(10));
        let begin = Instant::now();
        let canceller = {
            let parent = parent.clone();
            async move {
                tokio::time::sleep(Duration::from_secs(1)).await;
                parent.cancel();
            }
        };
        let calls = AtomicU32::new(0);
        let recorder = Recorder::default();
        let retry =
            Retry::new("mailer", &policy, Duration::from_secs(5), &parent).observer(&recorder);
        let base = ctx(&parent);
        let run = retry.run(&base, |_| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err::<(), _>(Failure::transient("down")) }
        });
        let ((), outcome) = tokio::join!(canceller, run);
        assert!(
            matches!(outcome, RetryOutcome::Cancelled { tries: 1 }),
            "{outcome:?}"
        );
        assert_eq!(
            begin.elapsed(),
            Duration::from_secs(1),
            "stopped when the parent fired, not after the 10s wait"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let tries = recorder.tries.lock().unwrap();
        assert_eq!(tries.len(), 1);
        assert_eq!(
            (tries[0].0, tries[0].1, tries[0].3),
            (1, TryOutcome::Failed, true)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_try_cancelled_by_the_parent_is_cancelled_not_failed() {
        let parent = CancellationToken::new();
        let policy = steady(3, ms(200));
        let recorder = Recorder::default();
        let begin = Instant::now();
        let canceller = {
            let parent = parent.clone();
            async move {
                tokio::time::sleep(Duration::from_secs(2)).await;
                parent.cancel();
            }
        };
        let retry =
            Retry::new("mailer", &policy, Duration::from_secs(60), &parent).observer(&recorder);
        // The work notices its token and reports an error of its own; still a cancellation.
        let base = ctx(&parent);
        let run = retry.run(&base, |c| async move {
            c.cancel.cancelled().await;
            Err::<(), _>(Failure::transient("interrupted"))
        });
        let ((), outcome) = tokio::join!(canceller, run);
        assert!(
            matches!(outcome, RetryOutcome::Cancelled { tries: 1 }),
            "{outcome:?}"
        );
        assert_eq!(begin.elapsed(), Duration::from_secs(2));
        let tries = recorder.tries.lock().unwrap();
        assert_eq!(
            *tries,
            [(
                1,
                TryOutcome::Cancelled,
                None,
                false,
                Duration::from_secs(2)
            )]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_already_cancelled_parent_runs_nothing() {
        let parent = CancellationToken::new();
        parent.cancel();
        let policy = steady(3, ms(200));
        let calls = AtomicU32::new(0);
        let outcome = Retry::new("mailer", &policy, Duration::from_secs(5), &parent)
            .run(&ctx(&parent), |_| {
                calls.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, Failure>(()) }
            })
            .await;
        assert!(
            matches!(outcome, RetryOutcome::Cancelled { tries: 0 }),
            "{outcome:?}"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_permanent_failure_stops_after_one_try() {
        let parent = CancellationToken::new();
        let policy = steady(5, ms(200));
        let calls = AtomicU32::new(0);
        let recorder = Recorder::default();
        let begin = Instant::now();
        let outcome = Retry::new("mailer", &policy, Duration::from_secs(5), &parent)
            .observer(&recorder)
            .run(&ctx(&parent), |_| {
                calls.fetch_add(1, Ordering::SeqCst);
                async { Err::<(), _>(Failure::permanent("smtp-5xx", "550 no such user")) }
            })
            .await;
        match outcome {
            RetryOutcome::Failed { failure, tries } => {
                assert_eq!(tries, 1);
                assert_eq!(failure, Failure::permanent("smtp-5xx", "550 no such user"));
            }
            other => panic!("expected a failure, got {other:?}"),
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(begin.elapsed(), Duration::ZERO);
        let tries = recorder.tries.lock().unwrap();
        assert_eq!(tries.len(), 1);
        assert_eq!((tries[0].1, tries[0].3), (TryOutcome::Failed, false));
    }

    #[tokio::test(start_paused = true)]
    async fn throttled_waits_at_least_retry_after() {
        let parent = CancellationToken::new();
        let policy = steady(3, ms(200));
        let starts = Mutex::new(Vec::new());
        let begin = Instant::now();
        let outcome = Retry::new("mailer", &policy, Duration::from_secs(5), &parent)
            .run(&ctx(&parent), |c| {
                starts.lock().unwrap().push(begin.elapsed());
                async move {
                    match c.try_number {
                        1 => Err(Failure::throttled(Duration::from_secs(7), "429")),
                        // A retry_after shorter than the backoff does not shorten it.
                        2 => Err(Failure::throttled(ms(1), "429")),
                        _ => Ok("sent"),
                    }
                }
            })
            .await;
        assert!(
            matches!(
                outcome,
                RetryOutcome::Succeeded {
                    value: "sent",
                    tries: 3
                }
            ),
            "{outcome:?}"
        );
        assert_eq!(
            *starts.lock().unwrap(),
            [ms(0), Duration::from_secs(7), ms(7_400)]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_total_budget_stops_before_a_wait_that_would_cross_it() {
        let parent = CancellationToken::new();
        let policy = steady(10, Duration::from_secs(1));
        let calls = AtomicU32::new(0);
        let recorder = Recorder::default();
        let begin = Instant::now();
        let outcome =
            Retry::new("mailer", &policy, Duration::from_secs(5), &parent)
                .budget(ms(2_500))
                .observer(&recorder)
                .run(&ctx(&parent), |c| {
                    calls.fetch_add(1, Ordering::SeqCst);
                    async move {
                        Err::<(), _>(Failure::transient(format!("try {} failed", c.try_number)))
                    }
                })
                .await;
        // try 1 at 0s, wait 1s, try 2 at 1s; the next wait (2s) would end at 3s > 2.5s.
        match outcome {
            RetryOutcome::Failed { failure, tries } => {
                assert_eq!(tries, 2);
                assert_eq!(failure.detail(), "try 2 failed", "the last failure is kept");
            }
            other => panic!("expected a failure, got {other:?}"),
        }
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        assert_eq!(begin.elapsed(), Duration::from_secs(1));
        let will_retry: Vec<bool> = recorder.tries.lock().unwrap().iter().map(|t| t.3).collect();
        assert_eq!(will_retry, [true, false]);
    }

    #[tokio::test(start_paused = true)]
    async fn persist_retries_even_permanent_failures_until_it_succeeds() {
        let calls = AtomicU32::new(0);
        let recorded = persist(
            "email-send",
            Duration::from_secs(30),
            &steady(1, ms(100)),
            || {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                async move {
                    match n {
                        0 => Err(Failure::permanent("database-rejected", "XX000")),
                        1 => Err(Failure::transient("connection reset")),
                        _ => Ok("sent"),
                    }
                }
            },
        )
        .await;
        assert_eq!(recorded, Ok("sent"));
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn persist_gives_up_when_the_budget_is_spent() {
        let begin = Instant::now();
        let recorded: Result<(), Failure> = persist(
            "email-send",
            Duration::from_secs(2),
            &steady(1, ms(500)),
            || async { Err(Failure::permanent("database-rejected", "XX000")) },
        )
        .await;
        let failure = recorded.unwrap_err();
        assert_eq!(failure.class(), crate::FailureClass::Transient);
        assert!(failure.detail().contains("XX000"), "{failure}");
        assert!(
            begin.elapsed() < Duration::from_secs(2),
            "{:?}",
            begin.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_throttle_longer_than_the_wait_budget_ends_the_run_at_once() {
        let parent = CancellationToken::new();
        let policy = steady(3, ms(10));
        let calls = AtomicU32::new(0);
        let begin = Instant::now();
        let outcome = Retry::new("webhook", &policy, Duration::from_secs(5), &parent)
            .wait_budget(Duration::from_secs(20))
            .run(&ctx(&parent), |_| {
                calls.fetch_add(1, Ordering::SeqCst);
                async { Err::<(), _>(Failure::throttled(Duration::from_secs(3600), "429")) }
            })
            .await;
        match outcome {
            RetryOutcome::Failed { failure, tries } => {
                assert_eq!(tries, 1);
                assert_eq!(failure.retry_after(), Some(Duration::from_secs(3600)));
            }
            other => panic!("expected the throttled failure back, got {other:?}"),
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(
            begin.elapsed(),
            Duration::ZERO,
            "nothing was waited out in memory"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn waits_within_the_wait_budget_are_waited() {
        let parent = CancellationToken::new();
        let policy = steady(3, ms(10));
        let calls = AtomicU32::new(0);
        let begin = Instant::now();
        let outcome = Retry::new("webhook", &policy, Duration::from_secs(5), &parent)
            .wait_budget(Duration::from_secs(10))
            .run(&ctx(&parent), |c| {
                calls.fetch_add(1, Ordering::SeqCst);
                async move {
                    match c.try_number {
                        // 4 s, then 4 s more: 8 s of the 10 s budget.
                        1 | 2 => Err(Failure::throttled(Duration::from_secs(4), "429")),
                        _ => Ok(()),
                    }
                }
            })
            .await;
        assert!(matches!(outcome, RetryOutcome::Succeeded { tries: 3, .. }));
        assert_eq!(begin.elapsed(), Duration::from_secs(8));
    }

    #[tokio::test(start_paused = true)]
    async fn an_unknown_outcome_is_never_tried_again_in_process() {
        let parent = CancellationToken::new();
        let policy = steady(5, ms(10));
        let calls = AtomicU32::new(0);
        let outcome = Retry::new("email-send", &policy, Duration::from_secs(5), &parent)
            .run(&ctx(&parent), |_| {
                calls.fetch_add(1, Ordering::SeqCst);
                async { Err::<(), _>(Failure::unknown("no answer after the final dot")) }
            })
            .await;
        match outcome {
            RetryOutcome::Failed { failure, tries } => {
                assert_eq!(tries, 1);
                assert!(failure.is_unknown());
                assert_eq!(
                    failure.class(),
                    crate::FailureClass::Transient,
                    "parked, not dead"
                );
            }
            other => panic!("expected the unknown outcome back, got {other:?}"),
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_total_budget_also_cuts_a_long_try_short() {
        let parent = CancellationToken::new();
        let policy = steady(3, ms(200));
        let begin = Instant::now();
        let outcome = Retry::new("mailer", &policy, Duration::from_secs(60), &parent)
            .budget(Duration::from_secs(3))
            .run(&ctx(&parent), |_| {
                std::future::pending::<Result<(), Failure>>()
            })
            .await;
        match outcome {
            RetryOutcome::Failed { failure, tries } => {
                assert_eq!(tries, 1);
                assert_eq!(failure.detail(), "job `mailer` exceeded its 3s timeout");
            }
            other => panic!("expected a failure, got {other:?}"),
        }
        assert_eq!(begin.elapsed(), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn the_observer_sees_every_try_in_order() {
        let parent = CancellationToken::new();
        let policy = steady(4, ms(100));
        let recorder = Recorder::default();
        let outcome = Retry::new("mailer", &policy, Duration::from_secs(1), &parent)
            .observer(&recorder)
            .run(&ctx(&parent), |c| async move {
                match c.try_number {
                    1 => Err(Failure::transient("reset")),
                    2 => {
                        tokio::time::sleep(Duration::from_secs(10)).await;
                        Ok(0)
                    }
                    n => {
                        tokio::time::sleep(ms(50)).await;
                        Ok(n)
                    }
                }
            })
            .await;
        assert!(
            matches!(outcome, RetryOutcome::Succeeded { value: 3, tries: 3 }),
            "{outcome:?}"
        );
        assert_eq!(
            *recorder.tries.lock().unwrap(),
            [
                (
                    1,
                    TryOutcome::Failed,
                    Some("reset".to_string()),
                    true,
                    Duration::ZERO
                ),
                (
                    2,
                    TryOutcome::Failed,
                    Some("job `mailer` exceeded its 1s timeout".to_string()),
                    true,
                    Duration::from_secs(1)
                ),
                (3, TryOutcome::Succeeded, None, false, ms(50)),
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn each_try_gets_its_own_child_token_cancelled_when_it_ends() {
        let parent = CancellationToken::new();
        let policy = steady(2, ms(10));
        let tokens = Mutex::new(Vec::new());
        let outcome = Retry::new("mailer", &policy, Duration::from_secs(1), &parent)
            .run(&ctx(&parent), |c| {
                assert!(!c.cancel.is_cancelled());
                tokens.lock().unwrap().push(c.cancel.clone());
                async { Err::<(), _>(Failure::transient("x")) }
            })
            .await;
        assert_eq!(outcome.tries(), 2);
        let tokens = tokens.lock().unwrap();
        assert_eq!(tokens.len(), 2);
        assert!(
            tokens.iter().all(CancellationToken::is_cancelled),
            "a finished try's token is cancelled"
        );
        assert!(!parent.is_cancelled(), "the parent is untouched");
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_try_is_a_transient_failure_and_the_next_try_runs() {
        let parent = CancellationToken::new();
        let policy = steady(3, ms(200));
        let recorder = Recorder::default();
        let outcome = Retry::new("mailer", &policy, Duration::from_secs(1), &parent)
            .observer(&recorder)
            .run(&ctx(&parent), |c| async move {
                if c.try_number == 1 {
                    panic!("index out of bounds");
                }
                Ok::<_, Failure>("recovered")
            })
            .await;
        assert!(
            matches!(
                outcome,
                RetryOutcome::Succeeded {
                    value: "recovered",
                    tries: 2
                }
            ),
            "{outcome:?}"
        );
        let first = recorder.tries.lock().unwrap()[0].clone();
        assert_eq!(
            first.2.as_deref(),
            Some("job `mailer` panicked: index out of bounds")
        );
    }

    #[test]
    fn the_run_future_is_send() {
        fn assert_send<T: Send>(_: &T) {}
        let parent = CancellationToken::new();
        let policy = RetryPolicy::default();
        let retry = Retry::new("mailer", &policy, Duration::from_secs(1), &parent);
        let base = ctx(&parent);
        let fut = retry.run(&base, |_| async { Ok::<_, Failure>(1) });
        assert_send(&fut);
        assert!(format!("{retry:?}").contains("mailer"));
    }
}
