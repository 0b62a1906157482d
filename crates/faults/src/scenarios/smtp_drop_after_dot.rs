//! `smtp-drop-after-dot`: the connection to the SMTP server dropped after the final "." of a
//! reply, before the server's answer.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use worker_testkit::FaultProxy;

use super::sink_switch::SinkSwitch;
use super::{Fault, Load, Scenario};
use crate::run::{Run, Setup};

/// How late the sink answers the final "." while the fault lasts: within the host's 10 s
/// send timeout, so that only the cut ends the wait.
const LATE_BY_SECS: u64 = 8;

/// The cuts of one repetition, this far apart: each drops the sends whose final "." went out
/// since the previous one.
const CUT_EVERY: Duration = Duration::from_secs(3);
const CUTS: u32 = 3;

pub fn scenario() -> Scenario {
    Scenario {
        name: "smtp-drop-after-dot",
        about: "The host's SMTP goes through a `FaultProxy` in front of the shared SMTP sink. \
                At a random moment of each repetition the sink's late-answer switch for the \
                scenario's own sender (`<services dir>/smtp-delay/<sender>`, `8`: delivered at \
                once, the final \".\" answered after 8 s, within the host's 10 s send timeout) \
                is set, and the proxy cuts every open connection 3 times, 3 s apart: the \
                replies waiting for their answer lose their connection after the final \".\". \
                Then the switch is removed. Each such send is an unknown outcome, sent again by \
                the command's next delivery, so duplicates must stay within the faults in a \
                send's window and no ping may be lost. The scenario fails as a harness error if \
                no send met a cut after its \".\". \"Ready again\" is from the switch's removal.",
        fault: Some(|| Box::new(SmtpDropAfterDot::default())),
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
struct SmtpDropAfterDot {
    proxy: Option<FaultProxy>,
}

#[async_trait::async_trait]
impl Fault for SmtpDropAfterDot {
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
        let switch = SinkSwitch::delay(&run.boxes.sender, LATE_BY_SECS)?;
        for _ in 0..CUTS {
            tokio::time::sleep(CUT_EVERY).await;
            proxy.cut();
        }
        let removed = Instant::now();
        drop(switch);
        run.record_ready_after(removed).await
    }

    async fn finish(&mut self, run: &mut Run) -> anyhow::Result<()> {
        super::expect_unknown_outcomes(run, "a cut after the final \".\"").await
    }
}
