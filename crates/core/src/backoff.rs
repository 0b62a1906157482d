//! [`Backoff`]: the wait of a loop that keeps trying until it succeeds or is stopped (a
//! reconnect, a listener, a connect at start), where [`Retry`](crate::Retry) bounds the tries
//! of one unit of work. Both grow by [`RetryPolicy::delay_for`], the one backoff formula.

use std::time::Duration;

use crate::RetryPolicy;

/// Waits that double from `first` up to `max`, and start over after a success.
#[derive(Debug, Clone)]
pub struct Backoff {
    policy: RetryPolicy,
    failures: u32,
}

impl Backoff {
    pub fn doubling(first: Duration, max: Duration) -> Self {
        Self {
            policy: RetryPolicy {
                max_tries: u32::MAX,
                base_delay: first,
                factor: 2.0,
                max_delay: max.max(first),
                jitter: false,
            },
            failures: 0,
        }
    }

    /// Each wait drawn from `[d/2, d]` instead of `d` (see
    /// [`RetryPolicy::jittered_delay_for`]), so that processes cut off together do not all
    /// come back at the same instant.
    #[must_use]
    pub fn jittered(mut self) -> Self {
        self.policy.jitter = true;
        self
    }

    /// The wait after the failures so far, without counting another, before any jitter.
    pub fn current(&self) -> Duration {
        // `delay_for(2)` is the first wait: try 1 has none.
        self.policy.delay_for(self.failures.saturating_add(2))
    }

    /// The wait to sleep now; the next one is twice as long, up to the cap.
    pub fn next_wait(&mut self) -> Duration {
        let wait = self
            .policy
            .jittered_delay_for(self.failures.saturating_add(2));
        self.failures = self.failures.saturating_add(1);
        wait
    }

    /// After a success: the next wait is the first again.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_cap_and_start_over_after_a_reset() {
        let mut backoff = Backoff::doubling(Duration::from_millis(100), Duration::from_millis(500));
        let waits: Vec<u64> = (0..5)
            .map(|_| backoff.next_wait().as_millis() as u64)
            .collect();
        assert_eq!(waits, [100, 200, 400, 500, 500]);
        backoff.reset();
        assert_eq!(backoff.next_wait(), Duration::from_millis(100));
    }

    #[test]
    fn a_cap_below_the_first_wait_keeps_the_first() {
        let mut backoff = Backoff::doubling(Duration::from_secs(2), Duration::from_secs(1));
        assert_eq!(backoff.next_wait(), Duration::from_secs(2));
        assert_eq!(backoff.next_wait(), Duration::from_secs(2));
    }

    #[test]
    fn a_jittered_wait_stays_within_half_and_whole() {
        for ms in [10u64, 500, 30_000] {
            let d = Duration::from_millis(ms);
            let mut backoff = Backoff::doubling(d, d).jittered();
            for _ in 0..50 {
                let j = backoff.next_wait();
                assert!(j >= d / 2 && j <= d, "{j:?} for {d:?}");
            }
        }
    }

    #[test]
    fn a_million_failures_never_overflow() {
        let mut backoff = Backoff::doubling(Duration::from_millis(1), Duration::from_secs(10));
        for _ in 0..1_000_000 {
            backoff.next_wait();
        }
        assert_eq!(backoff.current(), Duration::from_secs(10));
    }
}
