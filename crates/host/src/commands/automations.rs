//! `worker-host automations import FILE [--dry-run]`: checks or imports automation
//! definitions.

use crate::connections;
use crate::exit::Fatal;
use crate::settings::Settings;

#[derive(Debug, clap::Subcommand)]
pub enum AutomationsAction {
    /// Import (create or update, by id or else by name) the automations of a TOML or JSON
    /// file, all or none.
    Import {
        /// The file; its extension (.toml or .json) names the format.
        file: std::path::PathBuf,
        /// Validate the file without touching the database.
        #[arg(long)]
        dry_run: bool,
    },
}

pub async fn run(settings: &Settings, action: AutomationsAction) -> Result<(), Fatal> {
    let AutomationsAction::Import { file, dry_run } = action;
    let invalid = |e: job_automation_trigger::import::ImportError| {
        Fatal::usage(format!("{}: {e}", file.display()))
    };
    if dry_run {
        let definitions = job_automation_trigger::import::load_file(&file).map_err(invalid)?;
        println!(
            "{}: {} automations, all valid",
            file.display(),
            definitions.len()
        );
        return Ok(());
    }
    let pool = worker_store::connect(&connections::pool_options(&settings.database))
        .await
        .map_err(Fatal::unavailable)?;
    let report = job_automation_trigger::import::import_file(&pool, &file)
        .await
        .map_err(invalid)?;
    println!("{report}");
    pool.close().await;
    Ok(())
}
