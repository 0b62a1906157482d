use std::sync::atomic::AtomicU64;

use worker_core::{Failure, NoLease, TickReport};

use super::*;

/// A tick that takes `work` (on the paused clock) and counts its runs.
struct Slow {
    work: Duration,
    /// The first tick's work, when it differs (an overrun that later ticks recover from).
    first: Option<Duration>,
    started: AtomicU64,
    runs: AtomicU64,
    fail: bool,
}

impl Slow {
    fn new(work: Duration) -> Arc<Self> {
        Arc::new(Self {
            work,
            first: None,
            started: AtomicU64::new(0),
            runs: AtomicU64::new(0),
            fail: false,
        })
    }
}

impl TimerJob for Slow {
    fn name(&self) -> &str {
        "slow"
    }
    async fn tick(&self, _ctx: &WorkContext) -> Result<TickReport, Failure> {
        let work = match (self.started.fetch_add(1, Ordering::Relaxed), self.first) {
            (0, Some(first)) => first,
            _ => self.work,
        };
        tokio::time::sleep(work).await;
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
        history: None,
        control: Control::default(),
        liveness: None,
    };
    (task, stats)
}

/// Drives `task` from a ticker on the paused clock that offers a tick every `every` (the
/// first at once) exactly as the cron ticker does, through [`offer`]. tokio-cron-scheduler
/// itself reads the wall clock, so the paused tests stand in for it here; the tests at the
/// end run the real one.
fn start(
    task: TimerTask<Slow, NoLease>,
    every: Duration,
    tracker: &TaskTracker,
    shutdown: &CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let (sender, ticks) = mpsc::channel(1);
    let (stats, stop) = (task.stats.clone(), shutdown.clone());
    tracker.spawn(async move {
        let mut interval = tokio::time::interval(every);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = interval.tick() => { offer(&sender, &stats, "slow"); }
            }
        }
    });
    tokio::spawn(task.drive(ticks, tracker.clone(), shutdown.clone()))
}

async fn stop(
    looping: tokio::task::JoinHandle<()>,
    tracker: TaskTracker,
    shutdown: CancellationToken,
) {
    shutdown.cancel();
    looping.await.unwrap();
    tracker.close();
    tracker.wait().await;
}

#[tokio::test(start_paused = true)]
async fn a_tick_longer_than_its_interval_makes_skips_that_are_counted() {
    let job = Slow::new(Duration::from_millis(2500));
    let (task, stats) = task(job.clone(), Duration::from_secs(1));
    let (tracker, shutdown) = (TaskTracker::new(), CancellationToken::new());
    let looping = start(task, Duration::from_secs(1), &tracker, &shutdown);
    tokio::time::sleep(Duration::from_millis(10_500)).await;

    let snapshot = stats.snapshot();
    // Ticks fire at 0, 1, 2, …, 10 s; each runs 2.5 s, so only every third one (0, 3, 6, 9)
    // finds the guard free: three have finished, the fourth is still running at 10.5 s.
    assert_eq!(snapshot.ran, 3, "{snapshot:?}");
    assert_eq!(snapshot.skipped_busy, 7, "{snapshot:?}");
    // The loop took every tick at once: none was missed.
    assert_eq!(snapshot.missed, 0, "{snapshot:?}");
    assert_eq!(job.runs.load(Ordering::Relaxed), 3);
    stop(looping, tracker, shutdown).await;
}

#[tokio::test(start_paused = true)]
async fn a_tick_that_overruns_its_schedule_never_stops_later_ticks() {
    let job = Arc::new(Slow {
        first: Some(Duration::from_millis(5500)),
        ..Arc::into_inner(Slow::new(Duration::from_millis(10))).unwrap()
    });
    let (task, stats) = task(job.clone(), Duration::from_secs(1));
    let (tracker, shutdown) = (TaskTracker::new(), CancellationToken::new());
    let looping = start(task, Duration::from_secs(1), &tracker, &shutdown);
    tokio::time::sleep(Duration::from_millis(12_500)).await;

    let snapshot = stats.snapshot();
    // The tick at 0 runs until 5.5 s: those at 1 … 5 s are skipped and counted; every tick
    // from 6 s to 12 s runs again (#113 is the schedule that would have stopped here).
    assert_eq!(snapshot.skipped_busy, 5, "{snapshot:?}");
    assert_eq!(snapshot.ran, 1 + 7, "{snapshot:?}");
    assert_eq!(snapshot.missed, 0, "{snapshot:?}");
    stop(looping, tracker, shutdown).await;
}

#[tokio::test(start_paused = true)]
async fn a_starved_runtime_loses_ticks_but_the_schedule_goes_on() {
    let job = Slow::new(Duration::from_millis(10));
    let (task, _stats) = task(job.clone(), Duration::from_secs(1));
    let (tracker, shutdown) = (TaskTracker::new(), CancellationToken::new());
    let looping = start(task, Duration::from_secs(1), &tracker, &shutdown);
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
    stop(looping, tracker, shutdown).await;
}

#[tokio::test(start_paused = true)]
async fn a_failing_tick_is_recorded_and_the_next_tick_still_runs() {
    let job = Arc::new(Slow {
        fail: true,
        ..Arc::into_inner(Slow::new(Duration::from_millis(1))).unwrap()
    });
    let (task, stats) = task(job.clone(), Duration::from_secs(1));
    let (tracker, shutdown) = (TaskTracker::new(), CancellationToken::new());
    let looping = start(task, Duration::from_secs(1), &tracker, &shutdown);
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let snapshot = stats.snapshot();
    assert_eq!(snapshot.failed, 4, "{snapshot:?}");
    assert_eq!(snapshot.last.last_error.as_deref(), Some("the tick broke"));
    stop(looping, tracker, shutdown).await;
}

#[tokio::test(start_paused = true)]
async fn a_wake_ticks_at_once() {
    let job = Slow::new(Duration::from_millis(1));
    let (mut task, _stats) = task(job.clone(), Duration::from_secs(3600));
    let wake = Arc::new(Notify::new());
    task.wake = Some(wake.clone());
    let (tracker, shutdown) = (TaskTracker::new(), CancellationToken::new());
    let looping = start(task, Duration::from_secs(3600), &tracker, &shutdown);
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
    stop(looping, tracker, shutdown).await;
}

#[tokio::test(start_paused = true)]
async fn a_wake_during_a_running_tick_becomes_one_more_tick_not_a_skip() {
    let job = Slow::new(Duration::from_secs(1));
    let (mut task, stats) = task(job.clone(), Duration::from_secs(3600));
    let wake = Arc::new(Notify::new());
    task.wake = Some(wake.clone());
    let (tracker, shutdown) = (TaskTracker::new(), CancellationToken::new());
    let looping = start(task, Duration::from_secs(3600), &tracker, &shutdown);
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
    stop(looping, tracker, shutdown).await;
}

/// A pause state held in memory, standing in for `job_pauses` in the paused-clock tests.
#[derive(Debug, Default)]
struct Switch(std::sync::atomic::AtomicBool);

impl control::PauseCheck for Switch {
    fn is_paused<'a>(
        &'a self,
        _job: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<bool, String>> {
        let paused = self.0.load(Ordering::Relaxed);
        Box::pin(async move { Ok(paused) })
    }
}

fn controlled(job: Arc<Slow>, switch: Arc<Switch>) -> (TimerTask<Slow, NoLease>, TimerHandle) {
    let (task, stats) = task(job, Duration::from_secs(1));
    let (handle, control) = TimerHandle::new(
        "slow",
        task.schedule.clone(),
        task.timeout,
        false,
        stats,
        Some(switch),
    );
    (TimerTask { control, ..task }, handle)
}

#[tokio::test(start_paused = true)]
async fn a_paused_job_skips_its_scheduled_ticks_and_counts_them() {
    let job = Slow::new(Duration::from_millis(10));
    let switch = Arc::new(Switch::default());
    switch.0.store(true, Ordering::Relaxed);
    let (task, handle) = controlled(job.clone(), switch.clone());
    let (tracker, shutdown) = (TaskTracker::new(), CancellationToken::new());
    let looping = start(task, Duration::from_secs(1), &tracker, &shutdown);
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert_eq!(job.runs.load(Ordering::Relaxed), 0, "paused: nothing ran");
    assert_eq!(handle.stats.snapshot().skipped_paused, 4);

    switch.0.store(false, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        job.runs.load(Ordering::Relaxed),
        2,
        "resumed: ticks run again"
    );
    stop(looping, tracker, shutdown).await;
}

#[tokio::test(start_paused = true)]
async fn a_tick_run_now_runs_even_while_the_job_is_paused() {
    let job = Slow::new(Duration::from_millis(10));
    let switch = Arc::new(Switch::default());
    switch.0.store(true, Ordering::Relaxed);
    let (task, handle) = controlled(job.clone(), switch);
    let (tracker, shutdown) = (TaskTracker::new(), CancellationToken::new());
    // A schedule far away: only the run now can run it.
    let looping = start(task, Duration::from_secs(3600), &tracker, &shutdown);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(job.runs.load(Ordering::Relaxed), 0);
    handle.run_now().unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(job.runs.load(Ordering::Relaxed), 1);
    let snapshot = handle.stats.snapshot();
    assert_eq!((snapshot.run_now, snapshot.ran), (1, 1));
    assert_eq!(snapshot.durations.last_ms, Some(10));
    stop(looping, tracker, shutdown).await;
}

#[test]
fn a_tick_offered_to_a_busy_loop_is_missed_at_once_never_queued() {
    let stats = TimerStats::default();
    let (sender, mut ticks) = mpsc::channel(1);
    // Not `async`: it cannot wait, whatever the loop does.
    assert!(offer(&sender, &stats, "slow"));
    assert!(!offer(&sender, &stats, "slow"));
    assert!(!offer(&sender, &stats, "slow"));
    assert_eq!(stats.snapshot().missed, 2);
    assert!(ticks.try_recv().is_ok());
    assert!(ticks.try_recv().is_err(), "one tick waits, never a backlog");
    drop(ticks);
    assert!(!offer(&sender, &stats, "slow"), "a stopped loop");
    assert_eq!(stats.snapshot().missed, 2, "a stopped loop misses nothing");
}

// The real ticker reads the wall clock, so these two wait on it: for at least one fire of an
// every-second schedule, with generous bounds.

#[tokio::test]
async fn the_cron_ticker_never_waits_for_a_loop_that_does_not_drain() {
    let stats = Arc::new(TimerStats::default());
    let (sender, mut ticks) = mpsc::channel(1);
    let ticker = CronTicker::start("* * * * * *", "slow", sender, stats.clone())
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), async {
        while stats.snapshot().missed == 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("a second fire into the full channel is counted as missed");
    ticker.shutdown().await;
    assert!(ticks.try_recv().is_ok());
    assert!(ticks.try_recv().is_err(), "one tick waits, never a backlog");
}

#[tokio::test]
async fn a_cron_schedule_ticks_through_tokio_cron_scheduler_and_stops_with_the_host() {
    let job = Slow::new(Duration::from_millis(1));
    let stats = Arc::new(TimerStats::default());
    let task = TimerTask {
        schedule: Schedule::Cron("* * * * * *".into()),
        stats: stats.clone(),
        ..task(job.clone(), Duration::from_secs(1)).0
    };
    let (tracker, shutdown) = (TaskTracker::new(), CancellationToken::new());
    let looping = tokio::spawn(task.run(tracker.clone(), shutdown.clone()));
    tokio::time::timeout(Duration::from_secs(10), async {
        while job.runs.load(Ordering::Relaxed) == 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("a tick within the first seconds");
    tokio::time::timeout(Duration::from_secs(5), stop(looping, tracker, shutdown))
        .await
        .expect("the loop, its ticks and its ticker stop with the host");
    assert_eq!(stats.snapshot().skipped_busy, 0);
}

#[tokio::test(start_paused = true)]
async fn ticks_that_ran_are_counted_for_the_history_and_skips_are_not() {
    let job = Arc::new(Slow {
        fail: true,
        ..Arc::into_inner(Slow::new(Duration::from_millis(1))).unwrap()
    });
    let tally = worker_store::history::Tally::default();
    let (mut task, _stats) = task(job.clone(), Duration::from_secs(1));
    task.history = Some(tally.job("slow"));
    let (tracker, shutdown) = (TaskTracker::new(), CancellationToken::new());
    let looping = start(task, Duration::from_secs(1), &tracker, &shutdown);
    tokio::time::sleep(Duration::from_millis(3500)).await;
    stop(looping, tracker, shutdown).await;
    let counts = tally.drain();
    assert_eq!(counts.len(), 1, "{counts:?}");
    assert_eq!(counts[0].units, 4);
    assert_eq!(counts[0].failures.get("failed:transient"), Some(&4));
    assert_eq!(counts[0].durations.iter().sum::<i64>(), 4);
}
