//! From claimed rows to confirmed publishes, and from publish errors to a verdict per row.
//!
//! A batch is published with [`Publisher::publish_many`]: every message sent, then every
//! confirm awaited. Most errors belong to one message (unroutable, nacked, invalid) and are
//! taken as they come. Some do not: a publish to an exchange that does not exist, or one the
//! broker refuses, closes the whole channel, and every later confirm of the batch fails with
//! it. Blaming them all would let one poisoned row burn the attempts of the rows behind it, so
//! those rows are *isolated*: the first is published alone, which tells whose fault it was
//! (an exchange that does not exist or is forbidden fails every row bound for it), the rest are
//! published again together, and so on until each has a verdict of its own. Every pass settles
//! at least one row, so a batch settles in at most its size passes, usually in one or two.
//!
//! When the broker is not there at all (not connected, confirms that do not come) the rows
//! are left as they were, with no attempt counted: the outage is not theirs.

use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use worker_broker::{Headers, Outgoing, Properties, PublishError, Publisher};
use worker_store::OutboxRow;

/// What happened to one row of a batch.
#[derive(Debug, Clone)]
pub enum Verdict {
    /// Confirmed by the broker and routed somewhere.
    Published,
    /// This row's own failure: an attempt is added.
    Failed(PublishError),
    /// Not tried to the end (the broker is away, or the tick was cancelled): left pending,
    /// no attempt counted. Carries the error that stopped it, if any.
    Untouched(Option<PublishError>),
}

impl Verdict {
    pub fn is_published(&self) -> bool {
        matches!(self, Self::Published)
    }
}

/// How a publish error is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Blame {
    /// The message's own fault.
    Row,
    /// The broker is away or stalled: stop, blame nobody.
    Broker,
    /// The channel went down; whose fault it was must be found out.
    Unknown,
}

fn blame(err: &PublishError) -> Blame {
    match err {
        PublishError::Unroutable { .. }
        | PublishError::Nacked { .. }
        | PublishError::Invalid { .. } => Blame::Row,
        PublishError::NotConnected { .. } | PublishError::ConfirmTimeout { .. } => Blame::Broker,
        PublishError::Refused { .. } | PublishError::Lost { .. } => Blame::Unknown,
    }
}

/// Whether a refusal concerns the exchange itself, and so every message bound for it.
fn refuses_exchange(err: &PublishError) -> bool {
    matches!(err, PublishError::Refused { code, .. } if code == "NOTFOUND" || code == "ACCESSREFUSED")
}

/// Publishes `messages` with confirms and returns a verdict per message, in order (see the
/// module docs). Stops isolating when `cancel` fires, leaving what is unsettled untouched.
pub async fn publish_rows(
    publisher: &Publisher,
    messages: &[Outgoing],
    cancel: &CancellationToken,
) -> Vec<Verdict> {
    let mut verdicts: Vec<Option<Verdict>> = vec![None; messages.len()];
    let results = publisher.publish_many(messages).await;
    let mut unknown: Vec<usize> = Vec::new();
    let mut broker_down: Option<PublishError> = None;
    for (i, result) in results.into_iter().enumerate() {
        match result {
            Ok(()) => verdicts[i] = Some(Verdict::Published),
            Err(err) => match blame(&err) {
                Blame::Row => verdicts[i] = Some(Verdict::Failed(err)),
                Blame::Broker => {
                    verdicts[i] = Some(Verdict::Untouched(Some(err.clone())));
                    broker_down.get_or_insert(err);
                }
                Blame::Unknown => unknown.push(i),
            },
        }
    }
    if broker_down.is_none() && !unknown.is_empty() {
        tracing::debug!(
            rows = unknown.len(),
            "a publish closed the channel; isolating the rows it took down"
        );
        broker_down = isolate(publisher, messages, &mut unknown, &mut verdicts, cancel).await;
    }
    verdicts
        .into_iter()
        .map(|v| v.unwrap_or_else(|| Verdict::Untouched(broker_down.clone())))
        .collect()
}

/// Settles the rows in `unknown` one pass at a time; returns the broker error that stopped
/// it, if one did.
async fn isolate(
    publisher: &Publisher,
    messages: &[Outgoing],
    unknown: &mut Vec<usize>,
    verdicts: &mut [Option<Verdict>],
    cancel: &CancellationToken,
) -> Option<PublishError> {
    while let Some(&first) = unknown.first() {
        if cancel.is_cancelled() {
            return None;
        }
        // The first row alone: its result is its own.
        match publisher.publish(&messages[first]).await {
            Ok(()) => {
                verdicts[first] = Some(Verdict::Published);
                unknown.remove(0);
            }
            Err(err) if blame(&err) == Blame::Broker => return Some(err),
            Err(err) if refuses_exchange(&err) => {
                // Nothing bound for this exchange can be published: fail them all at once.
                let exchange = messages[first].exchange.clone();
                unknown.retain(|&i| {
                    if messages[i].exchange == exchange {
                        verdicts[i] = Some(Verdict::Failed(err.clone()));
                        false
                    } else {
                        true
                    }
                });
            }
            Err(err) => {
                verdicts[first] = Some(Verdict::Failed(err));
                unknown.remove(0);
            }
        }
        if unknown.is_empty() || cancel.is_cancelled() {
            return None;
        }
        // The rest together again.
        let batch: Vec<Outgoing> = unknown.iter().map(|&i| messages[i].clone()).collect();
        let results = publisher.publish_many(&batch).await;
        let mut still = Vec::new();
        for (&i, result) in unknown.iter().zip(results) {
            match result {
                Ok(()) => verdicts[i] = Some(Verdict::Published),
                Err(err) => match blame(&err) {
                    Blame::Row => verdicts[i] = Some(Verdict::Failed(err)),
                    Blame::Broker => return Some(err),
                    Blame::Unknown => still.push(i),
                },
            }
        }
        *unknown = still;
    }
    None
}

/// The message a claimed row stands for: persistent, with the row's message id, type,
/// content type, correlation id, creation time and headers. A text property longer than an
/// AMQP short string is not sent.
pub fn to_outgoing(row: OutboxRow) -> Outgoing {
    let properties = Properties {
        timestamp: Some(timestamp(row.created_at)),
        headers: headers_of(&row.headers),
        message_id: Some(row.message_id),
        kind: row.message_type,
        content_type: row.content_type,
        correlation_id: row.correlation_id,
        ..Properties::persistent()
    };
    Outgoing {
        exchange: row.exchange,
        routing_key: row.routing_key,
        body: row.body,
        properties,
    }
}

/// The span of one row's publish, `outbox.publish <routing key>`, and `message` made to carry
/// it. The span is the child of the span that enqueued the row (the trace context stored on
/// the row) and, through the message's `traceparent`, the parent of every consumer's span:
/// so one trace runs from the work that wrote the row, through its publish, to its
/// consumers. It links to the drain's tick. Without an OpenTelemetry layer the message keeps
/// the row's trace context as it is.
pub fn publish_span(outbox_id: i64, message: &mut Outgoing) -> tracing::Span {
    let message_id = message.properties.message_id.as_deref().unwrap_or("");
    let span = tracing::info_span!(
        parent: None,
        "outbox.publish",
        otel.name = %format_args!("outbox.publish {}", message.routing_key),
        otel.kind = "producer",
        otel.status_code = tracing::field::Empty,
        messaging.system = "rabbitmq",
        messaging.operation = "publish",
        messaging.destination.name = %message.exchange,
        messaging.rabbitmq.destination.routing_key = %message.routing_key,
        messaging.message.id = message_id,
        outbox.id = outbox_id,
        outcome = tracing::field::Empty,
        error = tracing::field::Empty,
    );
    let headers = &mut message.properties.headers;
    worker_broker::trace::continue_trace(&span, Some(headers));
    span.follows_from(tracing::Span::current());
    worker_broker::trace::inject_span(&span, headers);
    span
}

/// Records a row's verdict on its publish span: `outcome` (`published`, `failed`,
/// `untouched`) and, for a failure, the error.
pub fn record_verdict(span: &tracing::Span, verdict: &Verdict) {
    match verdict {
        Verdict::Published => {
            span.record("outcome", "published");
        }
        Verdict::Failed(err) => {
            span.record("outcome", "failed");
            span.record("otel.status_code", "ERROR");
            span.record("error", tracing::field::display(err));
        }
        Verdict::Untouched(err) => {
            span.record("outcome", "untouched");
            if let Some(err) = err {
                span.record("error", tracing::field::display(err));
            }
        }
    }
}

fn timestamp(at: DateTime<Utc>) -> u64 {
    u64::try_from(at.timestamp()).unwrap_or(0)
}

/// The stored JSON headers as AMQP headers (see [`worker_broker::headers_from_json`]).
pub fn headers_of(headers: &Value) -> Headers {
    worker_broker::headers_from_json(headers)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use worker_broker::HeaderValue;

    use super::*;

    #[test]
    fn errors_are_blamed_on_the_row_the_broker_or_nobody_yet() {
        let unroutable = PublishError::Unroutable {
            exchange: "e".into(),
            routing_key: "k".into(),
        };
        assert_eq!(blame(&unroutable), Blame::Row);
        let down = PublishError::NotConnected {
            waited: Duration::from_secs(1),
        };
        assert_eq!(blame(&down), Blame::Broker);
        let refused = PublishError::Refused {
            exchange: "nope".into(),
            code: "NOTFOUND".into(),
            detail: "no exchange 'nope'".into(),
        };
        assert_eq!(blame(&refused), Blame::Unknown);
        assert!(refuses_exchange(&refused));
        let lost = PublishError::Lost {
            exchange: "e".into(),
            detail: "channel closed".into(),
        };
        assert!(!refuses_exchange(&lost));
    }

    #[test]
    fn json_headers_become_an_amqp_table() {
        let table = headers_of(&serde_json::json!({
            "traceparent": "00-abc-def-01",
            "n": 5,
            "f": 1.5,
            "b": true,
            "z": null,
            "list": [1, 2],
        }));
        assert_eq!(
            table.get("traceparent"),
            Some(&HeaderValue::text("00-abc-def-01"))
        );
        assert_eq!(table.get("n"), Some(&HeaderValue::I64(5)));
        assert_eq!(table.get("f"), Some(&HeaderValue::F64(1.5)));
        assert_eq!(table.get("b"), Some(&HeaderValue::Bool(true)));
        assert_eq!(table.get("z"), Some(&HeaderValue::Void));
        assert_eq!(table.get("list"), Some(&HeaderValue::text("[1,2]")));
        assert!(headers_of(&Value::Null).is_empty());
    }

    #[test]
    fn a_row_becomes_a_persistent_message_with_its_properties() {
        let row = OutboxRow {
            id: 7,
            message_id: "m-7".into(),
            message_type: Some("email.received".into()),
            content_type: Some("application/json".into()),
            correlation_id: Some("c-1".into()),
            exchange: "events".into(),
            routing_key: "email.received".into(),
            headers: serde_json::json!({"tenant": "acme"}),
            body: b"{}".to_vec(),
            created_at: DateTime::from_timestamp(1_700_000_000, 0).unwrap(),
            attempts: 0,
        };
        let m = to_outgoing(row);
        assert_eq!(
            (m.exchange.as_str(), m.routing_key.as_str()),
            ("events", "email.received")
        );
        let p = &m.properties;
        assert_eq!(p.delivery_mode, Some(worker_broker::message::PERSISTENT));
        assert_eq!(p.message_id.as_deref(), Some("m-7"));
        assert_eq!(p.kind.as_deref(), Some("email.received"));
        assert_eq!(p.correlation_id.as_deref(), Some("c-1"));
        assert_eq!(p.timestamp, Some(1_700_000_000));
        assert!(p.headers.contains_key("tenant"));
    }
}
