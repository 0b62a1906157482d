//! The ack book: delivered tags and how each was settled, turned into as few acks as
//! possible, since one ack per message costs most of a bare consumer's CPU.

use std::collections::BTreeMap;

use lapin::Channel;
use lapin::options::{BasicAckOptions, BasicNackOptions};

/// How a handler asks for its delivery to be settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// Done with: the broker forgets it.
    Ack,
    /// Back to the queue (nack, requeue), counted against a quorum queue's delivery limit.
    Requeue,
}

/// Delivered tags and how each was settled, in tag order; turns completions into as few
/// acks as possible.
pub(super) struct AckBook {
    entries: BTreeMap<u64, Option<Settle>>,
    /// Completed entries to gather before flushing without waiting for the timer.
    batch: usize,
    completed: usize,
}

impl AckBook {
    pub(super) fn new(batch: usize) -> Self {
        Self {
            entries: BTreeMap::new(),
            batch,
            completed: 0,
        }
    }

    pub(super) fn delivered(&mut self, tag: u64) {
        self.entries.insert(tag, None);
    }

    pub(super) fn complete(&mut self, tag: u64, settle: Settle) {
        if let Some(slot) = self.entries.get_mut(&tag)
            && slot.is_none()
        {
            *slot = Some(settle);
            self.completed += 1;
        }
    }

    pub(super) fn pending(&self) -> usize {
        self.entries.len() - self.completed
    }

    pub(super) fn has_completed(&self) -> bool {
        self.completed > 0
    }

    /// Enough completed to be worth a flush now.
    pub(super) fn ready(&self) -> bool {
        self.completed >= self.batch
    }

    /// Nothing is in flight: flush at once rather than keep the last few waiting.
    pub(super) fn idle(&self) -> bool {
        self.completed > 0 && self.pending() == 0
    }

    /// Acks the contiguous completed prefix with one `multiple` ack (nacking requeued ones
    /// on the way); with `stragglers`, also settles completed entries behind a pending one,
    /// one by one, so that a slow handler never holds the others' prefetch slots.
    pub(super) async fn flush(
        &mut self,
        channel: &Channel,
        stragglers: bool,
    ) -> Result<(), String> {
        let mut ack_upto: Option<u64> = None;
        while let Some(entry) = self.entries.first_entry() {
            let Some(settle) = entry.get() else { break };
            let tag = *entry.key();
            match settle {
                Settle::Ack => ack_upto = Some(tag),
                Settle::Requeue => {
                    if let Some(upto) = ack_upto.take() {
                        ack(channel, upto, true).await?;
                    }
                    nack(channel, tag).await?;
                }
            }
            entry.remove();
            self.completed -= 1;
        }
        if let Some(upto) = ack_upto {
            ack(channel, upto, true).await?;
        }
        if stragglers && self.completed > 0 {
            let done: Vec<u64> = self
                .entries
                .iter()
                .filter(|(_, s)| s.is_some())
                .map(|(t, _)| *t)
                .collect();
            for tag in done {
                if let Some(Some(settle)) = self.entries.remove(&tag) {
                    self.completed -= 1;
                    match settle {
                        Settle::Ack => ack(channel, tag, false).await?,
                        Settle::Requeue => nack(channel, tag).await?,
                    }
                }
            }
        }
        Ok(())
    }
}

async fn ack(channel: &Channel, tag: u64, multiple: bool) -> Result<(), String> {
    channel
        .basic_ack(tag, BasicAckOptions { multiple })
        .await
        .map_err(|e| format!("ack failed: {}", worker_core::error_chain(&e)))
}

pub(super) async fn nack(channel: &Channel, tag: u64) -> Result<(), String> {
    channel
        .basic_nack(
            tag,
            BasicNackOptions {
                multiple: false,
                requeue: true,
            },
        )
        .await
        .map_err(|e| format!("nack failed: {}", worker_core::error_chain(&e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn acks_coalesce_into_one_multiple_for_a_contiguous_prefix() {
        // Pure bookkeeping part: which tags a flush would settle, without a channel.
        let mut book = AckBook::new(4);
        for t in 1..=6 {
            book.delivered(t);
        }
        for t in [2, 1, 3, 5] {
            book.complete(t, Settle::Ack);
        }
        assert_eq!(book.pending(), 2);
        assert!(book.ready());
        // Prefix 1..=3 is contiguous; 5 waits behind 4.
        let prefix: Vec<u64> = book
            .entries
            .iter()
            .take_while(|(_, s)| s.is_some())
            .map(|(t, _)| *t)
            .collect();
        assert_eq!(prefix, [1, 2, 3]);
    }
}
