//! One batch on one confirm channel: every message sent `mandatory` with the current trace
//! context, then every confirm awaited, and each `basic.return` matched back to its entry.

use std::time::Duration;

use lapin::message::BasicReturnMessage;
use lapin::options::BasicPublishOptions;
use lapin::types::ShortString;
use lapin::{BasicProperties, Channel, Confirmation};

use super::error::{PublishError, classify_lapin};
use super::outgoing::Outgoing;
use crate::trace;

/// Sends every message, then awaits every confirm. Returns the results and whether the
/// channel is still fit for use.
pub(super) async fn publish_batch(
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
