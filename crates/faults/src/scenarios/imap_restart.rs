//! `imap-restart`: the IMAP server the poller reads restarted, on a private Dovecot of the
//! scenario's own that serves the shared mail folders (the shared Dovecot is never touched).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::{Fault, Load, Scenario};
use crate::run::{Run, Setup};

/// How long the server stays down between its stop and its new start.
const DOWN: Duration = Duration::from_secs(3);

/// How long a start or a stop may take.
const PROCESS_WAIT: Duration = Duration::from_secs(20);

pub fn scenario() -> Scenario {
    Scenario {
        name: "imap-restart",
        about: "The poller reads a private Dovecot that the scenario starts (`dovecot -F` with \
                the shared configuration's mail location, users and passwords, but a port, \
                `base_dir`, `state_dir`, log and `instance_name` of its own under the \
                scenario's folder; the shared Dovecot, which the SMTP sink delivers for and the \
                harness reads replies from, is never touched). At a random moment of each \
                repetition the private server is stopped with SIGTERM (every IMAP connection \
                closed), stays down 3 s (connections refused) and is started again. \"Ready \
                again\" is from the stop.",
        fault: Some(|| Box::new(ImapRestart::default())),
        full: Load {
            repetitions: 10,
            per_repetition: 20,
        },
        quick: Load {
            repetitions: 1,
            per_repetition: 20,
        },
        rate_per_sec: 2.0,
        settle: Duration::from_secs(180),
        heartbeat: super::DEFAULT_HEARTBEAT,
    }
}

/// The fault: see [`scenario`]'s description.
#[derive(Default)]
struct ImapRestart {
    server: Option<PrivateDovecot>,
}

#[async_trait::async_trait]
impl Fault for ImapRestart {
    async fn prepare(&mut self, dir: &Path) -> anyhow::Result<Setup> {
        let mut server = PrivateDovecot::configure(&dir.join("dovecot"))?;
        server.start().await?;
        let port = server.port;
        self.server = Some(server);
        Ok(Setup {
            imap_port: Some(port),
            ..Setup::default()
        })
    }

    async fn apply(&mut self, run: &mut Run) -> anyhow::Result<()> {
        let server = self
            .server
            .as_mut()
            .context("the private Dovecot was not started")?;
        let stopped = Instant::now();
        server.stop().await?;
        tokio::time::sleep(DOWN).await;
        server.start().await?;
        run.record_ready_after(stopped).await
    }
}

/// A Dovecot of the scenario's own, in the foreground as the harness's child, stopped when
/// the value is dropped.
struct PrivateDovecot {
    config: PathBuf,
    log: PathBuf,
    port: u16,
    process: Option<Child>,
}

impl PrivateDovecot {
    /// Writes the configuration into `dir`: the shared one (`<services dir>/dovecot/
    /// dovecot.conf`, as `scripts/services.sh` writes it) with the folders, the log, the
    /// port and the instance name replaced.
    fn configure(dir: &Path) -> anyhow::Result<Self> {
        let shared = worker_testkit::services_dir().join("dovecot/dovecot.conf");
        let text = std::fs::read_to_string(&shared)
            .with_context(|| format!("reading the shared Dovecot's {}", shared.display()))?;
        let shared_port = worker_testkit::imap_addr()
            .rsplit_once(':')
            .map(|(_, port)| port.to_string())
            .context("WH_TEST_IMAP is host:port")?;
        std::fs::create_dir_all(dir)?;
        let dir = dir.canonicalize()?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let log = dir.join("dovecot.log");
        let id = &uuid::Uuid::new_v4().simple().to_string()[..8];
        let config = private_config(&text, &dir, &log, &shared_port, port, id)?;
        let path = dir.join("dovecot.conf");
        std::fs::write(&path, config)?;
        Ok(Self {
            config: path,
            log,
            port,
            process: None,
        })
    }

    /// Starts the server and waits until its port takes connections.
    async fn start(&mut self) -> anyhow::Result<()> {
        let child = Command::new("dovecot")
            .arg("-F")
            .arg("-c")
            .arg(&self.config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the private Dovecot (is dovecot installed?)")?;
        self.process = Some(child);
        let deadline = Instant::now() + PROCESS_WAIT;
        loop {
            if tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .is_ok()
            {
                return Ok(());
            }
            if let Some(child) = self.process.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                bail!(
                    "the private Dovecot exited with {status}; its log: {}",
                    self.log.display()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "the private Dovecot did not listen within {PROCESS_WAIT:?}; its log: {}",
                    self.log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// SIGTERM, and waits for the exit (SIGKILL after the wait).
    async fn stop(&mut self) -> anyhow::Result<()> {
        let Some(mut child) = self.process.take() else {
            return Ok(());
        };
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .context("running kill -TERM")?;
        if !status.success() {
            bail!("kill -TERM {} failed: {status}", child.id());
        }
        let deadline = Instant::now() + PROCESS_WAIT;
        while Instant::now() < deadline {
            if child.try_wait()?.is_some() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        child.kill()?;
        child.wait()?;
        Ok(())
    }
}

impl Drop for PrivateDovecot {
    fn drop(&mut self) {
        if let Some(mut child) = self.process.take()
            && let Ok(None) = child.try_wait()
        {
            // SIGTERM lets the master end its children; SIGKILL if it does not go.
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            for _ in 0..100 {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The shared configuration with the private server's folders, log, port and instance name.
fn private_config(
    shared: &str,
    dir: &Path,
    log: &Path,
    shared_port: &str,
    port: u16,
    id: &str,
) -> anyhow::Result<String> {
    let mut out = format!("instance_name = faults-imap-restart-{id}\n");
    let mut port_set = false;
    for line in shared.lines() {
        let trimmed = line.trim_start();
        let replaced = if trimmed.starts_with("base_dir ") || trimmed.starts_with("base_dir=") {
            format!("base_dir = {}", dir.join("run").display())
        } else if trimmed.starts_with("state_dir ") || trimmed.starts_with("state_dir=") {
            format!("state_dir = {}", dir.join("state").display())
        } else if trimmed.starts_with("log_path ") || trimmed.starts_with("log_path=") {
            format!("log_path = {}", log.display())
        } else if trimmed.starts_with("instance_name") {
            continue;
        } else if trimmed.replace(' ', "") == format!("port={shared_port}") {
            port_set = true;
            format!("    port = {port}")
        } else {
            line.to_string()
        };
        out.push_str(&replaced);
        out.push('\n');
    }
    anyhow::ensure!(
        port_set,
        "the shared Dovecot configuration has no `port = {shared_port}` line to replace"
    );
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_private_configuration_replaces_folders_log_and_port_only() {
        let shared = "base_dir = /s/run\nstate_dir = /s/state\nlog_path = /s/log\n\
                      mail_location = maildir:/m/%u/Maildir\nservice imap-login {\n  \
                      inet_listener imap {\n    port = 10143\n  }\n}\n";
        let dir = std::path::Path::new("/p");
        let text =
            super::private_config(shared, dir, &dir.join("dovecot.log"), "10143", 20000, "abc")
                .unwrap();
        assert!(text.starts_with("instance_name = faults-imap-restart-abc\n"));
        assert!(text.contains("base_dir = /p/run\n"));
        assert!(text.contains("state_dir = /p/state\n"));
        assert!(text.contains("log_path = /p/dovecot.log\n"));
        assert!(text.contains("mail_location = maildir:/m/%u/Maildir\n"));
        assert!(text.contains("port = 20000\n"));
        assert!(!text.contains("10143"));
    }
}
