//! Why a connection could not be opened.

use std::path::PathBuf;
use std::time::Duration;

use crate::topology::TopologyError;

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("invalid AMQP URI: {0}")]
    InvalidUri(String),
    #[error("the broker's CA file {}: {source}", path.display())]
    CaFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("connecting to {server} timed out after {}", humantime::format_duration(*after))]
    Timeout { server: String, after: Duration },
    #[error("connecting to {server}: {source}")]
    Broker {
        server: String,
        #[source]
        source: lapin::Error,
    },
    #[error(transparent)]
    Topology(#[from] TopologyError),
    /// The settings list no address at all.
    #[error("no broker address to connect to")]
    NoAddress,
    /// Every address of a list of more than one failed, each for its own reason.
    #[error("no RabbitMQ node answered: {}", failures.iter().map(|e| worker_core::error_chain(e)).collect::<Vec<_>>().join("; "))]
    NoNodeAnswered { failures: Vec<ConnectError> },
}

impl ConnectError {
    /// The failure of a pass over the addresses: the one failure as it is when there was
    /// one address, else all of them.
    pub(super) fn of_pass(mut failures: Vec<ConnectError>) -> Self {
        match failures.len() {
            0 => Self::NoAddress,
            1 => failures.remove(0),
            _ => Self::NoNodeAnswered { failures },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn a_failed_pass_reports_each_node_or_the_one() {
        let timeout = |server: &str| ConnectError::Timeout {
            server: server.into(),
            after: Duration::from_secs(1),
        };
        assert!(matches!(
            ConnectError::of_pass(vec![]),
            ConnectError::NoAddress
        ));
        let one = ConnectError::of_pass(vec![timeout("a:1/v")]).to_string();
        assert_eq!(one, "connecting to a:1/v timed out after 1s");
        let two = ConnectError::of_pass(vec![timeout("a:1/v"), timeout("b:2/v")]).to_string();
        assert!(two.starts_with("no RabbitMQ node answered: "), "{two}");
        assert!(two.contains("a:1/v") && two.contains("b:2/v"), "{two}");
    }
}
