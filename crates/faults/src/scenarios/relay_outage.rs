//! What the two relay outages share (`smtp-login-refused`, `smtp-relay-down`): retry tiers
//! that a reply works through within seconds (three tries: 2 s and 5 s apart), an outage
//! longer than all of them, short circuit cool-downs, the fault itself ([`Outage`], around a
//! [`Switch`] in front of the SMTP sink), and the checks that the relay's circuit opened and
//! closed and that nothing was dead-lettered.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;

use super::{Fault, Load, Scenario};
use crate::oracle::Check;
use crate::run::{Run, Setup};

/// What stands in front of the SMTP sink and puts the relay out and back.
#[async_trait::async_trait]
pub trait Switch: Send + Sync + Sized + 'static {
    /// Starts it in front of the sink at `sink`.
    async fn start(sink: std::net::SocketAddr) -> anyhow::Result<Self>;
    /// The port the host sends to.
    fn port(&self) -> u16;
    /// Settings the host needs besides the port.
    fn env(&self) -> Vec<(String, String)> {
        Vec::new()
    }
    fn out(&self);
    fn back(&self);
    /// What it saw, as checks (beside the circuit's).
    fn checks(&self) -> Vec<Check> {
        Vec::new()
    }
}

/// The fault: the relay out for [`OUTAGE`] at a random moment of each repetition, then back.
pub struct Outage<S> {
    switch: Option<S>,
}

impl<S> Default for Outage<S> {
    fn default() -> Self {
        Self { switch: None }
    }
}

#[async_trait::async_trait]
impl<S: Switch> Fault for Outage<S> {
    async fn prepare(&mut self, _dir: &Path) -> anyhow::Result<Setup> {
        let sink = tokio::net::lookup_host(worker_testkit::smtp_addr())
            .await?
            .next()
            .context("the SMTP sink's address resolves to nothing")?;
        let switch = S::start(sink)
            .await
            .context("starting what stands in front of the SMTP sink")?;
        let mut env = self::env();
        env.push(("WORKER_HOST__SMTP__PORT".into(), switch.port().to_string()));
        env.extend(switch.env());
        self.switch = Some(switch);
        Ok(Setup {
            env,
            ..Setup::default()
        })
    }

    async fn begin(&mut self, run: &mut Run) -> anyhow::Result<()> {
        run.expected_dead_letters = Some(0);
        Ok(())
    }

    async fn apply(&mut self, run: &mut Run) -> anyhow::Result<()> {
        let switch = self.switch.as_ref().context("the switch was not started")?;
        switch.out();
        tokio::time::sleep(OUTAGE).await;
        let back = Instant::now();
        switch.back();
        run.record_ready_after(back).await
    }

    async fn finish(&mut self, _run: &mut Run) -> anyhow::Result<()> {
        if let Some(switch) = &self.switch {
            switch.back();
        }
        Ok(())
    }

    async fn verify(&mut self, run: &mut Run) -> anyhow::Result<Vec<Check>> {
        let mut checks = self.switch.as_ref().map(S::checks).unwrap_or_default();
        checks.extend(circuit_checks(run)?);
        Ok(checks)
    }
}

/// How long the relay is out: longer than a reply's every try (2 s + 5 s of tiers and three
/// sends), so that without the circuit every reply met in it would give up.
pub const OUTAGE: Duration = Duration::from_secs(30);

/// The settings both give every host process: three tries, a probe after 2 s, at most 5 s
/// apart.
pub fn env() -> Vec<(String, String)> {
    [
        ("WORKER_HOST__JOBS__EMAIL_SEND__MAX_ATTEMPTS", "3"),
        ("WORKER_HOST__CIRCUITS__COOL_DOWN", "2s"),
        ("WORKER_HOST__CIRCUITS__MAX_COOL_DOWN", "5s"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// The scenario's shape, with its own name, description and fault.
pub fn scenario(name: &'static str, about: &'static str, fault: super::MakeFault) -> Scenario {
    Scenario {
        name,
        about,
        fault: Some(fault),
        full: Load {
            repetitions: 3,
            per_repetition: 20,
        },
        quick: Load {
            repetitions: 1,
            per_repetition: 20,
        },
        rate_per_sec: 2.0,
        settle: Duration::from_secs(180),
        heartbeat: super::DEFAULT_HEARTBEAT,
    }
}

/// The relay's circuit opened and closed again, as the host's log says.
pub fn circuit_checks(run: &Run) -> anyhow::Result<Vec<Check>> {
    let log = std::fs::read_to_string(run.log_path())?;
    let opened = log.matches("circuit opened").count();
    let closed = log.matches("circuit closed").count();
    Ok(vec![
        Check::new(
            format!("relay circuit opened: {opened} times (must be at least 1)"),
            opened >= 1,
        ),
        Check::new(
            format!("relay circuit closed: {closed} times (must be at least 1)"),
            closed >= 1,
        ),
    ])
}
