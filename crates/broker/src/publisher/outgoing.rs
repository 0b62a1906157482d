//! [`Outgoing`]: a message to publish, and the AMQP headers of a JSON object.

use std::fmt;

use lapin::types::ShortString;
use serde::Serialize;

use crate::message::{HeaderValue, Headers, Properties};

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
    use super::*;
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
