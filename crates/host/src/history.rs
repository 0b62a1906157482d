//! The history's writer in the host: once a minute, on the minute, this replica's job counts
//! go into the minute rows; then, if this replica takes the `history` lease, it writes the
//! gauges the sampler last read (queues, retry tiers, dead letters, the outbox) and rolls the
//! minutes up into hours and the hours into days (`worker_store::history`).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use worker_store::AdvisoryLease;
use worker_store::history::{self, Gauge, HistoryRow, Resolution, Tally};

use crate::sampler::Readings;

/// The lease the replica that writes the gauges and the rollups holds for a round.
pub const LEASE: &str = "history";

/// What the writer needs.
#[derive(Debug, Clone)]
pub struct Writer {
    pub pool: PgPool,
    pub tally: Tally,
    pub lease: Arc<AdvisoryLease>,
    pub readings: Arc<RwLock<Readings>>,
}

/// Runs a round at the start of every minute until `shutdown`, then flushes what is left.
pub async fn run(writer: Writer, shutdown: CancellationToken) {
    // The first leased round catches up with what an absent writer left: every hour the
    // minutes still hold, every day the hours still hold.
    let mut since_hours = Utc::now() - chrono::Duration::days(2);
    let mut since_days = Utc::now() - chrono::Duration::days(30);
    loop {
        let wait = until_next_minute(Utc::now());
        tokio::select! {
            () = shutdown.cancelled() => {
                flush(&writer, Resolution::Minute.start_of(Utc::now())).await;
                return;
            }
            () = tokio::time::sleep(wait) => {}
        }
        // The minute that just ended.
        let minute = Resolution::Minute.start_of(Utc::now() - chrono::Duration::seconds(30));
        if round(&writer, minute, since_hours, since_days).await == Round::Leased {
            since_hours = minute - chrono::Duration::hours(1);
            since_days = minute - chrono::Duration::days(1);
        }
    }
}

/// What a round did besides flushing this replica's counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Round {
    /// This replica held the lease and wrote the gauges and the rollups.
    Leased,
    /// Another replica holds the lease, or the writes failed (the next round tries again).
    CountsOnly,
}

/// One round for `minute`: this replica's counts, then, under the lease, the gauges and the
/// rollups of the hours since `since_hours` and the days since `since_days`.
pub async fn round(
    writer: &Writer,
    minute: DateTime<Utc>,
    since_hours: DateTime<Utc>,
    since_days: DateTime<Utc>,
) -> Round {
    flush(writer, minute).await;
    if leased_round(writer, minute, since_hours, since_days).await {
        Round::Leased
    } else {
        Round::CountsOnly
    }
}

fn until_next_minute(now: DateTime<Utc>) -> Duration {
    let next = Resolution::Minute.start_of(now) + chrono::Duration::minutes(1);
    // A second past the minute, so that a clock a little behind still lands in the new one.
    (next - now + chrono::Duration::seconds(1))
        .to_std()
        .unwrap_or(Duration::from_secs(1))
}

/// Writes this replica's counts into `minute`; on failure they are kept for the next round.
async fn flush(writer: &Writer, minute: DateTime<Utc>) {
    let counts = writer.tally.drain();
    if let Err(e) = history::flush(&writer.pool, minute, &counts).await {
        tracing::warn!(error = %e, "the history's minute could not be written; its counts go with the next one");
        writer.tally.restore(&counts);
    }
}

/// The gauges and the rollups, if this replica takes the lease; whether it did them all.
async fn leased_round(
    writer: &Writer,
    minute: DateTime<Utc>,
    since_hours: DateTime<Utc>,
    since_days: DateTime<Utc>,
) -> bool {
    let guard = match writer.lease.acquire(LEASE).await {
        Ok(Some(guard)) => guard,
        Ok(None) => return false,
        Err(e) => {
            tracing::debug!(error = %e, "the history's lease could not be asked for");
            return false;
        }
    };
    let readings = writer
        .readings
        .read()
        .map(|r| r.clone())
        .unwrap_or_default();
    let gauges = gauge_rows(&readings, minute);
    let done = async {
        history::write(&writer.pool, Resolution::Minute, &gauges).await?;
        history::roll_up_since(&writer.pool, Resolution::Hour, since_hours).await?;
        history::roll_up_since(&writer.pool, Resolution::Day, since_days).await
    }
    .await;
    guard.release().await;
    match done {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(error = %e, "the history's gauges or rollups could not be written; the next round tries again");
            false
        }
    }
}

fn reading(value: u64) -> Gauge {
    let value = i64::try_from(value).unwrap_or(i64::MAX);
    Gauge {
        sum: value,
        max: value,
    }
}

/// The gauge rows of one minute: one per queue (`ready`, each retry tier as
/// `retry:<delay>`, `dead_letters`) and one for the outbox (`backlog`, `oldest_secs`).
pub fn gauge_rows(readings: &Readings, minute: DateTime<Utc>) -> Vec<HistoryRow> {
    let row = |series: &str, name: &str, gauges: BTreeMap<String, Gauge>| HistoryRow {
        series: series.into(),
        name: name.into(),
        at: minute,
        samples: 1,
        gauges,
        ..HistoryRow::default()
    };
    let mut rows: Vec<HistoryRow> = readings
        .queues
        .iter()
        .map(|queue| {
            let mut gauges = BTreeMap::new();
            if let Some(ready) = queue.ready {
                gauges.insert("ready".to_string(), reading(ready));
            }
            for tier in &queue.tiers {
                if let Some(parked) = tier.parked {
                    let delay = humantime::format_duration(tier.delay);
                    gauges.insert(format!("retry:{delay}"), reading(parked));
                }
            }
            let dead = readings
                .dead_letter_depth
                .get(&queue.queue)
                .copied()
                .unwrap_or_default();
            gauges.insert("dead_letters".to_string(), reading(dead));
            row("queue", &queue.queue, gauges)
        })
        .collect();
    let oldest = readings
        .outbox_oldest_pending
        .map_or(0, |age| age.as_secs());
    rows.push(row(
        "outbox",
        "outbox",
        BTreeMap::from([
            ("backlog".to_string(), reading(readings.outbox_pending)),
            ("oldest_secs".to_string(), reading(oldest)),
        ]),
    ));
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::{QueueReading, TierReading};

    #[test]
    fn each_queue_and_the_outbox_is_a_gauge_row() {
        let mut readings = Readings::default();
        readings.queues.push(QueueReading {
            queue: "email.send".into(),
            ready: Some(12),
            tiers: vec![TierReading {
                queue: "email.send.retry.1".into(),
                delay: Duration::from_secs(30),
                parked: Some(3),
            }],
            dead_queue: "email.send.dead".into(),
            dead_waiting: Some(1),
        });
        readings.dead_letter_depth.insert("email.send".into(), 4);
        readings.outbox_pending = 9;
        readings.outbox_oldest_pending = Some(Duration::from_secs(75));
        let rows = gauge_rows(&readings, Utc::now());
        assert_eq!(rows.len(), 2);
        let queue = &rows[0].gauges;
        assert_eq!(queue["ready"].max, 12);
        assert_eq!(queue["retry:30s"].max, 3);
        assert_eq!(queue["dead_letters"].max, 4);
        assert_eq!(rows[1].gauges["backlog"].sum, 9);
        assert_eq!(rows[1].gauges["oldest_secs"].sum, 75);
    }

    #[test]
    fn a_round_starts_just_past_the_next_minute() {
        let now: DateTime<Utc> = "2026-12-07T10:00:45Z".parse().unwrap();
        assert_eq!(until_next_minute(now), Duration::from_secs(16));
    }
}
