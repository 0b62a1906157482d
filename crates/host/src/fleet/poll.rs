//! Reading every installation's `/api/overview` at once, each bounded by `timeout`, on a
//! background round every `refresh`: the page shows the last round's results and never waits
//! on an installation. An installation that does not answer is unreachable from its first
//! failed reading on, until it answers again.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::settings::{FleetSettings, InstallationSettings};
use crate::environment::Environment;

/// The longest error shown for an unreachable installation.
const ERROR_MAX_CHARS: usize = 160;

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
    /// Why it is degraded: the broker link or the database probe, in words.
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
            shown.state = if reading.problems.is_empty() {
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
    // The client's timeout covers the body too; this one is the bound the page promises.
    let answer = tokio::time::timeout(timeout, async {
        let response = request.send().await?;
        let status = response.status();
        let body = response.text().await?;
        Ok::<_, reqwest::Error>((status, body))
    })
    .await;
    let within = humantime::format_duration(timeout);
    let (status, body) = match answer {
        Err(_) => return Err(format!("no answer within {within}")),
        Ok(Err(e)) => return Err(short(&describe(&e, &within))),
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
    let body: Value = serde_json::from_str(&body)
        .map_err(|e| short(&format!("not a worker-host overview: {e}")))?;
    Ok(reading_of(&body))
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
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let mut problems = Vec::new();
    let broker = status["broker"]["state"].as_str().unwrap_or("unknown");
    if broker != "connected" {
        problems.push(format!("broker link {broker}"));
    }
    if status["database"]["healthy"].as_bool() != Some(true) {
        problems.push("database probe unhealthy".to_string());
    }
    let failing_jobs = body["jobs"]
        .as_array()
        .map(|jobs| {
            jobs.iter()
                .filter(|j| j["state"] == "failing")
                .map(|j| text(&j["name"]))
                .collect()
        })
        .unwrap_or_default();
    let alerts = status["alerts"]
        .as_array()
        .map(|alerts| {
            alerts
                .iter()
                .map(|a| Alert {
                    name: text(&a["name"]),
                    message: text(&a["message"]),
                    since: a["since"].as_str().map(str::to_string),
                })
                .collect()
        })
        .unwrap_or_default();
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
        schema_release: status["schema"]["release"].as_str().map(str::to_string),
        environment: status["environment"]["name"].as_str().map(str::to_string),
    }
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
            token: Some(crate::secret::Secret::new("t")),
            token_file: None,
            token_env: None,
            environment: "staging".into(),
            environment_colour: None,
        }
    }
}
