//! [`execute`]: starts what a command needs (telemetry, the runtime) and runs it. `run` is the
//! host's [`lifecycle`](crate::lifecycle).

use super::Command;
use crate::commands::config::ConfigAction;
use crate::commands::topology::TopologyAction;
use crate::commands::upgrade::UpgradeAction;
use crate::commands::{
    audit_log, automations, circuits, config, dlq, health, jobs, mail, mail_auth, migrate,
    operators, outbox, privacy, queues, replicas, status, topology, upgrade,
};
use crate::exit::Fatal;
use crate::lifecycle::{self, Observability};
use crate::settings::{Settings, SettingsSource};
use crate::telemetry;

/// How long the runtime waits, once the command has returned, for its threads to finish.
const RUNTIME_SHUTDOWN: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs `command` with `settings` (loaded and validated) to its end.
pub fn execute(command: Command, settings: Settings, source: &SettingsSource) -> Result<(), Fatal> {
    if let Command::Config {
        action: ConfigAction::Check,
    } = command
    {
        config::check(&settings, source);
        return Ok(());
    }
    if let Command::Health = command {
        // No telemetry: a container runs this every few seconds.
        return tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Fatal::software(format!("the async runtime cannot start: {e}")))?
            .block_on(health::run(&settings));
    }
    // Outside the runtime: the exporters start runtimes of their own.
    let telemetry = telemetry::init(
        &settings.telemetry,
        &settings.installation,
        &settings.replica_name(),
    )
    .map_err(|e| Fatal::usage(format!("telemetry cannot start: {e:#}")))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Fatal::software(format!("the async runtime cannot start: {e}")))?;
    let observability = Observability {
        metrics: telemetry.metrics.clone(),
        prometheus: telemetry.prometheus.clone(),
    };
    let result = runtime.block_on(async move {
        match command {
            Command::Migrate { dry_run } => migrate::run(&settings, dry_run).await,
            Command::Status => status::run(&settings).await,
            Command::Replicas { action } => replicas::run(&settings, action).await,
            Command::Outbox { action } => outbox::run(&settings, action).await,
            Command::Automations { action } => automations::run(&settings, action).await,
            Command::Dlq { action } => dlq::run(&settings, action).await,
            Command::Jobs { action } => jobs::run(&settings, action).await,
            Command::Circuits { action } => circuits::run(&settings, action).await,
            Command::Mail { action } => mail::run(&settings, action).await,
            Command::AuditLog { action } => audit_log::run(&settings, action).await,
            Command::MailAuth { action } => mail_auth::run(&settings, action).await,
            Command::Operators { action } => operators::run(&settings, action).await,
            Command::Privacy { action } => privacy::run(&settings, action).await,
            Command::Queues { action } => queues::run(&settings, action).await,
            Command::Upgrade {
                action: UpgradeAction::Check(args),
            } => upgrade::check(&settings, &args).await,
            Command::Topology {
                action: TopologyAction::Declare,
            } => topology::declare(&settings).await,
            // `main` runs the fleet view before any host settings are read.
            Command::Fleet => Err(Fatal::usage(
                "the fleet view takes its own settings file: worker-host fleet --config fleet.toml",
            )),
            Command::Run | Command::Config { .. } | Command::Health => {
                lifecycle::run(settings, observability).await
            }
        }
    });
    // Bounded: a thread that a wedged unit of work blocks would hold a plain drop for ever.
    runtime.shutdown_timeout(RUNTIME_SHUTDOWN);
    telemetry.shutdown();
    result
}
