//! An idler running on a task of its own, for the IDLE tests against each server.

use std::sync::Arc;
use std::time::{Duration, Instant};

use job_inbound_email_poller::Idler;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use worker_store::AdvisoryLease;
use worker_testkit::TestDb;

/// An idler running on a task of its own, the wake it rings, and how to stop it.
pub struct Idling {
    pub idler: Idler,
    pub wake: Arc<Notify>,
    stop: CancellationToken,
    pub tracker: TaskTracker,
}

impl Idling {
    /// Runs `idler` (on the lease of `db`) until [`Idling::end`].
    pub fn start(idler: Idler, db: &TestDb) -> Self {
        let (wake, stop, tracker) = (
            Arc::new(Notify::new()),
            CancellationToken::new(),
            TaskTracker::new(),
        );
        let lease = Arc::new(AdvisoryLease::new(db.pool.clone()));
        tracker.spawn(idler.clone().run(lease, wake.clone(), stop.clone()));
        Self {
            idler,
            wake,
            stop,
            tracker,
        }
    }

    /// Stops it and waits for its task to end.
    pub async fn end(self) {
        self.stop.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }

    /// The news counted for `account` so far, once there is some (within 5 s).
    pub async fn news(&self, account: &str) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let news = self
                .idler
                .stats()
                .account(account)
                .map_or(0, |s| s.idle_news);
            if news > 0 || Instant::now() > deadline {
                return news;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
