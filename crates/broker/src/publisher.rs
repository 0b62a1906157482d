//! Confirmed publishing.
//!
//! Every publish is `mandatory` on a channel in confirm mode, and only a confirm without a
//! `basic.return` counts as success: RabbitMQ confirms an unroutable message (it was handled:
//! dropped), so the return is the only sign it went nowhere. [`Publisher::publish_many`] sends
//! a whole batch before it awaits the confirms, one round trip instead of one per message.
//!
//! lapin attaches a `basic.return` to whichever pending confirm the next ack resolves, not
//! to the publish it belongs to, and resolves a multiple-ack in no particular order. So a batch
//! owns its channel until all its confirms are in (a small pool of channels serves concurrent
//! batches), and returned messages are matched back to the batch's entries by content.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lapin::message::BasicReturnMessage;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::ShortString;
use lapin::{BasicProperties, Channel, Confirmation};
use serde::{Deserialize, Serialize};
use tokio::sync::{Mutex, watch};
use worker_core::Failure;

use crate::connection::Session;
use crate::message::{HeaderValue, Headers, Properties};
use crate::trace;

/// A message to publish.
#[derive(Clone, PartialEq)]
pub struct Outgoing {
    pub exchange: String,
    pub routing_key: String,
    pub body: Vec<u8>,
    pub properties: Properties,
}

impl fmt::Debug for Outgoing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Outgoing")
            .field("exchange", &self.exchange)
            .field("routing_key", &self.routing_key)
            .field("bytes", &self.body.len())
            .field("message_id", &self.properties.message_id)
            .finish()
    }
}

impl Outgoing {
    /// A persistent message with `body` as is.
    pub fn new(
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
        body: impl Into<Vec<u8>>,
    ) -> Self {
        Self {
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            body: body.into(),
            properties: Properties::persistent(),
        }
    }

    /// A persistent JSON message stamped with the current time.
    pub fn json<T: Serialize + ?Sized>(
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
        value: &T,
    ) -> Result<Self, serde_json::Error> {
        let body = serde_json::to_vec(value)?;
        let now = chrono::Utc::now().timestamp();
        let mut out = Self::new(exchange, routing_key, body);
        out.properties.content_type = Some("application/json".into());
        out.properties.timestamp = Some(u64::try_from(now).unwrap_or(0));
        Ok(out)
    }

    /// Sets the message id; one longer than an AMQP short string (255 bytes) is not sent.
    #[must_use]
    pub fn with_message_id(mut self, id: &str) -> Self {
        self.properties.message_id = Some(id.into());
        self
    }

    /// Sets the correlation id; one longer than an AMQP short string is not sent.
    #[must_use]
    pub fn with_correlation_id(mut self, id: &str) -> Self {
        self.properties.correlation_id = Some(id.into());
        self
    }

    /// Sets the AMQP `type` property (the message's kind, e.g. `email.received`).
    #[must_use]
    pub fn with_type(mut self, kind: &str) -> Self {
        self.properties.kind = Some(kind.into());
        self
    }

    /// Adds an application header; one whose name is longer than an AMQP short string is
    /// not sent.
    #[must_use]
    pub fn with_header(mut self, key: &str, value: impl Into<HeaderValue>) -> Self {
        self.properties.headers.insert(key, value);
        self
    }
}

/// Why a publish did not succeed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PublishError {
    #[error("not connected to RabbitMQ (waited {})", humantime::format_duration(*waited))]
    NotConnected { waited: Duration },

    #[error("the connection or channel was lost while publishing to '{exchange}': {detail}")]
    Lost { exchange: String, detail: String },

    #[error("no confirm from RabbitMQ within {} for the publish to '{exchange}'", humantime::format_duration(*after))]
    ConfirmTimeout { exchange: String, after: Duration },

    #[error("RabbitMQ refused the publish to '{exchange}' ({code}): {detail}")]
    Refused {
        exchange: String,
        code: String,
        detail: String,
    },

    #[error(
        "unroutable: no queue is bound to exchange '{exchange}' for routing key '{routing_key}'"
    )]
    Unroutable {
        exchange: String,
        routing_key: String,
    },

    #[error(
        "RabbitMQ nacked the publish to '{exchange}' (routing key '{routing_key}'): a queue refused it"
    )]
    Nacked {
        exchange: String,
        routing_key: String,
    },

    #[error("cannot publish to '{exchange}': {detail}")]
    Invalid { exchange: String, detail: String },
}

impl PublishError {
    /// Transient: the link, a timeout or a nack (`reject-publish` on a full queue), which may
    /// clear. Permanent: nothing routes the message, the broker refuses the exchange or the
    /// permission, or the message itself cannot be sent; trying again changes nothing until
    /// an operator acts.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::NotConnected { .. }
                | Self::Lost { .. }
                | Self::ConfirmTimeout { .. }
                | Self::Nacked { .. }
        )
    }

    /// The failure this error is, classified once.
    pub fn to_failure(&self) -> Failure {
        match self {
            Self::NotConnected { .. }
            | Self::Lost { .. }
            | Self::ConfirmTimeout { .. }
            | Self::Nacked { .. } => Failure::transient(self),
            Self::Refused { .. } => Failure::permanent("publish-refused", self),
            Self::Unroutable { .. } => Failure::permanent("unroutable", self),
            Self::Invalid { .. } => Failure::permanent("publish-invalid", self),
        }
    }
}

impl From<PublishError> for Failure {
    fn from(err: PublishError) -> Self {
        err.to_failure()
    }
}

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

/// A confirmed publisher over the current session; cheap to clone.
#[derive(Clone)]
pub struct Publisher {
    inner: Arc<Inner>,
}

struct Inner {
    sessions: watch::Receiver<Option<Session>>,
    slots: Vec<Mutex<Option<Slot>>>,
    next: AtomicUsize,
    settings: PublisherSettings,
}

struct Slot {
    generation: u64,
    channel: Channel,
}

impl fmt::Debug for Publisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Publisher")
            .field("settings", &self.inner.settings)
            .finish_non_exhaustive()
    }
}

impl Publisher {
    /// A publisher over `sessions` (from [`Supervisor::sessions`](crate::Supervisor::sessions)
    /// or [`Session::fixed`]).
    pub fn new(sessions: watch::Receiver<Option<Session>>, settings: PublisherSettings) -> Self {
        let slots = (0..settings.channels.max(1))
            .map(|_| Mutex::new(None))
            .collect();
        Self {
            inner: Arc::new(Inner {
                sessions,
                slots,
                next: AtomicUsize::new(0),
                settings,
            }),
        }
    }

    /// Publishes one message and waits for its confirm.
    pub async fn publish(&self, message: &Outgoing) -> Result<(), PublishError> {
        let mut results = self.publish_many(std::slice::from_ref(message)).await;
        results.pop().unwrap_or(Ok(()))
    }

    /// Publishes every message, then awaits all their confirms; one result per message, in
    /// order. Each message gets the current trace context unless it carries one already.
    pub async fn publish_many(&self, messages: &[Outgoing]) -> Vec<Result<(), PublishError>> {
        if messages.is_empty() {
            return Vec::new();
        }
        let session = match self.session().await {
            Ok(session) => session,
            Err(err) => return vec![Err(err); messages.len()],
        };
        let mut slot = self.slot().await;
        let channel = match open_channel(&mut slot, &session).await {
            Ok(channel) => channel,
            Err(err) => {
                let detail = worker_core::error_chain(&err);
                return messages.iter().map(|m| Err(lost(m, &detail))).collect();
            }
        };
        let (results, healthy) =
            publish_batch(&channel, messages, self.inner.settings.confirm_timeout).await;
        if !healthy {
            // The channel's state is unknown or closed: the next batch opens a fresh one.
            *slot = None;
            let _ = channel
                .close(200, "discarded after a failed publish".into())
                .await;
        }
        results
    }

    async fn session(&self) -> Result<Session, PublishError> {
        let mut sessions = self.inner.sessions.clone();
        let waited = self.inner.settings.connect_wait;
        let found = tokio::time::timeout(waited, async {
            loop {
                if let Some(session) = sessions
                    .borrow_and_update()
                    .clone()
                    .filter(Session::is_open)
                {
                    return Some(session);
                }
                if sessions.changed().await.is_err() {
                    // A fixed source whose connection died will never change again.
                    return None;
                }
            }
        })
        .await;
        found
            .ok()
            .flatten()
            .ok_or(PublishError::NotConnected { waited })
    }

    async fn slot(&self) -> tokio::sync::MutexGuard<'_, Option<Slot>> {
        let slots = &self.inner.slots;
        let start = self.inner.next.fetch_add(1, Ordering::Relaxed);
        for i in 0..slots.len() {
            if let Ok(guard) = slots[(start + i) % slots.len()].try_lock() {
                return guard;
            }
        }
        slots[start % slots.len()].lock().await
    }
}

async fn open_channel(slot: &mut Option<Slot>, session: &Session) -> Result<Channel, lapin::Error> {
    if let Some(s) = slot.as_ref()
        && s.generation == session.generation()
        && s.channel.status().connected()
    {
        return Ok(s.channel.clone());
    }
    *slot = None;
    let channel = session.connection().create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    *slot = Some(Slot {
        generation: session.generation(),
        channel: channel.clone(),
    });
    Ok(channel)
}

fn lost(message: &Outgoing, detail: &str) -> PublishError {
    PublishError::Lost {
        exchange: message.exchange.clone(),
        detail: detail.to_string(),
    }
}

/// Sends every message, then awaits every confirm. Returns the results and whether the
/// channel is still fit for use.
async fn publish_batch(
    channel: &Channel,
    messages: &[Outgoing],
    confirm_timeout: Duration,
) -> (Vec<Result<(), PublishError>>, bool) {
    let mut results: Vec<Result<(), PublishError>> = Vec::with_capacity(messages.len());
    let mut confirms = Vec::with_capacity(messages.len());
    let mut healthy = true;
    let options = BasicPublishOptions {
        mandatory: true,
        immediate: false,
    };
    for (i, message) in messages.iter().enumerate() {
        let (exchange, routing_key) = match (
            ShortString::try_new(message.exchange.as_str()),
            ShortString::try_new(message.routing_key.as_str()),
        ) {
            (Ok(e), Ok(r)) => (e, r),
            (Err(e), _) | (_, Err(e)) => {
                results.push(Err(PublishError::Invalid {
                    exchange: message.exchange.clone(),
                    detail: e.to_string(),
                }));
                continue;
            }
        };
        let properties = BasicProperties::from(&message.properties);
        let mut headers = properties.headers().clone().unwrap_or_default();
        trace::inject_current(&mut headers);
        let properties = properties.with_headers(headers);
        match channel
            .basic_publish(exchange, routing_key, options, &message.body, properties)
            .await
        {
            Ok(confirm) => {
                results.push(Ok(()));
                confirms.push((i, confirm));
            }
            Err(err) => {
                healthy = false;
                results.push(Err(classify_lapin(message, &err)));
            }
        }
    }

    let awaited = tokio::time::timeout(
        confirm_timeout,
        futures::future::join_all(
            confirms
                .into_iter()
                .map(|(i, c)| async move { (i, c.await) }),
        ),
    )
    .await;
    let confirmations = match awaited {
        Ok(confirmations) => confirmations,
        Err(_) => {
            for (i, message) in messages.iter().enumerate() {
                if results[i].is_ok() {
                    results[i] = Err(PublishError::ConfirmTimeout {
                        exchange: message.exchange.clone(),
                        after: confirm_timeout,
                    });
                }
            }
            return (results, false);
        }
    };

    let mut returned: Vec<BasicReturnMessage> = Vec::new();
    for (i, confirmation) in confirmations {
        match confirmation {
            Ok(Confirmation::Ack(ret)) => returned.extend(ret),
            Ok(Confirmation::Nack(ret)) => {
                returned.extend(ret);
                let m = &messages[i];
                results[i] = Err(PublishError::Nacked {
                    exchange: m.exchange.clone(),
                    routing_key: m.routing_key.clone(),
                });
            }
            Ok(Confirmation::NotRequested) => {}
            Err(err) => {
                healthy = false;
                results[i] = Err(classify_lapin(&messages[i], &err));
            }
        }
    }
    for ret in returned {
        let delivery = &ret.delivery;
        let owner = messages.iter().enumerate().position(|(i, m)| {
            results[i].is_ok()
                && m.exchange == delivery.exchange.as_str()
                && m.routing_key == delivery.routing_key.as_str()
                && m.properties.message_id.as_deref()
                    == delivery
                        .properties
                        .message_id()
                        .as_ref()
                        .map(ShortString::as_str)
                && m.body == delivery.data
        });
        // A return that matches nothing still means one of ours went nowhere: blame the first
        // entry to the same exchange and routing key rather than report a false success.
        let owner = owner.or_else(|| {
            messages.iter().enumerate().position(|(i, m)| {
                results[i].is_ok()
                    && m.exchange == delivery.exchange.as_str()
                    && m.routing_key == delivery.routing_key.as_str()
            })
        });
        if let Some(i) = owner {
            results[i] = Err(PublishError::Unroutable {
                exchange: delivery.exchange.to_string(),
                routing_key: delivery.routing_key.to_string(),
            });
        }
    }
    (results, healthy)
}

fn classify_lapin(message: &Outgoing, err: &lapin::Error) -> PublishError {
    if let lapin::ErrorKind::ProtocolError(e) = err.kind()
        && let AMQPErrorKind::Soft(soft) = e.kind()
        && matches!(
            soft,
            AMQPSoftError::NOTFOUND
                | AMQPSoftError::ACCESSREFUSED
                | AMQPSoftError::PRECONDITIONFAILED
        )
    {
        return PublishError::Refused {
            exchange: message.exchange.clone(),
            code: format!("{soft:?}"),
            detail: e.get_message().to_string(),
        };
    }
    lost(message, &worker_core::error_chain(err))
}

/// JSON headers (as stored in an outbox row or a dead letter's readable copy) as AMQP
/// headers: strings, integers, floats and booleans as themselves, `null` as void, arrays and
/// objects as their JSON text. Keys longer than an AMQP short string are left out.
pub fn headers_from_json(headers: &serde_json::Value) -> Headers {
    use serde_json::Value;
    let mut out = Headers::new();
    let Value::Object(map) = headers else {
        return out;
    };
    for (key, value) in map {
        if ShortString::try_new(key.as_str()).is_err() {
            continue;
        }
        let value = match value {
            Value::String(s) => HeaderValue::text(s.as_str()),
            Value::Bool(b) => HeaderValue::Bool(*b),
            Value::Number(n) => match (n.as_i64(), n.as_f64()) {
                (Some(i), _) => HeaderValue::I64(i),
                (None, Some(f)) => HeaderValue::F64(f),
                (None, None) => HeaderValue::text(n.to_string()),
            },
            Value::Null => HeaderValue::Void,
            other => HeaderValue::text(other.to_string()),
        };
        out.insert(key.as_str(), value);
    }
    out
}

#[cfg(test)]
mod tests {
    use worker_core::FailureClass;

    use super::*;

    #[test]
    fn errors_are_classified_once() {
        let unroutable = PublishError::Unroutable {
            exchange: "commands".into(),
            routing_key: "nowhere".into(),
        };
        assert_eq!(unroutable.to_failure().class(), FailureClass::Permanent);
        assert_eq!(unroutable.to_failure().reason(), "unroutable");
        assert!(unroutable.to_string().contains("'nowhere'"));
        let lost = PublishError::Lost {
            exchange: "x".into(),
            detail: "reset".into(),
        };
        assert_eq!(Failure::from(lost).class(), FailureClass::Transient);
        let timeout = PublishError::ConfirmTimeout {
            exchange: "x".into(),
            after: Duration::from_secs(1),
        };
        assert!(timeout.is_transient());
        let nack = PublishError::Nacked {
            exchange: "x".into(),
            routing_key: "k".into(),
        };
        assert!(nack.is_transient());
        let refused = PublishError::Refused {
            exchange: "x".into(),
            code: "NOTFOUND".into(),
            detail: "no exchange".into(),
        };
        assert!(!refused.is_transient());
    }

    #[test]
    fn json_messages_are_persistent_and_typed() {
        let m = Outgoing::json("commands", "email.send", &serde_json::json!({"a": 1}))
            .unwrap()
            .with_message_id("m-1");
        assert_eq!(m.properties.delivery_mode, Some(crate::message::PERSISTENT));
        assert_eq!(
            m.properties.content_type.as_deref(),
            Some("application/json")
        );
        assert_eq!(m.properties.message_id.as_deref(), Some("m-1"));
        assert_eq!(m.body, br#"{"a":1}"#);
    }
}
