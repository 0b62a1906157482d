//! The scenarios: each a small module with its description and, where it has one, the fault
//! it applies to a running [`Run`]. They share one shape ([`run`]): start the scenario's
//! world, then per repetition send a steady stream of pings and apply the fault at a random
//! moment of it, then settle and count.

mod amqp_blackhole;
mod amqp_close;
mod amqp_cut;
mod baseline;
mod host_kill9;
mod host_sigterm;
mod imap_drop_fetch;
mod imap_restart;
mod imap_uidvalidity;
mod memory_alarm;
mod pg_failover;
mod pg_immediate;
mod pg_restart;
mod pg_stall;
mod pg_terminate;
mod poison_429;
mod poison_malformed;
mod poison_panic;
mod rabbit_cluster_node_stop;
mod rabbit_kill9;
mod rabbit_restart;
mod rabbit_sigstop;
mod relay_outage;
mod replicas_kill;
mod rolling_upgrade;
mod sink_switch;
mod smtp_4xx_then_accept;
mod smtp_drop_after_dot;
mod smtp_login_refused;
mod smtp_no_greeting;
mod smtp_relay_down;
mod smtp_stall_after_data;
mod timer_lease_kill;
mod timer_overrun;
mod timer_replicas;

use std::path::Path;
use std::time::{Duration, Instant};

use rand::Rng;

use crate::direct::PINGS_PER_DIRECT;
use crate::mail::Pinger;
use crate::oracle::{Check, Figures};
use crate::run::{Run, Setup};

/// How much load a scenario puts on the host.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    pub repetitions: u32,
    /// Pings per repetition.
    pub per_repetition: u64,
}

/// A scenario's fault, with whatever it holds between its steps (a proxy, a private server).
/// A new one is made for every run of the scenario.
#[async_trait::async_trait]
pub trait Fault: Send {
    /// Before the host starts: starts what the fault needs in front of or instead of a
    /// service, and says how the host's settings differ ([`Setup`]).
    async fn prepare(&mut self, _dir: &Path) -> anyhow::Result<Setup> {
        Ok(Setup::default())
    }

    /// Once the first host is ready, before the first repetition: starts what the scenario
    /// runs beside it (a second replica, say).
    async fn begin(&mut self, _run: &mut Run) -> anyhow::Result<()> {
        Ok(())
    }

    /// Applies the fault to the running scenario, at a random moment of each repetition
    /// (and clears it: a fault that lasts a while waits for its end here), recording the time
    /// to ready again with [`Run::record_ready_after`] or a restart.
    async fn apply(&mut self, run: &mut Run) -> anyhow::Result<()>;

    /// After the last repetition, before the loop settles: undoes anything left applied.
    async fn finish(&mut self, _run: &mut Run) -> anyhow::Result<()> {
        Ok(())
    }

    /// After the loop settled, while the hosts still run: reads what the scenario promises
    /// beyond the common figures (from the database, `/metrics`), each a [`Check`].
    async fn verify(&mut self, _run: &mut Run) -> anyhow::Result<Vec<Check>> {
        Ok(Vec::new())
    }
}

/// Makes a scenario's fault.
pub type MakeFault = fn() -> Box<dyn Fault>;

/// One scenario of the suite.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: &'static str,
    /// What it does, for `docs/RELIABILITY.md`.
    pub about: &'static str,
    /// `None` for the baseline: no fault.
    pub fault: Option<MakeFault>,
    pub full: Load,
    pub quick: Load,
    /// Pings a second while the fault is applied.
    pub rate_per_sec: f64,
    /// The longest wait, after the last repetition, for the loop to finish its work.
    pub settle: Duration,
    /// The host's `broker.heartbeat` (given to every host process of the scenario): a dead
    /// connection is noticed within two of them, and "ready again" must come within two.
    pub heartbeat: Duration,
}

/// The scenarios that need a host built with `--features fault-injection` (given by
/// `--fault-injection-host-bin`).
pub const NEEDS_FAULT_INJECTION: &[&str] = &["poison-panic"];

/// The scenarios `--quick` leaves out unless named with `--scenario`: what they start takes
/// too long for CI's quick run (a three-node cluster: about 40 s before the first ping; the
/// previous release's cold build: minutes), or the quick run has their kind already (the
/// synchronous failover stands for the asynchronous one and the switchover).
pub const FULL_RUN_ONLY: &[&str] = &[
    "rabbit-cluster-node-stop",
    "rolling-upgrade",
    "pg-failover-async",
    "pg-switchover",
];

/// The host's own default `broker.heartbeat`, which most scenarios keep.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(10);

/// Every scenario built so far, in the order a run takes them.
pub fn all() -> Vec<Scenario> {
    vec![
        baseline::scenario(),
        // The broker.
        rabbit_restart::scenario(),
        rabbit_kill9::scenario(),
        rabbit_sigstop::scenario(),
        amqp_close::scenario(),
        amqp_cut::scenario(),
        amqp_blackhole::scenario(),
        memory_alarm::scenario(),
        rabbit_cluster_node_stop::scenario(),
        // The database.
        pg_restart::scenario(),
        pg_immediate::scenario(),
        pg_terminate::scenario(),
        pg_stall::scenario(),
        pg_failover::sync(),
        pg_failover::asynchronous(),
        pg_failover::switchover(),
        // The host itself.
        host_kill9::scenario(),
        host_sigterm::scenario(),
        // Poison.
        poison_malformed::scenario(),
        poison_panic::scenario(),
        poison_429::scenario(),
        // Timers and replicas.
        timer_overrun::scenario(),
        timer_replicas::scenario(),
        replicas_kill::scenario(),
        timer_lease_kill::scenario(),
        // Releases side by side.
        rolling_upgrade::scenario(),
        // The mail servers.
        smtp_no_greeting::scenario(),
        smtp_stall_after_data::scenario(),
        smtp_4xx_then_accept::scenario(),
        smtp_drop_after_dot::scenario(),
        smtp_login_refused::scenario(),
        smtp_relay_down::scenario(),
        imap_drop_fetch::scenario(),
        imap_restart::scenario(),
        imap_uidvalidity::scenario(),
    ]
}

/// For the faults aimed at a send's window: waits (up to the send timeout and a margin, for
/// the sends still waiting when the fault ended) until the host has counted an unknown
/// outcome, and fails as a harness error when none came: then the fault never met a send
/// where it was meant to, and the run proves nothing.
pub async fn expect_unknown_outcomes(run: &Run, fault: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if run.unknown_outcomes().await > 0 {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "no send met {fault} (no unknown outcome was counted): the fault was not applied"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Runs one scenario with `load` and returns its figures (a harness failure is one of them).
pub async fn run(scenario: &Scenario, load: Load, binary: &Path, dir: &Path) -> Figures {
    let started = Instant::now();
    let mut figures = Figures {
        scenario: scenario.name.to_string(),
        repetitions: load.repetitions,
        ready_limit_secs: Some(2.0 * scenario.heartbeat.as_secs_f64()),
        ..Figures::default()
    };
    if let Err(err) = run_inner(scenario, load, binary, dir, &mut figures).await {
        figures.harness_error = Some(format!("{err:#}"));
    }
    figures.duration_secs = started.elapsed().as_secs_f64();
    figures
}

async fn run_inner(
    scenario: &Scenario,
    load: Load,
    binary: &Path,
    dir: &Path,
    figures: &mut Figures,
) -> anyhow::Result<()> {
    let mut fault = scenario.fault.map(|make| make());
    let mut setup = match fault.as_mut() {
        Some(fault) => fault.prepare(dir).await?,
        None => Setup::default(),
    };
    setup.env.push((
        "WORKER_HOST__BROKER__HEARTBEAT".into(),
        format!("{}ms", scenario.heartbeat.as_millis()),
    ));
    let mut run = Run::start(scenario.name, binary, dir, setup).await?;
    run.per_repetition = load.per_repetition;
    eprintln!(
        "faults: {}: database {}, vhost {}, account {}, log {}",
        scenario.name,
        run.db.name,
        run.vhost.name,
        run.boxes.account,
        run.log_path().display()
    );
    if let Some(fault) = fault.as_mut() {
        fault.begin(&mut run).await?;
    }
    let pinger = Pinger::new(&run.boxes, scenario.name)?;
    let mut pings = Vec::new();
    let mut send_errors = Vec::new();
    let mut direct_errors = Vec::new();
    let window = load.per_repetition as f64 / scenario.rate_per_sec;
    for repetition in 0..load.repetitions {
        let first = pings.len() as u64;
        let sender = pinger.clone();
        let (count, rate) = (load.per_repetition, scenario.rate_per_sec);
        let sending = tokio::spawn(async move { sender.steady(first, count, rate).await });
        // The direct commands: one of each kind for every `PINGS_PER_DIRECT` pings, over the
        // same window.
        let direct = run.direct.clone();
        let direct_sending = tokio::spawn(async move {
            direct
                .steady(count / PINGS_PER_DIRECT, rate / PINGS_PER_DIRECT as f64)
                .await
        });
        if let Some(fault) = fault.as_mut() {
            let at = window * rand::rng().random_range(0.2..0.8);
            tokio::time::sleep(Duration::from_secs_f64(at)).await;
            fault.apply(&mut run).await?;
        }
        let (sent, errors) = sending.await?;
        pings.extend(sent);
        pings.append(&mut run.fault_pings);
        send_errors.extend(errors);
        let (expected, errors) = direct_sending.await?;
        run.direct_expected.extend(expected);
        direct_errors.extend(errors);
        eprintln!(
            "faults: {}: repetition {}/{} done, {} pings sent",
            scenario.name,
            repetition + 1,
            load.repetitions,
            pings.len()
        );
    }
    if let Some(fault) = fault.as_mut() {
        fault.finish(&mut run).await?;
    }
    if let Some(first) = send_errors.first() {
        eprintln!(
            "faults: {}: {} pings the SMTP server did not take (not counted), first: {first}",
            scenario.name,
            send_errors.len()
        );
    }
    if let Some(first) = direct_errors.first() {
        eprintln!(
            "faults: {}: {} direct commands not published (not counted), first: {first}",
            scenario.name,
            direct_errors.len()
        );
    }
    let settle = scenario.settle + Duration::from_secs(pings.len() as u64 / 20);
    run.settle(pings.len(), settle).await;
    if let Some(fault) = fault.as_mut() {
        figures.checks = fault.verify(&mut run).await?;
        for check in &figures.checks {
            eprintln!(
                "faults: {}: {} ({})",
                scenario.name,
                check.what,
                if check.passed { "holds" } else { "FAILS" }
            );
        }
    }
    run.count(&pings, figures).await
}
