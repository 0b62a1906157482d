//! Edit and retry, as its tests reach it: a mail refused with 550 and dead-lettered, its id,
//! an edit posted to the JSON API with an operator's token, and the sink's deliveries waited
//! for.

use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::Value;

use super::console::{World, http};
use super::short_id;

/// A refused mail: its dead letter and the outbound mail its command names.
pub struct FailedMail {
    pub dead_letter: i64,
    pub mail: String,
}

/// One ping from the refused address; its reply refused with 550 and dead-lettered.
pub async fn failed_mail(world: &World) -> anyhow::Result<FailedMail> {
    let dead_letter = *world
        .dead_letters(1)
        .await?
        .first()
        .context("a dead letter")?;
    let mail: String = sqlx::query_scalar(
        "SELECT id::text FROM outbound_emails WHERE status = 'failed' ORDER BY created_at LIMIT 1",
    )
    .fetch_one(&world.db.pool)
    .await?;
    Ok(FailedMail { dead_letter, mail })
}

/// A fresh address the sink accepts: `ok-<id>@localhost`.
pub fn fresh_address() -> String {
    format!("ok-{}@localhost", short_id())
}

/// An operator account `name` with an API token; the token.
pub fn operator_token(world: &World, name: &str) -> anyhow::Result<String> {
    world.add_account(name, "operator", "a-long-enough-password")?;
    world.add_token(name)
}

/// Posts the edit of `mail` with one-time key `key` and recipient `to` (the rest as it was)
/// to `/api/outbound/{mail}/edited` with `token`; the status and the JSON answer.
pub async fn api_edit(
    world: &World,
    token: &str,
    mail: &str,
    key: &str,
    to: &str,
) -> anyhow::Result<(u16, Value)> {
    let answer = http()
        .post(world.host.url(&format!("/api/outbound/{mail}/edited")))
        .bearer_auth(token)
        .form(&[
            ("edit_key", key),
            ("to", to),
            ("subject", "Re: ping 0"),
            ("text", "pong: the worker host got your mail \"ping 0\"."),
        ])
        .send()
        .await?;
    let status = answer.status().as_u16();
    let text = answer.text().await?;
    let body = serde_json::from_str(&text).with_context(|| format!("{status}: {text}"))?;
    Ok((status, body))
}

/// Waits until the sink delivered `count` mails to `address`'s local part (at most a
/// minute); the count then.
pub async fn wait_delivered(world: &World, address: &str, count: usize) -> usize {
    let local = address.split('@').next().unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(60);
    while world.sink.delivered(local).len() < count && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    world.sink.delivered(local).len()
}

/// The mails the sink delivered to `address`.
pub fn delivered(world: &World, address: &str) -> usize {
    world
        .sink
        .delivered(address.split('@').next().unwrap_or_default())
        .len()
}

/// Waits until the outbox has published everything (no pending row): what was committed has
/// reached the broker.
pub async fn outbox_drained(world: &World) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let pending: i64 =
            sqlx::query_scalar("SELECT count(*) FROM outbox WHERE status = 'pending'")
                .fetch_one(&world.db.pool)
                .await?;
        if pending == 0 || Instant::now() > deadline {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
