//! Why a topology could not be resolved or declared.

use lapin::protocol::{AMQPErrorKind, AMQPSoftError};

#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("queue settings{}: `{key}` {problem}", if queue.is_empty() { String::new() } else { format!(" of {queue}") })]
    Invalid {
        queue: String,
        key: String,
        problem: String,
    },

    #[error("{0}")]
    Conflict(Box<DeclareConflict>),

    #[error("declaring {what}: {source}")]
    Broker {
        what: String,
        #[source]
        source: lapin::Error,
    },
}

/// A queue or exchange that exists with other arguments than the settings want.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeclareConflict {
    /// `queue` or `exchange`.
    pub kind: &'static str,
    pub name: String,
    /// The argument that differs (`x-delivery-limit`), as the broker named it.
    pub argument: String,
    pub wanted: String,
    pub existing: String,
    /// The broker's own words.
    pub raw: String,
}

impl std::fmt::Display for DeclareConflict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self {
            kind,
            name,
            argument,
            wanted,
            existing,
            raw,
        } = self;
        let delete = if *kind == "queue" {
            format!("`rabbitmqctl delete_queue {name} --vhost <vhost>`, after draining it")
        } else {
            format!("the management UI or `rabbitmqadmin delete exchange name={name}`")
        };
        write!(
            f,
            "the {kind} '{name}' already exists with {argument} = {existing}, but the settings want {wanted}. \
             To resolve it, either set the setting back to match the existing {kind}, or delete the {kind} \
             ({delete}) so that the next start declares it anew. (broker said: {raw})"
        )
    }
}

impl TopologyError {
    /// Whether trying again after reconnecting may succeed (the broker was unreachable), as
    /// opposed to a conflict or bad settings that need an operator.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Broker { source, .. } => !matches!(
                source.kind(),
                lapin::ErrorKind::ProtocolError(e) if matches!(e.kind(), AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED | AMQPSoftError::ACCESSREFUSED))
            ),
            _ => false,
        }
    }
}
