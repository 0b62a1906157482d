//! Messages the harness puts straight into the scenario's queues, besides the pings: direct
//! `email.send` and `automation.action` commands (the workload's small share of commands that
//! do not come from a mail), and anything a poison scenario publishes (malformed messages, a
//! command carrying a fault-injection header, a throttled webhook's command).
//!
//! They are published through the management API's `POST /api/exchanges/<vhost>/<exchange>/
//! publish`, not over AMQP: the harness holds no AMQP connection on the scenario's vhost, so a
//! scenario that closes every connection of the vhost (`amqp-close`) closes only the host's.
//! A command names a row the host reads, so each is preceded by its row, written as the
//! host's own tests write it: an `outbound_emails` row for `email.send`, an
//! `action_executions` row (of a disabled automation of the harness's own) for
//! `automation.action`. The bodies are `worker-messages`' types, routed as the host routes
//! them (the commands exchange, the queue's name as the routing key).

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;
use worker_messages::{
    AUTOMATION_ACTION, ActionCommand, DomainEvent, EMAIL_SEND, EmailSendCommand,
    action_execution_id, outbound_email_id,
};
use worker_testkit::TestVhost;

use crate::mail::Mailboxes;

/// The host's exchanges (`[broker.topology]`, not set by the scenarios' settings).
pub const EVENTS_EXCHANGE: &str = "events";
pub const COMMANDS_EXCHANGE: &str = "commands";

/// One direct command of each kind for this many pings.
pub const PINGS_PER_DIRECT: u64 = 10;

/// Publishes into one vhost through the management API. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ApiPublisher {
    client: reqwest::Client,
    base: String,
    user: String,
    password: String,
    vhost: String,
}

impl ApiPublisher {
    /// A publisher into `vhost` through the management API at `api`
    /// (`http://user:password@host:port`: the vhost's own broker, private or shared).
    pub fn new(api: &str, vhost: &str) -> anyhow::Result<Self> {
        let url = reqwest::Url::parse(api).with_context(|| format!("parsing {api}"))?;
        let user = match url.username() {
            "" => "guest".to_string(),
            user => user.to_string(),
        };
        let password = url.password().unwrap_or("guest").to_string();
        let host = url.host_str().unwrap_or("127.0.0.1");
        let port = url.port().map(|p| format!(":{p}")).unwrap_or_default();
        Ok(Self {
            client: reqwest::Client::new(),
            base: format!("{}://{host}{port}", url.scheme()),
            user,
            password,
            vhost: vhost.to_string(),
        })
    }

    /// Publishes `payload` (any bytes: base64 on the wire when not UTF-8) with `properties`
    /// (the management API's JSON form: `content_type`, `message_id`, `headers`, …) and
    /// fails unless the broker routed it to a queue.
    pub async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        properties: Value,
        payload: &[u8],
    ) -> anyhow::Result<()> {
        let (payload, encoding) = match std::str::from_utf8(payload) {
            Ok(text) => (text.to_string(), "string"),
            Err(_) => (base64(payload), "base64"),
        };
        let url = format!(
            "{}/api/exchanges/{}/{exchange}/publish",
            self.base, self.vhost
        );
        let body = json!({
            "properties": properties,
            "routing_key": routing_key,
            "payload": payload,
            "payload_encoding": encoding,
        });
        let mut last = None;
        for _ in 0..3 {
            let answer = self
                .client
                .post(&url)
                .basic_auth(&self.user, Some(&self.password))
                .timeout(Duration::from_secs(30))
                .json(&body)
                .send()
                .await;
            match answer {
                Ok(response) if response.status().is_success() => {
                    let answer: Value = response.json().await?;
                    if answer["routed"] != json!(true) {
                        bail!("{exchange}/{routing_key}: not routed to any queue");
                    }
                    return Ok(());
                }
                Ok(response) => {
                    let status = response.status();
                    let text = response.text().await.unwrap_or_default();
                    bail!("{url}: HTTP {status}: {text}");
                }
                // A refused or broken HTTP connection published nothing: try again.
                Err(err) if err.is_connect() => last = Some(err),
                Err(err) => return Err(err).with_context(|| format!("publishing to {url}")),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(last
            .map(anyhow::Error::from)
            .unwrap_or_else(|| anyhow::anyhow!("no try")))
    }
}

/// Standard base64 with padding (for a payload that is not UTF-8).
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The JSON properties of a command as the outbox publishes one: persistent, JSON, with its
/// message id.
pub fn command_properties(message_id: &str, headers: Option<Value>) -> Value {
    let mut properties = json!({
        "delivery_mode": 2,
        "content_type": "application/json",
        "message_id": message_id,
    });
    if let Some(headers) = headers {
        properties["headers"] = headers;
    }
    properties
}

/// Writes the rows direct commands name and publishes the commands. Cheap to clone.
#[derive(Debug, Clone)]
pub struct DirectCommands {
    pool: PgPool,
    api: ApiPublisher,
    /// The harness's own automation, disabled (it matches no event): the executions of
    /// direct `automation.action` commands belong to it.
    automation_id: Uuid,
    /// Where direct mails go (`<direct>@localhost`): a mailbox of the scenario's own, apart
    /// from the replies to pings.
    to: String,
}

impl DirectCommands {
    /// Inserts the harness's automation.
    pub async fn new(pool: PgPool, vhost: &TestVhost, boxes: &Mailboxes) -> anyhow::Result<Self> {
        let automation_id = Uuid::new_v4();
        sqlx::query(
            "INSERT INTO automations (id, name, enabled, event_type) \
             VALUES ($1, 'faults-direct', false, 'faults.direct')",
        )
        .bind(automation_id)
        .execute(&pool)
        .await
        .context("inserting the harness's automation")?;
        Ok(Self {
            pool,
            api: ApiPublisher::new(vhost.api_url(), &vhost.name)?,
            automation_id,
            to: format!("{}@localhost", boxes.direct),
        })
    }

    pub fn api(&self) -> &ApiPublisher {
        &self.api
    }

    /// A queued outbound email to the direct mailbox and its `email.send` command (with
    /// `headers`, if any); returns the mail's Message-ID (no angle brackets).
    pub async fn email_send(&self, headers: Option<Value>) -> anyhow::Result<String> {
        let id = Uuid::new_v4();
        let message_id = format!("direct-email-{}@faults.test", id.simple());
        sqlx::query(
            "INSERT INTO outbound_emails (id, message_id, to_addresses, subject, text_body) \
             VALUES ($1, $2, $3, $4, 'a direct email.send command of the fault suite')",
        )
        .bind(id)
        .bind(&message_id)
        .bind(vec![self.to.clone()])
        .bind(format!("direct email {}", id.simple()))
        .execute(&self.pool)
        .await
        .context("inserting an outbound email")?;
        let body = serde_json::to_vec(&EmailSendCommand {
            outbound_email_id: id,
        })?;
        self.api
            .publish(
                COMMANDS_EXCHANGE,
                EMAIL_SEND,
                command_properties(&id.to_string(), headers),
                &body,
            )
            .await?;
        Ok(message_id)
    }

    /// A pending action execution of `action` and its `automation.action` command; returns
    /// the execution's id.
    pub async fn action(&self, action: Value) -> anyhow::Result<Uuid> {
        let event = DomainEvent {
            id: Uuid::new_v4(),
            event_type: "faults.direct".into(),
            occurred_at: chrono::Utc::now(),
            data: json!({}),
        };
        let execution = action_execution_id(event.id, self.automation_id, 0);
        sqlx::query(
            "INSERT INTO action_executions (id, automation_id, event_id, action_index, action, event) \
             VALUES ($1, $2, $3, 0, $4, $5)",
        )
        .bind(execution)
        .bind(self.automation_id)
        .bind(event.id)
        .bind(&action)
        .bind(serde_json::to_value(&event)?)
        .execute(&self.pool)
        .await
        .context("inserting an action execution")?;
        let body = serde_json::to_vec(&ActionCommand {
            action_execution_id: execution,
            automation_id: self.automation_id,
            event_id: event.id,
            action_index: 0,
        })?;
        self.api
            .publish(
                COMMANDS_EXCHANGE,
                AUTOMATION_ACTION,
                command_properties(&execution.to_string(), None),
                &body,
            )
            .await?;
        Ok(execution)
    }

    /// A `send_email` action to the direct mailbox; returns the Message-ID of the mail it
    /// queues (`<email id>@worker-host`, the email id derived from the execution id).
    pub async fn action_send_email(&self) -> anyhow::Result<String> {
        let action = json!({
            "type": "send_email",
            "to": [self.to],
            "subject": "direct action",
            "text": "a direct automation.action command of the fault suite",
            "reply_headers": false,
        });
        let execution = self.action(action).await?;
        Ok(format!("{}@worker-host", outbound_email_id(execution)))
    }

    /// Sends `pairs` pairs (one `email.send`, one `automation.action`) at `rate` pairs a
    /// second; returns the Message-IDs of the mails they must each deliver once, and the
    /// errors of those that could not be published (not counted).
    pub async fn steady(&self, pairs: u64, rate: f64) -> (Vec<String>, Vec<String>) {
        let start = Instant::now();
        let mut expected = Vec::new();
        let mut errors = Vec::new();
        for i in 0..pairs {
            let due = start + Duration::from_secs_f64(i as f64 / rate);
            tokio::time::sleep_until(due.into()).await;
            for result in [self.email_send(None).await, self.action_send_email().await] {
                match result {
                    Ok(id) => expected.push(id),
                    Err(err) => errors.push(format!("{err:#}")),
                }
            }
        }
        (expected, errors)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_pads_as_the_standard_says() {
        assert_eq!(super::base64(b""), "");
        assert_eq!(super::base64(b"f"), "Zg==");
        assert_eq!(super::base64(b"fo"), "Zm8=");
        assert_eq!(super::base64(b"foo"), "Zm9v");
        assert_eq!(super::base64(&[0xff, 0xfe, 0x00, 0x80]), "//4AgA==");
    }
}
