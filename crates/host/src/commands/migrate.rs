//! `worker-host migrate`: applies the embedded migrations, then exits.

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
        worker_store::migrate(&pool, crate::version::VERSION)
            .await
            .map_err(|e| Fatal::software(format!("migrating the database: {e}")))?;
        tracing::info!("migrations applied");
        pool.close().await;
        Ok(())
    }
    .instrument(span)
    .await
}
