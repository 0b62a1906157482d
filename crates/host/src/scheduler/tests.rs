use std::sync::atomic::AtomicU64;

use worker_core::{Failure, NoLease, TickReport};

use super::*;

/// A tick that takes `work` (on the paused clock) and counts its runs.
struct Slow {
    work: Duration,
    runs: AtomicU64,
    fail: bool,
}

impl TimerJob for Slow {
    fn name(&self) -> &str {
        "slow"
    }
    async fn tick(&self, _ctx: &WorkContext) -> Result<TickReport, Failure> {
        tokio::time::sleep(self.work).await;
        self.runs.fetch_add(1, Ordering::Relaxed);
        if self.fail {
            Err(Failure::transient("the tick broke"))
        } else {
            Ok(TickReport::default())
        }
    }
}

fn task(job: Arc<Slow>, every: Duration) -> (TimerTask<Slow, NoLease>, Arc<TimerStats>) {
    let stats = Arc::new(TimerStats::default());
    let task = TimerTask {
        job,
        schedule: Schedule::Every(every),
        timeout: Duration::from_secs(60),
        lease: None,
        wake: None,
        stats: stats.clone(),
        metrics: Metrics::new(opentelemetry::global::meter("test")),
        attempt_log: worker_store::AttemptLog::disabled(),
    };
    (task, stats)
}

#[test]
fn an_interval_stays_on_its_grid_and_skips_what_passed() {
    let start = Instant::now();
    let every = Duration::from_secs(1);
    let schedule = Schedule::Every(every);
    assert_eq!(next_due(&schedule, start, start), (start + every, 0));
    // Woken 3.5 s late: three ticks passed; the next is back on the grid.
    let (next, missed) = next_due(&schedule, start, start + Duration::from_millis(4500));
    assert_eq!(missed, 4);
    assert_eq!(next, start + Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn a_tick_longer_than_its_interval_makes_skips_that_are_counted() {
    let job = Arc::new(Slow {
        work: Duration::from_millis(2500),
        runs: AtomicU64::new(0),
        fail: false,
    });
    let (task, stats) = task(job.clone(), Duration::from_secs(1));
    let tracker = TaskTracker::new();
    let shutdown = CancellationToken::new();
    let looping = tokio::spawn(task.run(tracker.clone(), shutdown.clone()));
    tokio::time::sleep(Duration::from_millis(10_500)).await;

    let snapshot = stats.snapshot();
    // Ticks fire at 0, 1, 2, …, 10 s; each runs 2.5 s, so only every third one (0, 3, 6, 9)
    // finds the guard free: three have finished, the fourth is still running at 10.5 s.
    assert_eq!(snapshot.ran, 3, "{snapshot:?}");
    assert_eq!(snapshot.skipped_busy, 7, "{snapshot:?}");
    assert_eq!(job.runs.load(Ordering::Relaxed), 3);

    shutdown.cancel();
    looping.await.unwrap();
    tracker.close();
    tracker.wait().await;
}

#[tokio::test(start_paused = true)]
async fn a_starved_runtime_misses_ticks_but_the_schedule_goes_on() {
    let job = Arc::new(Slow {
        work: Duration::from_millis(10),
        runs: AtomicU64::new(0),
        fail: false,
    });
    let (task, stats) = task(job.clone(), Duration::from_secs(1));
    let tracker = TaskTracker::new();
    let shutdown = CancellationToken::new();
    let looping = tokio::spawn(task.run(tracker.clone(), shutdown.clone()));
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let before = job.runs.load(Ordering::Relaxed);
    assert_eq!(before, 3);

    // The runtime cannot run anything for 30 s (the clock jumps without the loop seeing it).
    tokio::time::advance(Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(5500)).await;

    let after = job.runs.load(Ordering::Relaxed);
    assert!(
        after >= before + 5,
        "the schedule must go on after falling behind: {before} then {after}"
    );
    assert!(stats.snapshot().missed >= 25, "{:?}", stats.snapshot());

    shutdown.cancel();
    looping.await.unwrap();
    tracker.close();
    tracker.wait().await;
}

#[tokio::test(start_paused = true)]
async fn a_failing_tick_is_recorded_and_the_next_tick_still_runs() {
    let job = Arc::new(Slow {
        work: Duration::from_millis(1),
        runs: AtomicU64::new(0),
        fail: true,
    });
    let (task, stats) = task(job.clone(), Duration::from_secs(1));
    let tracker = TaskTracker::new();
    let shutdown = CancellationToken::new();
    let looping = tokio::spawn(task.run(tracker.clone(), shutdown.clone()));
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let snapshot = stats.snapshot();
    assert_eq!(snapshot.failed, 4, "{snapshot:?}");
    assert_eq!(snapshot.last.last_error.as_deref(), Some("the tick broke"));
    shutdown.cancel();
    looping.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_wake_ticks_at_once() {
    let job = Arc::new(Slow {
        work: Duration::from_millis(1),
        runs: AtomicU64::new(0),
        fail: false,
    });
    let (mut task, _stats) = task(job.clone(), Duration::from_secs(3600));
    let wake = Arc::new(Notify::new());
    task.wake = Some(wake.clone());
    let tracker = TaskTracker::new();
    let shutdown = CancellationToken::new();
    let looping = tokio::spawn(task.run(tracker.clone(), shutdown.clone()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        job.runs.load(Ordering::Relaxed),
        1,
        "the first tick runs at start"
    );
    wake.notify_one();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        job.runs.load(Ordering::Relaxed),
        2,
        "a wake runs a tick long before the hour is up"
    );
    shutdown.cancel();
    looping.await.unwrap();
}

#[test]
fn a_cron_schedule_is_due_within_its_period() {
    let now = Instant::now();
    let (next, missed) = next_due(&Schedule::Cron("* * * * * *".into()), now, now);
    assert_eq!(missed, 0);
    assert!(next > now && next <= now + Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn a_wake_during_a_running_tick_becomes_one_more_tick_not_a_skip() {
    let job = Arc::new(Slow {
        work: Duration::from_secs(1),
        runs: AtomicU64::new(0),
        fail: false,
    });
    let (mut task, stats) = task(job.clone(), Duration::from_secs(3600));
    let wake = Arc::new(Notify::new());
    task.wake = Some(wake.clone());
    let tracker = TaskTracker::new();
    let shutdown = CancellationToken::new();
    let looping = tokio::spawn(task.run(tracker.clone(), shutdown.clone()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    for _ in 0..5 {
        wake.notify_one();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        job.runs.load(Ordering::Relaxed),
        2,
        "five wakes while busy make one more tick"
    );
    assert_eq!(stats.snapshot().skipped_busy, 0);
    shutdown.cancel();
    looping.await.unwrap();
}
