//! `host-kill9`: the host killed with SIGKILL at a random moment under load, then started
//! again.

use std::time::Duration;

use super::{DEFAULT_HEARTBEAT, Fault, Load, Scenario};
use crate::run::Run;

pub fn scenario() -> Scenario {
    Scenario {
        name: "host-kill9",
        about: "While pings arrive, the host is killed with `kill -9` at a random moment of each \
                repetition (between 20 % and 80 % of its sending window) and started again at \
                once with the same settings; the pings sent meanwhile wait in IMAP. Work the \
                dead process held comes back: unacked deliveries are redelivered, an email \
                claimed `sending` is taken over once its claim is stale (`jobs.email_send.claim_stale_after`, \
                45 s here: the 10 s send timeout + the 30 s record budget + 5 s). \"Ready again\" is from the new process's start.",
        fault: Some(|| Box::new(HostKill9)),
        full: Load {
            repetitions: 20,
            per_repetition: 30,
        },
        quick: Load {
            repetitions: 1,
            per_repetition: 20,
        },
        rate_per_sec: 10.0,
        settle: Duration::from_secs(300),
        heartbeat: DEFAULT_HEARTBEAT,
    }
}

/// The fault: see [`scenario`]'s description.
struct HostKill9;

#[async_trait::async_trait]
impl Fault for HostKill9 {
    async fn apply(&mut self, run: &mut Run) -> anyhow::Result<()> {
        apply(run).await
    }
}

async fn apply(run: &mut Run) -> anyhow::Result<()> {
    run.kill9_and_restart().await
}
