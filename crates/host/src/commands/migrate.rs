//! `worker-host migrate`: checks the schema against this release's (refusing a newer release's
//! that ran a contract step this one does not know, leaving alone one it only expanded),
//! applies the embedded migrations, then exits. With `--dry-run` it prints the SQL it would
//! apply, in order, and applies nothing.

use tracing::Instrument;

use crate::connections;
use crate::exit::Fatal;
use crate::settings::Settings;

pub async fn run(settings: &Settings, dry_run: bool) -> Result<(), Fatal> {
    let span = tracing::info_span!("migrate", installation = %settings.installation);
    async {
        let pool = worker_store::connect(&connections::pool_options(&settings.database))
            .await
            .map_err(Fatal::unavailable)?;
        match crate::schema::check(&pool).await? {
            crate::schema::Plan::Migrate { pending } if dry_run => print_pending(&pending),
            crate::schema::Plan::Migrate { .. } => {
                worker_store::migrate(&pool, crate::version::VERSION)
                    .await
                    .map_err(|e| Fatal::software(format!("migrating the database: {e}")))?;
                tracing::info!("migrations applied");
            }
            // A newer release's schema is that release's to migrate; this one has nothing to add.
            crate::schema::Plan::LeaveAhead if dry_run => {
                println!("-- a newer release migrated this database: this release applies nothing");
            }
            crate::schema::Plan::LeaveAhead => tracing::info!("nothing applied"),
        }
        pool.close().await;
        Ok(())
    }
    .instrument(span)
    .await
}

/// The SQL of the migrations `pending`, in the order they would be applied, each headed by
/// its version, its name and how it runs.
fn print_pending(pending: &[i64]) {
    if pending.is_empty() {
        println!(
            "-- nothing to apply: the database has every migration of release {}",
            crate::version::VERSION
        );
    }
    for migration in worker_store::MIGRATOR
        .iter()
        .filter(|m| pending.contains(&m.version))
    {
        let kind = match worker_store::schema::StepKind::of(&migration.sql) {
            worker_store::schema::StepKind::Contract => "contract step",
            worker_store::schema::StepKind::Expand => "expand step",
        };
        let transaction = if migration.no_tx {
            "outside a transaction"
        } else {
            "in one transaction"
        };
        println!(
            "-- {} {} ({kind}, {transaction})\n{}\n",
            migration.version,
            migration.description,
            migration.sql.trim_end()
        );
    }
}
