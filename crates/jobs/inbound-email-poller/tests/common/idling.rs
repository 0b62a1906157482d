//! An idler running on a task of its own, for the IDLE tests against each server.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use job_inbound_email_poller::{Idler, InboundEmailPoller, PollReport};
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use worker_store::AdvisoryLease;
use worker_testkit::TestDb;

use super::{BOUND, Row, poll, rows};

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

/// A poller run as the host runs it: its idler on its own task, and a tick at every wake.
pub struct Host {
    pub poller: Arc<InboundEmailPoller>,
    pub idling: Idling,
    /// Every tick's report, in order.
    pub ticks: Arc<Mutex<Vec<PollReport>>>,
    stop: CancellationToken,
    ticker: tokio::task::JoinHandle<()>,
}

impl Host {
    pub fn start(poller: InboundEmailPoller, db: &TestDb) -> Self {
        let idling = Idling::start(poller.idler(), db);
        let poller = Arc::new(poller);
        let ticks = Arc::new(Mutex::new(Vec::new()));
        let stop = CancellationToken::new();
        let ticker = tokio::spawn({
            let (poller, ticks, stop, wake) = (
                poller.clone(),
                ticks.clone(),
                stop.clone(),
                idling.wake.clone(),
            );
            async move {
                loop {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = wake.notified() => {}
                    }
                    let report = poll(&poller).await;
                    ticks.lock().unwrap().push(report);
                }
            }
        });
        Self {
            poller,
            idling,
            ticks,
            stop,
            ticker,
        }
    }

    /// Once `account` idles and the tick its connect woke has run.
    pub async fn settled(&self, account: &str) {
        let deadline = Instant::now() + BOUND;
        loop {
            let status = self
                .idling
                .idler
                .stats()
                .account(account)
                .unwrap_or_default();
            let idling = status.idle.as_deref() == Some("idling");
            if (idling && status.polls > 0) || Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // A wake still on its way (the connect's and the news of mail already there).
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    /// What the ticks stored, together.
    pub fn stored_by_ticks(&self) -> u64 {
        self.ticks
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.totals().stored)
            .sum()
    }

    pub async fn end(self) {
        self.stop.cancel();
        let _ = self.ticker.await;
        self.idling.end().await;
    }
}

/// Waits (bounded) until `account` has `n` rows; returns them.
pub async fn rows_reach(pool: &PgPool, account: &str, n: usize) -> anyhow::Result<Vec<Row>> {
    let deadline = Instant::now() + BOUND;
    loop {
        let r = rows(pool, account).await?;
        if r.len() >= n || Instant::now() > deadline {
            return Ok(r);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
