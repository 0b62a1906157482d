//! The outbox drain, bare: woken by the outbox's `NOTIFY` (the table's trigger, on commit),
//! it claims the due rows with the store's own statements (`begin_batch`, `claim`), publishes
//! them all on a confirming lapin channel (mandatory, persistent), awaits the confirms, and
//! deletes the confirmed rows in the claim's transaction. A row not confirmed stays pending
//! for the next batch. No publications rows (a mail's story), no attempt marks.
//!
//! It gathers only when gathering pays: woken within [`RECENT`] of a batch that found rows
//! (the loop is busy, more commits are on their way), it waits `BENCH_REF_GATHER_MS` (5 ms; 0:
//! never) so that one batch takes them together; woken after a quiet spell, it claims at once.

use std::time::{Duration, Instant};

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel};
use serde_json::Value;
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tracing::Instrument;
use worker_store::OutboxRow;
use worker_store::outbox::{CHANNEL, begin_batch, claim};

/// Rows a batch claims at most (the host's `batch_size`).
const BATCH: u32 = 500;

/// How soon after a batch that found rows a wake counts as busy (see the module docs).
const RECENT: Duration = Duration::from_millis(10);

/// The store's `delete_published` without its publications rows (the story's writes).
const DELETE_PUBLISHED: &str = "DELETE FROM outbox WHERE id = ANY($1) AND status = 'pending'";

pub async fn run(pool: PgPool, channel: Channel) {
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirm.select");
    let mut listener = PgListener::connect_with(&pool).await.expect("a listener");
    listener.listen(CHANNEL).await.expect("LISTEN outbox");
    let gather = Duration::from_millis(
        std::env::var("BENCH_REF_GATHER_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(5),
    );
    let mut found_rows: Option<Instant> = None;
    loop {
        // Everything due, a batch at a time, then wait for the next commit's notice (or a
        // second, for a row whose publish was not confirmed).
        loop {
            match batch(&pool, &channel)
                .instrument(tracing::info_span!("outbox.publish", batch = BATCH))
                .await
            {
                Ok(n) => {
                    if n > 0 {
                        found_rows = Some(Instant::now());
                    }
                    if n < BATCH as usize {
                        break;
                    }
                }
                Err(err) => {
                    eprintln!("drain: {err}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    break;
                }
            }
        }
        tokio::select! {
            notice = listener.recv() => {
                if let Err(err) = notice {
                    eprintln!("drain: the listener failed: {err}");
                }
            }
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        if !gather.is_zero() && found_rows.is_some_and(|at| at.elapsed() < RECENT) {
            tokio::time::sleep(gather).await;
        }
        // The notices of commits this batch will take: one batch serves them all.
        while listener.next_buffered().is_some() {}
    }
}

/// One batch: claim, publish, confirm, delete, commit. Returns the rows claimed.
async fn batch(pool: &PgPool, channel: &Channel) -> anyhow::Result<usize> {
    let mut tx = begin_batch(pool).await?;
    let rows = claim(&mut tx, BATCH).await?;
    if rows.is_empty() {
        tx.commit().await?;
        return Ok(0);
    }
    let mut confirms = Vec::with_capacity(rows.len());
    for row in &rows {
        let confirm = channel
            .basic_publish(
                row.exchange.as_str().into(),
                row.routing_key.as_str().into(),
                BasicPublishOptions {
                    mandatory: true,
                    immediate: false,
                },
                &row.body,
                properties(row),
            )
            .await?;
        confirms.push((row.id, confirm));
    }
    let mut published = Vec::with_capacity(rows.len());
    for (id, confirm) in confirms {
        let confirmation = confirm.await?;
        if confirmation.is_ack() && confirmation.take_message().is_none() {
            published.push(id);
        } else {
            eprintln!("drain: outbox row {id} was not confirmed routed");
        }
    }
    sqlx::query(DELETE_PUBLISHED)
        .bind(&published)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(rows.len())
}

/// The row's AMQP properties, as the host's publisher sets them: persistent, its message id,
/// type, content type, correlation id and headers.
fn properties(row: &OutboxRow) -> BasicProperties {
    let mut properties = BasicProperties::default()
        .with_delivery_mode(2)
        .with_message_id(row.message_id.as_str().into())
        .with_headers(headers(&row.headers));
    if let Some(kind) = &row.message_type {
        properties = properties.with_type(kind.as_str().into());
    }
    if let Some(content_type) = &row.content_type {
        properties = properties.with_content_type(content_type.as_str().into());
    }
    if let Some(correlation_id) = &row.correlation_id {
        properties = properties.with_correlation_id(correlation_id.as_str().into());
    }
    properties
}

/// The stored JSON headers as an AMQP table (strings, numbers, booleans), as
/// `worker_broker::headers_from_json` reads them.
fn headers(json: &Value) -> FieldTable {
    let mut table = FieldTable::default();
    let Value::Object(map) = json else {
        return table;
    };
    for (key, value) in map {
        let value = match value {
            Value::String(s) => AMQPValue::LongString(s.as_str().into()),
            Value::Bool(b) => AMQPValue::Boolean(*b),
            Value::Number(n) => match (n.as_i64(), n.as_f64()) {
                (Some(i), _) => AMQPValue::LongLongInt(i),
                (None, Some(f)) => AMQPValue::Double(f),
                (None, None) => AMQPValue::LongString(n.to_string().as_str().into()),
            },
            Value::Null => AMQPValue::Void,
            other => AMQPValue::LongString(other.to_string().as_str().into()),
        };
        table.insert(key.as_str().into(), value);
    }
    table
}
