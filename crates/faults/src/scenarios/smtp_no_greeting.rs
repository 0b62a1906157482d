//! `smtp-no-greeting`: the SMTP server accepts connections and never greets, for longer than
//! the host's connect timeout, then comes back.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use worker_testkit::FaultProxy;

use super::{Fault, Load, Scenario};
use crate::run::{Run, Setup};

/// How long the server stays silent: longer than the host's SMTP connect timeout (10 s,
/// `job_email_send::SmtpSettings`'s default, which bounds the TCP connect and the greeting
/// together) and its send timeout (`jobs.email_send.timeout`, 10 s here).
const SILENCE: Duration = Duration::from_secs(15);

pub fn scenario() -> Scenario {
    Scenario {
        name: "smtp-no-greeting",
        about: "The host's SMTP goes through a `FaultProxy` in front of the shared SMTP sink \
                (`smtp.port` set to the proxy's). At a random moment of each repetition the \
                proxy stalls for 15 s (longer than the host's 10 s connect timeout, which \
                bounds connect and greeting, and its 10 s send timeout): new connections are \
                accepted and never greeted, open ones stop forwarding. Then it is healed. \
                Sends in the silence fail as transient (no connection) and are retried; one \
                stalled after its final \".\" is an unknown outcome. \"Ready again\" is from \
                the heal.",
        fault: Some(|| Box::new(SmtpNoGreeting::default())),
        full: Load {
            repetitions: 10,
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

/// The fault: see [`scenario`]'s description.
#[derive(Default)]
struct SmtpNoGreeting {
    proxy: Option<FaultProxy>,
}

#[async_trait::async_trait]
impl Fault for SmtpNoGreeting {
    async fn prepare(&mut self, _dir: &Path) -> anyhow::Result<Setup> {
        let proxy = FaultProxy::start(worker_testkit::smtp_addr())
            .await
            .context("starting the proxy in front of the SMTP sink")?;
        let env = vec![("WORKER_HOST__SMTP__PORT".into(), proxy.port().to_string())];
        self.proxy = Some(proxy);
        Ok(Setup {
            env,
            ..Setup::default()
        })
    }

    async fn apply(&mut self, run: &mut Run) -> anyhow::Result<()> {
        let proxy = self.proxy.as_ref().context("the proxy was not started")?;
        proxy.stall();
        tokio::time::sleep(SILENCE).await;
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
}
