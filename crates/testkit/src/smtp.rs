//! A private instance of the project's SMTP sink (`scripts/smtp_sink.py` under aiosmtpd) for
//! one test: its own loopback port and its own folder of mail and switches, so that a test
//! can slow down or fail the server without touching the shared sink on 2525.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// A running SMTP sink of one test's own, killed when dropped.
#[derive(Debug)]
pub struct SmtpSink {
    /// The port it listens on, on 127.0.0.1.
    pub port: u16,
    dir: tempfile::TempDir,
    child: Child,
}

/// The Python that can import aiosmtpd: Debian's `/usr/bin/python3` first (it may not be the
/// first `python3` on PATH, e.g. under pyenv), then `python3`.
fn python() -> anyhow::Result<&'static str> {
    for candidate in ["/usr/bin/python3", "python3"] {
        let ok = Command::new(candidate)
            .args(["-c", "import aiosmtpd"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Ok(candidate);
        }
    }
    bail!("no python3 with aiosmtpd (scripts/services.sh up installs python3-aiosmtpd)")
}

impl SmtpSink {
    /// Starts a sink on a free loopback port and waits until it takes connections.
    pub fn start() -> anyhow::Result<Self> {
        Self::start_with(&[])
    }

    /// [`Self::start`], with STARTTLS offered (and required before MAIL) with `cert`.
    pub fn start_with_starttls(cert: &crate::ServerCert) -> anyhow::Result<Self> {
        let cert_path = cert.cert.display().to_string();
        let key_path = cert.key.display().to_string();
        Self::start_with(&["--tlscert", &cert_path, "--tlskey", &key_path])
    }

    fn start_with(extra: &[&str]) -> anyhow::Result<Self> {
        let scripts = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts");
        let dir = tempfile::Builder::new()
            .prefix("wh-smtp-sink-")
            .tempdir()
            .context("creating the SMTP sink's folder")?;
        for sub in ["mail", "smtp-fail", "smtp-delay"] {
            std::fs::create_dir_all(dir.path().join(sub))?;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let log = std::fs::File::create(dir.path().join("smtp.log"))?;
        let child = Command::new(python()?)
            .args(["-m", "aiosmtpd", "-n", "-l"])
            .arg(format!("127.0.0.1:{port}"))
            .args(extra)
            .args(["-c", "smtp_sink.Handler"])
            .env("PYTHONPATH", &scripts)
            .env("WH_SERVICES_DIR", dir.path())
            .env_remove("WH_MAIL_DIR")
            .env_remove("WH_SMTP_FAIL_DIR")
            .env_remove("WH_SMTP_DELAY_DIR")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting the SMTP sink")?;
        let mut sink = Self { port, dir, child };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(sink);
            }
            if let Some(status) = sink.child.try_wait()? {
                bail!("the SMTP sink exited ({status}): {}", sink.log());
            }
            if Instant::now() > deadline {
                bail!("the SMTP sink did not listen within 15 s: {}", sink.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `127.0.0.1:port`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The sink's folder (its services dir).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Holds back the answer to the end of DATA of every mail to `address` by `delay` (the
    /// mail is delivered at once), until [`SmtpSink::answer_at_once`].
    pub fn delay_answer(&self, address: &str, delay: Duration) -> anyhow::Result<()> {
        std::fs::write(
            self.dir.path().join("smtp-delay").join(address),
            format!("{}\n", delay.as_secs_f64()),
        )?;
        Ok(())
    }

    /// Removes the late-answer switch of `address`.
    pub fn answer_at_once(&self, address: &str) -> anyhow::Result<()> {
        match std::fs::remove_file(self.dir.path().join("smtp-delay").join(address)) {
            Err(err) if err.kind() != std::io::ErrorKind::NotFound => Err(err.into()),
            _ => Ok(()),
        }
    }

    /// Answers RCPT for `address` with `reply` (e.g. `451 4.3.0 try later`) until removed.
    pub fn fail_recipient(&self, address: &str, reply: &str) -> anyhow::Result<()> {
        std::fs::write(
            self.dir.path().join("smtp-fail").join(address),
            format!("{reply}\n"),
        )?;
        Ok(())
    }

    /// Accepts `address` again after [`SmtpSink::fail_recipient`].
    pub fn accept_recipient(&self, address: &str) -> anyhow::Result<()> {
        match std::fs::remove_file(self.dir.path().join("smtp-fail").join(address)) {
            Err(err) if err.kind() != std::io::ErrorKind::NotFound => Err(err.into()),
            _ => Ok(()),
        }
    }

    /// The mails delivered to `local_part` (lower case), raw.
    pub fn delivered(&self, local_part: &str) -> Vec<Vec<u8>> {
        let maildir = self
            .dir
            .path()
            .join("mail")
            .join(local_part)
            .join("Maildir");
        let mut mails = Vec::new();
        for sub in ["new", "cur"] {
            let Ok(entries) = std::fs::read_dir(maildir.join(sub)) else {
                continue;
            };
            let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
            paths.sort();
            mails.extend(paths.iter().filter_map(|p| std::fs::read(p).ok()));
        }
        mails
    }

    /// The sink's log, for a failure message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("smtp.log")).unwrap_or_default()
    }
}

impl Drop for SmtpSink {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
