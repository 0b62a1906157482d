//! The command line.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

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

#[derive(Debug, Subcommand)]
pub enum UpgradeAction {
    /// Report the settings keys this release reads under new names, the migrations it would
    /// apply, the replicas on another release and the depth of every queue; exit 69 when
    /// something should be resolved first.
    Check(crate::commands::upgrade::CheckArgs),
}

#[derive(Debug, Subcommand)]
pub enum ReplicasAction {
    /// Every replica that reported in the last week: live, silent (stopped reporting without
    /// a clean stop) or stopped.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Forget a replica that is gone for good without a clean stop (killed, its machine
    /// removed), so that it no longer counts as silent.
    Forget {
        /// The replica's name, as `replicas list` shows it.
        name: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum ConfigAction {
    /// Validate the settings, then print the effective settings with every secret redacted.
    Check,
}

#[derive(Debug, Subcommand)]
pub enum TopologyAction {
    /// Declare the exchanges, the consumer queues, their retry tiers and dead letters
    /// (idempotent; `run` does the same at start). A queue that exists with other arguments
    /// is reported with the argument that differs and how to resolve it.
    Declare,
}

#[derive(Debug, Subcommand)]
pub enum OutboxAction {
    /// Pending and failed rows, and the age of the oldest pending one; lists the failed rows.
    Status {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Make a failed row (or every failed row) pending again, due now, attempts reset.
    Retry {
        /// The outbox row id.
        #[arg(required_unless_present = "all_failed", conflicts_with = "all_failed")]
        id: Option<i64>,
        /// Every failed row.
        #[arg(long)]
        all_failed: bool,
        /// With --all-failed: count and list the failed rows it would put back (the oldest
        /// 20); move nothing. Recorded as a dry run.
        #[arg(long, requires = "all_failed")]
        dry_run: bool,
        /// With --all-failed: the count a dry run showed; put back at most this many, oldest
        /// first, and record it as what was confirmed. Rows that failed since stay failed.
        #[arg(long, requires = "all_failed", conflicts_with = "dry_run")]
        planned: Option<u64>,
        #[command(flatten)]
        actor: crate::commands::actor::ActorArgs,
    },
}

#[derive(Debug, Subcommand)]
pub enum JobsAction {
    /// The jobs, and which of them an operator paused (by whom, since when, why).
    List {
        #[arg(long)]
        json: bool,
    },
    /// Pause a job on every replica until it is resumed: a timer job's scheduled ticks are
    /// held back; a consumer job's consumers stop taking deliveries (what they hold is
    /// finished and acked; the rest waits in the queue).
    Pause {
        /// The job, as `jobs list` names it (`draft-expiry`, `email-send`, say).
        job: String,
        /// Why, recorded in the audit trail and shown with the pause.
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        actor: crate::commands::actor::ActorArgs,
    },
    /// Let a paused job run again: a timer on its schedule, a consumer on its queue.
    Resume {
        job: String,
        /// Why, recorded in the audit trail.
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        actor: crate::commands::actor::ActorArgs,
    },
}

#[derive(Debug, Subcommand)]
pub enum AutomationsAction {
    /// Import (create or update, by id or else by name) the automations of a TOML or JSON
    /// file, all or none.
    Import {
        /// The file; its extension (.toml or .json) names the format.
        file: PathBuf,
        /// Validate the file without touching the database.
        #[arg(long)]
        dry_run: bool,
    },
}
