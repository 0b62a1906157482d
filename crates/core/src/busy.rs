//! Skip-if-busy: a timer tick that finds the previous tick of the same job still running is
//! skipped, never queued behind it and never run beside it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// A one-slot guard per timer job within this process. Across replicas the
/// [`SingletonLease`](crate::lease::SingletonLease) does the same job.
#[derive(Debug)]
pub struct SkipIfBusy {
    job: String,
    running: AtomicBool,
    skipped: AtomicU64,
}

/// What [`SkipIfBusy::try_run`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Busy<T> {
    /// The work ran to completion with this value.
    Ran(T),
    /// The previous run was still going; the work was dropped without being polled.
    Skipped,
}

impl<T> Busy<T> {
    /// The value, if the work ran.
    pub fn ran(self) -> Option<T> {
        match self {
            Self::Ran(value) => Some(value),
            Self::Skipped => None,
        }
    }
}

/// Clears the running flag however the run ends: completion, panic or the future being dropped.
struct Running<'a>(&'a AtomicBool);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl SkipIfBusy {
    pub fn new(job: impl Into<String>) -> Self {
        Self {
            job: job.into(),
            running: AtomicBool::new(false),
            skipped: AtomicU64::new(0),
        }
    }

    /// The job this guard belongs to.
    pub fn job(&self) -> &str {
        &self.job
    }

    /// Runs `work` if the previous run finished; otherwise returns [`Busy::Skipped`] at once,
    /// logs a warning naming the job and counts the skip. Never queues and never blocks.
    pub async fn try_run<T, Fut: Future<Output = T>>(&self, work: Fut) -> Busy<T> {
        if self
            .running
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            let skipped = self.skipped.fetch_add(1, Ordering::Relaxed) + 1;
            tracing::warn!(job = %self.job, skipped, "previous run still in progress; skipping this one");
            return Busy::Skipped;
        }
        let _running = Running(&self.running);
        Busy::Ran(work.await)
    }

    /// Whether a run is in progress right now.
    pub fn is_busy(&self) -> bool {
        self.running.load(Ordering::Acquire)
    }

    /// How many runs were skipped since this guard was made.
    pub fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use std::panic::AssertUnwindSafe;
    use std::time::Duration;

    use futures::FutureExt;
    use tokio::time::Instant;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_overlapping_run_is_skipped_at_once_and_the_first_completes() {
        let busy = SkipIfBusy::new("outbox-drain");
        let begin = Instant::now();
        let first = busy.try_run(async {
            tokio::time::sleep(Duration::from_secs(10)).await;
            "first"
        });
        let second = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            assert!(busy.is_busy());
            let at = Instant::now();
            let polled = std::sync::atomic::AtomicBool::new(false);
            let outcome = busy
                .try_run(async {
                    polled.store(true, Ordering::SeqCst);
                    "second"
                })
                .await;
            assert_eq!(at.elapsed(), Duration::ZERO, "a skip does not wait");
            assert!(
                !polled.load(Ordering::SeqCst),
                "skipped work is never polled"
            );
            outcome
        };
        let (first, second) = tokio::join!(first, second);
        assert_eq!(first, Busy::Ran("first"));
        assert_eq!(second, Busy::Skipped);
        assert_eq!(begin.elapsed(), Duration::from_secs(10));
        assert_eq!(busy.skipped(), 1);
        assert!(!busy.is_busy());

        assert_eq!(
            busy.try_run(async { 3 }).await.ran(),
            Some(3),
            "free again once the first finished"
        );
        assert_eq!(busy.skipped(), 1);
        assert_eq!(busy.job(), "outbox-drain");
    }

    #[tokio::test]
    async fn a_panicking_or_dropped_run_frees_the_guard() {
        let busy = SkipIfBusy::new("j");
        let panicked = AssertUnwindSafe(busy.try_run(async {
            if busy.is_busy() {
                panic!("boom");
            }
            1
        }))
        .catch_unwind()
        .await;
        assert!(panicked.is_err());
        assert!(!busy.is_busy());

        let mut pending = Box::pin(busy.try_run(std::future::pending::<()>()));
        assert!((&mut pending).now_or_never().is_none());
        assert!(busy.is_busy());
        drop(pending);
        assert!(!busy.is_busy());
        assert_eq!(busy.try_run(async { 1 }).await, Busy::Ran(1));
        assert_eq!(busy.skipped(), 0);
    }
}
