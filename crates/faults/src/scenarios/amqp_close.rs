//! `amqp-close`: the host's AMQP connections closed by the broker (management API).

use std::time::{Duration, Instant};

use anyhow::Context;

use super::{DEFAULT_HEARTBEAT, Fault, Load, Scenario};
use crate::run::Run;

pub fn scenario() -> Scenario {
    Scenario {
        name: "amqp-close",
        about: "At a random moment of each repetition, every AMQP connection to the scenario's \
                vhost (only the host's: the harness holds none) is closed by the broker: `GET \
                /api/vhosts/<vhost>/connections`, then `DELETE /api/connections/<name>` for each. \
                \"Ready again\" is from the close.",
        fault: Some(|| Box::new(AmqpClose)),
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
struct AmqpClose;

#[async_trait::async_trait]
impl Fault for AmqpClose {
    async fn apply(&mut self, run: &mut Run) -> anyhow::Result<()> {
        apply(run).await
    }
}

async fn apply(run: &mut Run) -> anyhow::Result<()> {
    // The management API lists connections from statistics that lag (a new connection shows
    // up, a closed one goes away, within seconds): look again until one is really closed.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let connections = run
            .vhost
            .api(reqwest::Method::GET, "vhosts/{vhost}/connections", None)
            .await?;
        let names: Vec<String> = connections
            .as_array()
            .context("connections: not a list")?
            .iter()
            .filter_map(|c| c["name"].as_str().map(str::to_string))
            .collect();
        let at = Instant::now();
        let mut closed = 0;
        for name in &names {
            let path = format!("connections/{}", encode(name));
            // One already gone (listed from stale statistics) answers 404: not a close.
            if run
                .vhost
                .api(reqwest::Method::DELETE, &path, None)
                .await
                .is_ok()
            {
                closed += 1;
            }
        }
        if closed > 0 {
            return run.record_ready_after(at).await;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "no AMQP connection of the host to close within 15 s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Percent-encodes a connection name for a URL path segment.
fn encode(name: &str) -> String {
    name.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_connection_name_becomes_one_path_segment() {
        assert_eq!(
            super::encode("127.0.0.1:5000 -> 127.0.0.1:5672"),
            "127.0.0.1%3A5000%20-%3E%20127.0.0.1%3A5672"
        );
    }
}
