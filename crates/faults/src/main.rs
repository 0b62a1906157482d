//! `worker-faults`: the fault suite of issue 11. It runs the real release `worker-host` binary
//! on the real local services, one scenario at a time, each with a database, a vhost and
//! mailboxes of its own; it sends a steady stream of ping mails through the whole loop (SMTP
//! in, IMAP poll, trigger, action, SMTP out) while it applies the scenario's fault (kill -9 or
//! SIGTERM of the host, its PostgreSQL sessions terminated, its AMQP connections closed,
//! its SMTP server silent, late, refusing or cut after the final ".", its IMAP connection
//! dropped in a FETCH, its IMAP server restarted, its mailbox's UIDVALIDITY changed;
//! with `--disruptive`, the shared PostgreSQL and RabbitMQ restarted), and
//! then counts from outside what the host promised: every ping answered exactly once, no
//! database effect twice, the queues and the outbox drained, and ready again within two
//! heartbeat intervals. It prints the table and writes it to `docs/RELIABILITY.md`; it exits 1
//! when a scenario fails.
//!
//! Start it with `scripts/faults.sh` (which starts the services and builds both binaries).
//! The code: `scenarios/` (one file a scenario), `run.rs` (a scenario's world and the readings),
//! `oracle.rs` (the counting and the verdict), `report.rs` (the table and the document),
//! `host.rs` (the host process), `mail.rs` (the pings and the replies).

mod host;
mod mail;
mod oracle;
mod report;
mod run;
mod scenarios;
mod services;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use clap::Parser;

/// The host's broker heartbeat (`broker.heartbeat`, not set by the scenarios' settings).
const HEARTBEAT_SECS: f64 = 10.0;

#[derive(Debug, Parser)]
#[command(
    name = "worker-faults",
    about = "The worker-host fault suite (issue 11)"
)]
struct Args {
    /// One repetition of each scenario with a small load.
    #[arg(long)]
    quick: bool,
    /// Run only these scenarios (repeatable); all but the disruptive ones by default.
    #[arg(long = "scenario", value_name = "NAME")]
    scenarios: Vec<String>,
    /// Pings of the baseline (default: 10,000 full, 100 quick).
    #[arg(long, value_name = "N")]
    baseline_messages: Option<u64>,
    /// Repetitions of every fault scenario instead of its own.
    #[arg(long, value_name = "N")]
    repetitions: Option<u32>,
    /// Also run the disruptive scenarios (they restart the shared PostgreSQL and RabbitMQ).
    #[arg(long)]
    disruptive: bool,
    /// The `worker-host` binary under test.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/release/worker-host"))]
    host_bin: PathBuf,
    /// Where the document goes; `-` writes none.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/RELIABILITY.md"))]
    output: String,
    /// Where each scenario's settings and host log are kept.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/faults"))]
    work_dir: PathBuf,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(err) => {
            eprintln!("faults: {err:#}");
            ExitCode::from(70)
        }
    }
}

async fn run(args: Args) -> anyhow::Result<bool> {
    let started = Instant::now();
    let all = scenarios::all();
    for name in &args.scenarios {
        if !all.iter().any(|s| s.name == name) {
            let names: Vec<&str> = all.iter().map(|s| s.name).collect();
            anyhow::bail!("no scenario {name}; there are: {}", names.join(", "));
        }
    }
    anyhow::ensure!(
        args.host_bin.exists(),
        "no host binary at {} (cargo build --release -p worker-host)",
        args.host_bin.display()
    );
    let chosen: Vec<_> = all
        .iter()
        .filter(|s| {
            if args.scenarios.is_empty() {
                args.disruptive || !s.disruptive
            } else {
                args.scenarios.iter().any(|n| n == s.name)
            }
        })
        .cloned()
        .collect();
    let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%SZ").to_string();
    let ready_limit = 2.0 * HEARTBEAT_SECS;
    let mut rows = Vec::new();
    for scenario in &chosen {
        let mut load = if args.quick {
            scenario.quick
        } else {
            scenario.full
        };
        if scenario.fault.is_none() {
            if let Some(n) = args.baseline_messages {
                load.per_repetition = n;
            }
        } else if let Some(n) = args.repetitions {
            load.repetitions = n;
        }
        eprintln!(
            "faults: {}: {} × {} pings",
            scenario.name, load.repetitions, load.per_repetition
        );
        let dir = args.work_dir.join(&stamp).join(scenario.name);
        let figures = scenarios::run(scenario, load, &args.host_bin, &dir).await;
        let failures = figures.failures(ready_limit);
        eprintln!(
            "faults: {}: {} in {:.0} s{}",
            scenario.name,
            if failures.is_empty() { "pass" } else { "FAIL" },
            figures.duration_secs,
            if failures.is_empty() {
                String::new()
            } else {
                format!(": {}", failures.join("; "))
            }
        );
        rows.push(figures);
    }
    let table = report::table(&rows, ready_limit);
    println!("{table}");
    if args.output != "-" {
        let mut command = String::from("scripts/faults.sh");
        if args.quick {
            command.push_str(" --quick");
        }
        for name in &args.scenarios {
            command.push_str(&format!(" --scenario {name}"));
        }
        if args.disruptive {
            command.push_str(" --disruptive");
        }
        if let Some(n) = args.baseline_messages {
            command.push_str(&format!(" --baseline-messages {n}"));
        }
        if let Some(n) = args.repetitions {
            command.push_str(&format!(" --repetitions {n}"));
        }
        let env = environment(command, started.elapsed().as_secs_f64()).await;
        let text = report::document(&env, &rows, &all, ready_limit);
        let output = std::path::Path::new(&args.output);
        if let Some(parent) = output.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(output, text).with_context(|| format!("writing {}", output.display()))?;
        eprintln!("faults: written to {}", args.output);
    }
    Ok(rows.iter().all(|r| r.passed(ready_limit)))
}

/// The date, the machine and the service versions, each "unknown" when it cannot be read.
async fn environment(command: String, total_secs: f64) -> report::Environment {
    let first_line = |program: &str, args: &[&str]| {
        std::process::Command::new(program)
            .args(args)
            .output()
            .ok()
            .and_then(|o| {
                let text = String::from_utf8_lossy(&o.stdout).into_owned();
                text.lines().next().map(|l| l.trim().to_string())
            })
            .filter(|l| !l.is_empty())
            .unwrap_or_else(|| "unknown".into())
    };
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            let kb: f64 = text
                .lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))?
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .ok()?;
            Some(format!("{:.1} GiB", kb / 1024.0 / 1024.0))
        })
        .unwrap_or_else(|| "unknown".into());
    let rabbitmq = rabbit_version().await.unwrap_or_else(|_| "unknown".into());
    report::Environment {
        date: chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
        cores: std::thread::available_parallelism()
            .map(|n| n.to_string())
            .unwrap_or_else(|_| "unknown".into()),
        memory,
        postgres: first_line("psql", &["--version"]),
        rabbitmq,
        dovecot: first_line("dovecot", &["--version"]),
        command,
        total_secs,
    }
}

/// RabbitMQ's and Erlang's versions from the management API's overview.
async fn rabbit_version() -> anyhow::Result<String> {
    let vhost_free = worker_testkit::rabbit_api();
    let url = reqwest::Url::parse(&vhost_free)?;
    let mut base = url.clone();
    let _ = base.set_username("");
    let _ = base.set_password(None);
    let overview: serde_json::Value = reqwest::Client::new()
        .get(base.join("/api/overview")?)
        .basic_auth(url.username(), url.password())
        .timeout(std::time::Duration::from_secs(10))
        .send()
        .await?
        .json()
        .await?;
    Ok(format!(
        "{} (Erlang {})",
        overview["rabbitmq_version"].as_str().unwrap_or("?"),
        overview["erlang_version"].as_str().unwrap_or("?")
    ))
}
