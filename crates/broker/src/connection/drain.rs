//! Emptying a queue now, one message at a time (`basic.get`), each acked only once the
//! caller's `keep` stored it: for a command that must take what waits in a queue before it
//! goes on (the dead queues, before one person's data is erased).

use std::future::Future;

use lapin::options::{BasicAckOptions, BasicGetOptions};
use lapin::types::ShortString;
use worker_core::Failure;

use super::Session;
use crate::message::Delivery;

fn broker(queue: &str) -> impl Fn(lapin::Error) -> Failure + '_ {
    move |e| Failure::transient(format!("reading queue {queue}: {e}"))
}

impl Session {
    /// Takes every message ready in `queue`, hands each to `keep`, and acks it once `keep`
    /// succeeded; returns how many. A failed `keep` stops the drain with that message unacked
    /// (the broker keeps it). Messages another consumer holds unacked are not seen.
    pub async fn drain<F, Fut>(&self, queue: &str, mut keep: F) -> Result<u64, Failure>
    where
        F: FnMut(Delivery) -> Fut,
        Fut: Future<Output = Result<(), Failure>>,
    {
        let name = ShortString::try_new(queue)
            .map_err(|_| Failure::permanent("queue-name", format!("`{queue}` is no queue name")))?;
        let channel = self
            .connection()
            .create_channel()
            .await
            .map_err(broker(queue))?;
        let mut kept = 0;
        while let Some(got) = channel
            .basic_get(name.clone(), BasicGetOptions { no_ack: false })
            .await
            .map_err(broker(queue))?
        {
            let tag = got.delivery.delivery_tag;
            keep(Delivery::from(got.delivery)).await?;
            channel
                .basic_ack(tag, BasicAckOptions::default())
                .await
                .map_err(broker(queue))?;
            kept += 1;
        }
        let _ = channel.close(200, "queue drained".into()).await;
        Ok(kept)
    }
}
