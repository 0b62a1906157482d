//! `worker-host migrate`: checks the schema against this release's (refusing a newer release's
//! that ran a contract step this one does not know, leaving alone one it only expanded),
//! applies the embedded migrations, then exits.

use tracing::Instrument;

use crate::connections;
use crate::exit::Fatal;
use crate::settings::Settings;

pub async fn run(settings: &Settings) -> Result<(), Fatal> {
    let span = tracing::info_span!("migrate", installation = %settings.installation);
    async {
        let pool = worker_store::connect(&connections::pool_options(&settings.database))
            .await
            .map_err(Fatal::unavailable)?;
        match crate::schema::check(&pool).await? {
            crate::schema::Plan::Migrate { .. } => {
                worker_store::migrate(&pool, crate::version::VERSION)
                    .await
                    .map_err(|e| Fatal::software(format!("migrating the database: {e}")))?;
                tracing::info!("migrations applied");
            }
            // A newer release's schema is that release's to migrate; this one has nothing to add.
            crate::schema::Plan::LeaveAhead => tracing::info!("nothing applied"),
        }
        pool.close().await;
        Ok(())
    }
    .instrument(span)
    .await
}
