//! `timer-overrun`: the inbound email poller's ticks made longer than its schedule's interval
//! by a slow IMAP link (a [`FaultProxy`] in front of the shared Dovecot), to show that the host
//! never runs two ticks of one job at once (skip-if-busy), counts the ticks it skipped, and
//! does no work twice.

use std::path::Path;
use std::time::{Duration, Instant};

use worker_testkit::FaultProxy;

use super::{Fault, Load, Scenario};
use crate::oracle::Check;
use crate::run::{HostId, Run, Setup};
use crate::timers;

/// The poller's interval in this scenario: the shortest a schedule may have. A poll over the
/// slowed link (seven round trips, each chunk delayed [`DELAY`] either way) takes about two
/// seconds, so ticks still fall due while one runs.
const INTERVAL: Duration = Duration::from_secs(1);

/// The wait the proxy puts on every chunk either way while the fault lasts: an IMAP session
/// (greeting, LOGIN, SELECT, UID SEARCH, UID FETCH, a FETCH a mail, LOGOUT) takes seconds.
const DELAY: Duration = Duration::from_millis(150);

/// How long the link stays slow in each repetition.
const HOLD: Duration = Duration::from_secs(6);

/// How much two ticks' recorded spans may overlap without counting. A tick's span, as the
/// host records it, runs from the moment its work began with the lease held to the moment it
/// ended, before the lease went back, so two replicas' spans of a leased job lie within the
/// times each held the lock and never overlap. The slack covers the one stamp left: the end's
/// monotonic instant turned into wall time when the record is made. Before, a span ended when
/// the record was made, after the release, and a replica paused between the two (seen: 145 ms
/// in CI's quick run, with four scenarios at once) showed an overlap with the next holder's
/// tick that never happened; the slack was then 100 ms. Ticks that really ran side by side
/// overlap by most of a tick, or, for a session lost within a tick's first lease check
/// interval (see `worker_store::AdvisoryLease`), by up to that interval.
pub const SLACK: Duration = Duration::from_millis(25);

pub fn scenario() -> Scenario {
    Scenario {
        name: "timer-overrun",
        about: "The inbound email poller runs every second and reaches IMAP through a TCP proxy \
                (`FaultProxy`) in front of the shared Dovecot. At a random moment of each \
                repetition the proxy turns slow for 6 s (every chunk either way waits 150 ms), \
                so that each poll (LOGIN, SELECT, SEARCH, FETCH, LOGOUT) takes seconds, \
                longer than its interval; then it heals. The host must skip the ticks that fall due \
                while a tick runs (skip-if-busy), never run two at once, count the skips and \
                fetch no mail twice. Checked beyond the common figures: \
                `worker_ticks_total{job=\"inbound-email-poller\",outcome=\"skipped-busy\"}` on \
                `/metrics` above 0; the longest poller tick (attempt log, every tick written) \
                longer than the interval; and no two ticks of the poller (nor of any leased \
                job) overlapping in the attempt log by more than 25 ms (a tick's span as the \
                host records it runs from its work's start, the lease held, to its end, before \
                the lease goes back). The IMAP link does not touch \
                readiness: \"ready again\" is from the heal (the 2 s watch's upper bound when \
                `/readyz` never left 200).",
        fault: Some(|| Box::new(TimerOverrun::default())),
        full: Load {
            repetitions: 10,
            per_repetition: 20,
        },
        quick: Load {
            repetitions: 1,
            per_repetition: 20,
        },
        rate_per_sec: 5.0,
        settle: Duration::from_secs(120),
        heartbeat: super::DEFAULT_HEARTBEAT,
    }
}

/// The fault: see [`scenario`]'s description.
#[derive(Default)]
struct TimerOverrun {
    imap: Option<FaultProxy>,
}

#[async_trait::async_trait]
impl Fault for TimerOverrun {
    async fn prepare(&mut self, _dir: &Path) -> anyhow::Result<Setup> {
        let proxy = FaultProxy::start(worker_testkit::imap_addr()).await?;
        let mut env = timers::attempt_log_env();
        env.push((
            "WORKER_HOST__JOBS__INBOUND_EMAIL_POLLER__SCHEDULE".into(),
            format!("every {}ms", INTERVAL.as_millis()),
        ));
        let setup = Setup {
            env,
            imap_port: Some(proxy.port()),
            ..Setup::default()
        };
        self.imap = Some(proxy);
        Ok(setup)
    }

    async fn apply(&mut self, run: &mut Run) -> anyhow::Result<()> {
        let proxy = self.proxy()?;
        proxy.slow(DELAY);
        tokio::time::sleep(HOLD).await;
        proxy.heal();
        run.record_ready_after(Instant::now()).await
    }

    async fn finish(&mut self, _run: &mut Run) -> anyhow::Result<()> {
        self.proxy()?.heal();
        Ok(())
    }

    async fn verify(&mut self, run: &mut Run) -> anyhow::Result<Vec<Check>> {
        let host = run
            .process(HostId::First)
            .ok_or_else(|| anyhow::anyhow!("the host is not running"))?;
        let skipped = timers::ticks(host, timers::POLLER, "skipped-busy").await?;
        let ran = timers::ticks(host, timers::POLLER, "ran").await?;
        let longest_ms: f64 = sqlx::query_scalar(
            "SELECT coalesce(max(duration_ms), 0)::float8 FROM attempt_log \
             WHERE job = $1 AND tick IS NOT NULL AND is_final AND outcome = 'ran'",
        )
        .bind(timers::POLLER)
        .fetch_one(&run.db.pool)
        .await?;
        let mut checks = vec![
            Check::new(
                format!(
                    "poller ticks skipped as busy: {skipped} of {} (must be > 0)",
                    skipped + ran
                ),
                skipped > 0,
            ),
            Check::new(
                format!(
                    "longest poller tick {:.1} s (must exceed its {} s interval)",
                    longest_ms / 1000.0,
                    INTERVAL.as_secs()
                ),
                longest_ms > INTERVAL.as_secs_f64() * 1000.0,
            ),
        ];
        checks.push(overlap_check(run).await?);
        Ok(checks)
    }
}

impl TimerOverrun {
    fn proxy(&self) -> anyhow::Result<&FaultProxy> {
        self.imap
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("the IMAP proxy was not started"))
    }
}

/// One check over the timer jobs that run under the lease (and the busy guard): no two ticks
/// of one job overlapping beyond [`SLACK`] in the attempt log.
pub async fn overlap_check(run: &Run) -> anyhow::Result<Check> {
    let jobs = timers::tick_overlaps(&run.db.pool, &timers::leased_job_names(), SLACK).await?;
    let overlapping: i64 = jobs.iter().map(|j| j.overlapping).sum();
    let ran: i64 = jobs.iter().map(|j| j.ran).sum();
    let per_job: Vec<String> = jobs
        .iter()
        .map(|j| format!("{} {}/{}", j.job, j.overlapping, j.ran))
        .collect();
    let min_gap = jobs
        .iter()
        .filter_map(|j| j.min_gap_ms)
        .reduce(f64::min)
        .map_or("–".to_string(), |ms| format!("{ms:.0} ms"));
    Ok(Check::new(
        format!(
            "overlapping ticks of leased jobs: {overlapping} of {ran} (must be 0; {}; \
             shortest gap between one job's ticks {min_gap})",
            per_job.join(", ")
        ),
        overlapping == 0,
    ))
}
