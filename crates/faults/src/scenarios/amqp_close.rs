//! `amqp-close`: the host's AMQP connections closed by the broker (management API).

use std::time::{Duration, Instant};

use anyhow::Context;

use super::{Fault, Load, Scenario};
use crate::run::Run;

pub fn scenario() -> Scenario {
    Scenario {
        name: "amqp-close",
        about: "At a random moment of each repetition, every AMQP connection to the scenario's \
                vhost (only the host's: the harness holds none) is closed by the broker: `GET \
                /api/vhosts/<vhost>/connections`, then `DELETE /api/connections/<name>` for each. \
                \"Ready again\" is from the close.",
        fault: Fault::AmqpClose,
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
        disruptive: false,
    }
}

pub async fn apply(run: &mut Run) -> anyhow::Result<()> {
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
    anyhow::ensure!(
        !names.is_empty(),
        "the host had no AMQP connection to close"
    );
    let at = Instant::now();
    for name in &names {
        let path = format!("connections/{}", encode(name));
        if let Err(err) = run.vhost.api(reqwest::Method::DELETE, &path, None).await {
            // A connection that closed by itself meanwhile is not a failure of the harness.
            eprintln!("faults: amqp-close: closing {name}: {err:#}");
        }
    }
    run.record_ready_after(at).await
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
