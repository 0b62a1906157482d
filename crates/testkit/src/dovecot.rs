//! A private Dovecot for tests and fault scenarios that stop the IMAP server or need it
//! configured otherwise (TLS): `dovecot -F` with the shared configuration's mail location,
//! users and passwords (`<services dir>/dovecot/dovecot.conf`, as `scripts/services.sh` writes
//! it), but a port, `base_dir`, `state_dir`, log and `instance_name` of its own, in the
//! foreground as the caller's child, stopped when the value is dropped. The shared Dovecot is
//! never touched.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::tls::ServerCert;

/// How long a start or a stop may take.
const PROCESS_WAIT: Duration = Duration::from_secs(20);

/// A private Dovecot; see the module's doc.
#[derive(Debug)]
pub struct Dovecot {
    /// The IMAP port (plain, STARTTLS when TLS is on), on 127.0.0.1.
    pub port: u16,
    /// The IMAPS port (TLS from the first byte), when started with TLS.
    pub imaps_port: Option<u16>,
    config: PathBuf,
    log: PathBuf,
    process: Option<Child>,
    _temp: Option<tempfile::TempDir>,
}

impl Dovecot {
    /// Writes the configuration into `dir` (see the module's doc); [`Self::start`] starts it.
    pub fn configure(dir: &Path) -> anyhow::Result<Self> {
        Self::configure_with(dir, None)
    }

    /// A started server in a temporary folder of its own that serves TLS with `cert`: STARTTLS
    /// on [`Self::port`] and TLS from the first byte on [`Self::imaps_port`].
    pub async fn start_with_tls(cert: &ServerCert) -> anyhow::Result<Self> {
        let temp = tempfile::Builder::new()
            .prefix("wh-dovecot-")
            .tempdir()
            .context("creating the Dovecot's folder")?;
        let mut server = Self::configure_with(temp.path(), Some(cert))?;
        server._temp = Some(temp);
        server.start().await?;
        Ok(server)
    }

    fn configure_with(dir: &Path, tls: Option<&ServerCert>) -> anyhow::Result<Self> {
        let shared = crate::services_dir().join("dovecot/dovecot.conf");
        let text = std::fs::read_to_string(&shared)
            .with_context(|| format!("reading the shared Dovecot's {}", shared.display()))?;
        let shared_port = crate::imap_addr()
            .rsplit_once(':')
            .map(|(_, port)| port.to_string())
            .context("WH_TEST_IMAP is host:port")?;
        std::fs::create_dir_all(dir)?;
        let dir = dir.canonicalize()?;
        let port = free_port()?;
        let log = dir.join("dovecot.log");
        let id = &uuid::Uuid::new_v4().simple().to_string()[..8];
        let tls = match tls {
            Some(cert) => Some((cert.copy_to(&dir.join("tls"))?, free_port()?)),
            None => None,
        };
        let config = private_config(
            &text,
            &Private {
                dir: &dir,
                log: &log,
                shared_port: &shared_port,
                port,
                id,
                tls: tls.as_ref().map(|(cert, port)| (cert, *port)),
            },
        )?;
        let path = dir.join("dovecot.conf");
        std::fs::write(&path, config)?;
        Ok(Self {
            port,
            imaps_port: tls.map(|(_, port)| port),
            config: path,
            log,
            process: None,
            _temp: None,
        })
    }

    /// Adds a setting line to the configuration (`imap_capability = IMAP4rev1`, say); takes
    /// effect at the next [`Self::start`].
    pub fn add_setting(&self, line: &str) -> anyhow::Result<()> {
        let mut text = std::fs::read_to_string(&self.config)?;
        text.push('\n');
        text.push_str(line);
        text.push('\n');
        std::fs::write(&self.config, text)?;
        Ok(())
    }

    /// `127.0.0.1:port` of the IMAP listener.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Starts the server and waits until its ports take connections.
    pub async fn start(&mut self) -> anyhow::Result<()> {
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
            let mut up = tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .is_ok();
            if let Some(port) = self.imaps_port {
                up = up
                    && tokio::net::TcpStream::connect(("127.0.0.1", port))
                        .await
                        .is_ok();
            }
            if up {
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
    pub async fn stop(&mut self) -> anyhow::Result<()> {
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

impl Drop for Dovecot {
    fn drop(&mut self) {
        crate::blocking_cleanup(|| self.stop_now());
    }
}

impl Dovecot {
    fn stop_now(&mut self) {
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

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// What a private configuration changes in the shared one.
struct Private<'a> {
    dir: &'a Path,
    log: &'a Path,
    shared_port: &'a str,
    port: u16,
    id: &'a str,
    /// The certificate to serve and the IMAPS port.
    tls: Option<(&'a ServerCert, u16)>,
}

/// The shared configuration with the private server's folders, log, port and instance name
/// (and, with TLS, `ssl = yes`, the certificate and the IMAPS port).
fn private_config(shared: &str, private: &Private<'_>) -> anyhow::Result<String> {
    let mut out = format!("instance_name = wh-dovecot-{}\n", private.id);
    let mut port_set = false;
    let mut in_imaps = false;
    for line in shared.lines() {
        let trimmed = line.trim_start();
        let key_is = |key: &str| {
            trimmed
                .strip_prefix(key)
                .is_some_and(|rest| rest.starts_with([' ', '=']))
        };
        if trimmed.starts_with("inet_listener ") {
            in_imaps = trimmed.starts_with("inet_listener imaps");
        }
        let replaced = if key_is("base_dir") {
            format!("base_dir = {}", private.dir.join("run").display())
        } else if key_is("state_dir") {
            format!("state_dir = {}", private.dir.join("state").display())
        } else if key_is("log_path") {
            format!("log_path = {}", private.log.display())
        } else if key_is("instance_name") {
            continue;
        } else if let (true, Some((cert, _))) = (key_is("ssl"), private.tls) {
            format!(
                "ssl = yes\nssl_cert = <{}\nssl_key = <{}",
                cert.cert.display(),
                cert.key.display()
            )
        } else if let (true, Some((_, imaps))) = (in_imaps && key_is("port"), private.tls) {
            format!("    port = {imaps}")
        } else if trimmed.replace(' ', "") == format!("port={}", private.shared_port) {
            port_set = true;
            format!("    port = {}", private.port)
        } else {
            line.to_string()
        };
        out.push_str(&replaced);
        out.push('\n');
    }
    anyhow::ensure!(
        port_set,
        "the shared Dovecot configuration has no `port = {}` line to replace",
        private.shared_port
    );
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const SHARED: &str = "base_dir = /s/run\nstate_dir = /s/state\nlog_path = /s/log\nssl = no\n\
                          mail_location = maildir:/m/%u/Maildir\nservice imap-login {\n  \
                          inet_listener imap {\n    port = 10143\n  }\n  \
                          inet_listener imaps {\n    port = 0\n  }\n}\n\
                          service pop3-login {\n  inet_listener pop3 {\n    port = 0\n  }\n}\n";

    fn private(tls: Option<(&ServerCert, u16)>) -> String {
        let dir = Path::new("/p");
        let log = dir.join("dovecot.log");
        private_config(
            SHARED,
            &Private {
                dir,
                log: &log,
                shared_port: "10143",
                port: 20000,
                id: "abc",
                tls,
            },
        )
        .unwrap()
    }

    #[test]
    fn the_private_configuration_replaces_folders_log_and_port_only() {
        let text = private(None);
        assert!(text.starts_with("instance_name = wh-dovecot-abc\n"));
        assert!(text.contains("base_dir = /p/run\n"));
        assert!(text.contains("state_dir = /p/state\n"));
        assert!(text.contains("log_path = /p/dovecot.log\n"));
        assert!(text.contains("mail_location = maildir:/m/%u/Maildir\n"));
        assert!(text.contains("port = 20000\n"));
        assert!(text.contains("ssl = no\n"));
        assert!(!text.contains("10143"));
    }

    #[test]
    fn with_tls_the_private_configuration_serves_the_certificate_on_the_imaps_port() {
        let cert = ServerCert {
            cert: "/p/tls/server.pem".into(),
            key: "/p/tls/server.key".into(),
        };
        let text = private(Some((&cert, 20001)));
        assert!(text.contains("ssl = yes\nssl_cert = </p/tls/server.pem\n"));
        assert!(text.contains("ssl_key = </p/tls/server.key\n"));
        assert!(text.contains("inet_listener imaps {\n    port = 20001\n"));
        // pop3 stays off.
        assert!(text.contains("inet_listener pop3 {\n    port = 0\n"));
    }
}
