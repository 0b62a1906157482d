//! The host under test: the release `worker-host` binary started with the scenario's settings
//! file, its log appended to a file of the scenario's own, and the signals the scenarios send.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// How long a host may take to answer `/readyz` 200 before the harness gives up.
pub const READY_WAIT: Duration = Duration::from_secs(60);

/// A running `worker-host run`.
#[derive(Debug)]
pub struct HostProcess {
    child: Child,
    pub port: u16,
    /// When this process was started.
    pub started: Instant,
}

/// How to start the host: the binary, the settings file, the log and the admin port.
#[derive(Debug, Clone)]
pub struct HostCommand {
    pub binary: PathBuf,
    pub config: PathBuf,
    pub log: PathBuf,
    pub port: u16,
    /// `WORKER_HOST__…` overrides of the settings file.
    pub env: Vec<(String, String)>,
}

impl HostCommand {
    /// Starts a new process (its log appended to the scenario's).
    pub fn spawn(&self) -> anyhow::Result<HostProcess> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        let mut command = Command::new(&self.binary);
        command
            .arg("--config")
            .arg(&self.config)
            .arg("run")
            .env_remove("WORKER_HOST_CONFIG")
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("WORKER_HOST__") {
                command.env_remove(key);
            }
        }
        command.envs(self.env.iter().map(|(k, v)| (k, v)));
        let started = Instant::now();
        let child = command
            .spawn()
            .with_context(|| format!("starting {}", self.binary.display()))?;
        Ok(HostProcess {
            child,
            port: self.port,
            started,
        })
    }
}

impl HostProcess {
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// `/readyz`'s status code, or `None` when it does not answer.
    pub async fn readyz(&self) -> Option<u16> {
        let response = reqwest::Client::new()
            .get(self.url("/readyz"))
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .ok()?;
        Some(response.status().as_u16())
    }

    /// Waits until `/readyz` is 200; returns the seconds since `since`. Fails if the process
    /// exits or [`READY_WAIT`] passes.
    pub async fn wait_ready(&mut self, since: Instant, log: &Path) -> anyhow::Result<f64> {
        let deadline = Instant::now() + READY_WAIT;
        loop {
            if self.readyz().await == Some(200) {
                return Ok(since.elapsed().as_secs_f64());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                bail!(
                    "the host exited with {status} before it was ready:\n{}",
                    log_tail(log, 40)
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "/readyz not 200 within {READY_WAIT:?}:\n{}",
                    log_tail(log, 40)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The sum of `worker_email_unknown_outcomes_total` on `/metrics` (0 when not scraped).
    pub async fn unknown_outcomes(&self) -> anyhow::Result<u64> {
        let text = self.metrics().await?;
        Ok(metric_sum(&text, "worker_email_unknown_outcomes_total") as u64)
    }

    /// The whole `/metrics` scrape.
    pub async fn metrics(&self) -> anyhow::Result<String> {
        Ok(reqwest::Client::new()
            .get(self.url("/metrics"))
            .timeout(Duration::from_secs(5))
            .send()
            .await?
            .error_for_status()?
            .text()
            .await?)
    }

    /// `/status`, as JSON.
    pub async fn status(&self) -> anyhow::Result<serde_json::Value> {
        Ok(reqwest::Client::new()
            .get(self.url("/status"))
            .timeout(Duration::from_secs(5))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?)
    }

    /// The operating system's id of the process.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, and reaps the process.
    pub fn kill9(mut self) -> anyhow::Result<()> {
        self.child.kill().context("kill -9 of the host")?;
        self.child.wait()?;
        Ok(())
    }

    /// SIGTERM; waits up to `wait` for the exit and returns its code (`None`: killed after
    /// the wait, or ended by a signal).
    pub async fn sigterm(mut self, wait: Duration) -> anyhow::Result<Option<i32>> {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .context("running kill -TERM")?;
        if !status.success() {
            bail!("kill -TERM {} failed: {status}", self.child.id());
        }
        let deadline = Instant::now() + wait;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status.code());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.child.kill()?;
        self.child.wait()?;
        Ok(None)
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The sum of the samples of `name` in a Prometheus text scrape.
pub fn metric_sum(scrape: &str, name: &str) -> f64 {
    scrape
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let metric = series.split_once('{').map_or(series, |(m, _)| m);
            (metric == name)
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

/// The sum of the samples of `name` whose labels include every `(key, value)` of `labels`.
pub fn metric_sum_with(scrape: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    scrape
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, rest) = series.split_once('{').unwrap_or((series, "}"));
            if metric != name {
                return None;
            }
            let body = rest.strip_suffix('}')?;
            // Label values the host writes are job, queue and outcome names: no commas or
            // quotes inside, so a plain split reads them.
            let pairs: Vec<(&str, &str)> = body
                .split(',')
                .filter_map(|pair| {
                    let (key, value) = pair.split_once('=')?;
                    Some((key, value.trim_matches('"')))
                })
                .collect();
            labels
                .iter()
                .all(|wanted| pairs.contains(wanted))
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

/// The last `lines` lines of a log file.
pub fn log_tail(log: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    let from = all.len().saturating_sub(lines);
    format!(
        "--- last lines of {} ---\n{}",
        log.display(),
        all[from..].join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_sum_adds_every_series_of_the_name_only() {
        let scrape = "# TYPE worker_email_unknown_outcomes_total counter\n\
                      worker_email_unknown_outcomes_total{a=\"1\"} 2\n\
                      worker_email_unknown_outcomes_total 1\n\
                      worker_email_unknown_outcomes_total_other 7\n";
        assert_eq!(
            metric_sum(scrape, "worker_email_unknown_outcomes_total"),
            3.0
        );
    }

    #[test]
    fn metric_sum_with_keeps_the_series_whose_labels_match() {
        let scrape = "# TYPE worker_ticks_total counter\n\
                      worker_ticks_total{job=\"poller\",outcome=\"ran\"} 4\n\
                      worker_ticks_total{job=\"poller\",outcome=\"skipped-busy\"} 7\n\
                      worker_ticks_total{job=\"drafts\",outcome=\"skipped-busy\"} 2\n\
                      worker_ticks_total 100\n";
        let sum = |labels: &[(&str, &str)]| metric_sum_with(scrape, "worker_ticks_total", labels);
        assert_eq!(sum(&[("job", "poller"), ("outcome", "skipped-busy")]), 7.0);
        assert_eq!(sum(&[("outcome", "skipped-busy")]), 9.0);
        assert_eq!(sum(&[("job", "poller")]), 11.0);
        assert_eq!(sum(&[("job", "none")]), 0.0);
    }
}
