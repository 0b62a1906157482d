//! `worker-faults`: the fault suite of issue 11. It runs the real release `worker-host` binary
//! on the real local services, one scenario at a time, each with a database, a vhost and
//! mailboxes of its own; it sends a steady stream of ping mails through the whole loop (SMTP
//! in, IMAP poll, trigger, action, SMTP out) while it applies the scenario's fault (kill -9 or
//! SIGTERM of the host, its PostgreSQL sessions terminated, a private PostgreSQL cluster
//! restarted or crashed, its database traffic stalled, its AMQP connections closed, cut or
//! blackholed through a proxy, a private RabbitMQ node restarted, killed, frozen or alarmed,
//! the node of a private three-node cluster the host is on stopped,
//! its SMTP server silent, late, refusing or cut after the final ".", its IMAP connection
//! dropped in a FETCH, a private IMAP server restarted, its mailbox's UIDVALIDITY changed,
//! poison messages, timers overrunning and replicas competing for leases, a rolling upgrade
//! from the previous release), and
//! then counts from outside what the host promised: every ping answered exactly once, no
//! database effect twice, the queues and the outbox drained, and ready again within two
//! heartbeat intervals. It prints the table and writes it to `docs/RELIABILITY.md`; it exits 1
//! when a scenario fails.
//!
//! Start it with `scripts/faults.sh` (which starts the services and builds both binaries).
//! The code: `scenarios/` (one file a scenario), `run/` (a scenario's world: its start, its
//! host processes, the readings, the settings file),
//! `oracle.rs` (the counting and the verdict), `report.rs` (the table and the document),
//! `host.rs` (the host process), `mail.rs` (the pings and the replies), `rabbit_node.rs` and
//! `rabbit_cluster.rs` (a private RabbitMQ node, or cluster, for the broker's process faults),
//! `previous_release.rs` (the previous release's binary, built from `docs/previous-release`).

mod command;
mod direct;
mod host;
mod mail;
mod oracle;
mod pg_cluster;
mod previous_release;
mod rabbit_cluster;
mod rabbit_node;
mod report;
mod run;
mod scenarios;
mod timers;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use futures::StreamExt;

/// The host's broker heartbeat (`broker.heartbeat`) in the scenarios that keep the default;
/// a scenario with its own ([`scenarios::Scenario::heartbeat`]) carries its own limit in its
/// figures.
const HEARTBEAT_SECS: f64 = scenarios::DEFAULT_HEARTBEAT.as_secs_f64();

#[derive(Debug, Parser)]
#[command(
    name = "worker-faults",
    about = "The worker-host fault suite (issue 11)"
)]
struct Args {
    /// One repetition of each scenario with a small load (those of `FULL_RUN_ONLY` only
    /// when named with --scenario).
    #[arg(long)]
    quick: bool,
    /// Run only these scenarios (repeatable); all by default.
    #[arg(long = "scenario", value_name = "NAME")]
    scenarios: Vec<String>,
    /// Pings of the baseline (default: 10,000 full, 100 quick).
    #[arg(long, value_name = "N")]
    baseline_messages: Option<u64>,
    /// Scenarios run at once (each has its own database, vhost, mailboxes and private
    /// servers); default 1, and 6 with `--quick`.
    #[arg(long, value_name = "N")]
    parallel: Option<usize>,
    /// Repetitions of every fault scenario instead of its own.
    #[arg(long, value_name = "N")]
    repetitions: Option<u32>,
    /// The `worker-host` binary under test.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/release/worker-host"))]
    host_bin: PathBuf,
    /// The `worker-host` binary built with `--features fault-injection`, for the scenarios
    /// that need it (`poison-panic`); the `--host-bin` one when not given.
    #[arg(long, value_name = "PATH")]
    fault_injection_host_bin: Option<PathBuf>,
    /// Where the document goes; `-` writes none. Default: docs/RELIABILITY.md for a full
    /// run, `quick.md` in the work dir for `--quick` (so that CI's run leaves the recorded
    /// full run alone).
    #[arg(long)]
    output: Option<String>,
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

async fn run(mut args: Args) -> anyhow::Result<bool> {
    let started = Instant::now();
    // The settings name their automations file by a path the host resolves against the
    // settings file's folder: a relative work dir would be counted twice.
    args.work_dir = std::path::absolute(&args.work_dir)
        .with_context(|| format!("resolving {}", args.work_dir.display()))?;
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
    if let Some(path) = &args.fault_injection_host_bin {
        anyhow::ensure!(
            path.exists(),
            "no host binary at {} (cargo build --release -p worker-host --features fault-injection --target-dir target/fault-injection)",
            path.display()
        );
    }
    let chosen: Vec<_> = all
        .iter()
        .filter(|s| {
            let named = args.scenarios.iter().any(|n| n == s.name);
            let wanted = args.scenarios.is_empty() || named;
            // A full-run-only scenario runs in --quick only when asked for by name.
            wanted && (!args.quick || named || !scenarios::FULL_RUN_ONLY.contains(&s.name))
        })
        .cloned()
        .collect();
    if args.quick && args.scenarios.is_empty() {
        eprintln!(
            "faults: --quick leaves out {} (full run only; name it with --scenario to run it)",
            scenarios::FULL_RUN_ONLY.join(", ")
        );
    }
    let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%SZ").to_string();
    let ready_limit = 2.0 * HEARTBEAT_SECS;
    let parallel = args
        .parallel
        .unwrap_or(if args.quick { 6 } else { 1 })
        .max(1);
    // Each scenario is a task of its own: a clean-up that blocks its thread (a `Drop` that
    // waits on a server) then stalls no other scenario.
    let rows: Vec<_> = futures::stream::iter(chosen.iter().map(|scenario| {
        let scenario = scenario.clone();
        let load = load_of(&scenario, &args);
        let dir = args.work_dir.join(&stamp).join(scenario.name);
        let binary = match &args.fault_injection_host_bin {
            Some(path) if scenarios::NEEDS_FAULT_INJECTION.contains(&scenario.name) => path,
            _ => &args.host_bin,
        }
        .clone();
        let run = async move {
            eprintln!(
                "faults: {}: {} × {} pings",
                scenario.name, load.repetitions, load.per_repetition
            );
            let figures = scenarios::run(&scenario, load, &binary, &dir).await;
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
            figures
        };
        tokio::spawn(run)
    }))
    .buffered(parallel)
    .collect::<Vec<_>>()
    .await
    .into_iter()
    .collect::<Result<_, _>>()
    .context("a scenario's task panicked")?;
    let table = report::table(&rows, ready_limit);
    println!("{table}");
    let output = args.output.clone().unwrap_or_else(|| {
        if args.quick {
            args.work_dir.join("quick.md").display().to_string()
        } else {
            concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/RELIABILITY.md").to_string()
        }
    });
    if output != "-" {
        let mut command = String::from("scripts/faults.sh");
        if args.quick {
            command.push_str(" --quick");
        }
        for name in &args.scenarios {
            command.push_str(&format!(" --scenario {name}"));
        }
        if let Some(n) = args.baseline_messages {
            command.push_str(&format!(" --baseline-messages {n}"));
        }
        if let Some(n) = args.repetitions {
            command.push_str(&format!(" --repetitions {n}"));
        }
        if let Some(n) = args.parallel {
            command.push_str(&format!(" --parallel {n}"));
        }
        let env = environment(command, started.elapsed().as_secs_f64()).await;
        let text = report::document(&env, &rows, &all, ready_limit);
        let path = std::path::Path::new(&output);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(path, text).with_context(|| format!("writing {output}"))?;
        eprintln!("faults: written to {output}");
    }
    Ok(rows.iter().all(|r| r.passed(ready_limit)))
}

/// The scenario's load: its own full or quick one, with the command line's overrides.
fn load_of(scenario: &scenarios::Scenario, args: &Args) -> scenarios::Load {
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
    load
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
