//! `worker-host fleet`: the fleet view, on its own settings file. It runs before (and
//! instead of) the host's settings: a fleet view has no database, broker or jobs of its own.

use std::path::Path;
use std::process::ExitCode;

use crate::exit::{self, Fatal};
use worker_fleet::Stopped;
use worker_fleet::settings::{DEFAULT_PATH, FleetSettings};

/// Loads the fleet's settings from `config` (else [`DEFAULT_PATH`]) and serves the view until
/// SIGTERM or SIGINT; the exit code says how it ended.
pub fn main(config: Option<&Path>) -> ExitCode {
    let path = config.unwrap_or_else(|| Path::new(DEFAULT_PATH));
    let env: Vec<(String, String)> = std::env::vars().collect();
    let settings = match FleetSettings::load(path, &env) {
        Ok(settings) => settings,
        Err(errors) => {
            eprintln!("worker-host fleet: the settings cannot be used:");
            for error in errors {
                eprintln!("  {error}");
            }
            return ExitCode::from(exit::USAGE as u8);
        }
    };
    match run(settings) {
        Ok(()) => ExitCode::SUCCESS,
        Err(fatal) => {
            eprintln!("worker-host fleet: {}", fatal.message);
            ExitCode::from(fatal.code as u8)
        }
    }
}

fn run(settings: FleetSettings) -> Result<(), Fatal> {
    // Logs to standard error, as `RUST_LOG` says (info by default); a token is never in them.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Fatal::software(format!("the async runtime cannot start: {e}")))?;
    let result = runtime
        .block_on(worker_fleet::run(
            settings,
            crate::version::VERSION,
            crate::lifecycle::wait_for_signal(),
        ))
        .map_err(|stopped| match stopped {
            Stopped::Unavailable(message) => Fatal::unavailable(message),
            Stopped::Software(message) => Fatal::software(message),
        });
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
    result
}
