//! One unit of work, bounded: a deadline, a cancellation token linked to the caller's, and a
//! panic caught and turned into a failure of that unit instead of a crash of the host.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;
use tokio_util::sync::CancellationToken;

use crate::failure::Failure;

/// Why a unit of work did not produce a value.
#[derive(Debug, thiserror::Error)]
pub enum UnitError {
    /// The work failed, overran its deadline or panicked.
    #[error(transparent)]
    Failed(Failure),
    /// The parent token fired: the host is stopping, not the work failing.
    #[error("cancelled")]
    Cancelled,
}

impl UnitError {
    /// The failure, unless the unit was cancelled.
    pub fn into_failure(self) -> Option<Failure> {
        match self {
            Self::Failed(failure) => Some(failure),
            Self::Cancelled => None,
        }
    }
}

/// Runs one unit of work under a child token of `parent` that is cancelled at `limit`.
///
/// * Work that ignores its token is dropped at the deadline anyway, and the result is
///   `Failed(Transient)` with the detail ``"job `x` exceeded its 30s timeout"``.
/// * The parent firing ends the unit at once as [`UnitError::Cancelled`]; so does a failure
///   the work returns after the parent fired (it was most likely caused by the cancellation).
/// * A panic inside the work, including in `work` itself, becomes
///   ``Failed(Transient "job `x` panicked: <message>")``.
///
/// The child token is cancelled whenever the unit ends, so tasks the work started with it stop
/// too.
pub async fn run_unit<T, Fut>(
    job: &str,
    limit: Duration,
    parent: &CancellationToken,
    work: impl FnOnce(CancellationToken) -> Fut,
) -> Result<T, UnitError>
where
    Fut: Future<Output = Result<T, Failure>>,
{
    if parent.is_cancelled() {
        return Err(UnitError::Cancelled);
    }
    let token = parent.child_token();
    let _cancel_on_exit = token.clone().drop_guard();
    let guarded = AssertUnwindSafe(async { work(token.clone()).await }).catch_unwind();
    tokio::select! {
        biased;
        () = parent.cancelled() => Err(UnitError::Cancelled),
        ended = tokio::time::timeout(limit, guarded) => match ended {
            Err(_elapsed) => {
                token.cancel();
                Err(UnitError::Failed(Failure::transient(format!(
                    "job `{job}` exceeded its {} timeout",
                    humantime::format_duration(limit)
                ))))
            }
            Ok(Err(payload)) => {
                let message = panic_message(payload.as_ref());
                tracing::error!(job, panic = %message, "unit of work panicked");
                Err(UnitError::Failed(Failure::transient(format!("job `{job}` panicked: {message}"))))
            }
            Ok(Ok(Err(_))) if parent.is_cancelled() => Err(UnitError::Cancelled),
            Ok(Ok(Err(failure))) => Err(UnitError::Failed(failure)),
            Ok(Ok(Ok(value))) => Ok(value),
        },
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "a panic without a message"
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tokio::time::Instant;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn work_that_ignores_its_token_is_cut_at_the_deadline() {
        let parent = CancellationToken::new();
        let seen = Mutex::new(None);
        let begin = Instant::now();
        let result = run_unit("outbox-drain", Duration::from_secs(30), &parent, |token| {
            *seen.lock().unwrap() = Some(token);
            std::future::pending::<Result<(), Failure>>()
        })
        .await;
        assert_eq!(begin.elapsed(), Duration::from_secs(30));
        match result {
            Err(UnitError::Failed(f)) => {
                assert_eq!(
                    f,
                    Failure::transient("job `outbox-drain` exceeded its 30s timeout")
                );
            }
            other => panic!("expected the deadline failure, got {other:?}"),
        }
        let token = seen.lock().unwrap().take().unwrap();
        assert!(
            token.is_cancelled(),
            "the unit's token is cancelled at the deadline"
        );
        assert!(!parent.is_cancelled());
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_sleep_is_cut_at_the_deadline_too() {
        let parent = CancellationToken::new();
        let begin = Instant::now();
        let result = run_unit(
            "draft-expiry",
            Duration::from_millis(1_500),
            &parent,
            |_| async {
                tokio::time::sleep(Duration::from_secs(3_600)).await;
                Ok(1)
            },
        )
        .await;
        assert_eq!(begin.elapsed(), Duration::from_millis(1_500));
        let failure = result.unwrap_err().into_failure().unwrap();
        assert_eq!(
            failure.detail(),
            "job `draft-expiry` exceeded its 1s 500ms timeout"
        );
        assert!(!failure.is_permanent());
    }

    #[tokio::test(start_paused = true)]
    async fn work_within_its_limit_returns_its_value_or_failure() {
        let parent = CancellationToken::new();
        let ok = run_unit("j", Duration::from_secs(1), &parent, |_| async {
            tokio::time::sleep(Duration::from_millis(999)).await;
            Ok("done")
        })
        .await;
        assert_eq!(ok.unwrap(), "done");
        let failed = run_unit("j", Duration::from_secs(1), &parent, |_| async {
            Err::<(), _>(Failure::permanent("bad", "no"))
        })
        .await;
        assert_eq!(
            failed.unwrap_err().into_failure(),
            Some(Failure::permanent("bad", "no"))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_parent_firing_cancels_the_unit_at_once() {
        let parent = CancellationToken::new();
        let begin = Instant::now();
        let canceller = {
            let parent = parent.clone();
            async move {
                tokio::time::sleep(Duration::from_secs(2)).await;
                parent.cancel();
            }
        };
        let unit = run_unit("j", Duration::from_secs(30), &parent, |_| {
            std::future::pending::<Result<(), Failure>>()
        });
        let ((), result) = tokio::join!(canceller, unit);
        assert!(matches!(result, Err(UnitError::Cancelled)), "{result:?}");
        assert_eq!(begin.elapsed(), Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn the_work_sees_its_token_fire_with_the_parent() {
        let parent = CancellationToken::new();
        parent.cancel();
        let ran = Mutex::new(false);
        let result = run_unit("j", Duration::from_secs(1), &parent, |_| {
            *ran.lock().unwrap() = true;
            async { Ok(()) }
        })
        .await;
        assert!(matches!(result, Err(UnitError::Cancelled)));
        assert!(
            !*ran.lock().unwrap(),
            "nothing runs under an already-cancelled parent"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_panic_becomes_a_transient_failure_and_the_next_unit_runs() {
        let parent = CancellationToken::new();
        let panicked = run_unit(
            "inbound-poller",
            Duration::from_secs(1),
            &parent,
            |_| async {
                let items: Vec<u32> = Vec::new();
                if items.is_empty() {
                    panic!("no account {}", 7);
                }
                Ok(items[0])
            },
        )
        .await;
        match panicked {
            Err(UnitError::Failed(f)) => {
                assert_eq!(
                    f,
                    Failure::transient("job `inbound-poller` panicked: no account 7")
                );
            }
            other => panic!("expected a failure, got {other:?}"),
        }
        // A panic while building the future is caught too.
        let eager = run_unit::<(), std::future::Ready<Result<(), Failure>>>(
            "inbound-poller",
            Duration::from_secs(1),
            &parent,
            |_| panic!("static message"),
        )
        .await;
        assert_eq!(
            eager.unwrap_err().into_failure().unwrap().detail(),
            "job `inbound-poller` panicked: static message"
        );
        let next = run_unit(
            "inbound-poller",
            Duration::from_secs(1),
            &parent,
            |_| async { Ok(42) },
        )
        .await;
        assert_eq!(next.unwrap(), 42);
    }
}
