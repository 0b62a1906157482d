//! Emptying a dead queue into the archive now, on a connection of the caller's: what an
//! erasure of one person's data does first (`worker-host privacy erase`), so that a dead letter
//! still in the broker is erased with the rest. Each message is archived by the archiver's own
//! step ([`Archiver::archive_batch`], idempotent) before it is acked.

use lapin::options::{BasicAckOptions, BasicGetOptions};
use lapin::types::ShortString;
use worker_broker::{Delivery, Session};
use worker_core::Failure;

use crate::{Archiver, DeadQueue, RawMessage};

fn broker(e: lapin::Error) -> Failure {
    Failure::transient(format!("reading a dead queue: {e}"))
}

/// Archives every message ready in each of `queues`, one at a time; returns how many. A message
/// a running archiver holds unacked is that archiver's to archive (within its insert timeout).
pub async fn drain(
    archiver: &Archiver,
    session: &Session,
    queues: &[DeadQueue],
) -> Result<u64, Failure> {
    let channel = session
        .connection()
        .create_channel()
        .await
        .map_err(broker)?;
    let mut archived = 0;
    for dead in queues {
        let Ok(queue) = ShortString::try_new(dead.dead_queue.as_str()) else {
            continue;
        };
        while let Some(got) = channel
            .basic_get(queue.clone(), BasicGetOptions { no_ack: false })
            .await
            .map_err(broker)?
        {
            let tag = got.delivery.delivery_tag;
            let delivery = Delivery::from(got.delivery);
            archiver
                .archive_batch(dead, &[RawMessage::from(&delivery)])
                .await?;
            channel
                .basic_ack(tag, BasicAckOptions::default())
                .await
                .map_err(broker)?;
            archived += 1;
        }
    }
    let _ = channel.close(200, "dead queues drained".into()).await;
    Ok(archived)
}
