//! One batch: what a claimed batch is after its publish, the publish itself, and the deletes
//! and marks written for it (see the crate docs, "One tick").

use sqlx::PgConnection;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use worker_broker::Outgoing;
use worker_core::Failure;
use worker_store::outbox::{self, PublishFailure};

use crate::publish::{self, Verdict};
use crate::{JOB_NAME, OutboxDrain};

/// What one batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchReport {
    /// Claims that found rows: one per batch, each its own transaction.
    pub batches: u64,
    pub claimed: u64,
    pub published: u64,
    /// Failed this time, pending again after their backoff.
    pub retrying: u64,
    /// Failed for the last time: now `failed`.
    pub failed: u64,
    /// Not tried to the end (broker away, tick cancelled): left pending as they were.
    pub untouched: u64,
    /// The drain stopped on its tick budget while full batches kept coming: more is due.
    pub more_due: bool,
}

impl BatchReport {
    pub(crate) fn add(&mut self, other: &Self) {
        self.more_due |= other.more_due;
        self.batches += other.batches;
        self.claimed += other.claimed;
        self.published += other.published;
        self.retrying += other.retrying;
        self.failed += other.failed;
        self.untouched += other.untouched;
    }
}

/// A claimed batch after its publish, before its deletes and marks: see [`OutboxDrain::publish_batch`].
#[derive(Debug)]
pub struct PublishedBatch {
    pub(crate) rows: Vec<(i64, i32, String)>,
    pub(crate) verdicts: Vec<Verdict>,
}

impl PublishedBatch {
    /// Rows claimed.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The row ids that were confirmed.
    pub fn published_ids(&self) -> Vec<i64> {
        self.rows
            .iter()
            .zip(&self.verdicts)
            .filter(|(_, v)| v.is_published())
            .map(|((id, _, _), _)| *id)
            .collect()
    }
}

impl OutboxDrain {
    /// Claims a batch inside `tx` and publishes it; nothing is deleted or marked yet. The first half
    /// of [`drain_batch`](Self::drain_batch), public so that a test can "crash" between the
    /// publish and the commit by dropping `tx`.
    pub async fn publish_batch(
        &self,
        tx: &mut PgConnection,
        cancel: &CancellationToken,
    ) -> Result<PublishedBatch, Failure> {
        let claimed = outbox::claim(tx, self.settings.batch_size).await?;
        if claimed.is_empty() {
            return Ok(PublishedBatch {
                rows: Vec::new(),
                verdicts: Vec::new(),
            });
        }
        let mut rows = Vec::with_capacity(claimed.len());
        let mut messages: Vec<Outgoing> = Vec::with_capacity(claimed.len());
        let mut spans = Vec::with_capacity(claimed.len());
        for row in claimed {
            rows.push((row.id, row.attempts, row.message_id.clone()));
            let id = row.id;
            let mut message = publish::to_outgoing(row);
            // Each row's publish is a span of its own, in the trace of the work that wrote
            // the row; the message carries it to the consumers.
            spans.push(publish::publish_span(id, &mut message));
            messages.push(message);
        }
        let span = tracing::debug_span!("outbox publish", rows = rows.len());
        let verdicts = publish::publish_rows(&self.publisher, &messages, cancel)
            .instrument(span)
            .await;
        for (span, verdict) in spans.iter().zip(&verdicts) {
            publish::record_verdict(span, verdict);
        }
        Ok(PublishedBatch { rows, verdicts })
    }

    /// Writes what a published batch did inside `tx`: the confirmed rows deleted (their
    /// publications recorded), an attempt (or `failed`) for the others, nothing for the
    /// untouched ones.
    pub async fn settle(
        &self,
        tx: &mut PgConnection,
        batch: &PublishedBatch,
    ) -> Result<BatchReport, Failure> {
        let mut published = Vec::new();
        let mut failures = Vec::new();
        let mut untouched = 0;
        for ((id, attempts, message_id), verdict) in batch.rows.iter().zip(&batch.verdicts) {
            match verdict {
                Verdict::Published => published.push(*id),
                Verdict::Failed(err) => {
                    let attempts = u32::try_from(*attempts).unwrap_or(0).saturating_add(1);
                    let retry_in = self.settings.retry_in(attempts);
                    tracing::warn!(
                        job = JOB_NAME,
                        row = id,
                        message_id = %message_id,
                        attempts,
                        max_attempts = self.settings.max_attempts,
                        error = %err,
                        "outbox row not published"
                    );
                    failures.push(PublishFailure {
                        id: *id,
                        error: err.to_string(),
                        retry_in,
                    });
                }
                Verdict::Untouched(_) => untouched += 1,
            }
        }
        let deleted = outbox::delete_published(tx, &published).await?;
        let counts = outbox::record_failures(tx, &failures, self.settings.max_attempts).await?;
        if counts.failed > 0 {
            tracing::error!(
                job = JOB_NAME,
                rows = counts.failed,
                "outbox rows gave up after their last attempt; see `worker-host outbox status`"
            );
        }
        Ok(BatchReport {
            batches: 1,
            claimed: batch.rows.len() as u64,
            published: deleted,
            retrying: counts.retrying,
            failed: counts.failed,
            untouched,
            more_due: false,
        })
    }
}
