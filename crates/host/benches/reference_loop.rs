//! The host against the reference loop (issue 41, item 4): the same mail loop written with the
//! bare clients (`benches/reference/`), run side by side with the host on worlds of their own
//! (a database, a vhost and an IMAP account each), in alternating order (host, reference, host,
//! reference…), `BENCH_PAIRS` pairs per rate.
//!
//! The load is an open loop: pings sent over SMTP to the loop's IMAP account, each from a
//! sender of its own (the reply limit is a default), at Poisson arrivals of each rate of
//! `BENCH_RATES` mails/s; `BENCH_WARMUP_SECS` of warm-up, then `BENCH_STEADY_SECS` of steady
//! state. For the mails sent in the steady window:
//! - the latency from the ping's acceptance by the SMTP sink (the clock when the sink answered
//!   its DATA) to its reply's acceptance (the reply's file's modification time in the sender's
//!   Maildir: the sink writes it before it answers), p50 and p99;
//! - the CPU per mail of each process over the steady window (`/proc/<pid>/stat`, user and
//!   system): the loop (the host, or the reference's process), PostgreSQL (the backends of the
//!   loop's own database: the server is shared with other work), RabbitMQ, Dovecot, the SMTP
//!   sink and the load generator (this process);
//! - the transactions per mail (`pg_stat_database` of the loop's database).
//!
//! Each rate prints every run, then the medians over the pairs with their ranges. Then, from a
//! counted run of each loop (`BENCH_COUNT_MAILS` mails at 5/s, with sqlx's statement log on),
//! the statements and transactions on one mail's path, by hop (`throughput/hops.rs`: the host's
//! spans; the reference runs its hops in spans of the same names, inert but in that run).
//!
//! ```text
//! cargo bench -p worker-host --bench reference_loop
//! BENCH_PAIRS=2 BENCH_STEADY_SECS=20 BENCH_RATES=5,50 cargo bench -p worker-host --bench reference_loop
//! ```
//!
//! Defaults: `BENCH_PAIRS=5`, `BENCH_RATES=5,50,150`, `BENCH_WARMUP_SECS=15`,
//! `BENCH_STEADY_SECS=120`, `BENCH_COUNT_MAILS=50` (0 leaves the counted runs out),
//! `BENCH_REPLY_WAIT_SECS=180` (how long after the steady window a reply may still come; a
//! mail without one by then counts at that wait and is reported missing),
//! `BENCH_REF_GATHER_MS=5` (the reference drain's gather when busy; 0: never). The full run takes
//! about 3 rates × 2 loops × 5 pairs × 2.5 minutes, 75 minutes, and the counted runs. Needs the
//! local services (`scripts/services.sh up`); the host is this build's binary (the release
//! profile's fat LTO; `CARGO_PROFILE_BENCH_LTO=false CARGO_PROFILE_BENCH_CODEGEN_UNITS=16`
//! builds in a third of the time, for a trial).
//!
//! The bench's own executable is the reference's process: `--reference-loop` runs the loop
//! (`reference::main`) instead of the bench.

// A benchmark program: a failure should stop it loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "throughput/hops.rs"]
mod hops;
mod reference;
#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use lettre::message::Mailbox;
use lettre::transport::smtp::PoolConfig;
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use support::{Host, base_settings, free_port, short_id};
use worker_testkit::{TestDb, TestVhost};

/// The demo's automation: a reply to every mail whose subject starts with "ping".
const AUTOMATION: &str = include_str!("../../../config/automations.demo.toml");

/// Clock ticks a second (`getconf CLK_TCK`), as `/proc/<pid>/stat` counts.
const TICKS_PER_SECOND: f64 = 100.0;

fn main() {
    if std::env::args().any(|a| a == "--reference-loop") {
        reference::main();
        return;
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(bench());
}

// ---------------------------------------------------------------------------------------------
// Knobs
// ---------------------------------------------------------------------------------------------

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Knobs {
    pairs: usize,
    rates: Vec<f64>,
    warmup: Duration,
    steady: Duration,
    reply_wait: Duration,
    count_mails: usize,
}

fn knobs() -> Knobs {
    let rates = std::env::var("BENCH_RATES").unwrap_or_else(|_| "5,50,150".into());
    Knobs {
        pairs: env("BENCH_PAIRS", 5) as usize,
        rates: rates
            .split(',')
            .filter_map(|r| r.trim().parse().ok())
            .collect(),
        warmup: Duration::from_secs(env("BENCH_WARMUP_SECS", 15)),
        steady: Duration::from_secs(env("BENCH_STEADY_SECS", 120)),
        reply_wait: Duration::from_secs(env("BENCH_REPLY_WAIT_SECS", 180)),
        count_mails: env("BENCH_COUNT_MAILS", 50) as usize,
    }
}

// ---------------------------------------------------------------------------------------------
// The two loops, each on a world of its own
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Host,
    Reference,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Host => "host",
            Kind::Reference => "reference",
        }
    }
}

enum Process {
    Host(Host),
    Reference {
        child: Child,
        log: PathBuf,
        _dir: tempfile::TempDir,
    },
}

/// A loop running on its own database, vhost and IMAP account.
struct World {
    process: Process,
    db: TestDb,
    _vhost: TestVhost,
    account: String,
}

impl World {
    async fn start(kind: Kind, statement_log: bool) -> World {
        let account = format!("refb-{}", short_id());
        let db = TestDb::create().await.unwrap();
        let vhost = TestVhost::create().await.unwrap();
        let process = match kind {
            Kind::Host => Process::Host(start_host(&db, &vhost, &account, statement_log).await),
            Kind::Reference => start_reference(&db, &vhost, &account, statement_log).await,
        };
        World {
            process,
            db,
            _vhost: vhost,
            account,
        }
    }

    fn pid(&self) -> u32 {
        match &self.process {
            Process::Host(host) => host.pid(),
            Process::Reference { child, .. } => child.id(),
        }
    }

    fn log_text(&self) -> String {
        match &self.process {
            Process::Host(host) => host.log_text(),
            Process::Reference { log, .. } => std::fs::read_to_string(log).unwrap_or_default(),
        }
    }

    fn log_tail(&self) -> String {
        let text = self.log_text();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    async fn stop(self) {
        match self.process {
            Process::Host(mut host) => {
                if host.stop().await != Some(0) {
                    eprintln!("the host did not stop cleanly\n{}", host.log_tail());
                }
            }
            Process::Reference { mut child, .. } => {
                let _ = Command::new("kill")
                    .args(["-TERM", &child.id().to_string()])
                    .status();
                let deadline = Instant::now() + Duration::from_secs(10);
                while Instant::now() < deadline {
                    if let Ok(Some(_)) = child.try_wait() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        remove_mailbox(&self.account);
    }
}

/// The host with the shipped defaults but for where the services are: the IMAP account and
/// the demo's automation (as `benches/common`'s `launch_binary`, copied: that file is shared).
async fn start_host(db: &TestDb, vhost: &TestVhost, account: &str, statement_log: bool) -> Host {
    let (imap_host, imap_port) = worker_testkit::imap_addr()
        .rsplit_once(':')
        .map(|(h, p)| (h.to_string(), p.to_string()))
        .unwrap();
    let rust_log = if statement_log {
        "info,sqlx::query=debug"
    } else {
        "info"
    };
    let host = Host::launch_with("BENCH_SHOW_LOG", &[("RUST_LOG", rust_log)], |dir, port| {
        let automations = dir.join("automations.toml");
        std::fs::write(&automations, AUTOMATION)?;
        let files = format!("[{:?}]", automations.display().to_string());
        let settings = base_settings("reference-bench", &files, db, vhost, port);
        Ok(format!(
            "{settings}\n[[imap.accounts]]\nname = \"bench\"\nhost = {imap_host:?}\nport = {imap_port}\nusername = {account:?}\npassword = \"secret\"\n"
        ))
    })
    .await
    .unwrap();
    // The IDLE session is up a moment after /readyz.
    tokio::time::sleep(Duration::from_secs(2)).await;
    host
}

/// The reference's process: the topology declared by the host's own command, the demo's
/// automation imported, then this executable with `--reference-loop`.
async fn start_reference(
    db: &TestDb,
    vhost: &TestVhost,
    account: &str,
    statement_log: bool,
) -> Process {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("worker-host.toml");
    std::fs::write(
        &config,
        base_settings("reference-bench", "[]", db, vhost, free_port()),
    )
    .unwrap();
    let declared = support::host_command(&config)
        .args(["topology", "declare"])
        .output()
        .unwrap();
    assert!(
        declared.status.success(),
        "topology declare: {}",
        String::from_utf8_lossy(&declared.stderr)
    );
    let automations = dir.path().join("automations.toml");
    std::fs::write(&automations, AUTOMATION).unwrap();
    job_automation_trigger::import_file(&db.pool, &automations)
        .await
        .unwrap();

    let out = dir.path().join("reference.out");
    let log = dir.path().join("reference.log");
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .arg("--reference-loop")
        .env("REF_DATABASE_URL", &db.url)
        .env("REF_AMQP_URL", vhost.amqp_url())
        .env("REF_IMAP_ADDR", worker_testkit::imap_addr())
        .env("REF_ACCOUNT", account)
        .env_remove("REF_STATEMENT_LOG")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&log).unwrap());
    if statement_log {
        command.env("REF_STATEMENT_LOG", "1");
    }
    let mut child = command.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(&out)
        .unwrap_or_default()
        .contains("ready")
    {
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "the reference exited with {status}:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        assert!(Instant::now() < deadline, "the reference was not ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Process::Reference {
        child,
        log,
        _dir: dir,
    }
}

// ---------------------------------------------------------------------------------------------
// Mailboxes
// ---------------------------------------------------------------------------------------------

fn mail_dir(local: &str) -> PathBuf {
    worker_testkit::services_dir().join("mail").join(local)
}

/// When the first mail in `local`'s mailbox was written, if there is one.
fn first_mail_written(local: &str) -> Option<SystemTime> {
    let base = mail_dir(local).join("Maildir");
    ["new", "cur"]
        .iter()
        .filter_map(|sub| std::fs::read_dir(base.join(sub)).ok())
        .flat_map(|entries| entries.flatten())
        .filter_map(|e| e.metadata().ok()?.modified().ok())
        .min()
}

/// Removes a mailbox the bench made (its pings' senders, the loop's account).
fn remove_mailbox(local: &str) {
    if local.starts_with("refb-") {
        let _ = std::fs::remove_dir_all(mail_dir(local));
    }
}

// ---------------------------------------------------------------------------------------------
// CPU by process
// ---------------------------------------------------------------------------------------------

const GROUPS: &[&str] = &[
    "loop",
    "PostgreSQL",
    "RabbitMQ",
    "Dovecot",
    "SMTP sink",
    "load generator",
];

/// User and system ticks of `pid`; with `children`, also of its waited-for children (a
/// service's exited workers: Dovecot's logins, say).
fn ticks(stat: &str, children: bool) -> u64 {
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let wanted: &[usize] = if children {
        &[11, 12, 13, 14]
    } else {
        &[11, 12]
    };
    wanted
        .iter()
        .filter_map(|i| fields.get(*i)?.parse::<u64>().ok())
        .sum()
}

/// CPU ticks by group: the loop's process (`loop_pid`), the backends of `database`, and the
/// shared services.
fn cpu_by_group(loop_pid: u32, database: &str) -> BTreeMap<&'static str, u64> {
    let mut out = BTreeMap::new();
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline"))
            .map(|raw| String::from_utf8_lossy(&raw).replace('\0', " "))
            .unwrap_or_default();
        let (group, children) = if pid == loop_pid {
            ("loop", true)
        } else if pid == me {
            // Not its children: the previous world's process is reaped into them.
            ("load generator", false)
        } else if cmdline.starts_with("postgres:") && cmdline.contains(database) {
            ("PostgreSQL", false)
        } else if cmdline.contains("beam.smp") {
            ("RabbitMQ", true)
        } else if !cmdline.contains("dovecot-wh-mta")
            && (cmdline.starts_with("dovecot/") || cmdline.contains("dovecot/dovecot.conf"))
        {
            ("Dovecot", true)
        } else if cmdline.contains("aiosmtpd") {
            ("SMTP sink", true)
        } else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        *out.entry(group).or_default() += ticks(&stat, children);
    }
    out
}

fn cpu_per_mail(
    before: &BTreeMap<&'static str, u64>,
    after: &BTreeMap<&'static str, u64>,
    mails: usize,
) -> BTreeMap<&'static str, f64> {
    GROUPS
        .iter()
        .map(|group| {
            let ticks = after
                .get(group)
                .copied()
                .unwrap_or(0)
                .saturating_sub(before.get(group).copied().unwrap_or(0));
            (
                *group,
                ticks as f64 / TICKS_PER_SECOND * 1000.0 / mails.max(1) as f64,
            )
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The load: Poisson arrivals over SMTP
// ---------------------------------------------------------------------------------------------

/// One ping: its sender, when the sink accepted it, and whether it counts (sent in the steady
/// window).
struct Sent {
    sender: String,
    accepted: SystemTime,
    steady: bool,
}

fn transport() -> AsyncSmtpTransport<Tokio1Executor> {
    let addr = worker_testkit::smtp_addr();
    let (host, port) = addr.rsplit_once(':').unwrap();
    AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(host)
        .port(port.parse().unwrap())
        .timeout(Some(Duration::from_secs(20)))
        .pool_config(PoolConfig::new().max_size(32))
        .build()
}

fn ping(sender: &str, account: &str, i: usize) -> Message {
    Message::builder()
        .from(format!("{sender}@localhost").parse::<Mailbox>().unwrap())
        .to(format!("{account}@localhost").parse::<Mailbox>().unwrap())
        .subject(format!("ping {i}"))
        .message_id(Some(format!(
            "<ping-{}@bench.test>",
            uuid::Uuid::new_v4().simple()
        )))
        .body("are you there?".to_string())
        .unwrap()
}

/// The wait before the next arrival of a Poisson process of `rate` a second.
fn next_gap(rate: f64) -> f64 {
    let u: f64 = rand::random();
    -(1.0 - u).ln() / rate
}

/// Figures of one run.
struct Run {
    kind: Kind,
    mails: usize,
    missing: usize,
    p50: Duration,
    p99: Duration,
    cpu: BTreeMap<&'static str, f64>,
    transactions: f64,
}

/// Sends pings to `world` at Poisson arrivals of `rate` for `warmup + steady`; the steady
/// window's CPU and transactions are read at its two ends, exactly on time.
async fn drive(
    world: &World,
    rate: f64,
    warmup: Duration,
    steady: Duration,
) -> (Vec<Sent>, BTreeMap<&'static str, f64>, f64) {
    let smtp = Arc::new(transport());
    let run = short_id();
    let sent = Arc::new(Mutex::new(Vec::new()));
    let start = tokio::time::Instant::now();
    let (from, until) = (start + warmup, start + warmup + steady);
    let loop_pid = world.pid();
    let database = world.db.name.clone();
    let pool = world.db.pool.clone();
    let window = tokio::spawn(async move {
        tokio::time::sleep_until(from).await;
        let before = (
            cpu_by_group(loop_pid, &database),
            transactions_of(&pool).await,
        );
        tokio::time::sleep_until(until).await;
        let after = (
            cpu_by_group(loop_pid, &database),
            transactions_of(&pool).await,
        );
        (before, after)
    });
    let mut sends = Vec::new();
    let mut at = 0.0;
    let mut i = 0;
    loop {
        at += next_gap(rate);
        let when = start + Duration::from_secs_f64(at);
        if when >= until {
            break;
        }
        tokio::time::sleep_until(when).await;
        let steady = when >= from;
        let sender = format!("refb-{run}-{i}");
        let message = ping(&sender, &world.account, i);
        let smtp = Arc::clone(&smtp);
        let sent = Arc::clone(&sent);
        sends.push(tokio::spawn(async move {
            match smtp.send(message).await {
                Ok(_) => sent.lock().unwrap().push(Sent {
                    sender,
                    accepted: SystemTime::now(),
                    steady,
                }),
                Err(err) => eprintln!("a ping was not accepted: {err}"),
            }
        }));
        i += 1;
    }
    for send in sends {
        let _ = send.await;
    }
    let ((cpu_before, tx_before), (cpu_after, tx_after)) = window.await.unwrap();
    let sent = std::mem::take(&mut *sent.lock().unwrap());
    let mails = sent.iter().filter(|s| s.steady).count();
    (
        sent,
        cpu_per_mail(&cpu_before, &cpu_after, mails),
        (tx_after - tx_before) as f64 / mails.max(1) as f64,
    )
}

async fn transactions_of(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(pool)
    .await
    .unwrap_or(0)
}

/// The latency of each steady ping, waiting up to `wait` for the replies; a ping without one
/// counts at the wait. Returns the latencies and how many had none.
async fn latencies(sent: &[Sent], wait: Duration) -> (Vec<Duration>, usize) {
    let deadline = Instant::now() + wait;
    let mut pending: Vec<&Sent> = sent.iter().filter(|s| s.steady).collect();
    let mut out = Vec::with_capacity(pending.len());
    loop {
        pending.retain(|s| match first_mail_written(&s.sender) {
            Some(replied) => {
                out.push(replied.duration_since(s.accepted).unwrap_or_default());
                false
            }
            None => true,
        });
        if pending.is_empty() || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let missing = pending.len();
    out.extend(std::iter::repeat_n(wait, missing));
    out.sort();
    (out, missing)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

async fn measure(kind: Kind, rate: f64, knobs: &Knobs) -> Run {
    let world = World::start(kind, false).await;
    let (sent, cpu, transactions) = drive(&world, rate, knobs.warmup, knobs.steady).await;
    let (latencies, missing) = latencies(&sent, knobs.reply_wait).await;
    if missing > 0 {
        eprintln!(
            "{}: {missing} replies missing after {:?}\n{}",
            kind.name(),
            knobs.reply_wait,
            world.log_tail()
        );
    }
    world.stop().await;
    for s in &sent {
        remove_mailbox(&s.sender);
    }
    Run {
        kind,
        mails: latencies.len(),
        missing,
        p50: percentile(&latencies, 50.0),
        p99: percentile(&latencies, 99.0),
        cpu,
        transactions,
    }
}

// ---------------------------------------------------------------------------------------------
// The steps on one mail's path
// ---------------------------------------------------------------------------------------------

/// Statements and transactions per mail on the loop's hops, from a counted run's statement log.
async fn count_steps(
    kind: Kind,
    mails: usize,
    wait: Duration,
) -> (BTreeMap<hops::Hop, hops::Count>, usize) {
    let world = World::start(kind, true).await;
    let before = world.log_text().len();
    let (sent, _, _) = drive(
        &world,
        5.0,
        Duration::ZERO,
        Duration::from_secs_f64(mails as f64 / 5.0),
    )
    .await;
    let (_, missing) = latencies(&sent, wait).await;
    assert_eq!(
        missing,
        0,
        "{}: replies missing in the counted run",
        kind.name()
    );
    // The last reply's record, a moment after the sink accepted it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The IDLE session's fetch records its job's name quoted (`job="inbound-email-poller"`):
    // `hops.rs` reads it unquoted.
    let text = world.log_text();
    let log = text
        .get(before..)
        .unwrap_or("")
        .replace("\"inbound-email-poller\"", "inbound-email-poller");
    let counted = hops::count(&log);
    if let Ok(dir) = std::env::var("BENCH_STATEMENT_LOG") {
        std::fs::create_dir_all(&dir).unwrap();
        let path = Path::new(&dir).join(format!("reference-bench-{}.log", kind.name()));
        std::fs::write(&path, &log).unwrap();
        println!(
            "{}: the counted run's log is {}",
            kind.name(),
            path.display()
        );
    }
    world.stop().await;
    for s in &sent {
        remove_mailbox(&s.sender);
    }
    // Per mail sent: a Poisson run's count is not the planned one.
    (counted, sent.len())
}

// ---------------------------------------------------------------------------------------------
// The report
// ---------------------------------------------------------------------------------------------

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// `median [min–max]` of `values`.
fn summary(mut values: Vec<f64>, decimals: usize) -> String {
    values.sort_by(f64::total_cmp);
    if values.is_empty() {
        return "-".into();
    }
    let n = values.len();
    let median = if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    };
    if n == 1 {
        return format!("{median:.decimals$}");
    }
    format!(
        "{median:.decimals$} [{:.decimals$}–{:.decimals$}]",
        values[0],
        values[n - 1]
    )
}

fn print_run(rate: f64, pair: usize, run: &Run) {
    let cpu: Vec<String> = GROUPS
        .iter()
        .map(|g| format!("{:.2}", run.cpu.get(g).copied().unwrap_or(0.0)))
        .collect();
    println!(
        "| {rate} | {} | {} | {} | {} | {:.0} | {:.0} | {} | {:.1} |",
        pair + 1,
        run.kind.name(),
        run.mails,
        run.missing,
        ms(run.p50),
        ms(run.p99),
        cpu.join(" | "),
        run.transactions
    );
}

async fn bench() {
    let knobs = knobs();
    println!(
        "the host against the reference loop: {} pairs a rate, rates {:?} mails/s, {:?} warm-up, {:?} steady",
        knobs.pairs, knobs.rates, knobs.warmup, knobs.steady
    );
    let mut summaries = Vec::new();
    for &rate in &knobs.rates {
        println!();
        println!(
            "| rate | pair | loop | mails | missing | p50 ms | p99 ms | CPU ms/mail: loop | PostgreSQL | RabbitMQ | Dovecot | SMTP sink | load generator | tx/mail |"
        );
        println!("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        let mut runs: Vec<Run> = Vec::new();
        for pair in 0..knobs.pairs {
            for kind in [Kind::Host, Kind::Reference] {
                let run = measure(kind, rate, &knobs).await;
                print_run(rate, pair, &run);
                runs.push(run);
            }
        }
        summaries.push((rate, runs));
    }

    println!();
    println!(
        "medians over the pairs [ranges]: latency from the ping's acceptance to its reply's; CPU per mail of the steady window"
    );
    println!(
        "| rate | loop | p50 ms | p99 ms | CPU ms/mail: loop | PostgreSQL | RabbitMQ | Dovecot | SMTP sink | load generator | tx/mail | missing |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (rate, runs) in &summaries {
        for kind in [Kind::Host, Kind::Reference] {
            let of: Vec<&Run> = runs.iter().filter(|r| r.kind == kind).collect();
            let cpu: Vec<String> = GROUPS
                .iter()
                .map(|g| {
                    summary(
                        of.iter()
                            .map(|r| r.cpu.get(g).copied().unwrap_or(0.0))
                            .collect(),
                        2,
                    )
                })
                .collect();
            println!(
                "| {rate} | {} | {} | {} | {} | {} | {} |",
                kind.name(),
                summary(of.iter().map(|r| ms(r.p50)).collect(), 0),
                summary(of.iter().map(|r| ms(r.p99)).collect(), 0),
                cpu.join(" | "),
                summary(of.iter().map(|r| r.transactions).collect(), 1),
                of.iter().map(|r| r.missing).sum::<usize>(),
            );
        }
        let median = |kind: Kind, f: &dyn Fn(&Run) -> f64| {
            let mut v: Vec<f64> = runs.iter().filter(|r| r.kind == kind).map(f).collect();
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
        };
        let loop_cpu = |r: &Run| r.cpu.get("loop").copied().unwrap_or(0.0);
        let pg_cpu = |r: &Run| r.cpu.get("PostgreSQL").copied().unwrap_or(0.0);
        println!(
            "at {rate}/s the host against the reference: its CPU per mail {:.2}x (goal at 50/s: <= 1.3x), PostgreSQL's {:.2}x (goal: <= 1.2x), p50 {:.2}x, p99 {:.2}x",
            median(Kind::Host, &loop_cpu) / median(Kind::Reference, &loop_cpu),
            median(Kind::Host, &pg_cpu) / median(Kind::Reference, &pg_cpu),
            median(Kind::Host, &|r| ms(r.p50)) / median(Kind::Reference, &|r| ms(r.p50)),
            median(Kind::Host, &|r| ms(r.p99)) / median(Kind::Reference, &|r| ms(r.p99)),
        );
    }

    if knobs.count_mails > 0 {
        for kind in [Kind::Host, Kind::Reference] {
            let (counts, mails) = count_steps(kind, knobs.count_mails, knobs.reply_wait).await;
            println!();
            println!(
                "{}: statements (database round trips) and transactions per mail on one mail's path, by hop (sqlx's statement log, {mails} mails at 5/s):",
                kind.name(),
            );
            hops::print(&counts, mails);
        }
    }
}
