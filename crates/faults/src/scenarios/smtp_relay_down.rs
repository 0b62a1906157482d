//! `smtp-relay-down`: the relay refuses connections for longer than a reply's every try, then
//! is back.

use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use worker_testkit::FaultProxy;

use super::relay_outage::{self, OUTAGE};
use super::{Fault, Scenario};
use crate::oracle::Check;
use crate::run::{Run, Setup};

pub fn scenario() -> Scenario {
    relay_outage::scenario(
        "smtp-relay-down",
        "The host's SMTP goes through a `FaultProxy` in front of the shared SMTP sink. At a \
         random moment of each repetition the proxy cuts its open connections and stops \
         listening (connections refused) for 30 s, longer than a reply's every try (three, 2 s and 5 s apart, for this \
         scenario), then listens again. Five refused connections in a row open the relay's \
         circuit: the sender's consumers stop, what they held goes back to its queue \
         uncharged, and a sign-in probes the relay every 2 to 5 s. The replies that failed \
         before it opened are parked with a try counted, as any transient failure. Nothing \
         may be dead-lettered and every ping is answered once. \"Ready again\" is from the \
         proxy listening again.",
        || Box::new(SmtpRelayDown::default()),
    )
}

/// The fault: see [`scenario`]'s description.
#[derive(Default)]
struct SmtpRelayDown {
    proxy: Option<FaultProxy>,
}

#[async_trait::async_trait]
impl Fault for SmtpRelayDown {
    async fn prepare(&mut self, _dir: &Path) -> anyhow::Result<Setup> {
        let proxy = FaultProxy::start(worker_testkit::smtp_addr())
            .await
            .context("starting the proxy in front of the SMTP sink")?;
        let mut env = relay_outage::env();
        env.push(("WORKER_HOST__SMTP__PORT".into(), proxy.port().to_string()));
        self.proxy = Some(proxy);
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
        let proxy = self.proxy.as_ref().context("the proxy was not started")?;
        // Down: nothing new connects, and the pool's open connections die with it.
        proxy.refuse();
        proxy.cut();
        tokio::time::sleep(OUTAGE).await;
        let healed = Instant::now();
        proxy.heal();
        run.record_ready_after(healed).await
    }

    async fn finish(&mut self, _run: &mut Run) -> anyhow::Result<()> {
        if let Some(proxy) = &self.proxy {
            proxy.heal();
        }
        Ok(())
    }

    async fn verify(&mut self, run: &mut Run) -> anyhow::Result<Vec<Check>> {
        relay_outage::circuit_checks(run)
    }
}
