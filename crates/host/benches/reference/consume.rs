//! A bare lapin consumer per queue: manual acks, at most [`CONCURRENCY`] handlers at once,
//! each delivery handed to the job's own single-step entry (`worker_core::execute_once`)
//! after the same checks the host's runner makes first (a type the job skips, a schema
//! version newer than it reads). Acked once the handler returned: its effect and its outbox
//! rows are committed by then (publish-then-ack).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions, BasicRejectOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use worker_core::{ConsumerJob, ExecuteError, FailureClass, WorkContext, execute_once};

use super::{CONCURRENCY, PREFETCH};

/// Failed handlings, for the log: the bench's mails should have none.
static FAILED: AtomicU64 = AtomicU64::new(0);

/// Consumes `queue` with `job` until the process ends.
pub async fn run<J: ConsumerJob>(channel: lapin::Channel, queue: &'static str, job: J) {
    let job = Arc::new(job);
    channel
        .basic_qos(PREFETCH, BasicQosOptions::default())
        .await
        .expect("basic.qos");
    let mut deliveries = channel
        .basic_consume(
            queue.into(),
            format!("reference-{queue}").as_str().into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("basic.consume");
    let permits = Arc::new(tokio::sync::Semaphore::new(CONCURRENCY));
    while let Some(delivery) = deliveries.next().await {
        let delivery = match delivery {
            Ok(delivery) => delivery,
            Err(err) => {
                eprintln!("{queue}: the consumer failed: {err}");
                return;
            }
        };
        let Ok(permit) = Arc::clone(&permits).acquire_owned().await else {
            return;
        };
        let job = Arc::clone(&job);
        // Inert without a subscriber; named as the host's so that the counted run's
        // statements are charged to the same hop.
        let span = tracing::info_span!("consume", messaging.destination.name = %queue);
        tokio::spawn(
            async move {
                let _permit = permit;
                settle(&*job, queue, delivery).await;
            }
            .instrument(span),
        );
    }
}

async fn settle<J: ConsumerJob>(job: &J, queue: &str, delivery: lapin::message::Delivery) {
    let properties = &delivery.properties;
    let kind = properties
        .kind()
        .as_ref()
        .map(|k| k.as_str().to_string())
        .unwrap_or_else(|| delivery.routing_key.as_str().to_string());
    if job.skips(&kind).is_some() {
        let _ = delivery.acker.ack(BasicAckOptions::default()).await;
        return;
    }
    let version = schema_version(properties.headers().as_ref());
    let mut ctx = WorkContext::new(job.name(), CancellationToken::new());
    if let Some(id) = properties.message_id() {
        ctx = ctx.with_message_id(id.as_str());
    }
    let outcome = match worker_core::refuse_newer(&kind, version, job.reads_version(&kind)) {
        Ok(()) => execute_once(job, &ctx, &delivery.data).await,
        Err(failure) => Err(ExecuteError::Failed(failure)),
    };
    match outcome {
        Ok(_) => {
            let _ = delivery.acker.ack(BasicAckOptions::default()).await;
        }
        Err(err) => {
            let failed = FAILED.fetch_add(1, Ordering::Relaxed) + 1;
            eprintln!("{queue}: a delivery failed ({failed} so far): {err}");
            match err.class() {
                // Tried again through the queue after a pause: the reference has no retry
                // tiers, and none of the bench's mails should come here.
                FailureClass::Transient | FailureClass::Throttled | FailureClass::Unavailable => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    let _ = delivery
                        .acker
                        .nack(BasicNackOptions {
                            multiple: false,
                            requeue: true,
                        })
                        .await;
                }
                _ => {
                    let _ = delivery
                        .acker
                        .reject(BasicRejectOptions { requeue: false })
                        .await;
                }
            }
        }
    }
}

/// The `x-schema-version` header, 1 without one (as the host reads it).
fn schema_version(headers: Option<&FieldTable>) -> u32 {
    let Some(value) = headers.and_then(|h| h.inner().get(worker_messages::SCHEMA_VERSION_HEADER))
    else {
        return 1;
    };
    let number = match value {
        AMQPValue::LongLongInt(n) => *n,
        AMQPValue::LongInt(n) => i64::from(*n),
        AMQPValue::ShortInt(n) => i64::from(*n),
        AMQPValue::LongUInt(n) => i64::from(*n),
        AMQPValue::ShortShortInt(n) => i64::from(*n),
        _ => 1,
    };
    u32::try_from(number).unwrap_or(u32::MAX)
}
