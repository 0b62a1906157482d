//! `worker-host`: see `worker-host --help`.

use std::process::ExitCode;

use clap::Parser;
use worker_host::cli::{Cli, Command, ConfigAction, TopologyAction};
use worker_host::settings::{self, Settings};
use worker_host::{exit, run, telemetry};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { exit::USAGE } else { 0 };
            let _ = e.print();
            return ExitCode::from(code as u8);
        }
    };
    let source = settings::source_from(cli.config.as_deref());
    let env: Vec<(String, String)> = std::env::vars().collect();
    let settings = match Settings::load(&source, &env) {
        Ok(settings) => settings,
        Err(errors) => {
            eprintln!("worker-host: the settings cannot be used:");
            for error in errors {
                eprintln!("  {error}");
            }
            return ExitCode::from(exit::USAGE as u8);
        }
    };

    let command = cli.command.unwrap_or(Command::Run);
    if let Command::Config {
        action: ConfigAction::Check,
    } = command
    {
        println!(
            "# effective settings ({}), secrets redacted",
            source.path.display()
        );
        print!("{}", settings.to_redacted_toml());
        return ExitCode::SUCCESS;
    }

    let telemetry = match telemetry::init(&settings.telemetry, &settings.installation) {
        Ok(telemetry) => telemetry,
        Err(e) => {
            eprintln!("worker-host: telemetry cannot start: {e:#}");
            return ExitCode::from(exit::USAGE as u8);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("worker-host: the async runtime cannot start: {e}");
            return ExitCode::from(exit::SOFTWARE as u8);
        }
    };
    let observability = run::Observability {
        metrics: telemetry.metrics.clone(),
        prometheus: telemetry.prometheus.clone(),
    };
    let result = runtime.block_on(async move {
        match command {
            Command::Migrate => run::migrate(&settings).await,
            Command::Status => run::status(&settings).await,
            Command::Outbox { action } => run::outbox(&settings, action).await,
            Command::Automations { action } => run::automations(&settings, action).await,
            Command::Dlq { action } => worker_host::dlq::run(&settings, action).await,
            Command::Topology {
                action: TopologyAction::Declare,
            } => run::topology(&settings).await,
            Command::Run | Command::Config { .. } => run::run(settings, observability).await,
        }
    });
    drop(runtime);
    telemetry.shutdown();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(fatal) => {
            eprintln!("worker-host: {}", fatal.message);
            ExitCode::from(fatal.code as u8)
        }
    }
}
