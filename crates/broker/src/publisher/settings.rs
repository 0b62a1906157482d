//! The publisher's settings: its confirm channels and how long it waits.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// `[broker.publisher]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PublisherSettings {
    /// Confirm channels, each serving one batch at a time.
    pub channels: usize,
    /// How long to wait for a batch's confirms (a blocked connection holds them back).
    #[serde(with = "humantime_serde")]
    pub confirm_timeout: Duration,
    /// How long a publish waits for a connection before failing with `NotConnected`.
    #[serde(with = "humantime_serde")]
    pub connect_wait: Duration,
}

impl Default for PublisherSettings {
    fn default() -> Self {
        Self {
            channels: 4,
            confirm_timeout: Duration::from_secs(15),
            connect_wait: Duration::from_secs(5),
        }
    }
}
