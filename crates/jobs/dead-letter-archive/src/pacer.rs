//! A replay's pace: at most so many messages a second, stopped as soon as its run is.

use std::time::Duration;

use tokio::time::Instant;
use worker_broker::{Outgoing, PublishError, Publisher};

use crate::bulk::Control;

/// Sends at most `rate` messages per second, in slices of a tenth of a second's worth, and
/// gives up a wait as soon as the run is stopped.
pub(crate) struct Pacer {
    rate: Option<u32>,
    /// The most messages a slice holds.
    slice_max: u32,
    start: Instant,
    sent: u64,
    stop: Control,
}

impl Pacer {
    /// A pacer of `rate`, whose slices hold at most `slice_max` messages.
    pub(crate) fn new(rate: Option<u32>, slice_max: u32, stop: Control) -> Self {
        Self {
            rate,
            slice_max,
            start: Instant::now(),
            sent: 0,
            stop,
        }
    }

    /// Each message's result, or `None` when the run was stopped before any was sent.
    /// Stopped between slices, the slices not sent are failed with why.
    pub(crate) async fn publish(
        &mut self,
        publisher: &Publisher,
        messages: &[Outgoing],
    ) -> Option<Vec<Result<(), PublishError>>> {
        let Some(rate) = self.rate else {
            return Some(publisher.publish_many(messages).await);
        };
        let slice = usize::try_from((rate / 10).clamp(1, self.slice_max.max(1))).unwrap_or(1);
        let mut results = Vec::with_capacity(messages.len());
        for chunk in messages.chunks(slice) {
            let due = self.start + Duration::from_secs_f64(self.sent as f64 / f64::from(rate));
            tokio::select! {
                () = tokio::time::sleep_until(due) => {}
                () = self.stop.stopped() => {
                    if results.is_empty() {
                        return None;
                    }
                    // The part sent so far is kept; the rest is left dead for the next run.
                    return Some(results);
                }
            }
            results.extend(publisher.publish_many(chunk).await);
            self.sent += chunk.len() as u64;
        }
        Some(results)
    }
}
