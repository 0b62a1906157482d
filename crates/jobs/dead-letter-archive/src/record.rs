//! What one dead letter becomes: a [`NewDeadLetter`] row, read from a delivery's headers (or
//! from a failed outbox row), pure and testable without a broker.
//!
//! Three kinds of dead letter reach a dead queue, and each is read for what it says:
//!
//! * the consumer runner's: `x-dead-reason` (malformed, rejected, gave-up), `x-dead-attempts`,
//!   `x-dead-error`, `x-dead-class`, `x-dead-queue`, `x-dead-at` — [`Source::Runner`];
//! * the broker's, when a queue's delivery limit (or another dead-lettering rule) caught a
//!   message the host could not settle: the latest `x-death` entry (reason `delivery_limit`,
//!   queue, count, time) or the `x-first-death-*` headers — [`Source::Broker`];
//! * anything else (published straight to a dead exchange by hand, say): reason `unknown`,
//!   [`Source::Unknown`]. It is archived all the same: nothing is ever dropped.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use worker_broker::consumer::{
    ATTEMPT_HEADER, DEAD_AT_HEADER, DEAD_ATTEMPTS_HEADER, DEAD_CLASS_HEADER, DEAD_ERROR_HEADER,
    DEAD_QUEUE_HEADER, DEAD_REASON_HEADER,
};
use worker_broker::topology::ORIGINAL_ROUTING_KEY_HEADER;
use worker_broker::{Delivery, HeaderValue, Headers, Properties, QueueTopology};

pub use worker_store::dead_letters::{
    DELIVERY_LIMIT, NewDeadLetter, OUTBOX_FAILED, OUTBOX_QUEUE, REPLAYED_FROM_HEADER, Source,
    UNKNOWN,
};
use worker_store::dead_letters::{fingerprint, hex};

use crate::headers::{contains_nul, scrub_str};
pub use crate::headers::{json_to_table, table_to_json};

/// Per-delivery bookkeeping of the broker: differs between two deliveries of one message, so
/// it is neither stored nor hashed nor replayed.
const DELIVERY_COUNTERS: [&str; 2] = ["x-delivery-count", "x-acquired-count"];

/// A dead queue the archiver empties, and the work queue its messages died in (the queue a
/// dead letter without an `x-dead-queue` of its own is replayed to).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadQueue {
    pub dead_queue: String,
    pub queue: String,
}

impl DeadQueue {
    pub fn new(dead_queue: impl Into<String>, queue: impl Into<String>) -> Self {
        Self {
            dead_queue: dead_queue.into(),
            queue: queue.into(),
        }
    }

    /// The dead queue of a consumer queue of the topology (`Q.dead` for `Q` by default).
    pub fn of(queue: &QueueTopology) -> Self {
        Self::new(queue.dead_queue.clone(), queue.name.clone())
    }
}

/// The AMQP properties of a dead letter, as stored (`properties` jsonb) and replayed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct MessageProperties {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_encoding: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    /// Seconds since the epoch, as AMQP has it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<u64>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub app_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivery_mode: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expiration: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster_id: Option<String>,
}

impl MessageProperties {
    pub fn of(p: &Properties) -> Self {
        let s = |v: &Option<String>| v.as_deref().map(scrub_str);
        Self {
            content_type: s(&p.content_type),
            content_encoding: s(&p.content_encoding),
            correlation_id: s(&p.correlation_id),
            message_id: s(&p.message_id),
            timestamp: p.timestamp,
            kind: s(&p.kind),
            app_id: s(&p.app_id),
            priority: p.priority,
            reply_to: s(&p.reply_to),
            delivery_mode: p.delivery_mode,
            expiration: s(&p.expiration),
            user_id: s(&p.user_id),
            cluster_id: s(&p.cluster_id),
        }
    }

    /// The properties a replayed copy carries: persistent, without `expiration` (which would
    /// expire it) or `user-id` (which must match the publishing connection's user). Text
    /// longer than an AMQP short string is not sent.
    pub fn for_replay(&self) -> Properties {
        Properties {
            content_type: self.content_type.clone(),
            content_encoding: self.content_encoding.clone(),
            correlation_id: self.correlation_id.clone(),
            message_id: self.message_id.clone(),
            timestamp: self.timestamp,
            kind: self.kind.clone(),
            app_id: self.app_id.clone(),
            priority: self.priority,
            reply_to: self.reply_to.clone(),
            cluster_id: self.cluster_id.clone(),
            ..Properties::persistent()
        }
    }
}

/// What [`FromMessage::from_message`] needs of a delivery.
#[derive(Debug, Clone, Copy)]
pub struct RawMessage<'a> {
    pub routing_key: &'a str,
    pub redelivered: bool,
    pub properties: &'a Properties,
    pub body: &'a [u8],
}

impl<'a> From<&'a Delivery> for RawMessage<'a> {
    fn from(d: &'a Delivery) -> Self {
        Self {
            routing_key: d.routing_key(),
            redelivered: d.redelivered(),
            properties: d.properties(),
            body: d.body(),
        }
    }
}

/// A dead letter read from a broker message: the row's type is the store's, which knows no
/// broker, so the reading is this trait's.
pub trait FromMessage {
    /// Reads a message taken from `dead`'s dead queue; `now` is its time of death when the
    /// message does not say.
    fn from_message(dead: &DeadQueue, message: RawMessage<'_>, now: DateTime<Utc>) -> Self;
}

impl FromMessage for NewDeadLetter {
    fn from_message(dead: &DeadQueue, message: RawMessage<'_>, now: DateTime<Utc>) -> Self {
        let mut kept = message.properties.headers.clone();
        for key in DELIVERY_COUNTERS {
            kept.remove(key);
        }
        let h = &kept;

        let (source, reason, queue, class, attempts, last_error, died_at);
        if let Some(r) = text(h.get(DEAD_REASON_HEADER)) {
            source = Source::Runner;
            reason = r;
            queue = text(h.get(DEAD_QUEUE_HEADER));
            class = text(h.get(DEAD_CLASS_HEADER));
            attempts = int(h.get(DEAD_ATTEMPTS_HEADER));
            last_error = text(h.get(DEAD_ERROR_HEADER));
            died_at = text(h.get(DEAD_AT_HEADER))
                .and_then(|t| DateTime::parse_from_rfc3339(&t).ok())
                .map(|t| t.with_timezone(&Utc))
                .or_else(|| latest_death(h).and_then(|d| d.time));
        } else if let Some(death) = latest_death(h).or_else(|| first_death(h)) {
            source = Source::Broker;
            reason = death.reason.clone().unwrap_or_else(|| UNKNOWN.into());
            queue = death.queue.clone();
            class = None;
            attempts = int(h.get(ATTEMPT_HEADER));
            last_error = Some(format!(
                "dead-lettered by the broker from {}: {}{}",
                death.queue.as_deref().unwrap_or("its queue"),
                death.reason.as_deref().unwrap_or("no reason given"),
                death
                    .count
                    .map(|c| format!(" (x-death count {c})"))
                    .unwrap_or_default(),
            ));
            died_at = death.time;
        } else {
            source = Source::Unknown;
            reason = UNKNOWN.into();
            queue = text(h.get(DEAD_QUEUE_HEADER));
            class = None;
            attempts = None;
            last_error = text(h.get(DEAD_ERROR_HEADER));
            died_at = None;
        }

        let properties = MessageProperties::of(message.properties);
        let routing_key =
            text(h.get(ORIGINAL_ROUTING_KEY_HEADER)).unwrap_or_else(|| message.routing_key.into());
        let dedup_key = dedup_key(&dead.dead_queue, message, &properties, &kept);
        let mut replayable = kept.clone();
        replayable.retain(|k, _| !is_dead_letter_bookkeeping(k));
        let amqp_headers = serde_json::to_value(&replayable)
            .ok()
            .filter(|v| !contains_nul(v));
        let last_error = last_error.map(|e| scrub_str(&e));
        let (error_fingerprint, error_normalized) = fingerprint(last_error.as_deref());
        Self {
            dedup_key,
            redelivered: message.redelivered,
            source,
            queue: queue
                .map(|q| scrub_str(&q))
                .unwrap_or_else(|| dead.queue.clone()),
            dead_queue: Some(dead.dead_queue.clone()),
            exchange: None,
            routing_key: Some(scrub_str(&routing_key)),
            message_id: properties.message_id.clone(),
            message_type: properties.kind.clone(),
            reason: scrub_str(&reason),
            class: class.map(|c| scrub_str(&c)),
            attempts: attempts.and_then(|a| i32::try_from(a).ok()),
            last_error,
            error_fingerprint,
            error_normalized,
            died_at: died_at.unwrap_or(now),
            headers: table_to_json(&kept),
            amqp_headers,
            properties: serde_json::to_value(&properties).unwrap_or_default(),
            body: message.body.to_vec(),
            outbox_id: None,
        }
    }
}

/// Whether a header is the dead-letter bookkeeping a replay drops: the attempt (reset), the
/// runner's `x-dead-*`, the broker's `x-death` and `x-first-/x-last-death-*`, the delivery
/// counters, and a previous `x-replayed-from`.
pub fn is_dead_letter_bookkeeping(key: &str) -> bool {
    key == ATTEMPT_HEADER
        || key == REPLAYED_FROM_HEADER
        || key.starts_with("x-dead-")
        || key == "x-death"
        || key.starts_with("x-first-death-")
        || key.starts_with("x-last-death-")
        || DELIVERY_COUNTERS.contains(&key)
}

/// One `x-death` entry, or the `x-first-death-*` headers.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Death {
    reason: Option<String>,
    queue: Option<String>,
    count: Option<i64>,
    time: Option<DateTime<Utc>>,
}

/// The most recent `x-death` entry (RabbitMQ keeps the most recent first).
fn latest_death(h: &Headers) -> Option<Death> {
    let Some(HeaderValue::Array(deaths)) = h.get("x-death") else {
        return None;
    };
    deaths.iter().find_map(|entry| match entry {
        HeaderValue::Table(t) => Some(Death {
            reason: text(t.get("reason")),
            queue: text(t.get("queue")),
            count: int(t.get("count")),
            time: match t.get("time") {
                Some(HeaderValue::Timestamp(ts)) => i64::try_from(*ts)
                    .ok()
                    .and_then(|s| DateTime::from_timestamp(s, 0)),
                other => int(other).and_then(|s| DateTime::from_timestamp(s, 0)),
            },
        }),
        _ => None,
    })
}

fn first_death(h: &Headers) -> Option<Death> {
    let reason = text(h.get("x-first-death-reason"))?;
    Some(Death {
        reason: Some(reason),
        queue: text(h.get("x-first-death-queue")),
        count: None,
        time: None,
    })
}

/// The sha256 of everything that stays the same across redeliveries of one message: the dead
/// queue, the routing key, the properties, the headers without the delivery counters, and the
/// body.
fn dedup_key(
    dead_queue: &str,
    message: RawMessage<'_>,
    properties: &MessageProperties,
    headers: &Headers,
) -> String {
    let mut h = Sha256::new();
    let mut part = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    };
    part(dead_queue.as_bytes());
    part(message.routing_key.as_bytes());
    part(&serde_json::to_vec(properties).unwrap_or_default());
    part(&serde_json::to_vec(headers).unwrap_or_default());
    part(message.body);
    format!("amqp:{}", hex(&h.finalize()))
}

/// A header's text: a long or short string (lossy UTF-8).
pub(crate) fn text(v: Option<&HeaderValue>) -> Option<String> {
    v?.as_text().map(|t| t.into_owned())
}

/// A header's integer, of any AMQP integer type.
pub(crate) fn int(v: Option<&HeaderValue>) -> Option<i64> {
    match v? {
        HeaderValue::Timestamp(n) => i64::try_from(*n).ok(),
        other => other.as_integer(),
    }
}

#[cfg(test)]
mod tests {
    use chrono::SecondsFormat;

    use super::*;

    fn s(v: &str) -> HeaderValue {
        HeaderValue::text(v)
    }

    fn props(headers: &[(&str, HeaderValue)]) -> Properties {
        let mut t = Headers::new();
        for (k, v) in headers {
            t.insert(*k, v.clone());
        }
        Properties {
            message_id: Some("m-1".into()),
            kind: Some("email.send".into()),
            content_type: Some("application/json".into()),
            headers: t,
            ..Properties::default()
        }
    }

    fn read(p: &Properties, redelivered: bool) -> NewDeadLetter {
        NewDeadLetter::from_message(
            &DeadQueue::new("orders.dead", "orders"),
            RawMessage {
                routing_key: "orders",
                redelivered,
                properties: p,
                body: b"{\"id\":1}",
            },
            DateTime::from_timestamp(1_800_000_000, 0).unwrap_or_default(),
        )
    }

    #[test]
    fn the_runners_headers_are_read() {
        let p = props(&[
            (DEAD_REASON_HEADER, s("gave-up")),
            (DEAD_ATTEMPTS_HEADER, HeaderValue::I64(5)),
            (DEAD_ERROR_HEADER, s("smtp 421 for ann@example.com")),
            (DEAD_CLASS_HEADER, s("transient")),
            (DEAD_QUEUE_HEADER, s("email.send")),
            (DEAD_AT_HEADER, s("2026-11-29T10:00:00.250Z")),
            (ORIGINAL_ROUTING_KEY_HEADER, s("email.send")),
            ("traceparent", s("00-abc-def-01")),
        ]);
        let row = read(&p, false);
        assert_eq!(row.source, Source::Runner);
        assert_eq!(row.reason, "gave-up");
        assert_eq!(row.queue, "email.send");
        assert_eq!(row.attempts, Some(5));
        assert_eq!(row.class.as_deref(), Some("transient"));
        assert_eq!(row.routing_key.as_deref(), Some("email.send"));
        assert_eq!(row.message_id.as_deref(), Some("m-1"));
        assert_eq!(row.message_type.as_deref(), Some("email.send"));
        assert_eq!(row.error_normalized, "smtp <n> for <email>");
        assert_eq!(
            row.died_at.to_rfc3339_opts(SecondsFormat::Millis, true),
            "2026-11-29T10:00:00.250Z"
        );
        assert_eq!(row.headers["x-dead-attempts"], 5);
        // The replayable headers keep the application ones, typed, and drop the bookkeeping.
        let table: Headers = serde_json::from_value(row.amqp_headers.clone().unwrap()).unwrap();
        assert_eq!(table.get("traceparent"), Some(&s("00-abc-def-01")));
        assert_eq!(
            table.get(ORIGINAL_ROUTING_KEY_HEADER),
            Some(&s("email.send"))
        );
        assert!(table.iter().all(|(k, _)| !k.starts_with("x-dead-")));
    }

    #[test]
    fn a_delivery_limit_dead_letter_is_read_from_x_death() {
        let mut death = Headers::new();
        death.insert("reason", s("delivery_limit"));
        death.insert("queue", s("orders"));
        death.insert("count", HeaderValue::I64(1));
        death.insert("time", HeaderValue::Timestamp(1_800_000_100));
        let mut expired = Headers::new();
        expired.insert("reason", s("expired"));
        expired.insert("queue", s("orders.retry.10s"));
        let deaths = vec![HeaderValue::Table(death), HeaderValue::Table(expired)];
        let p = props(&[
            ("x-death", HeaderValue::Array(deaths)),
            ("x-first-death-reason", s("expired")),
            ("x-attempt", HeaderValue::I64(2)),
        ]);
        let row = read(&p, false);
        assert_eq!(row.source, Source::Broker);
        assert_eq!(row.reason, DELIVERY_LIMIT);
        assert_eq!(row.queue, "orders");
        assert_eq!(row.attempts, Some(2));
        assert_eq!(row.died_at.timestamp(), 1_800_000_100);
        assert_eq!(
            row.error_normalized,
            "dead-lettered by the broker from orders: delivery_limit (x-death count <n>)"
        );
        assert_eq!(row.headers["x-death"][0]["time"], "2027-01-15T08:01:40Z");
    }

    #[test]
    fn a_message_without_either_is_unknown_not_dropped() {
        let p = Properties::default();
        let row = read(&p, false);
        assert_eq!(row.source, Source::Unknown);
        assert_eq!(row.reason, UNKNOWN);
        assert_eq!(row.queue, "orders", "the dead queue's work queue");
        assert_eq!(row.died_at.timestamp(), 1_800_000_000, "now");
        assert_eq!(row.body, b"{\"id\":1}");
    }

    #[test]
    fn the_key_ignores_the_delivery_counters_and_the_redelivered_flag() {
        let base = [(DEAD_REASON_HEADER, s("rejected"))];
        let first = read(&props(&base), false);
        let again = read(
            &props(&[
                (DEAD_REASON_HEADER, s("rejected")),
                ("x-delivery-count", HeaderValue::I64(1)),
            ]),
            true,
        );
        assert_eq!(first.dedup_key, again.dedup_key);
        assert_eq!(first.headers, again.headers);
        let other = read(&props(&[(DEAD_REASON_HEADER, s("gave-up"))]), false);
        assert_ne!(first.dedup_key, other.dedup_key);
    }

    #[test]
    fn nul_bytes_never_reach_postgres() {
        let p = props(&[
            (DEAD_REASON_HEADER, s("rejected")),
            (DEAD_ERROR_HEADER, s("bad\0byte")),
            ("x-app", s("a\0b")),
        ]);
        let row = read(&p, false);
        assert_eq!(row.last_error.as_deref(), Some("bad\u{FFFD}byte"));
        assert!(!contains_nul(&row.headers));
        assert!(row.amqp_headers.is_some(), "byte strings are kept as bytes");
    }

    #[test]
    fn properties_round_trip_for_replay() {
        let p = Properties {
            timestamp: Some(42),
            expiration: Some("1000".into()),
            ..props(&[])
        };
        let mp = MessageProperties::of(&p);
        let back = mp.for_replay();
        assert_eq!(back.message_id, p.message_id);
        assert_eq!(back.timestamp, Some(42));
        assert_eq!(back.expiration, None, "a replayed copy does not expire");
        assert_eq!(back.delivery_mode, Some(2));
    }
}
