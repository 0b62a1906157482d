//! The harness the binary-level tests share: the real `worker-host` binary started with a
//! settings file of the test's own (own database, vhost and admin port) and stopped with
//! SIGTERM, its HTTP endpoints and log, bounded waits, and the broker, SMTP and IMAP helpers.

// Each test binary uses a different subset of this module.
#![allow(dead_code)]

pub mod browser;
pub mod circuits;
pub mod console;
pub mod container;
pub mod edit;
pub mod fleet;
pub mod history;
pub mod pause;
pub mod progress;
pub mod story;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::TryStreamExt;
use lettre::message::Mailbox;
use lettre::transport::smtp::AsyncSmtpTransport;
use lettre::{AsyncTransport, Message, Tokio1Executor};
use worker_testkit::{TestDb, TestVhost};

/// How long any one thing the test waits for may take (the machine is slow and shared).
pub const WAIT: Duration = Duration::from_secs(60);
/// How often a wait looks again.
pub const POLL: Duration = Duration::from_millis(200);

/// One test at a time: each starts a host of its own, on two shared cores.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The demo's automation: a reply to the sender of any mail whose subject contains `ping`.
pub const AUTOMATION: &str = r#"
[[automations]]
name = "reply-to-ping"
event_type = "email.received"
conditions = [{ path = "subject", op = "contains", value = "ping" }]

[[automations.actions]]
type = "send_email"
to = ["{{ from }}"]
subject = "Re: {{ subject }}"
text = "pong: the worker host got your mail \"{{ subject }}\"."
"#;

/// Writes [`AUTOMATION`] into `dir`; returns the value for `automations_files`.
pub fn write_automation(dir: &Path) -> anyhow::Result<String> {
    let file = dir.join("automations.toml");
    std::fs::write(&file, AUTOMATION)?;
    Ok(format!("[{:?}]", file.display().to_string()))
}

/// The settings every test host has: `installation`, `automations_files` (a TOML array), the
/// test's database and vhost, the admin port and a 5 s shutdown grace.
pub fn base_settings(
    installation: &str,
    automations_files: &str,
    db: &TestDb,
    vhost: &TestVhost,
    port: u16,
) -> String {
    format!(
        r#"
installation = {installation:?}
automations_files = {automations_files}

[database]
name = {db:?}
password = "worker_host"

[broker]
vhost = {vhost:?}
username = "guest"
password = "guest"

[admin]
listen = "127.0.0.1:{port}"

[workers]
shutdown_grace = "5s"
"#,
        db = db.name,
        vhost = vhost.name,
    )
}

/// The IMAP account `account` (password `secret`), which the poller reads every second.
pub fn mail_account_settings(account: &str) -> String {
    format!(
        r#"
[[imap.accounts]]
name = "loop"
username = {account:?}
password = "secret"

[jobs.inbound_email_poller]
schedule = "every 1s"
"#
    )
}

pub fn short_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..8].to_string()
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs `probe` until it returns `Some`, at most [`WAIT`]; fails naming `what`, the probe's
/// last error and `context()` (the tail of a host's log, say).
pub async fn wait_for<T, F, Fut>(what: &str, context: impl Fn() -> String, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = Instant::now() + WAIT;
    let mut last = String::from("(no answer yet)");
    loop {
        match probe().await {
            Ok(Some(value)) => return value,
            Ok(None) => {}
            Err(err) => last = format!("{err:#}"),
        }
        if Instant::now() > deadline {
            panic!(
                "{what}: not within {WAIT:?} (last error: {last})\n{}",
                context()
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

// ---------------------------------------------------------------------------------------------
// The host
// ---------------------------------------------------------------------------------------------

/// A running `worker-host run` with its settings and its log (stderr) in a temporary folder.
/// Killed when dropped if a test ends without stopping it.
pub struct Host {
    child: Child,
    port: u16,
    config: PathBuf,
    log: PathBuf,
    /// The variable that, when set, has [`Host::stop_cleanly`] print the whole log.
    show_log_var: &'static str,
    _dir: tempfile::TempDir,
}

/// A database, a vhost and a settings file of the test's own naming them: what a
/// command-line test runs the binary against. The folder of the file lives as long as this.
pub struct Installation {
    pub db: TestDb,
    pub vhost: TestVhost,
    pub config: PathBuf,
    pub dir: tempfile::TempDir,
}

impl Installation {
    /// `installation = name`, with the base settings.
    pub async fn new(name: &str) -> anyhow::Result<Self> {
        let db = TestDb::create().await?;
        let vhost = TestVhost::create().await?;
        let dir = tempfile::tempdir()?;
        let config = dir.path().join("worker-host.toml");
        std::fs::write(&config, base_settings(name, "[]", &db, &vhost, free_port()))?;
        Ok(Self {
            db,
            vhost,
            config,
            dir,
        })
    }

    /// `worker-host topology declare` on its vhost, which must succeed.
    pub fn declare_topology(&self) {
        let declared = host_command(&self.config)
            .args(["topology", "declare"])
            .output()
            .expect("the binary runs");
        assert!(
            declared.status.success(),
            "{}",
            String::from_utf8_lossy(&declared.stderr)
        );
    }
}

/// A `worker-host` command with only this test's settings file in effect.
pub fn host_command(config: &Path) -> Command {
    host_command_for(Path::new(env!("CARGO_BIN_EXE_worker-host")), config)
}

/// [`host_command`] for another build of the binary (the fault-injection build, say).
pub fn host_command_for(binary: &Path, config: &Path) -> Command {
    let mut command = Command::new(binary);
    command
        .arg("--config")
        .arg(config)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .env_remove("WORKER_HOST_CONFIG")
        .env("RUST_LOG", "info");
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("WORKER_HOST__") {
            command.env_remove(key);
        }
    }
    command
}

impl Host {
    /// Starts the host with the settings `settings` writes (given the temporary folder, for
    /// files of its own, and the admin port) and waits until `/readyz` is 200.
    /// `show_log_var` names the variable that has [`Host::stop_cleanly`] print the whole log.
    pub async fn launch(
        show_log_var: &'static str,
        settings: impl FnOnce(&Path, u16) -> anyhow::Result<String>,
    ) -> anyhow::Result<Self> {
        Self::launch_with(show_log_var, &[], settings).await
    }

    /// [`Host::launch`] with environment variables `env` set (overrides, `RUST_LOG`).
    pub async fn launch_with(
        show_log_var: &'static str,
        env: &[(&str, &str)],
        settings: impl FnOnce(&Path, u16) -> anyhow::Result<String>,
    ) -> anyhow::Result<Self> {
        let mut host = Self::spawn(
            Path::new(env!("CARGO_BIN_EXE_worker-host")),
            show_log_var,
            env,
            settings,
        )?;
        host.wait_ready().await?;
        Ok(host)
    }

    /// Starts `binary run` (the test's own build, or another such as the fault-injection
    /// build) as [`Host::launch_with`] does, without waiting for it to be ready.
    pub fn spawn(
        binary: &Path,
        show_log_var: &'static str,
        env: &[(&str, &str)],
        settings: impl FnOnce(&Path, u16) -> anyhow::Result<String>,
    ) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let port = free_port();
        let config = dir.path().join("worker-host.toml");
        std::fs::write(&config, settings(dir.path(), port)?)?;
        let log = dir.path().join("host.log");
        let mut command = host_command_for(binary, &config);
        command.envs(env.iter().copied());
        let child = command
            .arg("run")
            .stdout(std::fs::File::create(dir.path().join("host.out"))?)
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        Ok(Self {
            child,
            port,
            config,
            log,
            show_log_var,
            _dir: dir,
        })
    }

    /// Waits until `/readyz` is 200; fails with the log's tail if the host exits first or
    /// takes longer than [`WAIT`].
    pub async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + WAIT;
        loop {
            if self.readyz().await.ok() == Some(200) {
                return Ok(());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                bail!(
                    "the host exited with {status} before it was ready:\n{}",
                    self.log_tail()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "/readyz did not answer 200 within {WAIT:?}:\n{}",
                    self.log_tail()
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The operating system's id of the host process.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// What the host wrote to stdout.
    pub fn stdout_text(&self) -> String {
        std::fs::read_to_string(self.log.with_file_name("host.out")).unwrap_or_default()
    }

    /// The settings file the host runs with.
    pub fn config_path(&self) -> &Path {
        &self.config
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last lines the host logged, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = self.log_text();
        let lines: Vec<&str> = text.lines().collect();
        let from = lines.len().saturating_sub(60);
        format!(
            "--- last lines of the host's log ---\n{}",
            lines[from..].join("\n")
        )
    }

    /// The log's JSON lines, parsed (a line that is not JSON fails the test: the format is
    /// JSON for log collectors).
    pub fn log_lines(&self) -> Vec<serde_json::Value> {
        self.log_text()
            .lines()
            .filter(|line| !line.trim().is_empty())
            .map(|line| {
                serde_json::from_str(line)
                    .unwrap_or_else(|e| panic!("a log line that is not JSON ({e}): {line}"))
            })
            .collect()
    }

    pub async fn readyz(&self) -> anyhow::Result<u16> {
        let response = reqwest::Client::new()
            .get(self.url("/readyz"))
            .timeout(Duration::from_secs(10))
            .send()
            .await?;
        Ok(response.status().as_u16())
    }

    pub async fn get_text(&self, path: &str) -> anyhow::Result<String> {
        let response = reqwest::Client::new()
            .get(self.url(path))
            .timeout(Duration::from_secs(10))
            .send()
            .await?;
        let status = response.status();
        let text = response.text().await?;
        if !status.is_success() {
            bail!("{path}: HTTP {status}: {text}");
        }
        Ok(text)
    }

    pub async fn status(&self) -> anyhow::Result<serde_json::Value> {
        Ok(serde_json::from_str(&self.get_text("/status").await?)?)
    }

    /// The active alerts on `/status`.
    pub async fn alerts(&self) -> anyhow::Result<Vec<serde_json::Value>> {
        let status = self.status().await?;
        status["alerts"]
            .as_array()
            .cloned()
            .with_context(|| format!("no alerts list on /status: {status}"))
    }

    /// The counts `/status` shows for one job.
    pub async fn counts(&self, job: &str) -> anyhow::Result<serde_json::Value> {
        let status = self.status().await?;
        status["jobs"]
            .as_array()
            .and_then(|jobs| jobs.iter().find(|j| j["name"] == job))
            .map(|j| j["counts"].clone())
            .with_context(|| format!("no job {job} on /status: {status}"))
    }

    pub async fn count(&self, job: &str, key: &str) -> anyhow::Result<u64> {
        let counts = self.counts(job).await?;
        counts[key]
            .as_u64()
            .with_context(|| format!("no count {key} for {job}: {counts}"))
    }

    /// `/metrics`, as scraped.
    pub async fn metrics(&self) -> anyhow::Result<Scrape> {
        Ok(Scrape(self.get_text("/metrics").await?))
    }

    /// Waits until `probe` returns `Some`, at most [`WAIT`], showing the log's tail on failure.
    pub async fn wait_for<T, F, Fut>(&self, what: &str, probe: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = anyhow::Result<Option<T>>>,
    {
        wait_for(what, || self.log_tail(), probe).await
    }

    /// Runs `worker-host ARGS` with this host's settings file; returns the exit code, the
    /// standard output and the standard error.
    pub async fn cli(&self, args: &[&str]) -> anyhow::Result<(Option<i32>, String, String)> {
        let mut command = tokio::process::Command::from(host_command(&self.config));
        let output = tokio::time::timeout(WAIT, command.args(args).output())
            .await
            .with_context(|| format!("worker-host {args:?} did not finish within {WAIT:?}"))??;
        Ok((
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        ))
    }

    /// SIGTERM, then the exit code (None if it did not exit within 30 s and was killed).
    pub async fn stop(&mut self) -> Option<i32> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        None
    }

    /// Stops the host and asserts it exited with 0 within 30 s.
    pub async fn stop_cleanly(mut self) {
        let code = self.stop().await;
        if std::env::var_os(self.show_log_var).is_some() {
            eprintln!("{}", self.log_text());
        }
        assert_eq!(
            code,
            Some(0),
            "SIGTERM must stop the host with exit 0 within 30 s\n{}",
            self.log_tail()
        );
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Metrics
// ---------------------------------------------------------------------------------------------

/// A Prometheus text scrape.
pub struct Scrape(pub String);

impl Scrape {
    /// The metric families (`# TYPE name kind`).
    pub fn families(&self) -> BTreeSet<String> {
        self.0
            .lines()
            .filter_map(|line| line.strip_prefix("# TYPE "))
            .filter_map(|rest| rest.split_whitespace().next())
            .map(str::to_string)
            .collect()
    }

    /// The sum of the samples of `name` whose labels include all of `want`.
    pub fn sum(&self, name: &str, want: &[(&str, &str)]) -> f64 {
        self.0
            .lines()
            .filter(|line| !line.starts_with('#'))
            .filter_map(|line| {
                let (series, value) = line.rsplit_once(' ')?;
                let (metric, labels) = match series.split_once('{') {
                    Some((metric, rest)) => (metric, parse_labels(rest.strip_suffix('}')?)),
                    None => (series, BTreeMap::new()),
                };
                let selected = metric == name
                    && want
                        .iter()
                        .all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v));
                selected.then(|| value.parse::<f64>().ok()).flatten()
            })
            .sum()
    }

    /// `worker_messages_total` for one job and outcome.
    pub fn messages(&self, job: &str, outcome: &str) -> f64 {
        self.sum(
            "worker_messages_total",
            &[("job", job), ("outcome", outcome)],
        )
    }

    /// The values of label `label` among the samples of `name`.
    pub fn label_values(&self, name: &str, label: &str) -> BTreeSet<String> {
        self.0
            .lines()
            .filter(|line| !line.starts_with('#'))
            .filter_map(|line| {
                let (series, _) = line.rsplit_once(' ')?;
                let (metric, rest) = series.split_once('{')?;
                (metric == name)
                    .then(|| parse_labels(rest.strip_suffix('}')?).remove(label))
                    .flatten()
            })
            .collect()
    }
}

/// `a="x",b="y \"quoted\""` into a map.
fn parse_labels(text: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut chars = text.chars().peekable();
    loop {
        let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
        if key.is_empty() || chars.next() != Some('"') {
            return labels;
        }
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(other) => value.push(other),
                    None => {}
                },
                '"' => break,
                other => value.push(other),
            }
        }
        labels.insert(key.trim().to_string(), value);
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Broker
// ---------------------------------------------------------------------------------------------

// Not every test file publishes.
#[allow(unused_imports)]
pub use worker_testkit::amqp::publish_confirmed;

// ---------------------------------------------------------------------------------------------
// Mail
// ---------------------------------------------------------------------------------------------

/// A pinging `email.received` event from `from`, as the poller would emit it.
pub fn ping_from(from: &str, n: usize) -> (lapin::BasicProperties, Vec<u8>) {
    let id = uuid::Uuid::new_v4();
    let event = serde_json::json!({
        "id": id,
        "type": "email.received",
        "occurred_at": chrono::Utc::now(),
        "data": {
            "inbound_email_id": uuid::Uuid::new_v4(),
            "account": "test",
            "mailbox": "INBOX",
            "message_id": format!("ping-{id}@test"),
            "from": from,
            "from_name": null,
            "to": ["host@localhost"],
            "subject": format!("ping {n}"),
            "text": "are you there?",
            "references": [],
            "parse_error": null,
        },
    });
    let properties = lapin::BasicProperties::default()
        .with_delivery_mode(2)
        .with_message_id(id.to_string().into())
        .with_content_type("application/json".into());
    (properties, serde_json::to_vec(&event).unwrap())
}

/// Publishes `count` pings from `from` to the events exchange, as the outbox drain would: the
/// demo automation answers each with a mail to `from`.
pub async fn publish_pings(vhost: &TestVhost, from: &str, count: usize) -> anyhow::Result<()> {
    let pings: Vec<_> = (0..count).map(|n| ping_from(from, n)).collect();
    let messages: Vec<(lapin::BasicProperties, &[u8])> = pings
        .iter()
        .map(|(properties, body)| (properties.clone(), body.as_slice()))
        .collect();
    worker_testkit::amqp::publish_confirmed(vhost, "events", "email.received", &messages).await
}

/// Sends a mail from `from` to `to` over the local SMTP server; returns its Message-ID
/// (`ping-<uuid>@<domain>`, without angle brackets).
pub async fn send_mail(
    from: &str,
    to: &str,
    subject: &str,
    domain: &str,
) -> anyhow::Result<String> {
    let message_id = format!("ping-{}@{domain}", uuid::Uuid::new_v4().simple());
    let mail = Message::builder()
        .from(from.parse::<Mailbox>()?)
        .to(to.parse::<Mailbox>()?)
        .subject(subject)
        .message_id(Some(format!("<{message_id}>")))
        .body("are you there?".to_string())?;
    let addr = worker_testkit::smtp_addr();
    let (host, port) = addr.rsplit_once(':').context("WH_TEST_SMTP is host:port")?;
    let smtp = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(host)
        .port(port.parse()?)
        .timeout(Some(Duration::from_secs(20)))
        .build();
    smtp.send(mail).await.context("sending the mail")?;
    Ok(message_id)
}

/// While it lives, the local SMTP server answers RCPT for `address` with `reply`.
pub struct SmtpFailSwitch {
    path: PathBuf,
}

impl SmtpFailSwitch {
    pub fn set(address: &str, reply: &str) -> anyhow::Result<Self> {
        let dir = worker_testkit::services_dir().join("smtp-fail");
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(address);
        std::fs::write(&path, format!("{reply}\n"))
            .with_context(|| format!("writing the switch {}", path.display()))?;
        Ok(Self { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SmtpFailSwitch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A mail as read back over IMAP.
#[derive(Debug)]
pub struct ReceivedMail {
    pub subject: Option<String>,
    pub in_reply_to: Vec<String>,
    pub to: Vec<String>,
}

fn parse_mail(raw: &[u8]) -> anyhow::Result<ReceivedMail> {
    let message = mail_parser::MessageParser::default()
        .parse(raw)
        .context("a mail that does not parse")?;
    let in_reply_to = match message.in_reply_to() {
        mail_parser::HeaderValue::Text(id) => vec![id.to_string()],
        mail_parser::HeaderValue::TextList(ids) => ids.iter().map(|id| id.to_string()).collect(),
        _ => Vec::new(),
    };
    let to = message
        .to()
        .map(|to| {
            to.iter()
                .filter_map(|a| a.address().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    Ok(ReceivedMail {
        subject: message.subject().map(str::to_string),
        in_reply_to,
        to,
    })
}

/// Opens `user`'s INBOX (password `secret`) read-only, so nothing changes, and runs `read`
/// on the session and the sequence numbers of every mail in it; at most 20 s in all.
async fn read_inbox<T, F, Fut>(user: &str, read: F) -> anyhow::Result<T>
where
    F: FnOnce(async_imap::Session<tokio::net::TcpStream>, Vec<u32>) -> Fut,
    Fut: Future<Output = anyhow::Result<(async_imap::Session<tokio::net::TcpStream>, T)>>,
{
    tokio::time::timeout(Duration::from_secs(20), async {
        let stream = tokio::net::TcpStream::connect(worker_testkit::imap_addr()).await?;
        let mut client = async_imap::Client::new(stream);
        let _greeting = client.read_response().await?;
        let mut session = client.login(user, "secret").await.map_err(|(err, _)| err)?;
        session.examine("INBOX").await?;
        let mut seqs: Vec<u32> = session.search("ALL").await?.into_iter().collect();
        seqs.sort_unstable();
        let (mut session, value) = read(session, seqs).await?;
        session.logout().await?;
        anyhow::Ok(value)
    })
    .await
    .with_context(|| format!("reading {user}'s INBOX over IMAP timed out"))?
}

/// Every mail in `user`'s INBOX, read over IMAP (read-only).
pub async fn inbox(user: &str) -> anyhow::Result<Vec<ReceivedMail>> {
    let raw = read_inbox(user, |mut session, seqs| async move {
        let mut raw = Vec::new();
        if !seqs.is_empty() {
            let set: Vec<String> = seqs.iter().map(u32::to_string).collect();
            let fetched: Vec<_> = session
                .fetch(set.join(","), "RFC822")
                .await?
                .try_collect()
                .await?;
            raw.extend(
                fetched
                    .iter()
                    .map(|f| f.body().unwrap_or_default().to_vec()),
            );
        }
        Ok((session, raw))
    })
    .await?;
    raw.iter().map(|m| parse_mail(m)).collect()
}

/// How many mails `user`'s INBOX holds (read-only).
pub async fn inbox_count(user: &str) -> anyhow::Result<usize> {
    read_inbox(
        user,
        |session, seqs| async move { Ok((session, seqs.len())) },
    )
    .await
}

// ---------------------------------------------------------------------------------------------
// Webhook receivers
// ---------------------------------------------------------------------------------------------

/// A local HTTP receiver for webhook actions: it reads each whole request (headers and a
/// `Content-Length` body), answers `response` (a full HTTP/1.1 head, e.g.
/// `"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n"`) with `Connection: close`, and counts the
/// requests it answered. Returns its port and the count.
pub async fn http_receiver(
    response: &'static str,
) -> anyhow::Result<(u16, std::sync::Arc<std::sync::atomic::AtomicUsize>)> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let counted = counted.clone();
            tokio::spawn(async move {
                if answer(stream, response).await.is_ok() {
                    counted.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
    });
    Ok((port, calls))
}

async fn answer(mut stream: tokio::net::TcpStream, response: &str) -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut request = Vec::new();
    let mut buf = [0u8; 4096];
    let body_start = loop {
        let n = stream.read(&mut buf).await?;
        anyhow::ensure!(n > 0, "the client went away mid-request");
        request.extend_from_slice(&buf[..n]);
        if let Some(at) = request.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
    };
    let head = String::from_utf8_lossy(&request[..body_start]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while request.len() < body_start + length {
        let n = stream.read(&mut buf).await?;
        anyhow::ensure!(n > 0, "the client went away mid-body");
        request.extend_from_slice(&buf[..n]);
    }
    stream
        .write_all(format!("{response}Connection: close\r\n\r\n").as_bytes())
        .await?;
    stream.shutdown().await?;
    Ok(())
}

/// Keeps a copy of every outbox row written from now on in `outbox_copy` (a trigger on the
/// test's database), since the drain deletes a row once the broker confirmed it: a test that
/// needs what was published (its body, its properties) reads the copy. Call it once the host
/// has migrated the database, before the work the test reads.
pub async fn keep_outbox_copies(db: &TestDb) -> anyhow::Result<()> {
    for statement in [
        "CREATE TABLE outbox_copy (LIKE outbox)",
        "CREATE FUNCTION outbox_copy() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN INSERT INTO outbox_copy SELECT NEW.*; RETURN NEW; END $$",
        "CREATE TRIGGER outbox_copy AFTER INSERT ON outbox \
         FOR EACH ROW EXECUTE FUNCTION outbox_copy()",
    ] {
        sqlx::query(statement).execute(&db.pool).await?;
    }
    Ok(())
}
