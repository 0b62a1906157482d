//! Emptying a dead queue into the archive now, on a connection of the caller's: what an
//! erasure of one person's data does first (`worker-host privacy erase`), so that a dead letter
//! still in the broker is erased with the rest. Each message is archived by the archiver's own
//! step ([`Archiver::archive_batch`], idempotent) before it is acked.

use worker_broker::Session;
use worker_core::Failure;

use crate::{Archiver, DeadQueue, RawMessage};

/// Archives every message ready in each of `queues`, one at a time; returns how many. A message
/// a running archiver holds unacked is that archiver's to archive (within its insert timeout).
pub async fn drain(
    archiver: &Archiver,
    session: &Session,
    queues: &[DeadQueue],
) -> Result<u64, Failure> {
    let mut archived = 0;
    for dead in queues {
        archived += session
            .drain(&dead.dead_queue, |delivery| async move {
                archiver
                    .archive_batch(dead, &[RawMessage::from(&delivery)])
                    .await
                    .map(|_| ())
            })
            .await?;
    }
    Ok(archived)
}
