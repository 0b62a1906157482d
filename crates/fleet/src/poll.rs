//! Reading every installation's `/api/overview` at once, each bounded by `timeout`, on a
//! background round every `refresh`: the page shows the last round's results and never waits
//! on an installation. An installation that does not answer is unreachable from its first
//! failed reading on, until it answers again.
//!
//! What one installation can cost the view is bounded: its answer is read in chunks up to
//! [`ANSWER_MAX_BYTES`] (a longer one is dropped, its connection closed, and the installation
//! shown failing with "answer over N bytes"), and each list and text kept of it is cut
//! ([`LIST_MAX`], [`FIELD_MAX_CHARS`]). A broken or hostile installation streaming for the
//! whole timeout cannot grow the fleet process.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::settings::{FleetSettings, InstallationSettings};
use worker_pages::environment::Environment;

/// The longest error shown for an unreachable installation.
const ERROR_MAX_CHARS: usize = 160;

/// The longest answer read from an installation. An overview is a few kilobytes (a host with
/// twenty jobs and every alert firing stays under 64 KiB); anything past this is not one.
pub const ANSWER_MAX_BYTES: usize = 4 * 1024 * 1024;

/// The most entries kept of each list of a reading (failing jobs, alerts); past it, one entry
/// says how many more there were.
pub const LIST_MAX: usize = 50;

/// The longest text kept of each field of a reading (a name, an alert's message).
pub const FIELD_MAX_CHARS: usize = 200;

/// One installation as the view shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Installation {
    pub name: String,
    /// Its console, where the row links.
    pub url: String,
    /// The environment the fleet's settings give it.
    pub environment: Environment,
    /// `waiting` (not read yet), `healthy`, `degraded` or `unreachable`.
    pub state: &'static str,
    /// What the last answer said; `None` until one came, and while unreachable.
    pub reading: Option<Reading>,
    /// When it last answered.
    pub last_answer: Option<DateTime<Utc>>,
    /// Since when it does not answer (the first failed reading after its last answer).
    pub unreachable_since: Option<DateTime<Utc>>,
    /// Why not, in short. Never holds a token: the request's URL and error only.
    pub last_error: Option<String>,
}

/// What an installation's `/api/overview` says.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Reading {
    /// The installation's own name for itself (`installation`), and the replica that answered.
    pub installation: String,
    pub replica: String,
    /// Why it is degraded (besides an open circuit): the broker link or the database
    /// probe, in words.
    pub problems: Vec<String>,
    /// The jobs whose last error is newer than their last success.
    pub failing_jobs: Vec<String>,
    pub outbox_failed: u64,
    pub dead_letters: u64,
    pub alerts: Vec<Alert>,
    pub release: String,
    pub revision: String,
    /// The highest migration applied, and the release that applied it.
    pub schema_version: Option<i64>,
    pub schema_release: Option<String>,
    /// The environment it says it is (`admin.environment`), when set.
    pub environment: Option<String>,
    /// Its open circuits: each makes it degraded.
    pub circuits: Vec<Circuit>,
}

/// An installation's open circuit: its dependency, why, since when.
#[derive(Debug, Clone, Serialize)]
pub struct Circuit {
    pub dependency: String,
    pub reason: String,
    pub since: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Alert {
    pub name: String,
    pub message: String,
    pub since: Option<String>,
}

/// The view's state: every installation, in the settings' order, and when the last round
/// ended.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Fleet {
    pub installations: Vec<Installation>,
    pub last_round: Option<DateTime<Utc>>,
    pub refresh_secs: u64,
    pub timeout_secs: f64,
}

pub type Shared = Arc<RwLock<Fleet>>;

impl Fleet {
    /// Every installation, not read yet.
    pub fn new(settings: &FleetSettings) -> Self {
        Self {
            installations: settings
                .installations
                .iter()
                .map(|i| Installation {
                    name: i.name.trim().to_string(),
                    url: i.base_url().to_string(),
                    environment: i.environment(),
                    state: "waiting",
                    reading: None,
                    last_answer: None,
                    unreachable_since: None,
                    last_error: None,
                })
                .collect(),
            last_round: None,
            refresh_secs: settings.refresh.as_secs(),
            timeout_secs: settings.timeout.as_secs_f64(),
        }
    }
}

/// Reads every installation every `refresh` until `shutdown`.
pub async fn run(
    settings: Arc<FleetSettings>,
    client: reqwest::Client,
    fleet: Shared,
    shutdown: CancellationToken,
) {
    let mut ticks = tokio::time::interval(settings.refresh);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let answers = futures::future::join_all(
            settings
                .installations
                .iter()
                .map(|i| read(&client, i, settings.timeout)),
        )
        .await;
        let now = Utc::now();
        let Ok(mut fleet) = fleet.write() else {
            return;
        };
        for (shown, answer) in fleet.installations.iter_mut().zip(answers) {
            record(shown, answer, now);
        }
        fleet.last_round = Some(now);
    }
}

/// Puts one reading's outcome on its installation's row.
fn record(shown: &mut Installation, answer: Result<Reading, String>, now: DateTime<Utc>) {
    match answer {
        Ok(reading) => {
            shown.state = if reading.problems.is_empty() && reading.circuits.is_empty() {
                "healthy"
            } else {
                "degraded"
            };
            shown.reading = Some(reading);
            shown.last_answer = Some(now);
            shown.unreachable_since = None;
            shown.last_error = None;
        }
        Err(error) => {
            if shown.unreachable_since.is_none() {
                tracing::warn!(installation = %shown.name, %error, "an installation does not answer");
            }
            shown.state = "unreachable";
            shown.reading = None;
            shown.unreachable_since.get_or_insert(now);
            shown.last_error = Some(error);
        }
    }
}

/// One installation's `/api/overview`, within `timeout`.
async fn read(
    client: &reqwest::Client,
    installation: &InstallationSettings,
    timeout: Duration,
) -> Result<Reading, String> {
    let url = format!("{}/api/overview", installation.base_url());
    let mut request = client.get(&url).timeout(timeout);
    if let Some(token) = &installation.token {
        request = request.bearer_auth(token.expose());
    }
    let within = humantime::format_duration(timeout);
    // The client's timeout covers the body too; this one is the bound the page promises.
    let answer = tokio::time::timeout(timeout, async {
        let response = request
            .send()
            .await
            .map_err(|e| short(&describe(&e, &within)))?;
        let status = response.status();
        let body = bounded_body(response, ANSWER_MAX_BYTES, &within).await?;
        Ok::<_, String>((status, body))
    })
    .await;
    let (status, body) = match answer {
        Err(_) => return Err(format!("no answer within {within}")),
        Ok(Err(e)) => return Err(e),
        Ok(Ok(answer)) => answer,
    };
    match status.as_u16() {
        200 => {}
        401 | 403 => {
            return Err(format!(
                "the token was refused ({status}): set a viewer account's API token"
            ));
        }
        _ => return Err(short(&format!("answered {status}"))),
    }
    let body: Value = serde_json::from_slice(&body)
        .map_err(|e| short(&format!("not a worker-host overview: {e}")))?;
    Ok(reading_of(&body))
}

/// The answer's body, read a chunk at a time up to `max` bytes. Past `max` (announced by its
/// `Content-Length` or found while reading) the answer is dropped unread, which closes its
/// connection, and the installation is failing: "answer over `max` bytes".
async fn bounded_body(
    mut response: reqwest::Response,
    max: usize,
    within: &humantime::FormattedDuration,
) -> Result<Vec<u8>, String> {
    let over = || format!("answer over {max} bytes: not a worker-host overview");
    if response
        .content_length()
        .is_some_and(|length| length > u64::try_from(max).unwrap_or(u64::MAX))
    {
        return Err(over());
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| short(&describe(&e, within)))?
    {
        if body.len() + chunk.len() > max {
            return Err(over());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// A client error in words, without the library's wrapping: the refused connection, the
/// name that did not resolve.
fn describe(error: &reqwest::Error, within: &humantime::FormattedDuration) -> String {
    if error.is_timeout() {
        return format!("no answer within {within}");
    }
    let mut cause: &dyn std::error::Error = error;
    while let Some(next) = cause.source() {
        cause = next;
    }
    if error.is_connect() {
        format!("cannot connect: {cause}")
    } else {
        cause.to_string()
    }
}

fn short(text: &str) -> String {
    if text.chars().count() <= ERROR_MAX_CHARS {
        return text.to_string();
    }
    let mut out: String = text.chars().take(ERROR_MAX_CHARS).collect();
    out.push('…');
    out
}

/// What the view shows of an overview's JSON; a field that is missing shows as missing,
/// never as a failure, so that an older release is still shown.
pub fn reading_of(body: &Value) -> Reading {
    let status = &body["status"];
    let text = |v: &Value| field(v.as_str().unwrap_or_default());
    let mut problems = Vec::new();
    let broker = status["broker"]["state"].as_str().unwrap_or("unknown");
    if broker != "connected" {
        problems.push(format!("broker link {broker}"));
    }
    if status["database"]["healthy"].as_bool() != Some(true) {
        problems.push("database probe unhealthy".to_string());
    }
    let mut circuits = circuits_of(body);
    if let Some(more) = beyond_list_max(&mut circuits) {
        circuits.push(Circuit {
            dependency: "more".to_string(),
            reason: format!("… and {more} more open circuits"),
            since: None,
        });
    }
    let mut failing_jobs: Vec<String> = body["jobs"]
        .as_array()
        .map(|jobs| {
            jobs.iter()
                .filter(|j| j["state"] == "failing")
                .map(|j| text(&j["name"]))
                .collect()
        })
        .unwrap_or_default();
    if let Some(more) = beyond_list_max(&mut failing_jobs) {
        failing_jobs.push(format!("… and {more} more"));
    }
    let mut alerts: Vec<Alert> = status["alerts"]
        .as_array()
        .map(|alerts| {
            alerts
                .iter()
                .map(|a| Alert {
                    name: text(&a["name"]),
                    message: text(&a["message"]),
                    since: a["since"].as_str().map(field),
                })
                .collect()
        })
        .unwrap_or_default();
    if let Some(more) = beyond_list_max(&mut alerts) {
        alerts.push(Alert {
            name: "more".to_string(),
            message: format!("… and {more} more alerts"),
            since: None,
        });
    }
    Reading {
        installation: text(&status["installation"]),
        replica: text(&status["replica"]),
        problems,
        failing_jobs,
        outbox_failed: body["outbox"]["failed"].as_u64().unwrap_or_default(),
        dead_letters: body["dead_letters"]["waiting"].as_u64().unwrap_or_default(),
        alerts,
        release: text(&status["release"]),
        revision: text(&status["revision"]),
        schema_version: status["schema"]["version"].as_i64(),
        schema_release: status["schema"]["release"].as_str().map(field),
        environment: status["environment"]["name"].as_str().map(field),
        circuits,
    }
}

/// The overview's open circuits (read from the installation's shared table); none from a
/// release before circuits.
fn circuits_of(body: &Value) -> Vec<Circuit> {
    let text = |v: &Value| field(v.as_str().unwrap_or_default());
    body["circuits"]
        .as_array()
        .map(|open| {
            open.iter()
                .map(|c| Circuit {
                    dependency: text(&c["dependency"]),
                    reason: text(&c["reason"]),
                    since: c["opened_at"].as_str().map(field),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Cuts `list` to [`LIST_MAX`] entries; how many it had past that, if any.
fn beyond_list_max<T>(list: &mut Vec<T>) -> Option<usize> {
    let more = list.len().checked_sub(LIST_MAX).filter(|n| *n > 0)?;
    list.truncate(LIST_MAX);
    Some(more)
}

/// One text field of a reading, at most [`FIELD_MAX_CHARS`] characters.
fn field(text: &str) -> String {
    if text.chars().count() <= FIELD_MAX_CHARS {
        return text.to_string();
    }
    let mut out: String = text.chars().take(FIELD_MAX_CHARS).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> Installation {
        let settings: FleetSettings = FleetSettings {
            installations: vec![InstallationSettings {
                name: "acme".into(),
                url: "http://127.0.0.1:1/".into(),
                token: None,
                token_file: None,
                token_env: None,
                environment: "production".into(),
                environment_colour: None,
                allow_plaintext: false,
            }],
            ..FleetSettings::default()
        };
        Fleet::new(&settings).installations.remove(0)
    }

    #[test]
    fn an_overview_reads_as_health_failures_alerts_and_versions() {
        let body = serde_json::json!({
            "status": {
                "installation": "acme", "replica": "r1", "release": "1.4.0", "revision": "abc",
                "broker": {"state": "reconnecting"}, "database": {"healthy": true},
                "alerts": [{"name": "dead_letters", "message": "3 waiting", "since": "2026-12-01T10:00:00Z"}],
                "schema": {"version": 20261201000000_i64, "release": "1.4.0"},
                "environment": {"name": "production", "colour": "red", "production": true},
            },
            "jobs": [{"name": "email-send", "state": "failing"}, {"name": "draft-expiry", "state": "ok"}],
            "dead_letters": {"waiting": 3},
            "outbox": {"failed": 2},
        });
        let reading = reading_of(&body);
        assert_eq!(reading.problems, vec!["broker link reconnecting"]);
        assert_eq!(reading.failing_jobs, vec!["email-send"]);
        assert_eq!((reading.dead_letters, reading.outbox_failed), (3, 2));
        assert_eq!(reading.alerts[0].name, "dead_letters");
        assert_eq!(reading.schema_version, Some(20_261_201_000_000));
        assert_eq!(reading.environment.as_deref(), Some("production"));
        assert!(reading.circuits.is_empty(), "an overview without circuits");
    }

    #[test]
    fn an_open_circuit_degrades_the_installation_with_its_reason() {
        let body = serde_json::json!({
            "status": {"broker": {"state": "connected"}, "database": {"healthy": true}},
            "circuits": [{"dependency": "smtp-relay", "reason": "535 5.7.8 refused", "opened_at": "2026-12-04T10:00:00Z"}],
        });
        let mut shown = row();
        record(&mut shown, Ok(reading_of(&body)), Utc::now());
        assert_eq!(shown.state, "degraded");
        let reading = shown.reading.unwrap();
        assert_eq!(reading.circuits[0].dependency, "smtp-relay");
        assert_eq!(reading.circuits[0].reason, "535 5.7.8 refused");
    }

    #[test]
    fn a_reading_keeps_at_most_list_max_of_each_list_and_field_max_of_each_text() {
        let jobs: Vec<Value> = (0..500)
            .map(|i| serde_json::json!({"name": format!("job-{i}"), "state": "failing"}))
            .collect();
        let alerts: Vec<Value> = (0..500)
            .map(|i| serde_json::json!({"name": "a".repeat(10_000), "message": i.to_string()}))
            .collect();
        let body = serde_json::json!({"status": {"alerts": alerts}, "jobs": jobs});
        let reading = reading_of(&body);
        assert_eq!(reading.failing_jobs.len(), LIST_MAX + 1);
        assert_eq!(reading.failing_jobs[LIST_MAX], "… and 450 more");
        assert_eq!(reading.alerts.len(), LIST_MAX + 1);
        assert_eq!(reading.alerts[LIST_MAX].message, "… and 450 more alerts");
        assert_eq!(reading.alerts[0].name.chars().count(), FIELD_MAX_CHARS + 1);
    }

    #[tokio::test]
    async fn an_answer_longer_than_the_bound_is_refused_with_its_size() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let _server = tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = [0_u8; 4096];
            let _ = socket.read(&mut request).await;
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                ANSWER_MAX_BYTES + 1
            );
            let _ = socket.write_all(head.as_bytes()).await;
            let _ = socket.write_all(&vec![b' '; ANSWER_MAX_BYTES + 1]).await;
        });
        let mut installation = row_settings();
        installation.url = format!("http://{addr}");
        let answer = read(
            &reqwest::Client::new(),
            &installation,
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(
            answer.unwrap_err(),
            format!("answer over {ANSWER_MAX_BYTES} bytes: not a worker-host overview")
        );
    }

    #[test]
    fn unreachable_counts_from_the_first_failure_until_an_answer() {
        let mut shown = row();
        let first = Utc::now();
        record(&mut shown, Err("cannot connect".into()), first);
        record(
            &mut shown,
            Err("cannot connect".into()),
            first + chrono::Duration::seconds(10),
        );
        assert_eq!(shown.state, "unreachable");
        assert_eq!(shown.unreachable_since, Some(first));
        record(
            &mut shown,
            Ok(Reading::default()),
            first + chrono::Duration::seconds(20),
        );
        assert_eq!(shown.state, "healthy");
        assert_eq!(shown.unreachable_since, None);
        assert_eq!(shown.last_error, None);
    }

    #[tokio::test]
    async fn a_silent_installation_is_unreachable_within_the_timeout() {
        // Accepts and never answers.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let _held = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        let mut installation = row_settings();
        installation.url = format!("http://{addr}");
        let started = std::time::Instant::now();
        let answer = read(
            &reqwest::Client::new(),
            &installation,
            Duration::from_millis(300),
        )
        .await;
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(answer.unwrap_err(), "no answer within 300ms");
    }

    fn row_settings() -> InstallationSettings {
        InstallationSettings {
            name: "silent".into(),
            url: String::new(),
            token: Some(worker_core::secret::Secret::new("t")),
            token_file: None,
            token_env: None,
            environment: "staging".into(),
            environment_colour: None,
            allow_plaintext: false,
        }
    }
}
