//! `timer-replicas`: two host processes on one installation (database, vhost, IMAP account),
//! competing for the queues and for the leased timer jobs while pings flow.

use std::path::Path;
use std::time::Duration;

use worker_testkit::FaultProxy;

use super::timer_overrun::overlap_check;
use super::{Fault, Load, Scenario};
use crate::host::metric_sum;
use crate::oracle::Check;
use crate::run::{Run, Setup};
use crate::timers::{self, HolderSamples};

/// The wait the IMAP proxy puts on every chunk either way, for the whole run: a poll lasts
/// about a second, so that the replicas' polls meet and overlapping ones would show.
pub const IMAP_DELAY: Duration = Duration::from_millis(50);

pub fn scenario() -> Scenario {
    Scenario {
        name: "timer-replicas",
        about: "Two host processes with the same settings (database, vhost, IMAP account), each \
                with its own admin port and log, both started before the pings: their consumers \
                share the queues and their timers compete for the leases (the poller, \
                draft expiry, dead-letter maintenance, retention and the reconciler \
                every second, on the same second of the clock in both); IMAP is reached through a TCP proxy that makes every chunk wait \
                50 ms, so that a poll lasts about a second, about its interval, and the two \
                processes' polls contend for the lease. No fault is applied: for a stretch of each repetition the harness \
                samples every 20 ms which process's session holds each leased job's advisory \
                lock (`pg_locks`, the session's client port matched to the process's sockets in \
                `/proc`). Checked beyond the common figures: no two ticks of one leased job \
                overlapping in the attempt log (every tick written, its span from the moment its \
                work began with the lease held to its end before the lease went back; 25 ms slack); ticks skipped on the lease above \
                0 (the replicas really met); both processes settled deliveries (the consumers \
                compete); never two holders of one lease in a sample. The unknown send outcomes \
                of both processes are counted. No fault, so no \"ready again\".",
        fault: Some(|| Box::new(TimerReplicas::default())),
        full: Load {
            repetitions: 5,
            per_repetition: 40,
        },
        quick: Load {
            repetitions: 1,
            per_repetition: 40,
        },
        rate_per_sec: 10.0,
        settle: Duration::from_secs(120),
        heartbeat: super::DEFAULT_HEARTBEAT,
    }
}

/// The fault (none, but the replica and the samples): see [`scenario`]'s description.
#[derive(Default)]
struct TimerReplicas {
    imap: Option<FaultProxy>,
    holders: HolderSamples,
}

/// What the replica scenarios prepare: IMAP through a proxy that slows every chunk by
/// [`IMAP_DELAY`] (kept in `imap` for the scenario's life), and the replica settings.
pub async fn slow_imap_replicas(imap: &mut Option<FaultProxy>) -> anyhow::Result<Setup> {
    let proxy = FaultProxy::start(worker_testkit::imap_addr()).await?;
    proxy.slow(IMAP_DELAY);
    let setup = Setup {
        env: timers::replica_env(),
        imap_port: Some(proxy.port()),
        ..Setup::default()
    };
    *imap = Some(proxy);
    Ok(setup)
}

#[async_trait::async_trait]
impl Fault for TimerReplicas {
    async fn prepare(&mut self, _dir: &Path) -> anyhow::Result<Setup> {
        slow_imap_replicas(&mut self.imap).await
    }

    async fn begin(&mut self, run: &mut Run) -> anyhow::Result<()> {
        run.start_replica().await
    }

    async fn apply(&mut self, run: &mut Run) -> anyhow::Result<()> {
        let sampled = timers::sample_holders(run, Duration::from_secs(3)).await?;
        self.holders.samples += sampled.samples;
        self.holders.held_by_first += sampled.held_by_first;
        self.holders.held_by_replica += sampled.held_by_replica;
        self.holders.handovers += sampled.handovers;
        self.holders.doubly_held += sampled.doubly_held;
        Ok(())
    }

    async fn verify(&mut self, run: &mut Run) -> anyhow::Result<Vec<Check>> {
        replica_checks(run, &self.holders, true).await
    }
}

/// What both replica scenarios check with both processes running: no overlapping leased
/// ticks, ticks skipped on the lease, deliveries on both processes (when `both_deliver`: a
/// process restarted late in the run may have had none left), and the lease samples (when
/// any were taken).
pub async fn replica_checks(
    run: &Run,
    holders: &HolderSamples,
    both_deliver: bool,
) -> anyhow::Result<Vec<Check>> {
    let mut skipped_lease = 0;
    let mut deliveries = Vec::new();
    for which in run.host_ids() {
        let host = run
            .process(which)
            .ok_or_else(|| anyhow::anyhow!("the {} host is not running", which.as_str()))?;
        let scrape = host.metrics().await?;
        skipped_lease += crate::host::metric_sum_with(
            &scrape,
            "worker_ticks_total",
            &[("outcome", "skipped-lease")],
        ) as u64;
        deliveries.push(metric_sum(&scrape, "worker_messages_total") as u64);
    }
    let mut checks = vec![
        overlap_check(run).await?,
        Check::new(
            format!("leased ticks skipped on the lease: {skipped_lease} (must be > 0)"),
            skipped_lease > 0,
        ),
    ];
    if both_deliver {
        let settled: Vec<String> = run
            .host_ids()
            .iter()
            .zip(&deliveries)
            .map(|(which, n)| format!("{n} {}", which.as_str()))
            .collect();
        checks.push(Check::new(
            format!(
                "deliveries settled: {} (each must be > 0)",
                settled.join(", ")
            ),
            deliveries.iter().all(|d| *d > 0),
        ));
    }
    if holders.samples > 0 {
        checks.push(Check::new(
            format!(
                "lease samples: {} ({} held by the first, {} by the replica, {} handovers, {} doubly held, must be 0)",
                holders.samples,
                holders.held_by_first,
                holders.held_by_replica,
                holders.handovers,
                holders.doubly_held
            ),
            holders.doubly_held == 0,
        ));
    }
    Ok(checks)
}
