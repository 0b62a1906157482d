//! One scenario's world: its database, vhost and mailboxes, the host process under test (and
//! its restarts), and the oracle's readings from outside (IMAP, PostgreSQL, the management
//! API, `/metrics`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use worker_testkit::{TestDb, TestVhost};

use crate::direct::DirectCommands;
use crate::host::{HostCommand, HostProcess};
use crate::mail::{self, Mailboxes};
use crate::oracle::{self, Figures};

/// The demo automation: a reply to the sender of any mail whose subject contains `ping`.
const AUTOMATION: &str = r#"
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

/// How long a SIGTERM stop may take before the harness kills the host (the settings give it
/// a 10 s grace).
pub const STOP_WAIT: Duration = Duration::from_secs(30);

/// How long the end state must hold before it is counted.
const QUIET: Duration = Duration::from_secs(7);

/// How a scenario's host differs from the plain one, as its fault's
/// [`prepare`](crate::scenarios::Fault::prepare) says.
#[derive(Debug, Default)]
pub struct Setup {
    /// Settings given to every host process of the scenario as `WORKER_HOST__…` environment
    /// variables, which override the settings file (for example the broker's port when a
    /// proxy stands in front of it).
    pub env: Vec<(String, String)>,
    /// The port of the IMAP server the host polls, when not the shared one's (a proxy in
    /// front of it, say): written into the settings file's account.
    pub imap_port: Option<u16>,
    /// The PostgreSQL server the scenario's database is created on, as an admin URL
    /// ([`TestDb::create_on`]); the shared one when `None`. A scenario that brings a private
    /// cluster names it here and points the host at it through [`Setup::env`].
    pub database_admin_url: Option<String>,
    /// The RabbitMQ node the scenario's vhost is made on; the shared one when `None`. A
    /// scenario that brings a private node names it here and points the host at it through
    /// [`Setup::env`].
    pub broker: Option<BrokerEndpoints>,
    /// The binary the first host process runs, when not the one under test (the previous
    /// release, in `rolling-upgrade`); replicas run the one under test.
    pub first_binary: Option<PathBuf>,
    /// An empty database, which the first host migrates at its start, instead of a copy of
    /// the migrated template (this tree's migrations, which an older release does not know).
    pub empty_database: bool,
}

/// Which host process of the scenario: the first, or the `n`-th replica
/// [`Run::start_replica`] started beside it (from 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HostId {
    First,
    Replica(usize),
}

impl HostId {
    /// The first replica: the one the two-process scenarios start.
    pub const REPLICA: Self = Self::Replica(0);

    /// The other one of a pair: the first and its first replica.
    pub fn other(self) -> Self {
        match self {
            Self::First => Self::REPLICA,
            Self::Replica(_) => Self::First,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::First => "first",
            Self::Replica(0) => "replica",
            Self::Replica(1) => "second replica",
            Self::Replica(_) => "another replica",
        }
    }

    /// The name it runs with (`replica`): `r0` for the first, `r1`, `r2`… for the replicas.
    pub fn replica_name(self) -> String {
        match self {
            Self::First => "r0".into(),
            Self::Replica(n) => format!("r{}", n + 1),
        }
    }
}

/// Where a broker other than the shared one answers.
#[derive(Debug, Clone)]
pub struct BrokerEndpoints {
    /// The management API, `http://user:password@host:port`.
    pub api: String,
    /// The AMQP listener, `host:port`.
    pub amqp: String,
}

/// A scenario's resources and its host.
#[derive(Debug)]
pub struct Run {
    pub db: TestDb,
    pub vhost: TestVhost,
    pub boxes: Mailboxes,
    /// Direct commands into the scenario's vhost (the workload's share, and the poison
    /// scenarios' messages).
    pub direct: DirectCommands,
    pub command: HostCommand,
    /// The binary under test (the first host's too, unless [`Setup::first_binary`] said
    /// otherwise): what replicas and [`Run::host_tool`] run.
    pub binary: PathBuf,
    host: Option<HostProcess>,
    /// More host processes with the same settings (database, vhost, IMAP account) but each its
    /// own admin port, log and replica name, as [`Run::start_replica`] started them; the
    /// process is `None` while it is killed.
    replicas: Vec<(HostCommand, Option<HostProcess>)>,
    /// `worker_email_unknown_outcomes_total` of the host processes already gone.
    unknown_before: u64,
    /// Seconds from the first host's start until it was ready.
    pub first_ready_secs: f64,
    /// Seconds until ready again, one per fault.
    pub ready: Vec<f64>,
    pub never_ready: bool,
    pub unclean_exits: u64,
    /// The Message-IDs of the mails the direct commands must deliver, once each, to the
    /// direct mailbox.
    pub direct_expected: Vec<String>,
    /// The dead letters the fault made on purpose, when it says (see
    /// [`Figures::expected_dead_letters`]).
    pub expected_dead_letters: Option<u64>,
    /// Pings per repetition of this run's load (a fault may size its own share by it).
    pub per_repetition: u64,
    /// Faults that should have made the host not ready (a silent broker, a stalled database)
    /// but during which `/readyz` stayed 200.
    pub unnoticed_faults: u64,
}

impl Run {
    /// Creates the database, vhost and mailboxes, writes the settings into `dir` and starts
    /// the host (ready).
    pub async fn start(
        name: &str,
        binary: &Path,
        dir: &Path,
        setup: Setup,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let db = match (&setup.database_admin_url, setup.empty_database) {
            (Some(url), false) => TestDb::create_on(url).await,
            (None, false) => TestDb::create().await,
            (Some(url), true) => TestDb::create_empty_on(url).await,
            (None, true) => TestDb::create_empty().await,
        }
        .context("creating the database")?;
        let vhost = match &setup.broker {
            Some(broker) => TestVhost::create_on(&broker.api, &broker.amqp)
                .await
                .with_context(|| format!("creating the vhost on the broker at {}", broker.amqp))?,
            None => TestVhost::create().await.context("creating the vhost")?,
        };
        let boxes = Mailboxes::new(name);
        let port = free_port()?;
        let automation = dir.join("automations.toml");
        std::fs::write(&automation, AUTOMATION)?;
        let config = dir.join("worker-host.toml");
        std::fs::write(
            &config,
            settings(&db, &vhost, &boxes, port, &automation, setup.imap_port),
        )?;
        let mut env = setup.env;
        env.push(("WORKER_HOST__REPLICA".into(), HostId::First.replica_name()));
        let command = HostCommand {
            binary: setup
                .first_binary
                .clone()
                .unwrap_or_else(|| binary.to_path_buf()),
            config,
            log: dir.join("host.log"),
            port,
            env,
        };
        let mut host = command.spawn()?;
        let since = host.started;
        let ready = host.wait_ready(since, &command.log).await?;
        // After the host's start: an empty database has the tables the harness's automation
        // goes into only once the host migrated it.
        let direct = DirectCommands::new(db.pool.clone(), &vhost, &boxes).await?;
        Ok(Self {
            db,
            vhost,
            boxes,
            direct,
            command,
            binary: binary.to_path_buf(),
            first_ready_secs: ready,
            host: Some(host),
            replicas: Vec::new(),
            unknown_before: 0,
            ready: Vec::new(),
            never_ready: false,
            unclean_exits: 0,
            direct_expected: Vec::new(),
            expected_dead_letters: None,
            per_repetition: 0,
            unnoticed_faults: 0,
        })
    }

    pub fn log_path(&self) -> &PathBuf {
        &self.command.log
    }

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
    async fn take_host(&mut self) -> anyhow::Result<HostProcess> {
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

    /// Waits, at most `bound`, until the sender has a mail for every ping, the direct mailbox
    /// one for every direct command, and the work queues, the dead queues and the outbox are
    /// empty, and stay so for [`QUIET`] (longer than the management API's 5 s statistics
    /// interval, whose queue depths lag; and time for a late duplicate).
    pub async fn settle(&self, pings: usize, bound: Duration) {
        let deadline = Instant::now() + bound;
        let mut clean_since: Option<Instant> = None;
        loop {
            let replies = mail::inbox_count(&self.boxes.sender).await.unwrap_or(0);
            let direct = mail::inbox_count(&self.boxes.direct).await.unwrap_or(0);
            let (queues, dead) = self
                .queues()
                .await
                .map(|q| (q.0, q.1))
                .unwrap_or((u64::MAX, u64::MAX));
            let outbox = self.outbox_left().await.unwrap_or(i64::MAX);
            if replies >= pings
                && direct >= self.direct_expected.len()
                && queues == 0
                && dead == 0
                && outbox == 0
            {
                let since = *clean_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= QUIET {
                    return;
                }
            } else {
                clean_since = None;
            }
            if Instant::now() > deadline {
                eprintln!(
                    "faults: not settled within {bound:?}: {replies}/{pings} replies, {direct}/{} direct mails, {queues} in the work queues, {dead} in the dead queues, {outbox} in the outbox",
                    self.direct_expected.len()
                );
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// (messages in the work queues and their retry tiers, messages in the dead queues, the
    /// work queues that hold any, as `name: n`).
    pub async fn queues(&self) -> anyhow::Result<(u64, u64, Vec<String>)> {
        let list = self
            .vhost
            .api(reqwest::Method::GET, "queues/{vhost}", None)
            .await?;
        let mut work = 0;
        let mut dead = 0;
        let mut busy = Vec::new();
        for queue in list.as_array().context("queues: not a list")? {
            let name = queue["name"].as_str().unwrap_or_default();
            let messages = queue["messages"].as_u64().unwrap_or(0);
            if name.ends_with(".dead") {
                dead += messages;
            } else {
                work += messages;
                if messages > 0 {
                    busy.push(format!("{name}: {messages}"));
                }
            }
        }
        Ok((work, dead, busy))
    }

    /// Outbox rows not yet published (pending or failed).
    pub async fn outbox_left(&self) -> anyhow::Result<i64> {
        self.scalar("SELECT count(*) FROM outbox WHERE status <> 'processed'")
            .await
    }

    async fn scalar(&self, sql: &str) -> anyhow::Result<i64> {
        sqlx::query_scalar(sql)
            .fetch_one(&self.db.pool)
            .await
            .with_context(|| format!("running {sql}"))
    }

    /// Groups of rows that must be one and are more.
    pub async fn duplicate_db_effects(&self) -> anyhow::Result<u64> {
        let mut total = 0;
        for sql in [
            // A mail seen again under another UID (a new UIDVALIDITY, moved out and back) gets
            // a row of its own that names the first (`duplicate_of`) and announces nothing.
            "SELECT count(*) FROM (SELECT 1 FROM inbound_emails WHERE message_id IS NOT NULL \
             AND duplicate_of IS NULL \
             GROUP BY account, mailbox, message_id HAVING count(*) > 1) g",
            "SELECT count(*) FROM (SELECT 1 FROM action_executions \
             GROUP BY event_id, automation_id, action_index HAVING count(*) > 1) g",
            "SELECT count(*) FROM (SELECT 1 FROM inbound_emails i \
             JOIN action_executions a ON a.event_id = i.event_id \
             GROUP BY i.account, i.message_id HAVING count(*) > 1) g",
            "SELECT count(*) FROM (SELECT 1 FROM outbound_emails WHERE action_execution_id IS NOT NULL \
             GROUP BY action_execution_id HAVING count(*) > 1) g",
        ] {
            total += self.scalar(sql).await? as u64;
        }
        Ok(total)
    }

    /// `dead_letters` rows beyond the first for one message: per (queue, message id), or per
    /// (queue, body) where there is no message id. Outbox rows are keyed by their row id.
    pub async fn duplicate_dead_letters(&self) -> anyhow::Result<u64> {
        let extra = self
            .scalar(
                "SELECT coalesce(sum(n - 1), 0)::bigint FROM (SELECT count(*) AS n FROM dead_letters \
                 WHERE source <> 'outbox' \
                 GROUP BY queue, coalesce(message_id, encode(sha256(body), 'hex')) \
                 HAVING count(*) > 1) g",
            )
            .await?;
        Ok(extra as u64)
    }

    /// A scalar query on the scenario's database (for a fault's own checks).
    pub async fn query_scalar(&self, sql: &str) -> anyhow::Result<i64> {
        self.scalar(sql).await
    }

    /// A count whose query takes the scenario's own ids as `$1` (a `text[]`, bound, not
    /// spliced into the text).
    pub async fn count_among(&self, sql: &str, ids: &[String]) -> anyhow::Result<i64> {
        sqlx::query_scalar(sql)
            .bind(ids)
            .fetch_one(&self.db.pool)
            .await
            .with_context(|| format!("running {sql}"))
    }

    /// The oracle's readings, into `figures`; then the host is stopped with SIGTERM.
    pub async fn count(&mut self, pings: &[String], figures: &mut Figures) -> anyhow::Result<()> {
        let replies = mail::replies(&self.boxes.sender).await?;
        let matched = oracle::count_replies(pings, &replies);
        let direct_mails = mail::message_ids(&self.boxes.direct).await?;
        let direct = oracle::count_replies(&self.direct_expected, &direct_mails);
        figures.direct_commands = self.direct_expected.len() as u64;
        figures.messages = pings.len() as u64 + figures.direct_commands;
        figures.lost = matched.lost + direct.lost;
        figures.duplicate_mails = matched.duplicates + direct.duplicates;
        figures.stray_mails = matched.strays + direct.strays;
        figures.duplicate_db_effects = self.duplicate_db_effects().await?;
        let (work, dead, busy) = self.queues().await?;
        if !busy.is_empty() {
            eprintln!("faults: left in the work queues: {}", busy.join(", "));
        }
        figures.left_in_queues = work;
        figures.left_in_outbox = self.outbox_left().await? as u64;
        figures.dead_letters =
            dead + self.scalar("SELECT count(*) FROM dead_letters").await? as u64;
        figures.left_in_dead_queues = dead;
        figures.duplicate_dead_letters = self.duplicate_dead_letters().await?;
        figures.expected_dead_letters = self.expected_dead_letters;
        // The first host may be gone already (stopped for good, as the old release in a
        // rolling upgrade); the others are stopped here.
        let host = match self.host.is_some() {
            true => Some(self.take_host().await?),
            false => None,
        };
        let replicas: Vec<HostProcess> = self
            .replicas
            .iter_mut()
            .filter_map(|(_, process)| process.take())
            .collect();
        for replica in &replicas {
            self.unknown_before += replica.unknown_outcomes().await.unwrap_or(0);
        }
        figures.faults_in_send_window = self.unknown_before;
        figures.max_secs_to_ready = self.ready.iter().copied().reduce(f64::max);
        figures.never_ready = self.never_ready;
        if let Some(host) = host {
            let code = host.sigterm(STOP_WAIT).await?;
            if code != Some(0) {
                eprintln!("faults: the final SIGTERM ended the host with {code:?}");
                self.unclean_exits += 1;
            }
        }
        for replica in replicas {
            let code = replica.sigterm(STOP_WAIT).await?;
            if code != Some(0) {
                eprintln!("faults: the final SIGTERM ended a replica with {code:?}");
                self.unclean_exits += 1;
            }
        }
        figures.unclean_exits = self.unclean_exits;
        figures.unnoticed_faults = self.unnoticed_faults;
        if !figures.failures(f64::MAX).is_empty() {
            eprintln!("faults: the host's log: {}", self.command.log.display());
            for (replica, _) in &self.replicas {
                eprintln!("faults: a replica's log: {}", replica.log.display());
            }
        }
        Ok(())
    }
}

/// The host's settings for one scenario.
fn settings(
    db: &TestDb,
    vhost: &TestVhost,
    boxes: &Mailboxes,
    port: u16,
    automation: &Path,
    imap_port: Option<u16>,
) -> String {
    let imap_port = imap_port
        .map(|port| format!("port = {port}\n"))
        .unwrap_or_default();
    let tiers = r#"retry_tiers = ["2s", "5s", "10s"]"#;
    format!(
        r#"
installation = "faults"
automations_files = [{automation:?}]

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
shutdown_grace = "10s"


[[imap.accounts]]
name = "faults"
username = {account:?}
password = "secret"
{imap_port}
[jobs.inbound_email_poller]
schedule = "every 1s"

[jobs.dead_letter_archive]
schedule = "every 2s"

[jobs.automation_trigger]
max_attempts = 30
[jobs.automation_trigger.queue]
{tiers}

[jobs.automation_action]
max_attempts = 30
[jobs.automation_action.queue]
{tiers}
# Every ping comes from one sender: the reply limit must not count it as a mail cannon.
[jobs.automation_action.auto_replies]
per_recipient = 1000000

[jobs.email_send]
max_attempts = 30
# One send (the runner's limit adds the record budget); a stale claim is taken over at 45 s.
timeout = "10s"
claim_stale_after = "45s"
[jobs.email_send.queue]
{tiers}
"#,
        automation = automation.display().to_string(),
        db = db.name,
        vhost = vhost.name,
        account = boxes.account,
    )
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}
