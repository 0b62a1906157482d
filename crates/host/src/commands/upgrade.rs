//! `worker-host upgrade check [--json]`: run with the new release's binary and the
//! installation's settings, against the live installation, before rolling it out. It reads
//! and never changes: the settings as this release reads them (old keys it reads under new
//! names, and what it refuses), the schema (whether this release runs on it, and the
//! migrations it would apply, each with the schema contract's findings: a lock on a growing
//! table, a contract step that leaves the previous release behind), the replicas still
//! on another release, the dead letters and outbox rows by message type and schema version
//! (`x-schema-version`) with whether this release reads them, and the depth of every queue,
//! retry tier and dead-letter queue (by passive declares: a queue is never consumed from, so
//! no delivery count rises).

use std::collections::BTreeMap;

use clap::Args;
use serde::Serialize;
use worker_store::replicas::{self, Standing};

use crate::connections;
use crate::exit::Fatal;
use crate::settings::Settings;
use crate::settings::renames::Deprecation;
use crate::version;

#[derive(Debug, clap::Subcommand)]
pub enum UpgradeAction {
    /// Report the settings keys this release reads under new names, the migrations it would
    /// apply, the replicas on another release and the depth of every queue; exit 69 when
    /// something should be resolved first.
    Check(crate::commands::upgrade::CheckArgs),
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// What the check found.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The release this binary is.
    pub release: &'static str,
    pub settings: SettingsReport,
    /// The schema as it is: its newest migration and the release that applied it.
    pub schema: Option<worker_store::schema::SchemaVersion>,
    pub migrations: Vec<Pending>,
    /// Replicas that reported within a week on another release than this one.
    pub other_releases: Vec<Standing>,
    /// Dead letters still dead and outbox rows not yet published, by message type and schema
    /// version.
    pub messages: Vec<Versions>,
    /// Ready messages by queue; `None` when the broker could not be asked.
    pub queues: Option<BTreeMap<String, u64>>,
    /// Queues of this release's topology the broker does not have yet (its start declares
    /// them).
    pub undeclared: Vec<String>,
    /// What stands in the way, one line each; empty when the upgrade may go on.
    pub blockers: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct SettingsReport {
    /// Old keys read under their new names, each until a later release.
    pub deprecated: Vec<DeprecatedKey>,
}

#[derive(Debug, Serialize)]
pub struct DeprecatedKey {
    pub source: String,
    pub old: String,
    pub new: Vec<String>,
    pub until: &'static str,
    /// What does the work of a key no longer used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instead: Option<&'static str>,
}

impl From<&Deprecation> for DeprecatedKey {
    fn from(d: &Deprecation) -> Self {
        Self {
            source: d.source.clone(),
            old: d.old.clone(),
            new: d.new.clone(),
            until: d.until,
            instead: d.instead,
        }
    }
}

/// Rows of one message type and schema version waiting in a table.
#[derive(Debug, Serialize)]
pub struct Versions {
    /// `dead_letters` (still dead) or `outbox` (pending or failed).
    pub table: &'static str,
    pub message_type: String,
    pub version: i64,
    pub count: i64,
    /// The newest version of the type this release reads.
    pub reads_up_to: u32,
    pub readable: bool,
}

/// The newest schema version of `message_type` this release reads (every older one too:
/// versions are only ever added).
fn reads_up_to(message_type: &str) -> u32 {
    use worker_messages::{ActionCommand, DomainEvent, EmailSendCommand, Message};
    match message_type {
        EmailSendCommand::TYPE => EmailSendCommand::VERSION,
        ActionCommand::TYPE => ActionCommand::VERSION,
        event => DomainEvent::reads_version(event),
    }
}

/// The rows waiting in the dead-letter archive and the outbox, by type and version.
async fn message_versions(pool: &sqlx::PgPool) -> Result<Vec<Versions>, Fatal> {
    // A header kept as a number or as digits; anything else (or none) is version 1, as the
    // consumers read it.
    const VERSION: &str = "CASE jsonb_typeof(headers -> 'x-schema-version') \
           WHEN 'number' THEN (headers ->> 'x-schema-version')::numeric::bigint \
           WHEN 'string' THEN CASE WHEN headers ->> 'x-schema-version' ~ '^[0-9]{1,9}$' \
                                   THEN (headers ->> 'x-schema-version')::bigint ELSE 1 END \
           ELSE 1 END";
    let mut found = Vec::new();
    for (table, waiting) in [
        ("dead_letters", "status = 'dead'"),
        ("outbox", "status IN ('pending', 'failed')"),
    ] {
        if !table_exists(pool, table).await? {
            continue;
        }
        let rows: Vec<(String, i64, i64)> = sqlx::query_as(&format!(
            "SELECT coalesce(message_type, ''), {VERSION} AS version, count(*) \
             FROM {table} WHERE {waiting} GROUP BY 1, 2 ORDER BY 1, 2"
        ))
        .fetch_all(pool)
        .await
        .map_err(Fatal::unavailable)?;
        for (message_type, version, count) in rows {
            let reads = reads_up_to(&message_type);
            found.push(Versions {
                table,
                readable: version >= 1 && version <= i64::from(reads),
                message_type,
                version,
                count,
                reads_up_to: reads,
            });
        }
    }
    Ok(found)
}

/// A migration this release would apply.
#[derive(Debug, Serialize)]
pub struct Pending {
    pub version: i64,
    pub description: String,
    /// A contract step: once applied, the previous release no longer runs on the schema.
    pub contract: bool,
    /// What the schema contract's rules find in it, by line: a long lock on a busy table,
    /// or a change the release before cannot run with.
    pub findings: Vec<String>,
}

pub async fn check(settings: &Settings, args: &CheckArgs) -> Result<(), Fatal> {
    let report = report(settings).await?;
    if args.json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| Fatal::software(format!("the report cannot be written: {e}")))?;
        println!("{text}");
    } else {
        print_report(&report);
    }
    if report.blockers.is_empty() {
        Ok(())
    } else {
        Err(Fatal::unavailable(format!(
            "the upgrade to {} should wait: {}",
            report.release,
            report.blockers.join("; ")
        )))
    }
}

async fn report(settings: &Settings) -> Result<Report, Fatal> {
    let pool = worker_store::connect(&connections::pool_options(&settings.database))
        .await
        .map_err(Fatal::unavailable)?;
    let migrations = pending(&pool).await?;
    let schema = crate::schema::version(&pool).await;
    let other_releases = if table_exists(&pool, "replicas").await? {
        replicas::standings(&pool, settings.alerts.replica_silent_after)
            .await
            .map_err(Fatal::unavailable)?
            .into_iter()
            .filter(|s| s.state != "stopped" && s.replica.version != version::VERSION)
            .collect()
    } else {
        // A database no release has migrated yet: no replica ever ran on it.
        Vec::new()
    };
    let messages = message_versions(&pool).await?;
    pool.close().await;
    let (queues, undeclared) = match queue_depths(settings).await {
        Some((depths, undeclared)) => (Some(depths), undeclared),
        None => (None, Vec::new()),
    };
    let mut blockers = Vec::new();
    if queues.is_none() {
        blockers.push("the broker could not be asked for its queues".to_string());
    }
    for group in messages.iter().filter(|m| !m.readable) {
        blockers.push(format!(
            "{} rows of {} in {} are schema version {}, which this release does not read (it reads up to {})",
            group.count, group.message_type, group.table, group.version, group.reads_up_to
        ));
    }
    Ok(Report {
        release: version::VERSION,
        settings: SettingsReport {
            deprecated: settings
                .deprecations
                .iter()
                .map(DeprecatedKey::from)
                .collect(),
        },
        schema,
        migrations,
        other_releases,
        messages,
        queues,
        undeclared,
        blockers,
    })
}

async fn table_exists(pool: &sqlx::PgPool, table: &str) -> Result<bool, Fatal> {
    sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(table)
        .fetch_one(pool)
        .await
        .map_err(Fatal::unavailable)
}

/// The migrations this release would apply, each with the rules' findings; a schema this
/// release must not run on (a newer release contracted it) is an error, as at start.
async fn pending(pool: &sqlx::PgPool) -> Result<Vec<Pending>, Fatal> {
    use worker_store::schema::{Compatibility, StepKind};
    let pending = match worker_store::schema::check(pool, version::VERSION).await {
        Ok(Compatibility::Known { pending }) => pending,
        Ok(Compatibility::Ahead { .. }) => Vec::new(),
        Err(e) => return Err(Fatal::unavailable(e)),
    };
    Ok(worker_store::MIGRATOR
        .iter()
        .filter(|m| pending.contains(&m.version))
        .map(|m| Pending {
            version: m.version,
            description: m.description.to_string(),
            contract: StepKind::of(&m.sql) == StepKind::Contract,
            findings: worker_store::migration_rules::check_sql(&m.sql)
                .into_iter()
                .map(|(line, rule)| format!("line {line}: {rule}"))
                .collect(),
        })
        .collect())
}

/// Every consumer queue, retry tier and dead-letter queue of the topology with its ready
/// messages, by passive declares (each on a channel of its own, since a queue that is not
/// there closes its channel), and the ones the broker does not have.
async fn queue_depths(settings: &Settings) -> Option<(BTreeMap<String, u64>, Vec<String>)> {
    let topology = settings.topology().ok()?;
    let connection = connections::broker_connection(settings).ok()?;
    let mut rotation = worker_broker::Rotation::new(connection.addresses.len());
    let (session, _) = connections::connect_broker_from(&connection, 1, &mut rotation)
        .await
        .ok()?;
    let names: Vec<String> = topology
        .queues
        .iter()
        .flat_map(|q| {
            std::iter::once(q.name.clone())
                .chain(q.tiers.iter().map(|t| t.queue.clone()))
                .chain(std::iter::once(q.dead_queue.clone()))
        })
        .collect();
    let mut depths = BTreeMap::new();
    let mut undeclared = Vec::new();
    for name in names {
        match session.queue_depths([name.as_str()]).await?.remove(&name) {
            Some(depth) => {
                depths.insert(name, depth);
            }
            None => undeclared.push(name),
        }
    }
    if let Err(e) = session.close("upgrade check").await {
        tracing::debug!(error = %e, "closing the checking connection");
    }
    Some((depths, undeclared))
}

fn print_report(report: &Report) {
    println!("upgrade check for release {}", report.release);
    println!("\nsettings:");
    if report.settings.deprecated.is_empty() {
        println!("  no old keys");
    }
    for key in &report.settings.deprecated {
        if key.new.is_empty() {
            println!(
                "  {}: `{}` is no longer used, ignored until {}",
                key.source, key.old, key.until
            );
            continue;
        }
        println!(
            "  {}: `{}` is read as `{}` until {}",
            key.source,
            key.old,
            key.new.join("` and `"),
            key.until
        );
    }
    match &report.schema {
        Some(schema) => println!(
            "\nschema: migration {} (applied by release {})",
            schema.version,
            schema.release.as_deref().unwrap_or("unrecorded")
        ),
        None => println!("\nschema: no migration applied yet"),
    }
    println!("migrations to apply:");
    if report.migrations.is_empty() {
        println!("  none");
    }
    for m in &report.migrations {
        let kind = if m.contract { " (contract step)" } else { "" };
        println!("  {} {}{kind}", m.version, m.description);
        for finding in &m.findings {
            println!("      {finding}");
        }
    }
    println!("\nreplicas on another release:");
    if report.other_releases.is_empty() {
        println!("  none");
    }
    for s in &report.other_releases {
        println!(
            "  {} ({}) runs {}, {}",
            s.replica.name, s.replica.host, s.replica.version, s.state
        );
    }
    println!("\nwaiting messages by type and schema version:");
    if report.messages.is_empty() {
        println!("  none");
    }
    for m in &report.messages {
        println!(
            "  {:>8}  {} {} v{} ({})",
            m.count,
            m.table,
            m.message_type,
            m.version,
            if m.readable {
                "read by this release"
            } else {
                "NOT read by this release"
            }
        );
    }
    println!("\nqueues (ready messages):");
    match &report.queues {
        Some(depths) => {
            for (queue, depth) in depths {
                println!("  {depth:>8}  {queue}");
            }
        }
        None => println!("  the broker could not be asked"),
    }
    if !report.undeclared.is_empty() {
        println!(
            "  not declared yet (the start declares them): {}",
            report.undeclared.join(", ")
        );
    }
    for blocker in &report.blockers {
        println!("\nblocker: {blocker}");
    }
}
