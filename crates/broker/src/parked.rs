//! What waits in a queue's retry tiers ("parked"): counted, and sent back to its work queue
//! now instead of when the tier's TTL expires (issue 39, "send parked mail now").
//!
//! A move is what the tier's expiry would have done: the message goes through the default
//! exchange to the work queue, with its body, properties and every header as they were, so
//! its `x-attempt` (and with it the tries it has left) is kept. Each message is taken with
//! `basic.get`, published `mandatory` and confirmed, and only then acked on the tier: nothing
//! is lost. A crash or a lost connection between the confirm and the ack leaves the message
//! in the tier as well as in the work queue; it is then delivered twice, and the consumers'
//! deduplication (the job's guard) makes the second a duplicate.

use std::time::Duration;

use lapin::options::{BasicAckOptions, BasicGetOptions, BasicNackOptions, QueueDeclareOptions};
use lapin::types::{FieldTable, ShortString};
use serde::Serialize;
use worker_core::Failure;

use crate::connection::Session;
use crate::message::{Delivery, PERSISTENT};
use crate::publisher::{Outgoing, Publisher};
use crate::topology::RetryTier;

/// One retry tier and what waits in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ParkedTier {
    /// The tier queue (`email.send.retry.10s`).
    pub queue: String,
    /// Its delay, in milliseconds.
    pub delay_ms: u64,
    /// Messages ready in it; `None` when the tier queue does not exist (not declared yet).
    pub waiting: Option<u64>,
}

/// What waits in a work queue's retry tiers, shortest delay first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Parked {
    pub queue: String,
    pub tiers: Vec<ParkedTier>,
}

impl Parked {
    /// Every message waiting in the tiers.
    pub fn total(&self) -> u64 {
        self.tiers.iter().filter_map(|t| t.waiting).sum()
    }
}

/// What a send-now moved.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SentNow {
    /// Messages published to the work queue, confirmed and acked on their tier.
    pub moved: u64,
    /// Per tier queue, how many of them came from it.
    pub from_tiers: Vec<(String, u64)>,
    /// Why it stopped before the cap or the tiers' end, if it did; the message it held went
    /// back to its tier.
    pub stopped: Option<String>,
}

fn broker(what: &str) -> impl Fn(lapin::Error) -> Failure + '_ {
    move |e| Failure::transient(format!("{what}: {e}"))
}

/// Counts what waits in each of `work_queue`'s retry tiers (passive declares, which move
/// nothing). A tier queue that does not exist counts as `None`.
pub async fn parked(
    session: &Session,
    work_queue: &str,
    tiers_of_queue: &[RetryTier],
) -> Result<Parked, Failure> {
    let mut tiers = Vec::with_capacity(tiers_of_queue.len());
    let options = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    let mut channel = None;
    for tier in tiers_of_queue {
        // A missing queue fails its passive declare and closes the channel: the next tier
        // gets a channel of its own.
        let open = match channel.take() {
            Some(open) => open,
            None => session
                .connection()
                .create_channel()
                .await
                .map_err(broker("counting the retry tiers (no channel opened)"))?,
        };
        let name = ShortString::try_new(tier.queue.as_str()).map_err(|_| {
            Failure::permanent("queue-name", format!("`{}` is no queue name", tier.queue))
        })?;
        let waiting = match open
            .queue_declare(name, options, FieldTable::default())
            .await
        {
            Ok(declared) => {
                channel = Some(open);
                Some(u64::from(declared.message_count()))
            }
            Err(e) if matches!(e.kind(), lapin::ErrorKind::ProtocolError(_)) => None,
            Err(e) => return Err(broker(&format!("counting {}", tier.queue))(e)),
        };
        tiers.push(ParkedTier {
            queue: tier.queue.clone(),
            delay_ms: u64::try_from(tier.delay.as_millis()).unwrap_or(u64::MAX),
            waiting,
        });
    }
    if let Some(open) = channel {
        let _ = open.close(200, "tiers counted".into()).await;
    }
    Ok(Parked {
        queue: work_queue.to_owned(),
        tiers,
    })
}

/// The copy a tier's expiry would have made: to the work queue through the default
/// exchange, everything kept but the per-message `expiration` (it would expire the copy in
/// the work queue) and `user-id` (it must match the publishing connection's user).
fn moved_copy(queue: &str, delivery: &Delivery) -> Outgoing {
    let mut properties = delivery.properties().clone();
    properties.delivery_mode = Some(PERSISTENT);
    properties.expiration = None;
    properties.user_id = None;
    properties.headers.remove("x-delivery-count");
    Outgoing {
        exchange: String::new(),
        routing_key: queue.to_owned(),
        body: delivery.body().to_vec(),
        properties,
    }
}

/// Moves at most `cap` messages from `tiers` (shortest delay first) to `work_queue`, each acked on its tier only once `publisher` had it confirmed. A failed
/// publish puts the message back in its tier and stops the move, with why, in
/// [`SentNow::stopped`]. Messages a tier's expiry moves meanwhile simply are not found.
pub async fn send_parked_now(
    session: &Session,
    publisher: &Publisher,
    work_queue: &str,
    tiers: &[RetryTier],
    cap: u64,
) -> Result<SentNow, Failure> {
    let mut sent = SentNow::default();
    if cap == 0 {
        return Ok(sent);
    }
    let channel = session
        .connection()
        .create_channel()
        .await
        .map_err(broker("moving parked messages (no channel opened)"))?;
    'tiers: for tier in tiers {
        let Ok(name) = ShortString::try_new(tier.queue.as_str()) else {
            continue;
        };
        let mut from_tier = 0;
        while sent.moved < cap {
            let got = match channel
                .basic_get(name.clone(), BasicGetOptions { no_ack: false })
                .await
            {
                Ok(Some(got)) => got,
                Ok(None) => break,
                Err(e) => {
                    sent.stopped = Some(format!("reading {}: {e}", tier.queue));
                    break 'tiers;
                }
            };
            let tag = got.delivery.delivery_tag;
            let delivery = Delivery::from(got.delivery);
            if let Err(e) = publisher.publish(&moved_copy(work_queue, &delivery)).await {
                // Back to its tier, where it waits as before.
                let _ = channel
                    .basic_nack(
                        tag,
                        BasicNackOptions {
                            requeue: true,
                            multiple: false,
                        },
                    )
                    .await;
                sent.stopped = Some(format!("publishing to {work_queue}: {e}"));
                break 'tiers;
            }
            if let Err(e) = channel.basic_ack(tag, BasicAckOptions::default()).await {
                // Confirmed in the work queue but not acked: the broker gives the tier its
                // copy back, a duplicate that the consumers' guard absorbs.
                sent.moved += 1;
                from_tier += 1;
                sent.stopped = Some(format!("acking on {}: {e}", tier.queue));
                sent.from_tiers.push((tier.queue.clone(), from_tier));
                break 'tiers;
            }
            sent.moved += 1;
            from_tier += 1;
        }
        if from_tier > 0 {
            sent.from_tiers.push((tier.queue.clone(), from_tier));
        }
        if sent.moved >= cap {
            break;
        }
    }
    let _ = tokio::time::timeout(
        Duration::from_secs(5),
        channel.close(200, "parked messages moved".into()),
    )
    .await;
    Ok(sent)
}
