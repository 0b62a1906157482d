//! `poison-malformed`: malformed messages published straight into the three work queues'
//! exchanges, mixed into the healthy stream.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};

use super::{Fault, Load, Scenario};
use crate::direct::{ApiPublisher, COMMANDS_EXCHANGE, EVENTS_EXCHANGE};
use crate::oracle::Check;
use crate::run::Run;

/// Malformed messages per ping of the repetition: 10,000 in full (2,000 pings), 300 quick
/// (60 pings).
const PER_PING: u64 = 5;
/// Every this many malformed messages, one is huge.
const HUGE_EVERY: u64 = 50;
/// A huge body's size: well within the broker's `max_message_size` (128 MiB by default) and
/// the management API's request limit, large enough to be more than any real command.
const HUGE_BYTES: usize = 512 * 1024;
/// Publishes in flight at once.
const IN_FLIGHT: usize = 8;

pub fn scenario() -> Scenario {
    Scenario {
        name: "poison-malformed",
        about: "While pings (and direct commands) flow, at a random moment of the repetition the \
                harness publishes 10,000 malformed messages (300 with `--quick`) through the \
                management API straight into the three work queues' exchanges (`events` with \
                routing key `email.received`, `commands` with `automation.action` and \
                `email.send`, in turn), each with a unique message id, cycling through: invalid \
                JSON; valid JSON of the wrong shape; content type `application/xml` with an XML \
                body; no content type with a plain-text body; a valid command body whose \
                `x-attempt` header is a string, or a table (a header of the wrong type); a \
                wrong-shape body whose `traceparent` header is a table where a string is \
                expected; a body that is not UTF-8; and, one in 50, a 512 KiB wrong-shape JSON \
                body. Each must be dead-lettered once at its first delivery (reason `malformed`, \
                one attempt, the reason in `x-dead-error`) and archived once: the dead letters \
                must equal the malformed messages exactly, and the scenario checks the rows' \
                reason and attempts. The host must not exit and every ping and direct command \
                must still be answered once. The host ignores the content type (it decodes \
                every body as JSON), so the two content-type variants carry bodies that are not \
                JSON. \"Ready again\" is from the end of the publishing.",
        fault: Some(|| Box::new(PoisonMalformed::default())),
        full: Load {
            repetitions: 1,
            per_repetition: 2_000,
        },
        quick: Load {
            repetitions: 1,
            per_repetition: 60,
        },
        rate_per_sec: 20.0,
        settle: Duration::from_secs(180),
        heartbeat: super::DEFAULT_HEARTBEAT,
    }
}

/// The fault: see [`scenario`]'s description.
#[derive(Default)]
struct PoisonMalformed {
    /// Malformed messages published (and routed).
    published: u64,
}

#[async_trait::async_trait]
impl Fault for PoisonMalformed {
    async fn apply(&mut self, run: &mut Run) -> anyhow::Result<()> {
        let count = run.per_repetition * PER_PING;
        let api = run.direct.api().clone();
        let started = Instant::now();
        let results: Vec<anyhow::Result<()>> = futures::stream::iter(0..count)
            .map(|n| {
                let api = api.clone();
                async move { publish_malformed(&api, n).await }
            })
            .buffer_unordered(IN_FLIGHT)
            .collect()
            .await;
        let failed: Vec<String> = results
            .into_iter()
            .filter_map(|r| r.err().map(|e| format!("{e:#}")))
            .collect();
        anyhow::ensure!(
            failed.is_empty(),
            "{} malformed messages not published, first: {}",
            failed.len(),
            failed.first().map(String::as_str).unwrap_or_default()
        );
        self.published += count;
        run.expected_dead_letters = Some(self.published);
        eprintln!(
            "faults: poison-malformed: {count} malformed messages published in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        run.record_ready_after(Instant::now()).await
    }

    async fn verify(&mut self, run: &mut Run) -> anyhow::Result<Vec<Check>> {
        let mut why = Vec::new();
        let malformed = run
            .query_scalar(
                "SELECT count(*) FROM dead_letters WHERE message_id LIKE 'poison-%' \
                 AND reason = 'malformed' AND class = 'malformed' AND attempts = 1 \
                 AND last_error LIKE 'malformed: %'",
            )
            .await? as u64;
        if malformed != self.published {
            why.push(format!(
                "{malformed} of {} malformed messages dead-lettered `malformed` at attempt 1 with the reason",
                self.published
            ));
        }
        let others = run
            .query_scalar("SELECT count(*) FROM dead_letters WHERE message_id NOT LIKE 'poison-%' OR message_id IS NULL")
            .await?;
        if others > 0 {
            why.push(format!("{others} dead letters of healthy messages"));
        }
        Ok(why
            .into_iter()
            .map(|what| Check::new(what, false))
            .collect())
    }
}

/// The variants, in turn; `n` picks one (and every [`HUGE_EVERY`]th is the huge one).
async fn publish_malformed(api: &ApiPublisher, n: u64) -> anyhow::Result<()> {
    let (exchange, routing_key) = match n % 3 {
        0 => (EVENTS_EXCHANGE, worker_messages::EMAIL_RECEIVED),
        1 => (COMMANDS_EXCHANGE, worker_messages::AUTOMATION_ACTION),
        _ => (COMMANDS_EXCHANGE, worker_messages::EMAIL_SEND),
    };
    let message_id = format!("poison-{n}-{}", uuid::Uuid::new_v4().simple());
    let json = Some("application/json");
    let wrong_shape = br#"{"hello": "world", "n": 1}"#.to_vec();
    let (content_type, headers, body): (Option<&str>, Option<Value>, Vec<u8>) =
        if n % HUGE_EVERY == HUGE_EVERY - 1 {
            let pad = "x".repeat(HUGE_BYTES);
            (json, None, format!(r#"{{"pad": "{pad}"}}"#).into_bytes())
        } else {
            match n % 8 {
                0 => (json, None, br#"{"action_execution_id": "#.to_vec()),
                1 => (json, None, wrong_shape),
                2 => (Some("application/xml"), None, b"<ping/>".to_vec()),
                3 => (None, None, b"ping".to_vec()),
                4 => (
                    json,
                    Some(json!({"x-attempt": "2"})),
                    valid_body(routing_key),
                ),
                5 => (
                    json,
                    Some(json!({"x-attempt": {"n": 2}})),
                    valid_body(routing_key),
                ),
                6 => (
                    json,
                    Some(json!({"traceparent": {"version": "00"}})),
                    wrong_shape,
                ),
                _ => (json, None, vec![0xff, 0xfe, b'{', b'"', 0xc3, 0x28, b'}']),
            }
        };
    let mut properties = json!({"delivery_mode": 2, "message_id": message_id});
    if let Some(content_type) = content_type {
        properties["content_type"] = json!(content_type);
    }
    if let Some(headers) = headers {
        properties["headers"] = headers;
    }
    api.publish(exchange, routing_key, properties, &body).await
}

/// A body the queue's job would decode (naming nothing that exists), for the variants whose
/// only fault is a header.
fn valid_body(routing_key: &str) -> Vec<u8> {
    let id = uuid::Uuid::new_v4();
    let body = match routing_key {
        worker_messages::EMAIL_RECEIVED => json!({
            "id": id, "type": "faults.poison", "occurred_at": chrono::Utc::now(), "data": {}
        }),
        worker_messages::AUTOMATION_ACTION => json!({
            "action_execution_id": id, "automation_id": id, "event_id": id, "action_index": 0
        }),
        _ => json!({"email_message_id": id}),
    };
    body.to_string().into_bytes()
}
