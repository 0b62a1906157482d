//! [`AttemptLogWriter`], the task that writes the attempt log in batches, and counts what it
//! could not write.

use std::fmt;
use std::sync::Weak;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::record::AttemptRecord;
use super::settings::AttemptLogSettings;
use super::store::insert_batch;

/// The task that writes the attempt log in batches; from [`AttemptLog::new`](super::AttemptLog::new).
pub struct AttemptLogWriter {
    pool: PgPool,
    receiver: Option<mpsc::Receiver<AttemptRecord>>,
    batch_size: usize,
    flush_interval: Duration,
    dropped: Weak<AtomicU64>,
}

impl fmt::Debug for AttemptLogWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttemptLogWriter")
            .field("batch_size", &self.batch_size)
            .field("flush_interval", &self.flush_interval)
            .finish_non_exhaustive()
    }
}

impl AttemptLogWriter {
    /// The writer of `receiver`'s records (none when the log is disabled); `dropped` is the
    /// handles' count of records lost.
    pub(super) fn new(
        pool: PgPool,
        receiver: Option<mpsc::Receiver<AttemptRecord>>,
        settings: &AttemptLogSettings,
        dropped: Weak<AtomicU64>,
    ) -> Self {
        Self {
            pool,
            receiver,
            batch_size: settings.batch_size.max(1),
            flush_interval: settings.flush_interval.max(Duration::from_millis(1)),
            dropped,
        }
    }

    /// Writes batches until `shutdown` fires or every [`AttemptLog`](super::AttemptLog) handle is dropped, then
    /// writes what is left in the channel and returns.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let Some(mut receiver) = self.receiver.take() else {
            return;
        };
        let mut batch: Vec<AttemptRecord> = Vec::with_capacity(self.batch_size);
        let mut reported_drops = 0;
        loop {
            let deadline = tokio::time::sleep(self.flush_interval);
            tokio::pin!(deadline);
            // Collect until the batch is full, the interval passes, or we must stop.
            let stop = loop {
                let room = self.batch_size.saturating_sub(batch.len()).max(1);
                tokio::select! {
                    biased;
                    () = shutdown.cancelled() => break true,
                    received = receiver.recv_many(&mut batch, room) => {
                        if received == 0 {
                            break true;
                        }
                        if batch.len() >= self.batch_size {
                            break false;
                        }
                    }
                    () = &mut deadline => break false,
                }
            };
            if stop {
                receiver.close();
                while let Some(record) = receiver.recv().await {
                    batch.push(record);
                    if batch.len() >= self.batch_size {
                        self.write(&mut batch).await;
                    }
                }
                self.write(&mut batch).await;
                self.report_drops(&mut reported_drops);
                return;
            }
            self.write(&mut batch).await;
            self.report_drops(&mut reported_drops);
        }
    }

    async fn write(&self, batch: &mut Vec<AttemptRecord>) {
        if batch.is_empty() {
            return;
        }
        let mut result = insert_batch(&self.pool, batch).await;
        if let Err(failure) = &result
            && failure.class().is_retryable()
        {
            tokio::time::sleep(self.flush_interval).await;
            result = insert_batch(&self.pool, batch).await;
        }
        if let Err(failure) = result {
            tracing::warn!(
                records = batch.len(),
                error = %failure,
                "could not write attempt-log records; dropping them"
            );
            if let Some(dropped) = self.dropped.upgrade() {
                dropped.fetch_add(batch.len() as u64, Ordering::Relaxed);
            }
        }
        batch.clear();
    }

    fn report_drops(&self, reported: &mut u64) {
        let Some(dropped) = self.dropped.upgrade() else {
            return;
        };
        let dropped = dropped.load(Ordering::Relaxed);
        if dropped > *reported {
            tracing::warn!(
                dropped = dropped - *reported,
                total_dropped = dropped,
                "attempt-log records dropped: the writer is behind (channel full) or the database refused them"
            );
            *reported = dropped;
        }
    }
}
