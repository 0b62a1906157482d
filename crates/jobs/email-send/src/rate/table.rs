//! The statements on `smtp_send_rate`: a send's turn, taken in one short transaction whose
//! first statement locks the account's row, so that replicas taking turns at once are served
//! one after the other, each reading what the one before it wrote.

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use worker_core::Failure;
use worker_store::classify;

use super::windows::{Bucket, Limits, Turn, Windows};

/// The row as read.
#[derive(sqlx::FromRow)]
struct Row {
    minute_sends: Vec<DateTime<Utc>>,
    bucket_starts: Vec<DateTime<Utc>>,
    bucket_messages: Vec<i32>,
    bucket_recipients: Vec<i32>,
    /// The database's clock, read after the lock: every replica counts by the same clock.
    now: DateTime<Utc>,
}

impl Row {
    fn windows(&self) -> Windows {
        let buckets = self
            .bucket_starts
            .iter()
            .zip(&self.bucket_messages)
            .zip(&self.bucket_recipients)
            .map(|((start, messages), recipients)| Bucket {
                start: *start,
                messages: u32::try_from(*messages).unwrap_or(0),
                recipients: u32::try_from(*recipients).unwrap_or(0),
            })
            .collect();
        Windows {
            minute: self.minute_sends.clone(),
            buckets,
        }
    }
}

/// The account's turn for a mail to `recipients`: counted in its windows when it may go now.
/// The windows as they are after it, and the database's time.
pub(crate) async fn take(
    pool: &PgPool,
    account: &str,
    limits: &Limits,
    recipients: u32,
) -> Result<(Turn, Windows, DateTime<Utc>), Failure> {
    let mut tx = pool.begin().await.map_err(classify)?;
    // The upsert locks the row (made on the account's first send) until the commit.
    let row: Row = sqlx::query_as(
        "INSERT INTO smtp_send_rate AS r (account) VALUES ($1) \
         ON CONFLICT (account) DO UPDATE SET account = r.account \
         RETURNING r.minute_sends, r.bucket_starts, r.bucket_messages, r.bucket_recipients, \
                   clock_timestamp() AS now",
    )
    .bind(account)
    .fetch_one(&mut *tx)
    .await
    .map_err(classify)?;
    let now = row.now;
    let mut windows = row.windows();
    windows.forget(now);
    let turn = windows.turn(limits, recipients, now);
    if turn == Turn::Now {
        windows.take(recipients, now, limits);
    }
    let starts: Vec<DateTime<Utc>> = windows.buckets.iter().map(|b| b.start).collect();
    let messages: Vec<i32> = windows.buckets.iter().map(|b| int(b.messages)).collect();
    let recipients: Vec<i32> = windows.buckets.iter().map(|b| int(b.recipients)).collect();
    sqlx::query(
        "UPDATE smtp_send_rate SET minute_sends = $2, bucket_starts = $3, \
             bucket_messages = $4, bucket_recipients = $5, updated_at = $6 \
         WHERE account = $1",
    )
    .bind(account)
    .bind(&windows.minute)
    .bind(&starts)
    .bind(&messages)
    .bind(&recipients)
    .bind(now)
    .execute(&mut *tx)
    .await
    .map_err(classify)?;
    tx.commit().await.map_err(classify)?;
    Ok((turn, windows, now))
}

/// The account's windows as they are, and the database's time (no lock: for a look).
pub(crate) async fn read(
    pool: &PgPool,
    account: &str,
) -> Result<(Windows, DateTime<Utc>), Failure> {
    let row: Option<Row> = sqlx::query_as(
        "SELECT minute_sends, bucket_starts, bucket_messages, bucket_recipients, \
                clock_timestamp() AS now \
         FROM smtp_send_rate WHERE account = $1",
    )
    .bind(account)
    .fetch_optional(pool)
    .await
    .map_err(classify)?;
    Ok(match row {
        Some(row) => (row.windows(), row.now),
        None => (Windows::default(), Utc::now()),
    })
}

fn int(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}
