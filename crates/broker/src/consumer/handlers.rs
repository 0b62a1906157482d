//! The handler tasks of a consume loop: the [`Scope`] each is given, and the [`Handlers`]
//! that track them across sessions and bound how long shutdown waits for them.

use std::sync::OnceLock;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long handlers still running at the settle deadline get, once cancelled, to return.
/// The host's grace must leave this, and closing, after the settle deadline.
pub const CANCEL_WAIT: Duration = Duration::from_secs(1);

/// What a handler is told besides its delivery.
#[derive(Debug, Clone)]
pub struct Scope {
    cancel: CancellationToken,
    orphaned: CancellationToken,
}

impl Scope {
    pub(super) fn new(cancel: CancellationToken, orphaned: CancellationToken) -> Self {
        Self { cancel, orphaned }
    }

    /// Cancelled at the settle deadline: stop, the delivery goes back to the queue.
    pub fn cancel(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Cancelled once the session that took the delivery is over: its settle can no longer
    /// reach the broker, which redelivers it.
    pub fn orphaned(&self) -> &CancellationToken {
        &self.orphaned
    }
}

/// The handlers of one consume loop: they outlive a lost channel, and shutdown waits for
/// them, within the settle deadline.
pub(super) struct Handlers {
    /// Not a child of the shutdown token: handlers in flight finish within the settle deadline.
    pub(super) cancel: CancellationToken,
    pub(super) tracker: TaskTracker,
    settle_until: OnceLock<Instant>,
}

impl Handlers {
    pub(super) fn new() -> Self {
        Self {
            cancel: CancellationToken::new(),
            tracker: TaskTracker::new(),
            settle_until: OnceLock::new(),
        }
    }

    /// The end of the settling, fixed by the first to ask once shutdown starts.
    pub(super) fn settle_until(&self, deadline: Duration) -> Instant {
        *self.settle_until.get_or_init(|| Instant::now() + deadline)
    }

    /// After the last session: waits for the handlers still running (those that outlived a
    /// lost channel) until the settle deadline, then cancels them and gives them a moment.
    /// When the session already did so at the deadline, what is left ignored cancellation:
    /// it is not waited for again.
    pub(super) async fn finish(&self, deadline: Duration) {
        self.tracker.close();
        if self.cancel.is_cancelled() {
            return;
        }
        let until = self.settle_until(deadline);
        if tokio::time::timeout_at(until, self.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                in_flight = self.tracker.len(),
                "settle deadline over: cancelling the handlers still running"
            );
            self.cancel.cancel();
            let _ = tokio::time::timeout(CANCEL_WAIT, self.tracker.wait()).await;
        }
        self.cancel.cancel();
    }
}
