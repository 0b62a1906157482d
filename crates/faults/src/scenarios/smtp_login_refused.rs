//! `smtp-login-refused`: the relay refuses every sign-in (`535 5.7.8`) for longer than a
//! reply's every try, then takes them again.

use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use worker_testkit::SignInGate;

use super::relay_outage::{self, OUTAGE};
use super::{Fault, Scenario};
use crate::oracle::Check;
use crate::run::{Run, Setup};

pub fn scenario() -> Scenario {
    relay_outage::scenario(
        "smtp-login-refused",
        "The host signs in to its relay through a `SignInGate` in front of the shared SMTP \
         sink (it offers AUTH and passes the rest through). At a random moment of each \
         repetition the gate answers every AUTH `535 5.7.8 Authentication credentials \
         invalid` for 30 s, longer than a reply's every try (three, 2 s and 5 s apart, for \
         this scenario), then takes sign-ins again. The first refusal opens the relay's \
         circuit at once: the sender's consumers stop on every replica, the reply in hand \
         goes back to its queue uncharged, and a sign-in probes the relay every 2 to 5 s. \
         Nothing may be dead-lettered and every ping is answered once. \"Ready again\" is \
         from the gate taking sign-ins again.",
        || Box::new(SmtpLoginRefused::default()),
    )
}

/// The fault: see [`scenario`]'s description.
#[derive(Default)]
struct SmtpLoginRefused {
    gate: Option<SignInGate>,
}

#[async_trait::async_trait]
impl Fault for SmtpLoginRefused {
    async fn prepare(&mut self, _dir: &Path) -> anyhow::Result<Setup> {
        let sink = tokio::net::lookup_host(worker_testkit::smtp_addr())
            .await?
            .next()
            .context("the SMTP sink's address resolves to nothing")?;
        let gate = SignInGate::start(sink)
            .await
            .context("starting the sign-in gate in front of the SMTP sink")?;
        let mut env = relay_outage::env();
        env.push(("WORKER_HOST__SMTP__PORT".into(), gate.port().to_string()));
        env.push(("WORKER_HOST__SMTP__USERNAME".into(), "faults".into()));
        env.push(("WORKER_HOST__SMTP__PASSWORD".into(), "secret".into()));
        self.gate = Some(gate);
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
        let gate = self.gate.as_ref().context("the gate was not started")?;
        gate.refuse();
        tokio::time::sleep(OUTAGE).await;
        let healed = Instant::now();
        gate.accept();
        run.record_ready_after(healed).await
    }

    async fn finish(&mut self, _run: &mut Run) -> anyhow::Result<()> {
        if let Some(gate) = &self.gate {
            gate.accept();
        }
        Ok(())
    }

    async fn verify(&mut self, run: &mut Run) -> anyhow::Result<Vec<Check>> {
        let refused = self.gate.as_ref().map_or(0, SignInGate::refused);
        let mut checks = vec![Check::new(
            format!("sign-ins refused by the relay: {refused} (must be at least 1)"),
            refused >= 1,
        )];
        checks.extend(relay_outage::circuit_checks(run)?);
        Ok(checks)
    }
}
