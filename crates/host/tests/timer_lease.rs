//! The scheduler's loop with a real lease (PostgreSQL advisory locks): a wake that arrives
//! while a leased tick runs is served as soon as that tick is done (issue 41: it waited for
//! the lease's release, which sat out the watch's 250 ms wait on the server).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use worker_core::{Failure, TickReport, TimerJob, WorkContext};
use worker_host::metrics::Metrics;
use worker_host::scheduler::schedule::Schedule;
use worker_host::scheduler::{Control, TimerStats, TimerTask};
use worker_store::AdvisoryLease;
use worker_testkit::TestDb;

/// A tick of `work`, recording when each one began and ended, and saying when one begins.
struct Timed {
    work: Duration,
    runs: Mutex<Vec<(Instant, Instant)>>,
    started: Notify,
}

impl TimerJob for Timed {
    fn name(&self) -> &str {
        "inbound-email-poller"
    }

    async fn tick(&self, _ctx: &WorkContext) -> Result<TickReport, Failure> {
        let began = Instant::now();
        self.started.notify_one();
        tokio::time::sleep(self.work).await;
        if let Ok(mut runs) = self.runs.lock() {
            runs.push((began, Instant::now()));
        }
        Ok(TickReport::default())
    }
}

#[tokio::test]
async fn a_wake_during_a_leased_tick_is_served_right_after_it() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let job = Arc::new(Timed {
        work: Duration::from_millis(40),
        runs: Mutex::default(),
        started: Notify::new(),
    });
    let wake = Arc::new(Notify::new());
    let pool = db.another_pool(4).await?;
    // Two connections open and idle, as in a running host's pool: the woken tick's lease is
    // then asked for on one of them, not on a new connection (tens of ms to sign in), while
    // sqlx still tests the first tick's connection on its way back.
    let (a, b) = (pool.acquire().await?, pool.acquire().await?);
    drop((a, b));
    let task = TimerTask {
        job: job.clone(),
        // Never fires on its own: the test offers the one scheduled tick.
        schedule: Schedule::Every(Duration::from_secs(3600)),
        timeout: Duration::from_secs(10),
        lease: Some(Arc::new(AdvisoryLease::new(pool.clone()))),
        wake: Some(wake.clone()),
        stats: Arc::new(TimerStats::default()),
        metrics: Metrics::new(opentelemetry::global::meter("test")),
        attempt_log: worker_store::AttemptLog::disabled(),
        history: None,
        control: Control::default(),
        liveness: None,
    };
    let (tracker, shutdown) = (TaskTracker::new(), CancellationToken::new());
    let (ticks, received) = mpsc::channel(1);
    let looping = tokio::spawn(task.drive(received, tracker.clone(), shutdown.clone()));

    ticks.send(()).await?;
    tokio::time::timeout(Duration::from_secs(5), job.started.notified()).await?;
    // Mid-tick: the loop coalesces it into one more tick once this one is over.
    wake.notify_one();
    let deadline = Instant::now() + Duration::from_secs(5);
    while job.runs.lock().unwrap().len() < 2 {
        anyhow::ensure!(Instant::now() < deadline, "the wake never made a tick");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    shutdown.cancel();
    looping.await?;
    tracker.close();
    tracker.wait().await;

    let runs = job.runs.lock().unwrap().clone();
    let gap = runs[1].0.duration_since(runs[0].1);
    eprintln!("the woken tick began {gap:?} after the first one's work ended");
    // Between the two: the lease's unlock, the loop taking the wake, the next lock: a few
    // round trips. 50 ms is a loaded machine's margin, a fifth of the 250 ms wait it sat out.
    assert!(
        gap < Duration::from_millis(50),
        "the wake was served {gap:?} after the tick"
    );
    Ok(())
}
