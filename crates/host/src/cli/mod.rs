//! The command line: its grammar (here, each command's own in `crate::commands`) and
//! [`execute`], which runs one.

mod execute;

pub use execute::execute;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::commands::automations::AutomationsAction;
use crate::commands::config::ConfigAction;
use crate::commands::jobs::JobsAction;
use crate::commands::outbox::OutboxAction;
use crate::commands::replicas::ReplicasAction;
use crate::commands::topology::TopologyAction;
use crate::commands::upgrade::UpgradeAction;

/// The worker host: runs this installation's background jobs against RabbitMQ, PostgreSQL,
/// IMAP and SMTP.
///
/// Settings come from one TOML file (`config/worker-host.toml` unless `--config` or
/// WORKER_HOST_CONFIG names another); any key can be overridden from the environment as
/// WORKER_HOST__SECTION__KEY, e.g. WORKER_HOST__DATABASE__PORT=5433. See
/// config/worker-host.example.toml for every key.
///
/// Exit codes: 0 done, 1 not healthy (`health`), 64 bad usage or settings, 69 a server stayed
/// unreachable, 70 other failure.
#[derive(Debug, Parser)]
#[command(name = "worker-host", version = crate::version::LONG, about, long_about)]
pub struct Cli {
    /// The settings file.
    #[arg(long, global = true, env = "WORKER_HOST_CONFIG", value_name = "PATH")]
    pub config: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the host until SIGTERM or SIGINT (the default): reach the database and the broker,
    /// apply migrations unless `database.migrate_on_start = false`, serve the admin endpoints.
    Run,
    /// Apply the database migrations that have not been applied yet, then exit.
    Migrate {
        /// Print the SQL that would be applied, in order, and apply nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Print the running host's status (jobs, broker, database, active alerts) as JSON, read
    /// from its admin endpoint `/status`.
    Status,
    /// Whether the running host is ready, asked of its admin endpoint's `/readyz`: exit 0 when
    /// it is, 1 when it is not or nothing answers (a container's HEALTHCHECK).
    Health,
    /// Before rolling out a release: run its binary with the installation's settings to see,
    /// without changing anything, what the upgrade would meet.
    Upgrade {
        #[command(subcommand)]
        action: UpgradeAction,
    },
    /// The replicas that report to the shared database, and forgetting one that is gone.
    Replicas {
        #[command(subcommand)]
        action: ReplicasAction,
    },
    /// The consumer queues: send what waits in a queue's retry tiers now.
    Queues {
        #[command(subcommand)]
        action: crate::commands::queues::QueuesAction,
    },
    /// Search, replay and purge the dead-letter archive.
    Dlq {
        #[command(subcommand)]
        action: crate::commands::dlq::DlqAction,
    },
    /// Load automations into the database.
    Automations {
        #[command(subcommand)]
        action: AutomationsAction,
    },
    /// Inspect the transactional outbox and put failed rows back.
    Outbox {
        #[command(subcommand)]
        action: OutboxAction,
    },
    /// The operators' named accounts, their roles and API tokens.
    Operators {
        #[command(subcommand)]
        action: crate::commands::operators::OperatorsAction,
    },
    /// Search the audit entries other teams published (`audit.entry`), as the audit-log job
    /// stored them.
    AuditLog {
        #[command(subcommand)]
        action: crate::commands::audit_log::AuditLogAction,
    },
    /// A mail's story, from the mailbox to the answer or to the reason there was none, and
    /// finding mails by sender, recipient, Message-ID, subject or time.
    Mail {
        #[command(subcommand)]
        action: crate::commands::mail::MailAction,
    },
    /// What the host holds about one person's address: export it (GDPR Art. 15) or erase it
    /// (Art. 17), each recorded in the audit trail with the address as a keyed hash.
    Privacy {
        #[command(subcommand)]
        action: crate::commands::privacy::PrivacyAction,
    },
    /// Check the sign-in of an IMAP account or of the SMTP server (OAuth2 or password).
    MailAuth {
        #[command(subcommand)]
        action: crate::commands::mail_auth::MailAuthAction,
    },
    /// Pause and resume jobs (timers and consumers) on every replica.
    Jobs {
        #[command(subcommand)]
        action: JobsAction,
    },
    /// The dependencies' open circuits (the SMTP relay, IMAP accounts, webhook hosts), and
    /// closing one by hand on every replica.
    Circuits {
        #[command(subcommand)]
        action: crate::commands::circuits::CircuitsAction,
    },
    /// Manage the broker topology.
    Topology {
        #[command(subcommand)]
        action: TopologyAction,
    },
    /// Inspect the settings.
    Config {
        #[command(subcommand)]
        action: ConfigAction,
    },
    /// Serve the fleet view: one page over every installation listed in its own settings file
    /// (`--config`, else `config/fleet.toml`; see config/fleet.example.toml), each read from
    /// its admin address with a viewer account's API token. It reads no host settings and
    /// reaches no database or broker.
    Fleet,
}
