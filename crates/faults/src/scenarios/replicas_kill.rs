//! `replicas-kill`: three replicas of one installation under the mail loop's load; the one
//! holding the poller's lease and one other are killed with SIGKILL at once, the third takes
//! the lease over, and every mail is answered once.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use worker_testkit::FaultProxy;

use super::timer_lease_kill::{poller_holder, secs, watch_takeover};
use super::timer_replicas::{replica_checks, slow_imap_replicas};
use super::{Fault, Load, Scenario};
use crate::oracle::Check;
use crate::run::{HostId, Run, Setup};
use crate::timers::HolderSamples;

/// The poller's interval in the replica settings ([`timers::replica_env`]).
const INTERVAL: Duration = Duration::from_secs(1);

/// How long a held lease's session may stay silent before its holder counts it as lost: the
/// margin of the takeover's bound (as `timer-lease-kill`).
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// Host processes in the scenario: the first and two replicas.
const PROCESSES: usize = 3;

pub fn scenario() -> Scenario {
    Scenario {
        name: "replicas-kill",
        about: "Three host processes with the same settings (database, vhost, IMAP account; the \
                leased jobs every second, as `timer-replicas`, IMAP through a proxy that makes \
                every chunk wait 50 ms so that a poll holds its lease most of the time), each \
                with its own admin port, log and replica name (`r0`, `r1`, `r2`), all consuming \
                the same queues and draining the same outbox. At a random moment of each \
                repetition the harness finds which process holds the poller's lease, kills it \
                and one of the two others with `kill -9` at once, and starts both again once \
                the third holds the lease (or 30 s passed). Checked beyond the common figures \
                (every mail answered once, nothing lost or left behind): the third took the \
                poller's lease within one interval plus the lease's 5 s check timeout; no two \
                ticks of a leased job overlapping in the attempt log; every process settled \
                deliveries; each process's `/status` names its own replica, and the \
                `replicas` table lists all three. \"Ready again\" is from the kill until both \
                killed processes answered `/readyz` 200.",
        fault: Some(|| Box::new(ReplicasKill::default())),
        full: Load {
            repetitions: 5,
            per_repetition: 30,
        },
        quick: Load {
            repetitions: 1,
            per_repetition: 30,
        },
        rate_per_sec: 6.0,
        settle: Duration::from_secs(240),
        heartbeat: super::DEFAULT_HEARTBEAT,
    }
}

/// The fault: see [`scenario`]'s description.
#[derive(Default)]
struct ReplicasKill {
    imap: Option<FaultProxy>,
    /// Per kill: the seconds until the dead session's lock was gone, and until the survivor
    /// held it.
    takeovers: Vec<(Option<f64>, Option<f64>)>,
}

#[async_trait::async_trait]
impl Fault for ReplicasKill {
    async fn prepare(&mut self, _dir: &Path) -> anyhow::Result<Setup> {
        slow_imap_replicas(&mut self.imap).await
    }

    async fn begin(&mut self, run: &mut Run) -> anyhow::Result<()> {
        for _ in 1..PROCESSES {
            run.start_replica().await?;
        }
        Ok(())
    }

    async fn apply(&mut self, run: &mut Run) -> anyhow::Result<()> {
        let (holder, port) = poller_holder(run).await?;
        let ids = run.host_ids();
        let others: Vec<HostId> = ids.iter().copied().filter(|id| *id != holder).collect();
        let (also_killed, survivor) = match others.as_slice() {
            [a, b] => (*a, *b),
            _ => anyhow::bail!("expected {PROCESSES} processes, found {}", ids.len()),
        };
        let survivor_pid = run
            .process(survivor)
            .context("the surviving process is not running")?
            .pid();
        let at = run.kill9(holder).await?;
        run.kill9(also_killed).await?;
        let (freed, took) = watch_takeover(&run.db.pool, port, survivor_pid, at).await?;
        eprintln!(
            "faults: replicas-kill: killed the {} (holding the poller's lease) and the {}; the lock gone after {}, taken over by the {} after {}",
            holder.as_str(),
            also_killed.as_str(),
            secs(freed),
            survivor.as_str(),
            secs(took),
        );
        run.respawn(holder).await?;
        run.respawn(also_killed).await?;
        run.ready.push(at.elapsed().as_secs_f64());
        self.takeovers.push((freed, took));
        Ok(())
    }

    async fn finish(&mut self, _run: &mut Run) -> anyhow::Result<()> {
        if let Some(proxy) = &self.imap {
            proxy.heal();
        }
        Ok(())
    }

    async fn verify(&mut self, run: &mut Run) -> anyhow::Result<Vec<Check>> {
        let mut checks = replica_checks(run, &HolderSamples::default(), true).await?;
        let limit = (INTERVAL + CHECK_TIMEOUT).as_secs_f64();
        let worst = self
            .takeovers
            .iter()
            .map(|(_, took)| *took)
            .try_fold(0.0_f64, |worst, took| took.map(|t| worst.max(t)));
        checks.push(Check::new(
            format!(
                "poller lease taken over by the third process after at most {} of {} double kills (limit {limit:.1} s)",
                secs(worst),
                self.takeovers.len()
            ),
            worst.is_some_and(|w| w <= limit),
        ));
        checks.push(names_check(run).await?);
        Ok(checks)
    }
}

/// Each process's `/status` names its own replica, and the `replicas` table lists them all.
async fn names_check(run: &Run) -> anyhow::Result<Check> {
    let mut named = Vec::new();
    for which in run.host_ids() {
        let process = run
            .process(which)
            .with_context(|| format!("the {} is not running", which.as_str()))?;
        let status = process.status().await?;
        named.push((
            which.replica_name(),
            status["replica"].as_str().unwrap_or_default().to_string(),
        ));
    }
    let listed: BTreeSet<String> = sqlx::query_scalar("SELECT name FROM replicas")
        .fetch_all(&run.db.pool)
        .await?
        .into_iter()
        .collect();
    let expected: BTreeSet<String> = named.iter().map(|(name, _)| name.clone()).collect();
    let own = named.iter().all(|(name, shown)| name == shown);
    Ok(Check::new(
        format!(
            "replica names: /status says {} (each its own: {own}); the replicas table lists {} (must be all {PROCESSES})",
            named
                .iter()
                .map(|(_, shown)| shown.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            listed.iter().cloned().collect::<Vec<_>>().join(", ")
        ),
        own && expected.is_subset(&listed),
    ))
}
