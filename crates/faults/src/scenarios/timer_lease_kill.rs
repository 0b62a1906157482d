//! `timer-lease-kill`: of two replicas, the one holding the poller's lease is killed with
//! SIGKILL mid-tick; the other must take the lease over at its next tick, and nothing may be
//! lost or done twice.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use sqlx::PgPool;
use worker_testkit::FaultProxy;

use super::timer_replicas::{replica_checks, slow_imap_replicas};
use super::{Fault, Load, Scenario};
use crate::oracle::Check;
use crate::run::{HostId, Run, Setup};
use crate::timers::{self, HolderSamples};

/// The poller's interval in the replica settings ([`timers::replica_env`]).
const INTERVAL: Duration = Duration::from_secs(1);

/// How long a held lease's session may stay silent before its holder counts it as lost
/// (`worker_store::lease::DEFAULT_CHECK_TIMEOUT`): the margin of the takeover's bound.
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest the harness looks for a holder of the poller's lease before the kill, and for
/// the survivor taking it after.
const LOOK: Duration = Duration::from_secs(30);

pub fn scenario() -> Scenario {
    Scenario {
        name: "timer-lease-kill",
        about: "Two host processes with the same settings (as `timer-replicas`: the poller and the \
                other leased jobs every second), IMAP reached through a TCP proxy \
                that makes every chunk wait 50 ms, so that a poll lasts about a second and the \
                poller's lease (a PostgreSQL advisory lock held for the tick) is held most of \
                the time. At a random moment of each repetition the harness finds which process \
                holds the poller's lease (`pg_locks`, the session's client port matched to the \
                process's sockets in `/proc`), kills that one with `kill -9`, and starts it again \
                as soon as the other process holds the lease (or 30 s passed). The lease ends with the dead process's session (its kernel closes the \
                socket, the server drops the lock); the other process must take it over at its \
                next tick: the takeover (kill until `pg_locks` shows the survivor's session \
                holding the lease, sampled every 10 ms) must be within one interval plus the \
                lease's 5 s check timeout. Checked beyond the common figures: that takeover \
                bound, and no two poller (or other leased) ticks overlapping in the attempt log \
                (25 ms slack; the killed process's last ticks may be missing, their rows not yet \
                written). \"Ready again\" is from the kill until the lease was taken over and \
                then the restarted process answered `/readyz` 200.",
        fault: Some(|| Box::new(TimerLeaseKill::default())),
        full: Load {
            repetitions: 10,
            per_repetition: 20,
        },
        quick: Load {
            repetitions: 1,
            per_repetition: 20,
        },
        rate_per_sec: 5.0,
        settle: Duration::from_secs(240),
        heartbeat: super::DEFAULT_HEARTBEAT,
    }
}

/// The fault: see [`scenario`]'s description.
#[derive(Default)]
struct TimerLeaseKill {
    imap: Option<FaultProxy>,
    /// Per kill: seconds until the dead session's lock was gone, and until the survivor held
    /// it (`None`: not within [`LOOK`]).
    takeovers: Vec<(Option<f64>, Option<f64>)>,
}

#[async_trait::async_trait]
impl Fault for TimerLeaseKill {
    async fn prepare(&mut self, _dir: &Path) -> anyhow::Result<Setup> {
        // A poll lasts about a second, about its interval, and both processes tick on the
        // same second: the poller's lease is held most of the time, and the kill lands mid-tick.
        slow_imap_replicas(&mut self.imap).await
    }

    async fn begin(&mut self, run: &mut Run) -> anyhow::Result<()> {
        run.start_replica().await
    }

    async fn apply(&mut self, run: &mut Run) -> anyhow::Result<()> {
        let (victim, port) = poller_holder(run).await?;
        let survivor = run
            .process(victim.other())
            .context("the other host is not running")?
            .pid();
        let at = run.kill9(victim).await?;
        let killed_at = chrono::Utc::now();
        // The killed process is started again only once the other took the lease over (or
        // the look gave up), so that the takeover measured is the survivor's, not a race
        // with the restarted process's first tick.
        let (freed, took) = watch_takeover(&run.db.pool, port, survivor, at).await?;
        run.respawn(victim).await?;
        let restart_secs = at.elapsed().as_secs_f64();
        eprintln!(
            "faults: timer-lease-kill: killed the {} host holding the poller's lease at {}; its lock gone after {}, taken over by the other after {}; the killed one restarted and ready {restart_secs:.1} s after the kill",
            victim.as_str(),
            killed_at.format("%H:%M:%S%.3f"),
            secs(freed),
            secs(took),
        );
        self.takeovers.push((freed, took));
        run.ready.push(restart_secs);
        Ok(())
    }

    async fn finish(&mut self, _run: &mut Run) -> anyhow::Result<()> {
        if let Some(proxy) = &self.imap {
            proxy.heal();
        }
        Ok(())
    }

    async fn verify(&mut self, run: &mut Run) -> anyhow::Result<Vec<Check>> {
        let mut checks = replica_checks(run, &HolderSamples::default(), false).await?;
        let limit = (INTERVAL + CHECK_TIMEOUT).as_secs_f64();
        let worst = self
            .takeovers
            .iter()
            .map(|(_, took)| *took)
            .try_fold(0.0_f64, |worst, took| took.map(|t| worst.max(t)));
        let freed = self
            .takeovers
            .iter()
            .filter_map(|(freed, _)| *freed)
            .reduce(f64::max);
        checks.push(Check::new(
            format!(
                "poller lease taken over after at most {} of {} kills (limit {limit:.1} s; the dead session's lock gone after at most {})",
                secs(worst),
                self.takeovers.len(),
                secs(freed)
            ),
            worst.is_some_and(|w| w <= limit),
        ));
        Ok(checks)
    }
}

pub(super) fn secs(value: Option<f64>) -> String {
    value.map_or("never".to_string(), |s| format!("{s:.2} s"))
}

/// Waits for a moment when a process's session holds the poller's lease; returns which
/// process and the session's client port.
pub(super) async fn poller_holder(run: &Run) -> anyhow::Result<(HostId, u16)> {
    let deadline = Instant::now() + LOOK;
    loop {
        for lease in timers::held_leases(&run.db.pool).await? {
            if lease.job == timers::POLLER
                && let Some(which) = timers::holder(run, &lease)
            {
                return Ok((which, lease.client_port));
            }
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "no process held the poller's lease within {LOOK:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// After the kill at `at` of the session on `dead_port`: the seconds until that session's
/// lock is gone from `pg_locks`, and until a session of process `survivor` holds the poller's
/// lease, each `None` if not within [`LOOK`].
pub(super) async fn watch_takeover(
    pool: &PgPool,
    dead_port: u16,
    survivor: u32,
    at: Instant,
) -> anyhow::Result<(Option<f64>, Option<f64>)> {
    let mut freed = None;
    while at.elapsed() < LOOK {
        let held: Vec<_> = timers::held_leases(pool)
            .await?
            .into_iter()
            .filter(|l| l.job == timers::POLLER)
            .collect();
        if freed.is_none() && !held.iter().any(|l| l.client_port == dead_port) {
            freed = Some(at.elapsed().as_secs_f64());
        }
        if !held.is_empty() {
            let ports = timers::local_ports(survivor)?;
            if held.iter().any(|l| ports.contains(&l.client_port)) {
                let took = at.elapsed().as_secs_f64();
                return Ok((freed.or(Some(took)), Some(took)));
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok((freed, None))
}
