//! How many mails a second the whole loop answers, against what each service manages alone on
//! this machine, in one run:
//!
//! 1. **ceilings**, each service with a bare client: the SMTP sink's accept rate (lettre's
//!    connection, `BENCH_SMTP_CONCURRENCY` of them side by side), Dovecot's fetch rate (one session,
//!    `UID FETCH n BODY.PEEK[]` one message at a time, as the poller does), PostgreSQL's
//!    commit rate (one-row transactions on 8 connections, `synchronous_commit` on);
//! 2. **inbound mails**: `BENCH_MAILS` pings appended to the host's IMAP account (each from a
//!    sender of its own: the reply limit is a default), through poller, outbox, trigger,
//!    action and send, until every reply is recorded sent;
//! 3. **events**: the same number of `email.received` events published straight to the
//!    broker, through trigger, action and send.
//!
//! For 2 and 3: mails a second end to end, the CPU per mail of each process group (the host,
//! PostgreSQL, RabbitMQ, Dovecot, the SMTP sink, from `/proc`), the transactions per mail
//! (`pg_stat_database` of the host's database) and, from a smaller run with sqlx's statement
//! log on, the database round trips (statements) and transactions per mail, by hop (the
//! span each statement ran in: the poller, the outbox drain, each consumer; the timers and
//! anything outside a hop apart). The host runs the shipped defaults (release build) but for
//! where the services are.
//!
//! `BENCH_BASELINE=<path of another worker-host build>` measures that build beside this one,
//! each run in turn on worlds of their own, and prints the ratios; `BENCH_STATEMENT_LOG=<dir>`
//! keeps each build's counted log there.
//!
//! ```text
//! cargo bench -p worker-host --bench mail_throughput
//! BENCH_MAILS=2000 BENCH_COUNT_MAILS=100 cargo bench -p worker-host --bench mail_throughput
//! BENCH_BASELINE=/tmp/worker-host-before cargo bench -p worker-host --bench mail_throughput
//! ```
//!
//! Needs the local services (`scripts/services.sh up`).

// A benchmark program: a failure should stop it loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "throughput/hops.rs"]
mod hops;
#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::env;
use futures::StreamExt;
use lettre::Message;
use lettre::message::Mailbox;
use lettre::transport::smtp::client::AsyncSmtpConnection;
use lettre::transport::smtp::extension::ClientId;
use support::{Host, short_id};
use worker_testkit::{TestDb, TestVhost};

/// Clock ticks a second (`getconf CLK_TCK`), as `/proc/<pid>/stat` counts.
const TICKS_PER_SECOND: f64 = 100.0;

// ---------------------------------------------------------------------------------------------
// CPU by process group
// ---------------------------------------------------------------------------------------------

/// The process groups whose CPU a run is charged with.
const GROUPS: &[&str] = &["host", "PostgreSQL", "RabbitMQ", "Dovecot", "SMTP sink"];

/// Which group a process belongs to, by its command line; `host_pid` is the host's.
fn group_of(pid: u32, cmdline: &str, host_pid: u32) -> Option<&'static str> {
    if pid == host_pid {
        Some("host")
    } else if cmdline.starts_with("postgres") {
        Some("PostgreSQL")
    } else if cmdline.contains("beam.smp") || cmdline.contains("rabbitmq") {
        Some("RabbitMQ")
    } else if cmdline.starts_with("dovecot")
        || cmdline.starts_with("imap")
        || cmdline.contains("dovecot/")
    {
        Some("Dovecot")
    } else if cmdline.contains("aiosmtpd") {
        Some("SMTP sink")
    } else {
        None
    }
}

/// CPU ticks (user + system, of the process and its waited-for children) of each group.
fn cpu_by_group(host_pid: u32) -> BTreeMap<&'static str, u64> {
    let mut out = BTreeMap::new();
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
        let Some(group) = group_of(pid, &cmdline, host_pid) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // The fields after the command (which may hold spaces, inside parentheses).
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u64 = [11, 12, 13, 14]
            .iter()
            .filter_map(|i| fields.get(*i)?.parse::<u64>().ok())
            .sum();
        *out.entry(group).or_default() += ticks;
    }
    out
}

/// Milliseconds of CPU per mail of each group between two readings.
fn cpu_per_mail(
    before: &BTreeMap<&'static str, u64>,
    after: &BTreeMap<&'static str, u64>,
    mails: usize,
) -> Vec<(&'static str, f64)> {
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
                ticks as f64 / TICKS_PER_SECOND * 1000.0 / mails as f64,
            )
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Ceilings
// ---------------------------------------------------------------------------------------------

fn mail_to(to: &str, from: &str, subject: &str) -> Message {
    Message::builder()
        .from(from.parse::<Mailbox>().unwrap())
        .to(to.parse::<Mailbox>().unwrap())
        .subject(subject)
        .message_id(Some(format!(
            "<{}@bench.test>",
            uuid::Uuid::new_v4().simple()
        )))
        .body("are you there?".to_string())
        .unwrap()
}

/// The SMTP sink's accept rate: `n` mails over `concurrency` connections side by side, each
/// sending its share one after another (Nagle's algorithm off, as the host's own pool).
async fn smtp_ceiling(n: usize, concurrency: usize) -> f64 {
    let to = format!("ceiling-{}@localhost", short_id());
    let started = Instant::now();
    let share = n.div_ceil(concurrency);
    let workers = (0..concurrency).map(|w| {
        let to = to.clone();
        async move {
            let tcp = tokio::net::TcpStream::connect(worker_testkit::smtp_addr())
                .await
                .unwrap();
            tcp.set_nodelay(true).unwrap();
            let hello = ClientId::Domain("bench.test".into());
            let mut connection = AsyncSmtpConnection::connect_with_transport(Box::new(tcp), &hello)
                .await
                .unwrap();
            for i in 0..share {
                let mail = mail_to(&to, "bench@localhost", &format!("ceiling {w}-{i}"));
                let envelope = mail.envelope().clone();
                connection
                    .send(&envelope, &mail.formatted())
                    .await
                    .expect("the sink accepts");
            }
            let _ = connection.quit().await;
        }
    });
    futures::future::join_all(workers).await;
    (share * concurrency) as f64 / started.elapsed().as_secs_f64()
}

type Imap = async_imap::Session<tokio::net::TcpStream>;

async fn imap_session(user: &str) -> Imap {
    let stream = tokio::net::TcpStream::connect(worker_testkit::imap_addr())
        .await
        .unwrap();
    let mut client = async_imap::Client::new(stream);
    client.read_response().await.unwrap();
    client
        .login(user, "secret")
        .await
        .map_err(|(e, _)| e)
        .unwrap()
}

fn raw_ping(from: &str, to: &str, i: usize) -> Vec<u8> {
    format!(
        "From: {from}\r\nTo: {to}\r\nSubject: ping {i}\r\nMessage-ID: <{}@bench.test>\r\n\r\nare you there?\r\n",
        uuid::Uuid::new_v4().simple()
    )
    .into_bytes()
}

/// Dovecot's fetch rate: `n` mails appended (not timed), then fetched one `UID FETCH` each.
async fn imap_ceiling(n: usize) -> f64 {
    let user = format!("ceiling-imap-{}", short_id());
    let mut session = imap_session(&user).await;
    for i in 0..n {
        session
            .append(
                "INBOX",
                None,
                None,
                raw_ping("a@localhost", &format!("{user}@localhost"), i),
            )
            .await
            .unwrap();
    }
    session.select("INBOX").await.unwrap();
    let uids: Vec<u32> = session
        .uid_search("ALL")
        .await
        .unwrap()
        .into_iter()
        .collect();
    let started = Instant::now();
    for uid in &uids {
        let fetched: Vec<_> = session
            .uid_fetch(uid.to_string(), "BODY.PEEK[]")
            .await
            .unwrap()
            .collect::<Vec<_>>()
            .await;
        assert!(!fetched.is_empty());
    }
    let rate = uids.len() as f64 / started.elapsed().as_secs_f64();
    let _ = session.logout().await;
    rate
}

/// PostgreSQL's commit rate: one-row transactions on 8 connections.
async fn pg_ceiling(n: usize) -> f64 {
    let db = TestDb::create_empty().await.unwrap();
    let pool = db.another_pool(8).await.unwrap();
    sqlx::query("CREATE TABLE commits (id bigserial PRIMARY KEY, body text NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let started = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let pool = pool.clone();
            async move {
                sqlx::query("INSERT INTO commits (body) VALUES ($1)")
                    .bind(format!("row {i}"))
                    .execute(&pool)
                    .await
                    .unwrap();
            }
        })
        .buffer_unordered(8)
        .for_each(|_| async {})
        .await;
    n as f64 / started.elapsed().as_secs_f64()
}

// ---------------------------------------------------------------------------------------------
// The loop
// ---------------------------------------------------------------------------------------------

struct World {
    host: Host,
    db: TestDb,
    vhost: TestVhost,
    account: String,
}

async fn world(binary: Option<&Path>, rust_log: &str) -> World {
    let account = format!("bench-loop-{}", short_id());
    let (host, db, vhost) = common::launch_binary(
        binary,
        "throughput-bench",
        &account,
        "",
        &[("RUST_LOG", rust_log)],
    )
    .await;
    World {
        host,
        db,
        vhost,
        account,
    }
}

async fn sent(db: &TestDb) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbound_emails WHERE status = 'sent'")
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

async fn transactions(db: &TestDb) -> i64 {
    sqlx::query_scalar(
        "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

/// Waits until `total` mails are recorded sent; the moment it saw it.
async fn until_sent(world: &World, total: i64, bound: Duration) -> Instant {
    let deadline = Instant::now() + bound;
    loop {
        if sent(&world.db).await >= total {
            return Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "only {} of {total} sent within {bound:?}\n{}",
            sent(&world.db).await,
            world.host.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `n` pings appended to the world's account, each from a sender of its own.
async fn append_pings(world: &World, n: usize) {
    let mut session = imap_session(&world.account).await;
    let run = short_id();
    let to = format!("{}@localhost", world.account);
    for i in 0..n {
        let from = format!("bench-{run}-{i}@localhost");
        session
            .append("INBOX", None, None, raw_ping(&from, &to, i))
            .await
            .unwrap();
    }
    let _ = session.logout().await;
}

/// `n` `email.received` events, each from a sender of its own, on one connection.
async fn publish_events(world: &World, n: usize) {
    let run = short_id();
    let events: Vec<_> = (0..n)
        .map(|i| support::ping_from(&format!("bench-ev-{run}-{i}@localhost"), i))
        .collect();
    let messages: Vec<(lapin::BasicProperties, &[u8])> = events
        .iter()
        .map(|(properties, body)| (properties.clone(), body.as_slice()))
        .collect();
    worker_testkit::amqp::publish_confirmed(&world.vhost, "events", "email.received", &messages)
        .await
        .unwrap();
}

struct Figures {
    label: &'static str,
    mails: usize,
    per_second: f64,
    cpu: Vec<(&'static str, f64)>,
    transactions: f64,
}

/// One run of the loop: `push` puts `n` mails in, and it ends when they are all sent.
async fn measure<F, Fut>(world: &World, label: &'static str, n: usize, push: F) -> Figures
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let host_pid = world.host.pid();
    let before_sent = sent(&world.db).await;
    let before_tx = transactions(&world.db).await;
    let before_cpu = cpu_by_group(host_pid);
    let started = Instant::now();
    push().await;
    let done = until_sent(world, before_sent + n as i64, Duration::from_secs(600)).await;
    let after_cpu = cpu_by_group(host_pid);
    let after_tx = transactions(&world.db).await;
    Figures {
        label,
        mails: n,
        per_second: n as f64 / (done - started).as_secs_f64(),
        cpu: cpu_per_mail(&before_cpu, &after_cpu, n),
        transactions: (after_tx - before_tx) as f64 / n as f64,
    }
}

/// Statements the host sent to PostgreSQL per mail, from sqlx's statement log.
fn statements_in(log: &str) -> usize {
    log.lines().filter(|l| l.contains("sqlx::query")).count()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mails = env("BENCH_MAILS", 1000);
    let counted = env("BENCH_COUNT_MAILS", 100);
    let smtp_concurrency = env("BENCH_SMTP_CONCURRENCY", 8);

    println!("ceilings, each service alone with a bare client:");
    let smtp = smtp_ceiling(mails, smtp_concurrency).await;
    println!(
        "  SMTP sink accepts             {smtp:>8.0} mails/s ({smtp_concurrency} connections)"
    );
    let imap = imap_ceiling(mails.min(1000)).await;
    println!("  Dovecot fetches               {imap:>8.0} mails/s (one UID FETCH each)");
    let pg = pg_ceiling(mails * 4).await;
    println!("  PostgreSQL commits            {pg:>8.0} transactions/s (8 connections)");

    // A baseline build, measured beside this one in the same run.
    let baseline: Option<PathBuf> = std::env::var_os("BENCH_BASELINE").map(PathBuf::from);
    let builds: Vec<(&str, Option<&Path>)> = match &baseline {
        Some(path) => vec![("baseline", Some(path.as_path())), ("this build", None)],
        None => vec![("this build", None)],
    };
    let runs = each_build(&builds, |world| async move {
        measure(&world, "inbound mails (IMAP)", mails, || {
            append_pings(&world, mails)
        })
        .await
    })
    .await;
    let event_runs = each_build(&builds, |world| async move {
        measure(&world, "events (broker)", mails, || {
            publish_events(&world, mails)
        })
        .await
    })
    .await;
    let mut counts = Vec::new();
    for (build, binary) in &builds {
        let counting = world_with_statement_log(*binary).await;
        let before = counting.host.log_text().len();
        measure(&counting, "counted", counted, || {
            append_pings(&counting, counted)
        })
        .await;
        let text = counting.host.log_text();
        let counted_log = text.get(before..).unwrap_or("");
        if let Ok(dir) = std::env::var("BENCH_STATEMENT_LOG") {
            let path = Path::new(&dir).join(format!("{}.log", build.replace(' ', "-")));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, counted_log).unwrap();
            println!("{build}: the counted run's log is {}", path.display());
        }
        counts.push((
            *build,
            statements_in(counted_log) as f64 / counted as f64,
            hops::count(counted_log),
        ));
        counting.host.stop_cleanly().await;
    }

    println!();
    println!(
        "| build | run | mails | mails/s | CPU ms per mail: host | PostgreSQL | RabbitMQ | Dovecot | SMTP sink | transactions per mail |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (build, figures) in runs.iter().chain(&event_runs) {
        let cpu: Vec<String> = figures
            .cpu
            .iter()
            .map(|(_, ms)| format!("{ms:.2}"))
            .collect();
        println!(
            "| {build} | {} | {} | {:.0} | {} | {:.1} |",
            figures.label,
            figures.mails,
            figures.per_second,
            cpu.join(" | "),
            figures.transactions
        );
    }
    if let ([(_, old_in), (_, new_in)], [(_, old_ev), (_, new_ev)]) =
        (runs.as_slice(), event_runs.as_slice())
    {
        let total = |f: &Figures| f.cpu.iter().map(|(_, ms)| ms).sum::<f64>();
        println!(
            "this build against the baseline: inbound {:.2}x the mails/s at {:.2}x the CPU per mail; events {:.2}x at {:.2}x",
            new_in.per_second / old_in.per_second,
            total(new_in) / total(old_in),
            new_ev.per_second / old_ev.per_second,
            total(new_ev) / total(old_ev),
        );
    }
    for (build, statements, by_hop) in &counts {
        println!();
        println!(
            "{build}: database round trips (statements) per inbound mail: {statements:.1} (sqlx's statement log, {counted} mails), by hop:"
        );
        hops::print(by_hop, counted);
    }
    println!();
    for ((build, inbound), (_, events)) in runs.iter().zip(&event_runs) {
        println!("{build}:");
        print_bounds(inbound, smtp, imap, pg);
        print_bounds(events, smtp, imap, pg);
    }
    // The bound moves as the loop's transactions fall: this build against the baseline's.
    if let [(_, old), (_, new)] = runs.as_slice() {
        let (_, old_bound) = bounds(old, pg);
        println!(
            "this build's inbound {:.0} mails/s = {:.2} of the baseline's bound ({old_bound:.0})",
            new.per_second,
            new.per_second / old_bound
        );
    }
}

/// `run` on a world of its own for each build in turn, the host stopped after each.
async fn each_build<'a, F, Fut>(
    builds: &[(&'a str, Option<&Path>)],
    run: F,
) -> Vec<(&'a str, Figures)>
where
    F: Fn(std::sync::Arc<World>) -> Fut,
    Fut: std::future::Future<Output = Figures>,
{
    let mut out = Vec::new();
    for (build, binary) in builds {
        let world = std::sync::Arc::new(world(*binary, "info").await);
        let figures = run(std::sync::Arc::clone(&world)).await;
        let world = std::sync::Arc::into_inner(world).expect("the run let go of its world");
        world.host.stop_cleanly().await;
        out.push((*build, figures));
    }
    out
}

/// The two 2-core bounds of a run: with the host and PostgreSQL free, and with the host free
/// and each of the mail's transactions costing what a bare commit does.
fn bounds(inbound: &Figures, pg: f64) -> (f64, f64) {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    // Where every process shares the same cores, the services the host talks to bound the
    // loop by their own CPU per mail, whatever the host and PostgreSQL cost.
    let others: f64 = inbound
        .cpu
        .iter()
        .filter(|(group, _)| !matches!(*group, "host" | "PostgreSQL"))
        .map(|(_, ms)| ms)
        .sum();
    // PostgreSQL's bare ceiling kept every core busy: that is what a commit costs the machine.
    let per_commit = cores as f64 * 1000.0 / pg;
    let with_commits = others + inbound.transactions * per_commit;
    (
        cores as f64 * 1000.0 / others.max(f64::MIN_POSITIVE),
        cores as f64 * 1000.0 / with_commits.max(f64::MIN_POSITIVE),
    )
}

/// The ceilings and bounds printed for one build's inbound run.
fn print_bounds(run: &Figures, smtp: f64, imap: f64, pg: f64) {
    let label = run.label;
    let slowest = [
        ("SMTP sink", smtp),
        ("Dovecot", imap),
        ("PostgreSQL", pg / run.transactions.max(1.0)),
    ]
    .into_iter()
    .min_by(|a, b| a.1.total_cmp(&b.1))
    .unwrap();
    println!(
        "  {label}: the slowest ceiling, in mails/s: {} {:.0} (PostgreSQL's in mails: its commits over the loop's transactions per mail); {:.0} mails/s = {:.2} of it",
        slowest.0,
        slowest.1,
        run.per_second,
        run.per_second / slowest.1
    );
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let cpu_total: f64 = run.cpu.iter().map(|(_, ms)| ms).sum();
    let (free, with_commits) = bounds(run, pg);
    println!(
        "  {label}: {cpu_total:.1} ms of CPU per mail in all, {:.2} cores busy on this machine's {cores}; on {cores} shared cores at most {free:.0} mails/s with the host and PostgreSQL free, {with_commits:.0} with the host free and each of the mail's {:.1} transactions costing a bare commit ({:.2} ms): the loop at {:.2} of that bound (goal 0.8)",
        cpu_total * run.per_second / 1000.0,
        run.transactions,
        cores as f64 * 1000.0 / pg,
        run.per_second / with_commits,
    );
}

/// A world whose host logs every statement it sends (sqlx's statement log).
async fn world_with_statement_log(binary: Option<&Path>) -> World {
    world(binary, "info,sqlx::query=debug").await
}
