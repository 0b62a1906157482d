//! What the email-send tests share: queueing a row, reading it back, a sender on a private
//! SMTP sink.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;
use worker_core::WorkContext;
use worker_messages::EmailSendCommand;
use worker_testkit::SmtpSink;

use job_email_send::{EmailSender, JOB_NAME, SmtpConfig, SmtpSecurity};

pub fn ctx() -> WorkContext {
    WorkContext::new(JOB_NAME, CancellationToken::new())
}

pub fn command(id: Uuid) -> EmailSendCommand {
    EmailSendCommand {
        email_message_id: id,
    }
}

/// SMTP settings for a private sink, with `pool_size` connections.
pub fn smtp_for(sink: &SmtpSink, pool_size: u32) -> SmtpConfig {
    SmtpConfig {
        host: "127.0.0.1".into(),
        port: sink.port,
        security: SmtpSecurity::Plain,
        pool_size,
        connect_timeout: Duration::from_secs(5),
        ..SmtpConfig::default()
    }
}

/// A sender on `sink` with `pool_size` connections and every send bounded by `send_timeout`.
pub fn sender_for(
    pool: &PgPool,
    sink: &SmtpSink,
    pool_size: u32,
    send_timeout: Duration,
) -> EmailSender {
    EmailSender::new(
        pool.clone(),
        &smtp_for(sink, pool_size),
        "Worker Host <worker-host@localhost>",
        send_timeout,
    )
    .unwrap()
}

/// Queues a mail to `to`, as the action executor would; returns its id.
pub async fn queue(pool: &PgPool, to: &str, subject: &str) -> Uuid {
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO outbound_emails (id, message_id, to_addresses, subject, text_body) \
         VALUES ($1, $2, $3, $4, 'pong')",
    )
    .bind(id)
    .bind(format!("{id}@worker-host"))
    .bind(vec![to.to_string()])
    .bind(subject)
    .execute(pool)
    .await
    .unwrap();
    id
}

/// (status, attempts, last_error, smtp_response) of a row.
pub async fn row(pool: &PgPool, id: Uuid) -> (String, i32, Option<String>, Option<String>) {
    sqlx::query_as(
        "SELECT status, attempts, last_error, smtp_response FROM outbound_emails WHERE id = $1",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap()
}
