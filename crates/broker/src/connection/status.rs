//! What the connection is doing, as the supervisor reports it.

/// What the connection is doing, for `/readyz` and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkState {
    /// Not connected yet, since start.
    Connecting,
    Connected,
    /// Connected, but the broker refuses publishes (memory or disk alarm). Consuming goes on.
    Blocked,
    /// Lost; reconnecting with backoff.
    Disconnected,
    /// The supervisor has stopped.
    Stopped,
}

impl LinkState {
    pub const fn as_str(&self) -> &'static str {
        match self {
            Self::Connecting => "connecting",
            Self::Connected => "connected",
            Self::Blocked => "blocked",
            Self::Disconnected => "disconnected",
            Self::Stopped => "stopped",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerStatus {
    pub state: LinkState,
    /// Connections made after the first one.
    pub reconnects: u64,
    /// Why the last connection attempt or connection failed.
    pub last_error: Option<String>,
    /// The address (`host:port`) of the node the current connection is to, or the last one
    /// was to; `None` before the first.
    pub address: Option<String>,
}

impl BrokerStatus {
    /// Whether the host should report ready: connected and not blocked.
    pub fn is_ready(&self) -> bool {
        self.state == LinkState::Connected
    }
}
