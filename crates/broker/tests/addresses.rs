//! A supervisor given several addresses, as for the nodes of a cluster: two [`FaultProxy`]s in
//! front of the shared broker stand for two nodes. A node that refuses, goes away or falls
//! silent is left for the next address at the next reconnect, instead of being waited for.
//! The test cluster of the fault suite (`rabbit-cluster-node-stop`) does the same with real
//! nodes; these need none.

// Helpers outside #[test] functions assert too: a failed expectation fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use tokio_util::sync::CancellationToken;
use worker_broker::{
    BrokerAddress, BrokerStatus, Outgoing, Publisher, PublisherSettings, Supervisor,
};
use worker_testkit::{FaultProxy, TestVhost};

/// The local broker's AMQP address, as the tests' connection settings name it.
fn broker() -> String {
    std::env::var("WH_TEST_AMQP_HOST").unwrap_or_else(|_| "127.0.0.1:5672".into())
}

const HEARTBEAT: Duration = Duration::from_secs(1);

/// Two "nodes" and a supervisor that knows both, connected to the first.
struct TwoNodes {
    _vhost: TestVhost,
    first: FaultProxy,
    second: FaultProxy,
    supervisor: Supervisor,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl TwoNodes {
    /// Starts the proxies and the supervisor; with `first_refuses`, the first proxy refuses
    /// connections before the supervisor starts.
    async fn start(first_refuses: bool) -> anyhow::Result<Self> {
        let vhost = TestVhost::create().await?;
        let first = FaultProxy::start(broker()).await?;
        let second = FaultProxy::start(broker()).await?;
        if first_refuses {
            refuse_now(&first).await?;
        }
        let mut settings = connection_settings(&vhost)?;
        settings.addresses = vec![address(&first), address(&second)];
        settings.heartbeat = HEARTBEAT;
        settings.connect_timeout = Duration::from_secs(3);
        settings.reconnect_min = ms(100);
        settings.reconnect_max = ms(500);
        let supervisor = Supervisor::new(settings, topology(&queue_settings(&[200], 5))?);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(supervisor.clone().run(shutdown.clone()));
        Ok(Self {
            _vhost: vhost,
            first,
            second,
            supervisor,
            shutdown,
            task,
        })
    }

    /// Waits until the supervisor is connected through `proxy`; returns how long that took.
    async fn connected_through(
        &self,
        proxy: &FaultProxy,
        within: Duration,
    ) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let wanted = address(proxy).to_string();
        let mut status = self.supervisor.status();
        tokio::time::timeout(
            within,
            status.wait_for(|s: &BrokerStatus| {
                s.is_ready() && s.address.as_deref() == Some(wanted.as_str())
            }),
        )
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "not connected through {wanted} within {within:?}: {:?}",
                self.supervisor.status().borrow()
            )
        })??;
        Ok(started.elapsed())
    }

    async fn stop(self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        self.task.await?;
        Ok(())
    }
}

fn address(proxy: &FaultProxy) -> BrokerAddress {
    BrokerAddress::new("127.0.0.1", proxy.port())
}

/// Switches `proxy` to refusing and waits until it does (the switch acts at the proxy's
/// next turn).
async fn refuse_now(proxy: &FaultProxy) -> anyhow::Result<()> {
    proxy.refuse();
    let addr = proxy.addr();
    worker_testkit::wait::eventually(
        "the proxy refusing",
        Duration::from_secs(5),
        || async move {
            Ok(tokio::net::TcpStream::connect(addr)
                .await
                .is_err()
                .then_some(()))
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_goes_away_is_left_for_the_next_address_and_publishing_goes_on()
-> anyhow::Result<()> {
    let nodes = TwoNodes::start(false).await?;
    nodes
        .connected_through(&nodes.first, Duration::from_secs(10))
        .await?;
    let publisher = Publisher::new(
        nodes.supervisor.sessions(),
        PublisherSettings {
            connect_wait: Duration::from_secs(10),
            ..PublisherSettings::default()
        },
    );
    publisher
        .publish(&Outgoing::new("commands", QUEUE, b"{}".to_vec()))
        .await?;

    // The first node stops: its connections close and it takes no new ones.
    nodes.first.refuse();
    nodes.first.cut();
    let moved = nodes
        .connected_through(&nodes.second, 2 * HEARTBEAT)
        .await?;
    publisher
        .publish(&Outgoing::new("commands", QUEUE, b"{}".to_vec()))
        .await?;
    let status = nodes.supervisor.status().borrow().clone();
    assert_eq!(status.reconnects, 1, "{status:?}");
    eprintln!("on the second node {moved:?} after the first went away");

    // The first comes back and the second goes: the ring wraps around to the first.
    nodes.first.heal();
    nodes.second.refuse();
    nodes.second.cut();
    nodes.connected_through(&nodes.first, 2 * HEARTBEAT).await?;
    assert_eq!(nodes.supervisor.status().borrow().reconnects, 2);
    nodes.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_node_is_noticed_by_heartbeats_and_left_for_the_next_address() -> anyhow::Result<()>
{
    let nodes = TwoNodes::start(false).await?;
    nodes
        .connected_through(&nodes.first, Duration::from_secs(10))
        .await?;

    // A partition: the first node swallows everything and closes nothing, new connections
    // included. Only the heartbeats tell; the reconnect must not try it first again.
    nodes.first.blackhole();
    let moved = nodes
        .connected_through(&nodes.second, 4 * HEARTBEAT)
        .await?;
    assert!(
        moved <= Duration::from_millis(3500),
        "on the second node after {moved:?} with a {HEARTBEAT:?} heartbeat"
    );
    nodes.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_address_that_refuses_at_start_costs_no_wait() -> anyhow::Result<()> {
    let nodes = TwoNodes::start(true).await?;
    // The probe that saw the refusal may have been taken before it: count from here.
    let accepted = nodes.first.accepted();
    let took = nodes
        .connected_through(&nodes.second, Duration::from_secs(10))
        .await?;
    // The pass goes straight on to the second address: no backoff between the two.
    assert!(took < Duration::from_secs(2), "connected after {took:?}");
    assert_eq!(
        nodes.first.accepted(),
        accepted,
        "the refusing proxy took a connection"
    );
    assert_eq!(nodes.supervisor.status().borrow().reconnects, 0);
    nodes.stop().await
}
