//! The host's lifecycle: reach the services, migrate, serve the admin endpoints, run until
//! a signal, then shut down within the grace period.

use std::sync::{Arc, RwLock};

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::admin::{self, AdminState};
use crate::alerts::AlertBook;
use crate::connections::{self, BrokerCheck, DatabaseCheck};
use crate::console::{Access, BulkRuns, Console, HostRuntime};
use crate::exit::Fatal;
use crate::jobs::{self, JobsContext};
use crate::metrics::{Metrics, PrometheusReader};
use crate::notify::{self, Notifier};
use crate::readiness::{Readiness, ReadinessCheck};
use crate::sampler;
use crate::secret::Secret;
use crate::settings::Settings;
use crate::status::{Reading, StatusBoard};
use crate::topology::{declare_topology, topology_failure};
use worker_store::{AdvisoryLease, AttemptLog};

/// What `run` reports through: the instruments and the reader behind `/metrics`.
#[derive(Debug, Clone)]
pub struct Observability {
    pub metrics: Metrics,
    pub prometheus: PrometheusReader,
}

/// `worker-host run`: runs until SIGTERM or SIGINT, then stops within the grace period.
pub async fn run(settings: Settings, observability: Observability) -> Result<(), Fatal> {
    let shutdown = CancellationToken::new();
    let tracker = TaskTracker::new();
    for deprecation in &settings.deprecations {
        tracing::warn!(old = %deprecation.old, new = ?deprecation.new, until = deprecation.until, "{deprecation}");
    }

    let (pool, supervisor, primary) = reach_services(&settings)
        .instrument(tracing::info_span!("host.start", installation = %settings.installation))
        .await?;
    let schema = crate::schema::version(&pool).await;

    // The supervisor reconnects and redeclares for as long as the host runs; after shutdown
    // starts it keeps the connection up until the consumers have let go of it.
    tracker.spawn(supervisor.clone().run(shutdown.clone()));

    let settings = Arc::new(settings);
    let liveness = worker_core::liveness::Liveness::default();
    let (attempt_log, attempt_writer) =
        AttemptLog::new(pool.clone(), &settings.workers.attempt_log);
    tracker.spawn(attempt_writer.run(shutdown.child_token()));
    let history = worker_store::history::Tally::default();
    let lease = Arc::new(AdvisoryLease::new(pool.clone()));
    // Read before any consumer starts, so that a replica starting while a consumer job is
    // paused never consumes its queue; a failed reading starts them, and the watch corrects
    // it within `workers.pause_poll`.
    let paused = worker_store::pauses::list(&pool).await.unwrap_or_else(|e| {
        tracing::warn!(error = %e, "could not read the paused jobs at start; the next reading applies them");
        Vec::new()
    });
    let circuits = worker_store::circuits::Circuits::new(
        pool.clone(),
        settings.circuits.clone(),
        settings.replica_name(),
    );
    match worker_store::circuits::list(&pool).await {
        Ok(open) => circuits.apply(open),
        Err(e) => {
            tracing::warn!(error = %e, "could not read the open circuits at start; the next reading applies them")
        }
    }
    let consumer_gates = Arc::new(jobs::ConsumerGates::new(&paused, &circuits.open_circuits()));
    tracker.spawn(jobs::watch_pauses(
        consumer_gates.clone(),
        circuits.clone(),
        pool.clone(),
        settings.workers.pause_poll,
        shutdown.child_token(),
    ));
    let oauth = worker_mail_auth::TokenSources::build(&settings.oauth)
        .map_err(|e| Fatal::usage(e.to_string()))?;
    crate::metrics::oauth::register(&observability.metrics.meter, &oauth);
    let jobs_context = JobsContext {
        settings: settings.clone(),
        oauth,
        pool: pool.clone(),
        publisher: supervisor.publisher(settings.broker.publisher.clone()),
        supervisor: supervisor.clone(),
        lease: lease.clone(),
        attempt_log,
        history: history.clone(),
        metrics: observability.metrics.clone(),
        tracker: tracker.clone(),
        shutdown: shutdown.clone(),
        pauses: Some(Arc::new(crate::scheduler::control::DatabasePauses::new(
            pool.clone(),
        ))),
        consumer_gates: Some(consumer_gates),
        circuits: circuits.clone(),
        liveness: liveness.clone(),
    };
    let started = jobs::start_all(&jobs_context).map_err(Fatal::usage)?;
    crate::metrics::jobs::register(
        &observability.metrics,
        &started.entries,
        &liveness,
        &crate::metrics::jobs::Build::of(&settings),
    );
    crate::metrics::circuits::register(&observability.metrics.meter, &circuits);
    let readiness = readiness(&settings, &supervisor, &started, primary.clone());
    let notifier = Notifier::from_env();
    tracker.spawn(notify::supervise(
        notifier,
        readiness.clone(),
        liveness,
        shutdown.child_token(),
    ));

    let (alerts, readings) = start_sampler(
        &settings,
        &pool,
        &supervisor,
        &started,
        &observability,
        &tracker,
        &shutdown,
    );
    tracker.spawn(crate::history::run(
        crate::history::Writer {
            pool: pool.clone(),
            tally: history,
            lease,
            readings: readings.clone(),
        },
        shutdown.child_token(),
    ));
    if settings.admin.enabled {
        serve_admin(
            &settings,
            &supervisor,
            started,
            Watched {
                alerts,
                readings,
                readiness,
                schema,
                circuits,
                primary,
            },
            &observability,
            &tracker,
            &shutdown,
        )
        .await?;
    }
    tracker.close();

    tracing::info!(installation = %settings.installation, "worker host running");
    wait_for_signal().await;
    let grace = settings.workers.shutdown_grace;
    tracing::info!(?grace, "shutting down");
    notifier.stopping(&format!(
        "stopping: settling within {}",
        humantime::format_duration(grace)
    ));
    shutdown.cancel();
    if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
        tracing::warn!(
            ?grace,
            "work still in flight at the end of the grace period was abandoned"
        );
    }
    // A clean stop, so that the other replicas do not count this one as gone silent.
    if let Err(e) = worker_store::replicas::stopped(&pool, &settings.replica_name()).await {
        tracing::warn!(error = %e, "could not record this replica's clean stop");
    }
    pool.close().await;
    tracing::info!("stopped");
    Ok(())
}

/// Readings for the gauges and the alerts. No alert touches readiness: restarting the host
/// cures none of them.
fn start_sampler(
    settings: &Settings,
    pool: &sqlx::PgPool,
    supervisor: &worker_broker::Supervisor,
    started: &jobs::Started,
    observability: &Observability,
    tracker: &TaskTracker,
    shutdown: &CancellationToken,
) -> (Arc<AlertBook>, Arc<RwLock<sampler::Readings>>) {
    let alerts = Arc::new(AlertBook::default());
    let readings = Arc::new(RwLock::new(sampler::Readings::default()));
    sampler::register_gauges(&observability.metrics, readings.clone());
    tracker.spawn(sampler::run(
        sampler::Sources {
            pool: pool.clone(),
            supervisor: supervisor.clone(),
            health: started.health.clone(),
            stuck_after: settings.jobs.reconciler.job.stuck_after,
            replica: worker_store::replicas::Replica {
                name: settings.replica_name(),
                installation: settings.installation.clone(),
                host: whoami::fallible::hostname().unwrap_or_else(|_| "unknown".into()),
                pid: i32::try_from(std::process::id()).unwrap_or(i32::MAX),
                version: crate::version::VERSION.to_string(),
                started_at: chrono::Utc::now(),
                last_seen: chrono::Utc::now(),
            },
            replica_silent_after: settings.alerts.replica_silent_after,
        },
        readings.clone(),
        alerts.clone(),
        settings.alerts.clone(),
        shutdown.child_token(),
    ));
    (alerts, readings)
}

/// What the admin endpoints read: the alerts and readings the sampler keeps up to date, and
/// readiness.
struct Watched {
    alerts: Arc<AlertBook>,
    readings: Arc<RwLock<sampler::Readings>>,
    readiness: Readiness,
    /// The schema as found at start (after migrating), for `/readyz`.
    schema: Option<worker_store::schema::SchemaVersion>,
    /// The dependencies' circuits, for `/status`.
    circuits: worker_store::circuits::Circuits,
    /// Which member of `database.hosts` is primary, for `/status` (`None` without the list).
    primary: Option<worker_store::PrimaryWatch>,
}

/// What readiness depends on: the database probe's last result (and, with `database.hosts`,
/// a member that takes writes) and the broker link.
fn readiness(
    settings: &Settings,
    supervisor: &worker_broker::Supervisor,
    started: &jobs::Started,
    primary: Option<worker_store::PrimaryWatch>,
) -> Readiness {
    let checks: Vec<Box<dyn ReadinessCheck>> = vec![
        Box::new(DatabaseCheck {
            health: started.health.clone(),
            stale_after: settings.jobs.db_health.timeout() * 3,
            primary,
        }),
        Box::new(BrokerCheck(supervisor.status())),
    ];
    Readiness::new(checks)
}

/// `/healthz`, `/readyz`, `/status`, `/metrics` and the console on `admin.listen`, until
/// shutdown.
async fn serve_admin(
    settings: &Settings,
    supervisor: &worker_broker::Supervisor,
    started: jobs::Started,
    watched: Watched,
    observability: &Observability,
    tracker: &TaskTracker,
    shutdown: &CancellationToken,
) -> Result<(), Fatal> {
    let board = StatusBoard {
        installation: settings.installation.clone(),
        replica: settings.replica_name(),
        started_at: chrono::Utc::now(),
        jobs: started.entries,
        broker: supervisor.status(),
        alerts: watched.alerts.clone(),
        database: Arc::new(DatabaseReading(
            started.health.clone(),
            watched.primary.clone(),
        )),
        environment: settings.admin.environment(),
        schema: watched.schema.clone(),
        circuits: watched.circuits.clone(),
        sending_rate: started.sending_rate.clone(),
    };
    let runtime = HostRuntime {
        board: board.clone(),
        readings: watched.readings,
        gates: started.gates,
        settings: Arc::new(settings.clone()),
    };
    let console = console(settings, supervisor, runtime, tracker, shutdown).await?;
    let server = admin::serve(
        settings.admin.listen,
        admin::Limits::of(&settings.admin),
        AdminState::new(watched.readiness)
            .with_allowed_hosts(&settings.admin)
            .with_schema(watched.schema)
            .with_metrics(observability.prometheus.clone())
            .with_status(board)
            .with_console(Arc::new(console)),
        shutdown.clone(),
    )
    .await
    .map_err(Fatal::unavailable)?;
    tracker.spawn(async move {
        if let Err(e) = server.await {
            tracing::error!(error = %e, "the admin server stopped");
        }
    });
    Ok(())
}

/// The operator's console, on a pool of its own.
async fn console(
    settings: &Settings,
    supervisor: &worker_broker::Supervisor,
    runtime: HostRuntime,
    tracker: &TaskTracker,
    shutdown: &CancellationToken,
) -> Result<Console, Fatal> {
    let mut options = connections::pool_options(&settings.database);
    options.connect = options.connect.application_name("worker-host console");
    options.max_connections = settings.admin.console_connections;
    options.min_connections = 0;
    let pool = worker_store::connect(&options)
        .await
        .map_err(Fatal::unavailable)?;
    let views = crate::console::views()
        .map_err(|e| Fatal::software(format!("the console's pages do not compile: {e:#}")))?;
    let admin = &settings.admin;
    sync_bootstrap(&pool, admin.operator_token.as_ref()).await?;
    Ok(Console {
        pool,
        publisher: supervisor.publisher(settings.broker.publisher.clone()),
        runtime: Arc::new(runtime),
        installation: settings.installation.clone(),
        environment: admin.environment(),
        access: Access::new(admin),
        bulk: BulkRuns::default(),
        views,
        replica: settings.replica_name(),
        archive_retention: settings.jobs.dead_letter_archive.job.archiver.retention,
        story_retention: settings.story_retention(),
        audit_log_retention: settings.jobs.retention.job.audit_log,
        bulk_rate: admin.bulk_rate,
        email_max_age: settings.jobs.email_send.max_age,
        password_hashing: admin.password_hashing,
        tracker: tracker.clone(),
        shutdown: shutdown.clone(),
        edits: crate::console::edit::EditSettings {
            route: job_email_send::edit::CommandRoute::new(
                settings.broker.topology.commands_exchange.clone(),
            ),
            recipients_max: settings.jobs.automation_action.auto_replies.recipients_max,
        },
        privacy_key: crate::privacy::hash_key(settings).ok(),
    })
}

/// Keeps the `bootstrap` account in step with `admin.operator_token`, and says at every start
/// that the token is a shared secret to be replaced by named accounts.
async fn sync_bootstrap(pool: &sqlx::PgPool, token: Option<&Secret>) -> Result<(), Fatal> {
    use worker_store::operators::BootstrapSync;
    let digest = token.map(|t| worker_console::credentials::token_digest(t.expose()));
    let outcome = worker_store::operators::sync_bootstrap(pool, digest.as_deref())
        .await
        .map_err(Fatal::unavailable)?;
    match outcome {
        BootstrapSync::Rotated => tracing::warn!(
            "admin.operator_token changed: the sessions made with the old one ended on every replica"
        ),
        BootstrapSync::Disabled => tracing::info!(
            "admin.operator_token is gone: the `bootstrap` account is disabled, its token and sessions ended on every replica"
        ),
        BootstrapSync::Enabled | BootstrapSync::Unchanged => {}
    }
    if token.is_some() {
        tracing::warn!(
            "admin.operator_token signs in as the built-in `bootstrap` admin, a secret every holder shares: make named accounts (`worker-host operators add NAME --role admin --password-stdin`), then remove admin.operator_token and restart"
        );
    }
    Ok(())
}

/// Reaches the database (checking its schema against this release's migrations, migrating it
/// if asked and the schema is not a newer release's, and importing the automation files) and
/// the broker (declaring the topology), each with bounded retries.
async fn reach_services(
    settings: &Settings,
) -> Result<
    (
        sqlx::PgPool,
        worker_broker::Supervisor,
        Option<worker_store::PrimaryWatch>,
    ),
    Fatal,
> {
    let worker_store::Connected { pool, primary } =
        worker_store::connect_watched(&connections::run_pool_options(settings))
            .await
            .map_err(Fatal::unavailable)?;
    match crate::schema::check(&pool).await? {
        crate::schema::Plan::Migrate { .. } if settings.database.migrate_on_start => {
            worker_store::migrate(&pool, crate::version::VERSION)
                .await
                .map_err(|e| Fatal::software(format!("migrating the database: {e}")))?;
        }
        crate::schema::Plan::Migrate { pending } if !pending.is_empty() => tracing::warn!(
            ?pending,
            "the database lacks migrations of this release and database.migrate_on_start is false: run `worker-host migrate`"
        ),
        crate::schema::Plan::Migrate { .. } | crate::schema::Plan::LeaveAhead => {}
    }
    for file in &settings.automations_files {
        let report = job_automation_trigger::import::import_file(&pool, file)
            .await
            .map_err(|e| {
                Fatal::usage(format!(
                    "importing automations from {}: {e}",
                    file.display()
                ))
            })?;
        tracing::info!(file = %file.display(), "automations imported:\n{report}");
    }
    declare_topology(settings).await?;
    let topology = settings.topology().map_err(topology_failure)?;
    let connection = connections::broker_connection(settings).map_err(Fatal::usage)?;
    let supervisor = worker_broker::Supervisor::new(connection, topology);
    Ok((pool, supervisor, primary))
}

/// Waits for SIGTERM or SIGINT (the fleet view stops on them too).
pub(crate) async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => tracing::info!("SIGTERM received"),
                    _ = int.recv() => tracing::info!("SIGINT received"),
                }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The database line of `/status`: what the health monitor last saw, and, with
/// `database.hosts`, the members and which one is primary.
#[derive(Debug)]
struct DatabaseReading(
    job_db_health::HealthHandle,
    Option<worker_store::PrimaryWatch>,
);

impl Reading for DatabaseReading {
    fn read(&self) -> serde_json::Value {
        let mut value = serde_json::to_value(self.0.snapshot()).unwrap_or_default();
        if let (Some(primary), Some(fields)) = (&self.1, value.as_object_mut()) {
            let status = primary.status();
            fields.insert("members".into(), serde_json::json!(status.members));
            fields.insert("primary".into(), serde_json::json!(status.primary));
            fields.insert("primary_since".into(), serde_json::json!(status.since));
            fields.insert(
                "primary_switches".into(),
                serde_json::json!(status.switches),
            );
            fields.insert(
                "member_answers".into(),
                serde_json::json!(status.last_survey),
            );
        }
        value
    }
}
