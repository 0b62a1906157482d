//! A private RabbitMQ cluster: [`RabbitNode`]s that share an Erlang cookie, the others joined
//! to the first with `rabbitmqctl join_cluster`, for tests that stop a node of a cluster (the
//! fault suite's `rabbit-cluster-node-stop`) and so must never touch the shared broker or the
//! cluster `scripts/services.sh up --rabbitmq-cluster` starts.
//!
//! Each node is a private node as [`RabbitNode`] describes (its own name, ports, data and
//! process group, under `dir/rabbit-<n>`); the nodes boot side by side, then join one by one
//! (`stop_app`, `join_cluster`, `start_app`): a boot takes about 10 s here and a join 7 to
//! 17 s, so a three-node cluster is ready in 30 to 50 s. Dropping the cluster drops its nodes,
//! which kills them and removes their data.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::RabbitNode;

/// How long the nodes may take to show as one running cluster after a join or a restart.
const CLUSTER_WAIT: Duration = Duration::from_secs(120);

/// A private RabbitMQ cluster; see the module docs.
#[derive(Debug)]
pub struct RabbitCluster {
    /// The nodes, the first the one the others joined.
    pub nodes: Vec<RabbitNode>,
}

impl RabbitCluster {
    /// Starts `size` nodes under `dir` and clusters them; returns once each answers on AMQP
    /// and on its management API and all show as running members.
    pub async fn start(dir: &Path, size: usize) -> anyhow::Result<Self> {
        anyhow::ensure!(size >= 1, "a cluster needs a node");
        let cookie = uuid::Uuid::new_v4().simple().to_string();
        let mut nodes = Vec::with_capacity(size);
        for n in 1..=size {
            nodes.push(RabbitNode::launch(
                dir,
                &format!("rabbit-{n}"),
                Some(&cookie),
                None,
                None,
            )?);
        }
        for node in &mut nodes {
            node.wait_ready().await?;
        }
        let cluster = Self { nodes };
        let (first, others) = cluster
            .nodes
            .split_first()
            .context("a cluster needs a node")?;
        for node in others {
            node.ctl(&["stop_app"]).await?;
            node.ctl(&["join_cluster", &first.name]).await?;
            node.ctl(&["start_app"]).await?;
        }
        cluster.wait_all_running(0).await?;
        Ok(cluster)
    }

    /// `host:port` of each node's AMQP listener, in order.
    pub fn amqp_addrs(&self) -> Vec<String> {
        self.nodes.iter().map(RabbitNode::amqp_addr).collect()
    }

    /// The node named `name` (as the management API and `rabbitmqctl` name it) and its index.
    pub fn node_named(&self, name: &str) -> Option<(usize, &RabbitNode)> {
        self.nodes.iter().enumerate().find(|(_, n)| n.name == name)
    }

    /// The nodes the management API of node `via` reports running.
    pub async fn running(&self, via: usize) -> anyhow::Result<Vec<String>> {
        let node = self.nodes.get(via).context("no such node")?;
        let url = format!("http://127.0.0.1:{}/api/nodes", node.management_port);
        let nodes: Vec<serde_json::Value> = reqwest::Client::new()
            .get(&url)
            .basic_auth("guest", Some("guest"))
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .with_context(|| format!("calling {url}"))?
            .error_for_status()?
            .json()
            .await?;
        Ok(nodes
            .iter()
            .filter(|n| n["running"].as_bool() == Some(true))
            .filter_map(|n| n["name"].as_str().map(str::to_string))
            .collect())
    }

    /// Waits until the management API of node `via` reports every node running: after the
    /// joins, or after a node of the cluster was started again.
    pub async fn wait_all_running(&self, via: usize) -> anyhow::Result<()> {
        let deadline = Instant::now() + CLUSTER_WAIT;
        loop {
            let running = self.running(via).await.unwrap_or_default();
            if self.nodes.iter().all(|n| running.contains(&n.name)) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "the private cluster did not show all its nodes running within {CLUSTER_WAIT:?}: {running:?}"
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}
