//! A `dead_letters` row: what is written ([`NewDeadLetter`]), who wrote it ([`Source`]), where
//! it stands ([`Status`]), and the reasons and queue names the writers share.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The header a replayed message carries: the id of the archived dead letter it came from.
pub const REPLAYED_FROM_HEADER: &str = "x-replayed-from";

/// The `queue` of an archived failed outbox row (and the `--queue` that selects them).
pub const OUTBOX_QUEUE: &str = "outbox";

/// Reason of a broker dead letter caught by the queue's delivery limit.
pub const DELIVERY_LIMIT: &str = "delivery_limit";
/// Reason of an archived failed outbox row.
pub const OUTBOX_FAILED: &str = "outbox-failed";
/// Reason of a dead letter that says nothing about why it died.
pub const UNKNOWN: &str = "unknown";

/// Who dead-lettered a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// The consumer runner, with its `x-dead-*` headers.
    Runner,
    /// The broker (`x-death`): the queue's delivery limit, typically.
    Broker,
    /// A failed outbox row.
    Outbox,
    /// Nobody said.
    Unknown,
}

impl Source {
    pub const fn as_str(&self) -> &'static str {
        match self {
            Self::Runner => "runner",
            Self::Broker => "broker",
            Self::Outbox => "outbox",
            Self::Unknown => "unknown",
        }
    }

    pub fn parse(s: &str) -> Self {
        match s {
            "runner" => Self::Runner,
            "broker" => Self::Broker,
            "outbox" => Self::Outbox,
            _ => Self::Unknown,
        }
    }
}

/// Where an archived dead letter stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// In the archive, waiting for an operator.
    Dead,
    /// Published again to its queue (kept, never deleted by the replay).
    Replayed,
    /// Given up on by an operator (kept until the retention sweep).
    Purged,
    /// Sent again edited by an operator (a failed mail's new copy, or its raw body decoded
    /// anew): a replay must not send the original.
    Edited,
}

impl Status {
    pub const fn as_str(&self) -> &'static str {
        match self {
            Self::Dead => "dead",
            Self::Replayed => "replayed",
            Self::Purged => "purged",
            Self::Edited => "edited",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "dead" => Some(Self::Dead),
            "replayed" => Some(Self::Replayed),
            "purged" => Some(Self::Purged),
            "edited" => Some(Self::Edited),
            _ => None,
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One row to archive.
#[derive(Debug, Clone, PartialEq)]
pub struct NewDeadLetter {
    pub dedup_key: String,
    /// The delivery was redelivered by the broker (so it may be archived already).
    pub redelivered: bool,
    pub source: Source,
    pub queue: String,
    pub dead_queue: Option<String>,
    pub exchange: Option<String>,
    pub routing_key: Option<String>,
    pub message_id: Option<String>,
    pub message_type: Option<String>,
    pub reason: String,
    pub class: Option<String>,
    pub attempts: Option<i32>,
    pub last_error: Option<String>,
    pub error_fingerprint: String,
    pub error_normalized: String,
    pub died_at: DateTime<Utc>,
    pub headers: Value,
    pub amqp_headers: Option<Value>,
    pub properties: Value,
    pub body: Vec<u8>,
    pub outbox_id: Option<i64>,
}
