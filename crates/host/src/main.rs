//! `worker-host`: see `worker-host --help`.

use std::process::ExitCode;

use clap::Parser;
use worker_host::cli::{self, Cli, Command};
use worker_host::settings::{self, Settings};
use worker_host::{commands, exit};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { exit::USAGE } else { 0 };
            let _ = e.print();
            return ExitCode::from(code as u8);
        }
    };
    if let Some(Command::Fleet) = cli.command {
        return commands::fleet::main(cli.config.as_deref());
    }
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
    // Said on standard error for every command (an operator sees it at `config check`);
    // `run` logs them again once its telemetry is up.
    for deprecation in &settings.deprecations {
        eprintln!("worker-host: warning: {deprecation}");
    }
    match cli::execute(cli.command.unwrap_or(Command::Run), settings, &source) {
        Ok(()) => ExitCode::SUCCESS,
        Err(fatal) => {
            eprintln!("worker-host: {}", fatal.message);
            ExitCode::from(fatal.code as u8)
        }
    }
}
