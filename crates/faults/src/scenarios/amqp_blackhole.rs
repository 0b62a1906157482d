//! `amqp-blackhole`: the host's AMQP traffic, through a fault proxy in front of the shared
//! broker, swallowed for longer than two heartbeats (a partition), then healed.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use worker_testkit::FaultProxy;

use super::amqp_cut::proxy_to_shared_broker;
use super::{Fault, Load, Scenario};
use crate::run::{Run, Setup};

/// The host's heartbeat in this scenario: short, so that the partition need not be long.
const HEARTBEAT: Duration = Duration::from_secs(5);

/// How long the partition lasts: three heartbeats.
const PARTITION: Duration = Duration::from_secs(15);

pub fn scenario() -> Scenario {
    Scenario {
        name: "amqp-blackhole",
        about: "The host reaches the shared RabbitMQ through a TCP proxy of the scenario's own \
                (`worker_testkit::FaultProxy` in front of 127.0.0.1:5672), with \
                `broker.heartbeat` = 5 s. At a random moment of each repetition the proxy \
                blackholes the traffic for 15 s (three heartbeats): bytes either way are read \
                and dropped, no connection is closed, new ones are accepted and never \
                answered, as in a network partition. The host must notice by its missing \
                heartbeats and go not ready within that time (`/readyz` is watched; a \
                partition it never notices fails the scenario). Then the proxy heals (the \
                blackholed connections are closed, new ones pass). \"Ready again\" is from the \
                heal, bounded by two heartbeats (10 s).",
        fault: Some(|| Box::new(AmqpBlackhole::default())),
        full: Load {
            repetitions: 5,
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
struct AmqpBlackhole {
    proxy: Option<FaultProxy>,
}

#[async_trait::async_trait]
impl Fault for AmqpBlackhole {
    async fn prepare(&mut self, _dir: &Path) -> anyhow::Result<Setup> {
        let (proxy, setup) = proxy_to_shared_broker().await?;
        self.proxy = Some(proxy);
        Ok(setup)
    }

    async fn apply(&mut self, run: &mut Run) -> anyhow::Result<()> {
        let proxy = self.proxy.as_ref().context("the proxy is not started")?;
        proxy.blackhole();
        let noticed = run.left_ready_within(PARTITION).await;
        // Heal whatever the watch said, or the scenario could not end.
        proxy.heal();
        let healed = Instant::now();
        if !noticed? {
            eprintln!("faults: amqp-blackhole: /readyz stayed 200 during the partition");
            run.unnoticed_faults += 1;
        }
        run.record_ready_after(healed).await
    }

    async fn finish(&mut self, _run: &mut Run) -> anyhow::Result<()> {
        if let Some(proxy) = &self.proxy {
            proxy.heal();
        }
        Ok(())
    }
}
