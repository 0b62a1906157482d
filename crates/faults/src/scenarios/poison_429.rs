//! `poison-429`: an automation action's webhook answered `429 Too Many Requests` with
//! `Retry-After: 3600` on every call, while the rest of the loop flows.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use uuid::Uuid;

use super::{Fault, Load, Scenario};
use crate::oracle::Check;
use crate::run::{Run, Setup};

/// The action executor's attempts in this scenario (instead of the suite's 30), so that the
/// throttled commands' ladder ends within the quick run.
const MAX_ATTEMPTS: u32 = 3;
/// The suite's longest retry tier (`retry_tiers = ["2s", "5s", "10s"]` in `run.rs`): a
/// throttled command asking for more than any tier is parked in it.
const LONGEST_TIER: Duration = Duration::from_secs(10);
/// How much earlier than the longest tier a call may come (timers, the broker's expiry).
const TIER_SLACK: Duration = Duration::from_secs(1);
/// Throttled webhook executions per repetition.
const PER_REPETITION: usize = 2;

pub fn scenario() -> Scenario {
    Scenario {
        name: "poison-429",
        about: "The harness starts an HTTP server on a free loopback port that answers every call \
                `429 Too Many Requests` with `Retry-After: 3600`, and counts the calls per \
                `Idempotency-Key`. At a random moment of each repetition it publishes two \
                direct `automation.action` commands whose executions are webhooks to that server, \
                while pings and the other direct commands flow (they must all be answered \
                once). The action executor's `max_attempts` is 3 here; its `in_process_wait` \
                is the default 30 s, shorter than the hour asked for, so the host must not wait \
                in memory nor retry in process: each delivery calls once and is parked in the \
                longest retry tier (10 s, since no tier waits an hour), and the third attempt \
                is dead-lettered `gave-up` (class `throttled`). Bound checked: at most 3 calls \
                per execution (one per attempt), at least 9 s apart, and at least one; nothing \
                lost: at the end each throttled execution is recorded `pending` with the 429 in \
                `last_error` and its command is in the dead-letter archive (replayable), which \
                the expected dead letters count. \"Ready again\" is from the publish.",
        fault: Some(|| Box::new(Poison429::default())),
        full: Load {
            repetitions: 5,
            per_repetition: 30,
        },
        quick: Load {
            repetitions: 1,
            per_repetition: 30,
        },
        rate_per_sec: 10.0,
        settle: Duration::from_secs(120),
        heartbeat: super::DEFAULT_HEARTBEAT,
    }
}

/// Calls the server got: when, per `Idempotency-Key` (the execution id).
type Calls = Arc<Mutex<BTreeMap<String, Vec<Instant>>>>;

/// The fault: see [`scenario`]'s description. The server stops when it is dropped.
#[derive(Default)]
struct Poison429 {
    url: String,
    calls: Calls,
    server: Option<tokio::task::JoinHandle<()>>,
    executions: Vec<Uuid>,
}

impl Drop for Poison429 {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            server.abort();
        }
    }
}

#[async_trait::async_trait]
impl Fault for Poison429 {
    async fn prepare(&mut self, _dir: &std::path::Path) -> anyhow::Result<Setup> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        self.url = format!("http://{addr}/hook");
        self.server = Some(tokio::spawn(serve(listener, self.calls.clone())));
        Ok(Setup {
            env: vec![
                (
                    "WORKER_HOST__JOBS__AUTOMATION_ACTION__MAX_ATTEMPTS".into(),
                    MAX_ATTEMPTS.to_string(),
                ),
                // The server is on loopback, which a webhook reaches only when allowed.
                (
                    "WORKER_HOST__JOBS__AUTOMATION_ACTION__WEBHOOK_ALLOW".into(),
                    format!("[\"{addr}\"]"),
                ),
            ],
            ..Setup::default()
        })
    }

    async fn apply(&mut self, run: &mut Run) -> anyhow::Result<()> {
        let at = Instant::now();
        for _ in 0..PER_REPETITION {
            let execution = run
                .direct
                .action(json!({"type": "webhook", "url": self.url}))
                .await?;
            self.executions.push(execution);
        }
        run.expected_dead_letters = Some(self.executions.len() as u64);
        run.record_ready_after(at).await
    }

    async fn verify(&mut self, run: &mut Run) -> anyhow::Result<Vec<Check>> {
        let mut why = Vec::new();
        let calls = self
            .calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let total: usize = calls.values().map(Vec::len).sum();
        eprintln!(
            "faults: poison-429: {total} calls for {} throttled executions",
            self.executions.len()
        );
        for execution in &self.executions {
            let times = calls
                .get(&execution.to_string())
                .cloned()
                .unwrap_or_default();
            if times.is_empty() || times.len() > MAX_ATTEMPTS as usize {
                why.push(format!(
                    "execution {execution}: {} webhook calls, expected 1 to {MAX_ATTEMPTS}",
                    times.len()
                ));
            }
            if let Some(gap) = times.windows(2).map(|w| w[1] - w[0]).min()
                && gap + TIER_SLACK < LONGEST_TIER
            {
                why.push(format!(
                    "execution {execution}: calls {:.1} s apart, less than the {LONGEST_TIER:?} tier",
                    gap.as_secs_f64()
                ));
            }
        }
        let stray = calls
            .keys()
            .filter(|key| !self.executions.iter().any(|e| e.to_string() == **key))
            .count();
        if stray > 0 {
            why.push(format!("{stray} webhook callers that are no execution"));
        }
        let ids: Vec<String> = self.executions.iter().map(ToString::to_string).collect();
        let recorded = run
            .count_among(
                "SELECT count(*) FROM action_executions WHERE id::text = ANY($1) \
                 AND status = 'pending' AND last_error LIKE '%429%'",
                &ids,
            )
            .await? as usize;
        let dead = run
            .count_among(
                &format!(
                    "SELECT count(*) FROM dead_letters WHERE message_id = ANY($1) \
                 AND reason = 'gave-up' AND class = 'throttled' AND attempts = {MAX_ATTEMPTS}"
                ),
                &ids,
            )
            .await? as usize;
        if recorded != self.executions.len() || dead != self.executions.len() {
            why.push(format!(
                "of {} throttled executions, {recorded} recorded pending with the 429, {dead} dead-lettered gave-up (throttled) after {MAX_ATTEMPTS} attempts",
                self.executions.len()
            ));
        }
        Ok(why
            .into_iter()
            .map(|what| Check::new(what, false))
            .collect())
    }
}

/// Answers every request `429` with `Retry-After: 3600`, recording its `Idempotency-Key`.
async fn serve(listener: TcpListener, calls: Calls) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            continue;
        };
        let calls = calls.clone();
        tokio::spawn(async move {
            let Some(key) = read_request(&mut stream).await else {
                return;
            };
            calls
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(key)
                .or_default()
                .push(Instant::now());
            let _ = stream
                .write_all(
                    b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 3600\r\n\
                      Content-Length: 0\r\nConnection: close\r\n\r\n",
                )
                .await;
            let _ = stream.shutdown().await;
        });
    }
}

/// Reads one request (head and `Content-Length` body, within 10 s and 1 MiB); returns its
/// `Idempotency-Key` (empty when it had none).
async fn read_request(stream: &mut tokio::net::TcpStream) -> Option<String> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 8192];
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let n = stream.read(&mut chunk).await.ok()?;
            if n == 0 {
                return None;
            }
            buffer.extend_from_slice(&chunk[..n]);
            if buffer.len() > 1 << 20 {
                return None;
            }
            let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") else {
                continue;
            };
            let head = String::from_utf8_lossy(&buffer[..end]).to_string();
            let header = |name: &str| {
                head.lines().find_map(|line| {
                    let (key, value) = line.split_once(':')?;
                    key.trim()
                        .eq_ignore_ascii_case(name)
                        .then(|| value.trim().to_string())
                })
            };
            let length: usize = header("content-length")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            if buffer.len() >= end + 4 + length {
                return Some(header("idempotency-key").unwrap_or_default());
            }
        }
    })
    .await
    .ok()
    .flatten()
}
