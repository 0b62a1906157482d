//! The scenario's host processes: replicas beside the first, kills, stops and restarts, a
//! host tool run beside them, and how soon each is ready again.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;

use super::settings::free_port;
use super::{HostId, Run, STOP_WAIT};
use crate::host::{HostCommand, HostProcess};

impl Run {
    /// Starts one more host process beside the others (ready): the same settings file and
    /// overrides, its own admin port, log (`host-replica.log`, `host-replica-2.log`… beside
    /// the first's) and replica name. All consume the same queues (the broker shares the
    /// deliveries between them) and run the same timers (the leased ones one at a time).
    pub async fn start_replica(&mut self) -> anyhow::Result<()> {
        self.start_replica_timed().await.map(|_| ())
    }

    /// [`Run::start_replica`], returning the seconds from the new process's start until it
    /// was ready.
    pub async fn start_replica_timed(&mut self) -> anyhow::Result<f64> {
        let which = HostId::Replica(self.replicas.len());
        let port = free_port()?;
        let mut command = self.command.clone();
        command.binary = self.binary.clone();
        command.port = port;
        let log = match self.replicas.len() {
            0 => "host-replica.log".to_string(),
            n => format!("host-replica-{}.log", n + 1),
        };
        command.log = self.command.log.with_file_name(log);
        command.env.retain(|(key, _)| key != "WORKER_HOST__REPLICA");
        command.env.push((
            "WORKER_HOST__ADMIN__LISTEN".into(),
            format!("127.0.0.1:{port}"),
        ));
        command
            .env
            .push(("WORKER_HOST__REPLICA".into(), which.replica_name()));
        let mut replica = command.spawn()?;
        let since = replica.started;
        let secs = replica.wait_ready(since, &command.log).await?;
        self.replicas.push((command, Some(replica)));
        Ok(secs)
    }

    /// SIGTERM of the process `which` (after reading its unknown-outcome count), for good:
    /// an exit other than 0 within [`STOP_WAIT`] is counted as unclean.
    pub async fn stop(&mut self, which: HostId) -> anyhow::Result<()> {
        let host = self
            .slot(which)
            .and_then(Option::take)
            .with_context(|| format!("the {} host is not running", which.as_str()))?;
        self.unknown_before += host.unknown_outcomes().await.unwrap_or(0);
        let code = host.sigterm(STOP_WAIT).await?;
        if code != Some(0) {
            eprintln!(
                "faults: SIGTERM ended the {} host with {code:?}",
                which.as_str()
            );
            self.unclean_exits += 1;
        }
        Ok(())
    }

    /// Runs `binary` with the scenario's settings file and overrides (`worker-host --config
    /// <file> <args>`, as an operator would beside the running hosts) to its end, its output
    /// appended to `log` beside the host's; fails when it does not exit 0 within `wait`.
    pub async fn host_tool(
        &self,
        binary: &Path,
        args: &[&str],
        log: &str,
        wait: Duration,
    ) -> anyhow::Result<()> {
        let log = self.command.log.with_file_name(log);
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("opening {}", log.display()))?;
        let err = out.try_clone()?;
        let mut command = tokio::process::Command::new(binary);
        command
            .arg("--config")
            .arg(&self.command.config)
            .args(args)
            .env_remove("WORKER_HOST_CONFIG")
            .stdin(std::process::Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true);
        // As the host's own processes: the harness's environment says nothing to it.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("WORKER_HOST__") {
                command.env_remove(key);
            }
        }
        command.envs(self.command.env.iter().map(|(k, v)| (k, v)));
        let status = tokio::time::timeout(wait, command.status())
            .await
            .with_context(|| {
                format!(
                    "{} {args:?} did not finish within {wait:?} (log {})",
                    binary.display(),
                    log.display()
                )
            })?
            .with_context(|| format!("starting {}", binary.display()))?;
        if !status.success() {
            anyhow::bail!(
                "{} {args:?}: {status}:\n{}",
                binary.display(),
                crate::host::log_tail(&log, 20)
            );
        }
        Ok(())
    }

    /// Every host process of the scenario, running or killed.
    pub fn host_ids(&self) -> Vec<HostId> {
        std::iter::once(HostId::First)
            .chain((0..self.replicas.len()).map(HostId::Replica))
            .collect()
    }

    /// The running process `which`, if it runs.
    pub fn process(&self, which: HostId) -> Option<&HostProcess> {
        match which {
            HostId::First => self.host.as_ref(),
            HostId::Replica(n) => self.replicas.get(n)?.1.as_ref(),
        }
    }

    fn command_of(&self, which: HostId) -> anyhow::Result<&HostCommand> {
        match which {
            HostId::First => Ok(&self.command),
            HostId::Replica(n) => self
                .replicas
                .get(n)
                .map(|(command, _)| command)
                .with_context(|| format!("no {} was started", which.as_str())),
        }
    }

    fn slot(&mut self, which: HostId) -> Option<&mut Option<HostProcess>> {
        match which {
            HostId::First => Some(&mut self.host),
            HostId::Replica(n) => self.replicas.get_mut(n).map(|(_, process)| process),
        }
    }

    /// kill -9 of the process `which` (after reading its unknown-outcome count); returns the
    /// moment of the kill. [`Run::respawn`] starts it again.
    pub async fn kill9(&mut self, which: HostId) -> anyhow::Result<Instant> {
        let host = self
            .slot(which)
            .and_then(Option::take)
            .with_context(|| format!("the {} host is not running", which.as_str()))?;
        self.unknown_before += host.unknown_outcomes().await.unwrap_or(0);
        let at = Instant::now();
        host.kill9()?;
        Ok(at)
    }

    /// Starts the process `which` again (after [`Run::kill9`]) and waits until it is ready;
    /// returns the seconds from its start, or `None` (and marks the run never ready) when it
    /// was not ready within the wait.
    pub async fn respawn(&mut self, which: HostId) -> anyhow::Result<Option<f64>> {
        let command = self.command_of(which)?.clone();
        let mut host = command.spawn()?;
        let since = host.started;
        let secs = match host.wait_ready(since, &command.log).await {
            Ok(secs) => Some(secs),
            Err(err) => {
                eprintln!("faults: {err:#}");
                self.never_ready = true;
                None
            }
        };
        if let Some(slot) = self.slot(which) {
            *slot = Some(host);
        }
        Ok(secs)
    }

    /// Takes the running host out (to kill or stop it), after reading its unknown-outcome
    /// count.
    pub(super) async fn take_host(&mut self) -> anyhow::Result<HostProcess> {
        let host = self.host.take().context("no host is running")?;
        self.unknown_before += host.unknown_outcomes().await.unwrap_or(0);
        Ok(host)
    }

    /// `worker_email_unknown_outcomes_total` so far, over every host process of the scenario
    /// (the running one's read from its `/metrics`; 0 for it when that cannot be read).
    pub async fn unknown_outcomes(&self) -> u64 {
        let running = match &self.host {
            Some(host) => host.unknown_outcomes().await.unwrap_or(0),
            None => 0,
        };
        self.unknown_before + running
    }

    /// Counts `sends` whose record the fault took from the database after the SMTP server
    /// had the mail (a failover that lost the commits of its last moments): the host cannot
    /// know they went, so each may go again, as a send met by a fault in its window.
    pub fn count_forgotten_sends(&mut self, sends: u64) {
        self.unknown_before += sends;
    }

    /// kill -9 of the host, then a new one; records the seconds from its start to ready.
    pub async fn kill9_and_restart(&mut self) -> anyhow::Result<()> {
        self.take_host().await?.kill9()?;
        self.restart().await
    }

    /// SIGTERM (counting an exit other than 0), then a new host; records its time to ready.
    pub async fn sigterm_and_restart(&mut self) -> anyhow::Result<()> {
        let code = self.take_host().await?.sigterm(STOP_WAIT).await?;
        if code != Some(0) {
            eprintln!("faults: SIGTERM ended the host with {code:?}");
            self.unclean_exits += 1;
        }
        self.restart().await
    }

    async fn restart(&mut self) -> anyhow::Result<()> {
        let mut host = self.command.spawn()?;
        let since = host.started;
        match host.wait_ready(since, &self.command.log).await {
            Ok(secs) => self.ready.push(secs),
            Err(err) => {
                eprintln!("faults: {err:#}");
                self.never_ready = true;
            }
        }
        self.host = Some(host);
        Ok(())
    }

    /// `/readyz`'s status code of the running host, `None` when it does not answer (or no
    /// host runs).
    pub async fn readyz(&self) -> Option<u16> {
        self.host.as_ref()?.readyz().await
    }

    /// After a fault applied at `at` to the running host: watches up to 2 s for `/readyz` to
    /// leave 200, then records the seconds from `at` until it answers 200 again (so about 2 s,
    /// an upper bound, when it never left 200 in the watch).
    pub async fn record_ready_after(&mut self, at: Instant) -> anyhow::Result<()> {
        let host = self.host.as_mut().context("no host is running")?;
        while at.elapsed() < Duration::from_secs(2) {
            if host.readyz().await != Some(200) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        match host.wait_ready(at, &self.command.log).await {
            Ok(secs) => self.ready.push(secs),
            Err(err) => {
                eprintln!("faults: {err:#}");
                self.never_ready = true;
            }
        }
        Ok(())
    }

    /// Watches `/readyz` for `span` (a fault that lasts that long) and says whether it left
    /// 200 at any time in it: whether the host noticed the fault.
    pub async fn left_ready_within(&self, span: Duration) -> anyhow::Result<bool> {
        let host = self.host.as_ref().context("no host is running")?;
        let until = Instant::now() + span;
        let mut left = false;
        while Instant::now() < until {
            left |= host.readyz().await != Some(200);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(left)
    }
}
