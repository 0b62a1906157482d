//! No output of the host ever shows a secret. One canary value goes into every secret slot
//! (the database, broker, SMTP and IMAP passwords, a webhook's user info, query string and
//! authorization header); the real `worker-host` binary is driven through its failure paths
//! (each password wrong, each server down, a webhook failing, mail that cannot be sent) at the
//! `trace` log level, with OTLP export to a collector of the test's own; then the canary is in
//! none of: stdout, stderr, `/status`, `/metrics`, `config check`, `dlq list` and `dlq show`,
//! the attempt log, the dead-letter archive and the OTLP exports.
//!
//! The canary is all digits, so that it also shows that such a password works: the broker
//! user the test creates has it as its password, given through the environment.
//!
//! `SECRETS_SHOW_LOG=1` prints the working host's log when it stops.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use support::{Host, SERIAL, free_port, host_command, send_mail, short_id};
use worker_testkit::{TestDb, TestVhost};

/// Every body the collector received, on any OTLP path, as sent.
type Exports = Arc<Mutex<Vec<Vec<u8>>>>;

async fn collect(State(exports): State<Exports>, body: Bytes) -> &'static str {
    exports.lock().unwrap().push(body.to_vec());
    ""
}

/// An OTLP/HTTP collector on a free port: its endpoint and what it received.
async fn otlp_collector() -> anyhow::Result<(String, Exports)> {
    let exports = Exports::default();
    let app = Router::new()
        .route("/v1/traces", axum::routing::post(collect))
        .route("/v1/metrics", axum::routing::post(collect))
        .route("/v1/logs", axum::routing::post(collect))
        .with_state(exports.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let endpoint = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((endpoint, exports))
}

/// A webhook receiver that fails every call with a 500 and, as a careless server would,
/// echoes the request's URI (with its token) in the answer.
async fn echoing_receiver() -> anyhow::Result<u16> {
    async fn fail(uri: Uri) -> (StatusCode, String) {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot handle {uri}"),
        )
    }
    let app = Router::new().fallback(fail);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(port)
}

/// A RabbitMQ user with `password` and every right on the test's vhost (as the host's own
/// user has on its own), deleted when dropped.
struct BrokerUser {
    vhost: TestVhost,
    name: String,
}

impl BrokerUser {
    async fn create(vhost: TestVhost, name: &str, password: &str) -> anyhow::Result<Self> {
        vhost
            .api(
                reqwest::Method::PUT,
                &format!("users/{name}"),
                Some(serde_json::json!({"password": password, "tags": ""})),
            )
            .await?;
        let user = Self {
            vhost,
            name: name.to_string(),
        };
        user.vhost
            .api(
                reqwest::Method::PUT,
                &format!("permissions/{{vhost}}/{name}"),
                Some(serde_json::json!({"configure": ".*", "write": ".*", "read": ".*"})),
            )
            .await?;
        Ok(user)
    }

    async fn delete(self) {
        let _ = self
            .vhost
            .api(
                reqwest::Method::DELETE,
                &format!("users/{}", self.name),
                None,
            )
            .await;
    }
}

fn automations(canary: &str, hook_port: u16, mail_to: &str) -> String {
    format!(
        r#"
[[automations]]
name = "canary"
event_type = "email.received"
conditions = [{{ path = "subject", op = "contains", value = "canary" }}]

[[automations.actions]]
type = "webhook"
url = "http://hook:{canary}@127.0.0.1:{hook_port}/hook?token={canary}"
headers = {{ authorization = "Bearer {canary}", x-api-key = "{canary}" }}

[[automations.actions]]
type = "send_email"
to = ["{mail_to}"]
subject = "Re: {{{{ subject }}}}"
text = "pong"
"#
    )
}

/// The settings of every run: `[database]`, `[broker]` and `[smtp]` come from `sections`.
fn settings(sections: &str, automations_file: &str, imap: &str, admin: u16, otlp: &str) -> String {
    format!(
        r#"
installation = "secrets-test"
automations_files = [{automations_file:?}]
{sections}

[admin]
listen = "127.0.0.1:{admin}"

[telemetry]
otlp_endpoint = "{otlp}"
metrics_interval = "1s"

[workers]
shutdown_grace = "5s"

[jobs.automation_action]
max_attempts = 1

[jobs.email_send]
max_attempts = 1

[jobs.inbound_email_poller]
schedule = "every 1s"

{imap}
"#
    )
}

/// Runs `worker-host run` that is expected to give up (a server wrong or down) and returns
/// its exit code, stdout and stderr.
async fn run_to_failure(
    config: &std::path::Path,
    env: &[(&str, &str)],
) -> (Option<i32>, String, String) {
    let mut command = tokio::process::Command::from(host_command(config));
    command
        .envs(env.iter().copied())
        .env("RUST_LOG", "trace")
        .arg("run")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let output = tokio::time::timeout(Duration::from_secs(120), command.output())
        .await
        .expect("the host gives up within 2 minutes")
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Fails naming `place` and the line that holds the canary.
fn assert_absent(canary: &str, place: &str, text: &str) {
    if let Some(line) = text.lines().find(|l| l.contains(canary)) {
        let line: String = line.chars().take(600).collect();
        panic!("the secret shows in {place}: {line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_output_of_the_host_shows_a_secret() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    // All digits: the value that settings used to refuse (and print) as a number.
    let canary = format!("7{:019}", rand_digits());
    let id = short_id();
    let db = TestDb::create().await?;
    let broker_user_name = format!("wh-canary-{id}");
    let vhost = TestVhost::create().await?;
    let vhost_name = vhost.name.clone();
    let broker_user = BrokerUser::create(vhost, &broker_user_name, &canary).await?;
    let (otlp, exports) = otlp_collector().await?;
    let hook_port = echoing_receiver().await?;
    let account = format!("secrets-{id}");
    let sender = format!("sender-secrets-{id}");

    let dir = tempfile::tempdir()?;
    let automations_file = dir.path().join("automations.toml");
    std::fs::write(
        &automations_file,
        automations(&canary, hook_port, &format!("{sender}@localhost")),
    )?;
    let automations_file = automations_file.display().to_string();
    let imap_file = dir.path().join("imap-password");
    std::fs::write(&imap_file, format!("{canary}\n"))?;
    // One account that works (mail comes in through it) and one whose password is the canary.
    let imap = format!(
        r#"
[[imap.accounts]]
name = "inbox"
username = "{account}"
password = "secret"

[[imap.accounts]]
name = "canary"
username = "canary-{id}"
password_file = {imap_file:?}
"#,
        imap_file = imap_file.display().to_string()
    );
    let smtp = format!("[smtp]\nusername = \"mailer\"\npassword = \"{canary}\"\n");
    let database = |password: &str, port: u16| {
        format!(
            "[database]\nname = {:?}\nport = {port}\npassword = \"{password}\"\nconnect_attempts = 2\n",
            db.name
        )
    };
    let broker = |user: &str, port: u16| {
        format!(
            "[broker]\nvhost = {vhost_name:?}\nusername = {user:?}\nport = {port}\nconnect_attempts = 2\nconnect_timeout = \"2s\"\n"
        )
    };
    let broker_password = [("WORKER_HOST__BROKER__PASSWORD", canary.as_str())];
    let closed_port = free_port();

    // The runs that give up: each password wrong, each server down.
    let failing = [
        (
            "the database password wrong",
            database(&canary, 5432),
            broker(&broker_user_name, 5672),
        ),
        (
            "the database down",
            database(&canary, closed_port),
            broker(&broker_user_name, 5672),
        ),
        (
            "the broker password wrong",
            database("worker_host", 5432),
            broker("guest", 5672),
        ),
        (
            "the broker down",
            database("worker_host", 5432),
            broker(&broker_user_name, closed_port),
        ),
    ];
    let mut outputs = Vec::new();
    for (case, database, broker) in &failing {
        let config = dir.path().join("failing.toml");
        let admin = free_port();
        std::fs::write(
            &config,
            settings(
                &format!("{database}{broker}{smtp}"),
                &automations_file,
                &imap,
                admin,
                &otlp,
            ),
        )?;
        let (code, stdout, stderr) = run_to_failure(&config, &broker_password).await;
        assert_ne!(code, Some(0), "{case}: the host should give up\n{stderr}");
        assert!(
            stderr.contains("trace") || stderr.contains("TRACE"),
            "{case}: the log is at the trace level"
        );
        outputs.push((format!("{case}: stdout"), stdout));
        outputs.push((format!("{case}: stderr"), stderr));
    }

    // The run that works, with the webhook, the mail and an IMAP login failing.
    let sections = format!(
        "{}{}{smtp}",
        database("worker_host", 5432),
        broker(&broker_user_name, 5672)
    );
    // The console's operator token is the canary too, all digits, from the environment.
    let host = Host::launch_with(
        "SECRETS_SHOW_LOG",
        &[
            broker_password[0],
            ("WORKER_HOST__ADMIN__OPERATOR_TOKEN", canary.as_str()),
            ("RUST_LOG", "trace"),
        ],
        |_, admin| Ok(settings(&sections, &automations_file, &imap, admin, &otlp)),
    )
    .await?;
    send_mail(
        &format!("{sender}@localhost"),
        &format!("{account}@localhost"),
        &format!("canary run {id}"),
        "secrets.test",
    )
    .await?;
    let pool = &db.pool;
    host.wait_for("the webhook and the mail dead-lettered and archived", || async move {
        let archived: i64 = sqlx::query_scalar(
            "SELECT count(DISTINCT queue) FROM dead_letters WHERE queue IN ('automation.action', 'email.send')",
        )
        .fetch_one(pool)
        .await?;
        Ok((archived == 2).then_some(()))
    })
    .await;
    let host_ref = &host;
    host.wait_for("the IMAP login failure on /status", || async move {
        let status = host_ref.get_text("/status").await?;
        Ok(status
            .to_lowercase()
            .contains("authentication")
            .then_some(()))
    })
    .await;
    // Long enough for the metrics (every second) and the traces (batched) to be exported.
    tokio::time::sleep(Duration::from_secs(3)).await;

    outputs.push(("/status".into(), host.get_text("/status").await?));
    let refused = support::console::Operator::sign_in(&host.url(""), "not-the-token", "x").await;
    assert!(refused.is_err(), "a wrong token is refused");
    let operator = support::console::Operator::sign_in(&host.url(""), &canary, "ops").await?;
    for page in [
        "/",
        "/dead-letters",
        "/dead-letters/messages?status=all",
        "/outbox",
        "/api/overview",
        "/api/dead-letters/messages?status=all",
    ] {
        let answer = operator.get(page).await?;
        assert_eq!(answer.status(), reqwest::StatusCode::OK, "{page}");
        outputs.push((format!("the console's {page}"), answer.text().await?));
    }
    outputs.push(("/metrics".into(), host.get_text("/metrics").await?));
    for args in [
        &["config", "check"][..],
        &["dlq", "list"],
        &["dlq", "show", "--limit", "10"],
        &["outbox", "status"],
    ] {
        let output = host_command(host.config_path())
            .envs(broker_password)
            .args(args)
            .output()?;
        assert_eq!(
            output.status.code(),
            Some(0),
            "{args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        outputs.push((
            format!("{args:?} stdout"),
            String::from_utf8_lossy(&output.stdout).into(),
        ));
        outputs.push((
            format!("{args:?} stderr"),
            String::from_utf8_lossy(&output.stderr).into(),
        ));
    }
    // The action executions keep the automation's action as written (the webhook's URL and
    // headers are the installation's own data, not output): only their errors are looked at.
    for (table, columns) in [
        ("attempt_log", "t.*"),
        ("dead_letters", "t.*"),
        ("outbound_emails", "t.*"),
        ("action_executions", "t.last_error"),
    ] {
        let rows: Vec<String> = sqlx::query_scalar(&format!(
            "SELECT row_to_json(r)::text FROM (SELECT {columns} FROM {table} t) r"
        ))
        .fetch_all(pool)
        .await?;
        assert!(!rows.is_empty(), "no rows in {table}");
        outputs.push((format!("the table {table}"), rows.join("\n")));
    }
    let mut host = host;
    let stopped = host.stop().await;
    assert_eq!(stopped, Some(0), "{}", host.log_tail());
    outputs.push(("the working host's stdout".into(), host.stdout_text()));
    outputs.push(("the working host's stderr".into(), host.log_text()));
    let exported = exports.lock().unwrap().clone();
    assert!(!exported.is_empty(), "nothing was exported over OTLP");
    for (i, body) in exported.iter().enumerate() {
        outputs.push((
            format!("OTLP export {i}"),
            String::from_utf8_lossy(body).into(),
        ));
    }
    broker_user.delete().await;

    for (place, text) in &outputs {
        assert_absent(&canary, place, text);
    }
    Ok(())
}

/// Nineteen pseudo-random digits, from a fresh UUID.
fn rand_digits() -> u64 {
    (uuid::Uuid::new_v4().as_u128() % 10_000_000_000_000_000_000) as u64
}
