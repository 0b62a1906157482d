//! The fleet view as its tests reach it: installations (a host each, on a database, a vhost
//! and an SMTP sink of its own, with a `viewer` account and its API token), and the fleet
//! view itself, the real binary's `worker-host fleet` on a settings file of the test's own.

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use worker_testkit::{SmtpSink, TestDb, TestVhost};

use super::{
    Host, base_settings, free_port, host_command, publish_pings, short_id, wait_for,
    write_automation,
};

/// The password of every installation's viewer account (the browser signs in with it).
pub const VIEWER_PASSWORD: &str = "fleet-viewer-password";

/// One installation: its host, stores, and its viewer account's API token.
pub struct Installation {
    pub name: String,
    pub host: Host,
    pub db: TestDb,
    pub vhost: TestVhost,
    pub sink: SmtpSink,
    /// `fail-<id>@localhost`: the sink refuses it, so its pings' replies become dead letters.
    pub refused: String,
    /// The API token of its account `fleet` (role viewer).
    pub token: String,
}

impl Installation {
    /// Starts installation `name` with `admin` lines of its own (`environment = ...`), and
    /// makes its viewer account `fleet` and a token of it.
    pub async fn start(
        show_log_var: &'static str,
        name: &str,
        admin: &str,
    ) -> anyhow::Result<Self> {
        let db = TestDb::create().await?;
        let vhost = TestVhost::create().await?;
        let sink = SmtpSink::start()?;
        let refused = format!("fail-{}@localhost", short_id());
        sink.fail_recipient(&refused, "550 5.1.1 no such user")?;
        let smtp_port = sink
            .addr()
            .rsplit_once(':')
            .map_or("2525", |(_, p)| p)
            .to_string();
        let host = Host::launch(show_log_var, |dir, port| {
            let automations = write_automation(dir)?;
            let settings = base_settings(name, &automations, &db, &vhost, port)
                .replacen("[admin]\n", &format!("[admin]\n{admin}\n"), 1);
            Ok(format!(
                "{settings}\n[admin.password_hashing]\nmemory_kib = 1024\niterations = 1\nparallelism = 1\n\n[smtp]\nport = {smtp_port}\n\n[alerts]\ninterval = \"500ms\"\n"
            ))
        })
        .await?;
        let config = host.config_path().to_path_buf();
        run_operators(
            &config,
            &["add", "fleet", "--role", "viewer", "--password-stdin"],
            VIEWER_PASSWORD,
        )?;
        let token = run_operators(&config, &["token", "fleet", "--label", "fleet-view"], "")?;
        Ok(Self {
            name: name.to_string(),
            host,
            db,
            vhost,
            sink,
            refused,
            token,
        })
    }

    /// `count` pings from the refused address; waits until their replies are dead letters.
    pub async fn dead_letters(&self, count: i64) -> anyhow::Result<()> {
        publish_pings(&self.vhost, &self.refused, usize::try_from(count)?).await?;
        let pool = &self.db.pool;
        wait_for(
            "the refused replies in the archive",
            || self.host.log_tail(),
            || async {
                let n: i64 =
                    sqlx::query_scalar("SELECT count(*) FROM dead_letters WHERE status = 'dead'")
                        .fetch_one(pool)
                        .await?;
                Ok((n >= count).then_some(()))
            },
        )
        .await;
        Ok(())
    }

    /// The highest migration applied to its database.
    pub async fn schema_version(&self) -> anyhow::Result<i64> {
        Ok(
            sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations")
                .fetch_one(&self.db.pool)
                .await?,
        )
    }
}

/// `worker-host operators <args>` on `config` with `stdin`; its standard output, trimmed.
fn run_operators(config: &Path, args: &[&str], stdin: &str) -> anyhow::Result<String> {
    use std::io::Write;
    let mut child = host_command(config)
        .arg("operators")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    if let Some(mut input) = child.stdin.take() {
        input.write_all(stdin.as_bytes())?;
    }
    let output = child.wait_with_output()?;
    if !output.status.success() {
        bail!(
            "operators {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// `worker-host fleet` on a settings file of its own, stopped (killed) when dropped.
pub struct FleetView {
    child: Child,
    pub port: u16,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl FleetView {
    /// Writes `settings` (without `listen`, which this adds) and starts the view; waits for
    /// its `/healthz`.
    pub async fn start(settings: &str) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let port = free_port();
        let config = dir.path().join("fleet.toml");
        std::fs::write(
            &config,
            format!("listen = \"127.0.0.1:{port}\"\n{settings}"),
        )?;
        let log = dir.path().join("fleet.log");
        let child = host_command(&config)
            .arg("fleet")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("starting worker-host fleet")?;
        let mut view = Self {
            child,
            port,
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let up = reqwest::get(view.url("/healthz"))
                .await
                .is_ok_and(|r| r.status().is_success());
            if up {
                return Ok(view);
            }
            if let Ok(Some(status)) = view.child.try_wait() {
                bail!("the fleet view exited with {status}:\n{}", view.log_text());
            }
            if Instant::now() > deadline {
                bail!(
                    "the fleet view did not answer within 30 s:\n{}",
                    view.log_text()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then the exit code (None if it did not exit within 10 s).
    pub async fn stop(&mut self) -> Option<i32> {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }
}

impl Drop for FleetView {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A TCP port that accepts connections and never answers: an installation that hangs.
pub async fn silent_listener() -> anyhow::Result<(std::net::SocketAddr, tokio::task::JoinHandle<()>)>
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    Ok((addr, task))
}
