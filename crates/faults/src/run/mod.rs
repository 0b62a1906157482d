//! One scenario's world: its database, vhost and mailboxes, the host process under test (and
//! its restarts), and the oracle's readings from outside (IMAP, PostgreSQL, the management
//! API, `/metrics`).
//!
//! `mod.rs` holds the world and its start; `hosts.rs` the host processes (replicas, kills,
//! stops, restarts, readiness); `readings.rs` what the oracle reads from outside;
//! `settings.rs` the settings file each scenario's hosts run with.

mod hosts;
mod readings;
mod settings;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use worker_testkit::{TestDb, TestVhost};

use self::settings::{AUTOMATION, free_port, settings};
use crate::direct::DirectCommands;
use crate::host::{HostCommand, HostProcess};
use crate::mail::Mailboxes;

/// How long a SIGTERM stop may take before the harness kills the host (the settings give it
/// a 10 s grace).
pub const STOP_WAIT: Duration = Duration::from_secs(30);

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
    /// [`Figures::expected_dead_letters`](crate::oracle::Figures::expected_dead_letters)).
    pub expected_dead_letters: Option<u64>,
    /// Pings per repetition of this run's load (a fault may size its own share by it).
    pub per_repetition: u64,
    /// Faults that should have made the host not ready (a silent broker, a stalled database)
    /// but during which `/readyz` stayed 200.
    pub unnoticed_faults: u64,
    /// The Message-IDs of pings a fault sent itself (to make the host work while the fault
    /// lasts): each must be answered once, as the load's are.
    pub fault_pings: Vec<String>,
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
            fault_pings: Vec::new(),
        })
    }

    pub fn log_path(&self) -> &PathBuf {
        &self.command.log
    }
}
