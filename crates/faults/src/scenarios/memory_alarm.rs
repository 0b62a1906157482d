//! `memory-alarm`: the scenario's private RabbitMQ node raises a memory alarm for 30 s, so
//! that every publisher is blocked (`connection.blocked`), then clears it.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;

use super::{DEFAULT_HEARTBEAT, Fault, Load, Scenario};
use crate::mail::Pinger;
use crate::rabbit_node::{RabbitNode, ScenarioSetup as _};
use crate::run::{Run, Setup};

/// How long the alarm lasts.
const ALARM: Duration = Duration::from_secs(30);

pub fn scenario() -> Scenario {
    Scenario {
        name: "memory-alarm",
        about: "The host runs against a private RabbitMQ node the scenario starts. At a random \
                moment of the repetition the node raises a memory alarm (`rabbitmqctl -n <node> \
                eval 'rabbit_alarm:set_alarm({{resource_limit, memory, node()}, []}).'`): the \
                broker sends `connection.blocked` and stops reading from publishing \
                connections, so the host's publishes (the outbox drain's, the consumers' \
                parking) wait; one more ping, sent as soon as the alarm is on and counted with \
                the load's, makes sure the host publishes meanwhile. After 30 s the alarm is cleared (`rabbit_alarm:clear_alarm`). \
                The pings sent meanwhile must all be answered once publishing resumes, and no \
                waiting publish may bring the host down. \"Ready again\" is from the clear.",
        fault: Some(|| Box::new(MemoryAlarm::default())),
        full: Load {
            repetitions: 1,
            per_repetition: 60,
        },
        quick: Load {
            repetitions: 1,
            per_repetition: 20,
        },
        rate_per_sec: 2.0,
        settle: Duration::from_secs(180),
        heartbeat: DEFAULT_HEARTBEAT,
    }
}

/// The fault: see [`scenario`]'s description.
#[derive(Default)]
struct MemoryAlarm {
    node: Option<RabbitNode>,
}

#[async_trait::async_trait]
impl Fault for MemoryAlarm {
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
        node.ctl(&[
            "eval",
            "rabbit_alarm:set_alarm({{resource_limit, memory, node()}, []}).",
        ])
        .await?;
        // The broker tells a connection it is blocked only once that connection publishes.
        // The load's pings may all be worked before `rabbitmqctl eval` returns (it took
        // longer than the quick load's 10 s window once in CI), so one more ping, counted
        // with them, makes the host publish while the alarm is on.
        let pinger = Pinger::new(&run.boxes, "memory-alarm, sent during the alarm")?;
        run.fault_pings.push(pinger.ping(run.per_repetition).await?);
        let noticed = run.left_ready_within(ALARM).await;
        node.ctl(&[
            "eval",
            "rabbit_alarm:clear_alarm({resource_limit, memory, node()}).",
        ])
        .await?;
        let cleared = Instant::now();
        if !noticed? {
            // Blocked is not ready (`LinkState::Blocked`): the host did not see the alarm.
            eprintln!("faults: memory-alarm: /readyz stayed 200 during the alarm");
            run.unnoticed_faults += 1;
        }
        run.record_ready_after(cleared).await
    }
}
