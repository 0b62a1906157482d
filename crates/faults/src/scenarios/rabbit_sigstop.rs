//! `rabbit-sigstop`: the scenario's private RabbitMQ node frozen with SIGSTOP for longer than
//! two heartbeats, then continued.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;

use super::{Fault, Load, Scenario};
use crate::rabbit_node::{RabbitNode, ScenarioSetup as _};
use crate::run::{Run, Setup};

/// The host's heartbeat in this scenario: short, so that the freeze need not be long.
const HEARTBEAT: Duration = Duration::from_secs(5);

/// How long the node stays frozen: three heartbeats, more than the two within which the host
/// must notice.
const FROZEN: Duration = Duration::from_secs(15);

pub fn scenario() -> Scenario {
    Scenario {
        name: "rabbit-sigstop",
        about: "The host runs against a private RabbitMQ node the scenario starts, with \
                `broker.heartbeat` = 5 s. At a random moment of each repetition the node's OS \
                process gets SIGSTOP: its sockets stay open and silent (no reset, no close), \
                as a frozen or partitioned server. It stays stopped 15 s (three heartbeats); \
                the host must notice the dead connection by its missing heartbeats and go \
                not ready within that time (`/readyz` is watched; a freeze it never notices \
                fails the scenario), then the node gets SIGCONT. \"Ready again\" is from the \
                SIGCONT, bounded by two heartbeats (10 s).",
        fault: Some(|| Box::new(RabbitSigstop::default())),
        full: Load {
            repetitions: 2,
            per_repetition: 30,
        },
        quick: Load {
            repetitions: 1,
            per_repetition: 20,
        },
        rate_per_sec: 10.0,
        settle: Duration::from_secs(180),
        heartbeat: HEARTBEAT,
    }
}

/// The fault: see [`scenario`]'s description.
#[derive(Default)]
struct RabbitSigstop {
    node: Option<RabbitNode>,
}

#[async_trait::async_trait]
impl Fault for RabbitSigstop {
    async fn prepare(&mut self, dir: &Path) -> anyhow::Result<Setup> {
        let node = RabbitNode::start(dir).await?;
        let setup = node.setup();
        self.node = Some(node);
        Ok(setup)
    }

    async fn apply(&mut self, run: &mut Run) -> anyhow::Result<()> {
        let node = self
            .node
            .as_ref()
            .context("the private node is not started")?;
        node.signal("STOP").await?;
        let noticed = run.left_ready_within(FROZEN).await;
        // Continue the node whatever the watch said, or the scenario could not end.
        node.signal("CONT").await?;
        let continued = Instant::now();
        if !noticed? {
            eprintln!("faults: rabbit-sigstop: /readyz stayed 200 while the node was stopped");
            run.unnoticed_faults += 1;
        }
        run.record_ready_after(continued).await
    }
}
