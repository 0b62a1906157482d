//! `rabbit-cluster-node-stop`: the host on a private three-node RabbitMQ cluster; the node
//! its connection is on is stopped, and the host must carry on through another node.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;

use super::{Fault, Load, Scenario};
use crate::oracle::Check;
use crate::rabbit_cluster::{ClusterSetup as _, RabbitCluster};
use crate::run::{Run, Setup};

/// Nodes of the cluster: a quorum queue keeps its majority with one of three away.
const NODES: usize = 3;

/// The host's `broker.heartbeat` here: "ready again" must come within two of them.
const HEARTBEAT: Duration = Duration::from_secs(5);

/// How long the stopped node stays away once the host is ready again: the loop goes on with
/// two nodes of three meanwhile.
const DOWN: Duration = Duration::from_secs(5);

/// How long the management API may take to show the host's connection (it gathers
/// connection statistics every 5 s, from every node).
const CONNECTION_SEEN_WAIT: Duration = Duration::from_secs(15);

pub fn scenario() -> Scenario {
    Scenario {
        name: "rabbit-cluster-node-stop",
        about: "The host runs against a private three-node RabbitMQ cluster the scenario \
                starts (three private nodes, clustered with `rabbitmqctl join_cluster`; about \
                40 s to start, so the full run only). Its `broker.addresses` lists nodes 1 and \
                2, and `broker.topology.queue_leader_locator = \"balanced\"` spreads the \
                queues' leaders over all three nodes, each queue replicated on all three; the \
                harness reads and publishes through node 3, which is never stopped. At a random \
                moment of each repetition the node the host's connection is on (as the \
                management API shows it) is stopped with `rabbitmqctl -n <node> stop` (its \
                connections are closed or reset, the queues it led elect new leaders); the host \
                must reconnect to the other address and be ready within two heartbeats (5 s \
                here) while that node is still down, and lose nothing. The node stays down 5 s \
                more, then starts again on its data and rejoins; the next repetition stops the \
                node the host went to. \"Ready again\" is from the stop command. A host that \
                knows only the stopped node stays unready until it returns and fails here.",
        fault: Some(|| Box::new(ClusterNodeStop::default())),
        full: Load {
            repetitions: 4,
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
struct ClusterNodeStop {
    cluster: Option<RabbitCluster>,
    /// Stops applied.
    stops: u32,
    /// Stops after which the host's connection showed on another node than the stopped one.
    moved: u32,
}

#[async_trait::async_trait]
impl Fault for ClusterNodeStop {
    async fn prepare(&mut self, dir: &Path) -> anyhow::Result<Setup> {
        let started = Instant::now();
        let cluster = RabbitCluster::start(dir, NODES).await?;
        eprintln!(
            "faults: rabbit-cluster-node-stop: {NODES}-node cluster up in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        let setup = cluster.setup(&[(
            "WORKER_HOST__BROKER__TOPOLOGY__QUEUE_LEADER_LOCATOR",
            "balanced",
        )])?;
        self.cluster = Some(cluster);
        Ok(setup)
    }

    async fn begin(&mut self, run: &mut Run) -> anyhow::Result<()> {
        // A failover redelivers what was in flight, well under the delivery limit: nothing
        // should be dead-lettered.
        run.expected_dead_letters = Some(0);
        Ok(())
    }

    async fn apply(&mut self, run: &mut Run) -> anyhow::Result<()> {
        let cluster = self
            .cluster
            .as_mut()
            .context("the private cluster is not started")?;
        let name = host_node(run).await?;
        let (index, _) = cluster
            .node_named(&name)
            .with_context(|| format!("the host is on {name}, no node of the cluster"))?;
        anyhow::ensure!(
            index + 1 < NODES,
            "the host is on {name}, which is not in its broker.addresses"
        );
        eprintln!("faults: rabbit-cluster-node-stop: stopping {name}, the host's node");
        let at = Instant::now();
        self.stops += 1;
        let node = &mut cluster.nodes[index];
        // The ready clock runs from the stop command, while the node goes down.
        let (stopped, ready) = tokio::join!(node.stop(), run.record_ready_after(at));
        stopped?;
        ready?;
        match moved_off(run, &name).await {
            Ok(to) => {
                eprintln!("faults: rabbit-cluster-node-stop: the host went to {to}");
                self.moved += 1;
            }
            Err(err) => eprintln!("faults: rabbit-cluster-node-stop: {err:#}"),
        }
        tokio::time::sleep(DOWN).await;
        cluster.nodes[index].restart().await?;
        cluster.wait_all_running(NODES - 1).await
    }

    async fn verify(&mut self, run: &mut Run) -> anyhow::Result<Vec<Check>> {
        let mut checks = vec![Check::new(
            format!(
                "the host's connection on another node after each stop: {} of {}",
                self.moved, self.stops
            ),
            self.moved == self.stops && self.stops > 0,
        )];
        let queues = run
            .vhost
            .api(
                reqwest::Method::GET,
                "queues/{vhost}?columns=name,members,online",
                None,
            )
            .await?;
        let queues = queues.as_array().context("queues: not a list")?;
        let short: Vec<String> = queues
            .iter()
            .filter(|q| {
                let online = q["online"].as_array().map_or(0, Vec::len);
                let members = q["members"].as_array().map_or(0, Vec::len);
                online < NODES || members < NODES
            })
            .filter_map(|q| q["name"].as_str().map(str::to_string))
            .collect();
        checks.push(Check::new(
            format!(
                "queues with fewer than {NODES} replicas online at the end: {} of {}{}",
                short.len(),
                queues.len(),
                if short.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", short.join(", "))
                }
            ),
            short.is_empty() && !queues.is_empty(),
        ));
        Ok(checks)
    }
}

/// The nodes the management API shows the scenario vhost's connections on (the harness holds
/// none there: these are the host's).
async fn host_nodes(run: &Run) -> anyhow::Result<BTreeSet<String>> {
    let connections = run
        .vhost
        .api(
            reqwest::Method::GET,
            "vhosts/{vhost}/connections?columns=name,node",
            None,
        )
        .await?;
    Ok(connections
        .as_array()
        .context("connections: not a list")?
        .iter()
        .filter_map(|c| c["node"].as_str().map(str::to_string))
        .collect())
}

/// Waits until the host's connection shows on one node; returns that node's name.
async fn host_node(run: &Run) -> anyhow::Result<String> {
    let deadline = Instant::now() + CONNECTION_SEEN_WAIT;
    loop {
        let on = host_nodes(run).await?;
        if on.len() == 1
            && let Some(node) = on.into_iter().next()
        {
            return Ok(node);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the host's connection did not show on one node within {CONNECTION_SEEN_WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Waits until the host's connection shows on a node other than `stopped`; returns it.
async fn moved_off(run: &Run, stopped: &str) -> anyhow::Result<String> {
    let deadline = Instant::now() + CONNECTION_SEEN_WAIT;
    loop {
        let on = host_nodes(run).await.unwrap_or_default();
        if let Some(other) = on.iter().find(|n| n.as_str() != stopped) {
            return Ok(other.clone());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the host's connection did not show on another node within {CONNECTION_SEEN_WAIT:?} (on {on:?})"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
