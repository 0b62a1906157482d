//! `amqp-cut`: the host's AMQP connections, through a fault proxy in front of the shared
//! broker, cut at a random moment.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use worker_testkit::FaultProxy;

use super::{DEFAULT_HEARTBEAT, Fault, Load, Scenario};
use crate::run::{Run, Setup};

pub fn scenario() -> Scenario {
    Scenario {
        name: "amqp-cut",
        about: "The host reaches the shared RabbitMQ through a TCP proxy of the scenario's own \
                (`worker_testkit::FaultProxy` in front of 127.0.0.1:5672; the host's \
                `broker.port` is the proxy's). At a random moment of each repetition the proxy \
                cuts every open connection (both sides closed with a FIN, as after a network \
                failure its kernel saw), then heals: new connections pass at once. \"Ready \
                again\" is from the cut.",
        fault: Some(|| Box::new(AmqpCut::default())),
        full: Load {
            repetitions: 20,
            per_repetition: 20,
        },
        quick: Load {
            repetitions: 1,
            per_repetition: 20,
        },
        rate_per_sec: 10.0,
        settle: Duration::from_secs(180),
        heartbeat: DEFAULT_HEARTBEAT,
    }
}

/// The fault: see [`scenario`]'s description.
#[derive(Default)]
struct AmqpCut {
    proxy: Option<FaultProxy>,
}

#[async_trait::async_trait]
impl Fault for AmqpCut {
    async fn prepare(&mut self, _dir: &Path) -> anyhow::Result<Setup> {
        let (proxy, setup) = proxy_to_shared_broker().await?;
        self.proxy = Some(proxy);
        Ok(setup)
    }

    async fn apply(&mut self, run: &mut Run) -> anyhow::Result<()> {
        let proxy = self.proxy.as_ref().context("the proxy is not started")?;
        anyhow::ensure!(
            proxy.open() > 0,
            "the host has no AMQP connection through the proxy to cut"
        );
        let at = Instant::now();
        proxy.cut();
        proxy.heal();
        run.record_ready_after(at).await
    }
}

/// A fault proxy in front of the shared broker's AMQP port, and the setting that points the
/// host at it.
pub(super) async fn proxy_to_shared_broker() -> anyhow::Result<(FaultProxy, Setup)> {
    let amqp = std::env::var("WH_TEST_AMQP_HOST").unwrap_or_else(|_| "127.0.0.1:5672".into());
    let proxy = FaultProxy::start(amqp.as_str())
        .await
        .with_context(|| format!("starting a proxy in front of {amqp}"))?;
    let setup = Setup {
        env: vec![("WORKER_HOST__BROKER__PORT".into(), proxy.port().to_string())],
        ..Setup::default()
    };
    Ok((proxy, setup))
}
