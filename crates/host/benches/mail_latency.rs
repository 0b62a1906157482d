//! How long a ping takes to be answered, end to end, with the shipped default settings: from
//! the moment the local SMTP server accepts an inbound ping (to the host's IMAP account) to
//! the moment it accepts the host's reply (to the sender). One ping at a time, each from a
//! sender of its own (the reply limit is a default too), through the real binary (release
//! build), Dovecot, PostgreSQL, RabbitMQ and the SMTP sink. Printed as percentiles, beside the
//! same loop with IMAP IDLE off (only the default 10 s schedule polls), in the same run.
//!
//! ```text
//! cargo bench -p worker-host --bench mail_latency
//! BENCH_PINGS=200 BENCH_SCHEDULE_PINGS=20 cargo bench -p worker-host --bench mail_latency
//! ```
//!
//! Needs the local services (`scripts/services.sh up`). The reply's acceptance is read from
//! its file's modification time in the sender's Maildir (the sink writes it before it
//! answers), the ping's from the clock when the sink's answer to its DATA arrived.
//!
//! Beside the host, an observer of its own idles plainly on the same mailbox and notes when
//! the IMAP server reports each ping (`EXISTS`): Dovecot holds every IDLE notification back by
//! 500 ms (`NOTIFY_DELAY_MSECS` in its `mailbox-watch.c`, not a setting), which is what the
//! host's recheck (`idle_recheck`) works around.
//!
//! The shipped recheck (a `NOOP` every 150 ms) is measured beside the one it replaced (`DONE`
//! and a new IDLE every 250 ms), `BENCH_PINGS` each, one after the other in the same run;
//! `BENCH_OLD_RECHECK=0` leaves the old one out. `BENCH_HOST=<a worker-host binary>` measures
//! that build instead of this one.

// A benchmark program: a failure should stop it loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "../tests/support/mod.rs"]
mod support;

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use async_imap::extensions::idle::IdleResponse;
use async_imap::imap_proto::{MailboxDatum, Response};
use common::env;
use support::{Host, send_mail, short_id};
use worker_testkit::{TestDb, TestVhost};

/// The Maildir folders (`new`, `cur`) of `local` on the shared SMTP sink and Dovecot.
fn maildir(local: &str) -> [PathBuf; 2] {
    let base = worker_testkit::services_dir()
        .join("mail")
        .join(local)
        .join("Maildir");
    [base.join("new"), base.join("cur")]
}

/// When the first mail in `local`'s mailbox was written, once there is one (within `wait`).
async fn first_mail_written(local: &str, wait: Duration) -> Option<SystemTime> {
    let deadline = Instant::now() + wait;
    loop {
        for dir in maildir(local) {
            if let Ok(entries) = std::fs::read_dir(&dir) {
                let written = entries
                    .flatten()
                    .filter_map(|e| e.metadata().ok()?.modified().ok())
                    .min();
                if written.is_some() {
                    return written;
                }
            }
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// One ping's times: accepted by the SMTP server, reported by the IMAP server to an idling
/// client, and its reply accepted.
struct Ping {
    accepted: SystemTime,
    reported: SystemTime,
    replied: SystemTime,
}

impl Ping {
    fn end_to_end(&self) -> Duration {
        self.replied
            .duration_since(self.accepted)
            .unwrap_or_default()
    }
    fn server(&self) -> Duration {
        self.reported
            .duration_since(self.accepted)
            .unwrap_or_default()
    }
    /// The reply was accepted before a plain IDLE client heard of the ping.
    fn before_notice(&self) -> bool {
        self.replied < self.reported
    }
}

type Imap = async_imap::Session<tokio::net::TcpStream>;

/// An IMAP session on `account`'s INBOX (read-only) and how many mails it holds.
async fn observer(account: &str) -> (Imap, u32) {
    let stream = tokio::net::TcpStream::connect(worker_testkit::imap_addr())
        .await
        .unwrap();
    let mut client = async_imap::Client::new(stream);
    client.read_response().await.unwrap();
    let mut session = client
        .login(account, "secret")
        .await
        .map_err(|(e, _)| e)
        .unwrap();
    let mailbox = session.examine("INBOX").await.unwrap();
    (session, mailbox.exists)
}

/// `n` pings to `account`, one at a time, each from a sender of its own.
async fn pings(host: &Host, account: &str, n: usize, wait: Duration) -> Vec<Ping> {
    let run = short_id();
    let (mut session, mut exists) = observer(account).await;
    let mut pings = Vec::with_capacity(n);
    for i in 0..n {
        let sender = format!("bench-{run}-{i}");
        let mut idle = session.idle();
        idle.init().await.unwrap();
        let sending = async {
            send_mail(
                &format!("{sender}@localhost"),
                &format!("{account}@localhost"),
                &format!("ping {i}"),
                "bench.test",
            )
            .await
            .expect("sending the ping");
            SystemTime::now()
        };
        let watching = async {
            loop {
                let (news, _stop) = idle.wait_with_timeout(wait);
                match news.await.unwrap() {
                    IdleResponse::NewData(data) => {
                        if let Response::MailboxData(MailboxDatum::Exists(count)) = data.parsed()
                            && *count > exists
                        {
                            return (SystemTime::now(), *count);
                        }
                    }
                    other => panic!("no EXISTS for ping {i} within {wait:?}: {other:?}"),
                }
            }
        };
        let (accepted, (reported, count)) = tokio::join!(sending, watching);
        exists = count;
        session = idle.done().await.unwrap();
        let Some(replied) = first_mail_written(&sender, wait).await else {
            panic!("no reply to ping {i} within {wait:?}\n{}", host.log_tail());
        };
        pings.push(Ping {
            accepted,
            reported,
            replied,
        });
    }
    let _ = session.logout().await;
    pings
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn report(label: &str, latencies: impl IntoIterator<Item = Duration>) -> (Duration, Duration) {
    let mut latencies: Vec<Duration> = latencies.into_iter().collect();
    latencies.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let (p50, p90, p99) = (
        percentile(&latencies, 50.0),
        percentile(&latencies, 90.0),
        percentile(&latencies, 99.0),
    );
    println!(
        "| {label} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
        latencies.len(),
        ms(latencies[0]),
        ms(p50),
        ms(p90),
        ms(p99),
        ms(latencies[latencies.len() - 1]),
    );
    (p50, p99)
}

/// A host with the shipped defaults but for where the services are, its IMAP account and
/// the demo's automation; `extra` sections besides (IDLE off). `BENCH_HOST` names another
/// build of the host to measure instead of this one (to compare builds run by run).
async fn host(account: &str, extra: &str) -> (Host, TestDb, TestVhost) {
    let binary = std::env::var_os("BENCH_HOST").map(PathBuf::from);
    common::launch_binary(binary.as_deref(), "latency-bench", account, extra, &[]).await
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let pings_idle = env("BENCH_PINGS", 200);
    let pings_schedule = env("BENCH_SCHEDULE_PINGS", 20);
    println!(
        "mail latency: ping accepted by the SMTP server -> reply accepted by it, one at a time, shipped defaults (poll every 10s)"
    );
    println!("| poller | pings | min ms | p50 ms | p90 ms | p99 ms | max ms |");
    println!("|---|---:|---:|---:|---:|---:|---:|");

    let account = format!("bench-idle-{}", short_id());
    let (host_idle, _db, _vhost) = host(&account, "").await;
    let idle = pings(&host_idle, &account, pings_idle, Duration::from_secs(30)).await;
    host_idle.stop_cleanly().await;
    let (p50, p99) = report(
        "IMAP IDLE, NOOP every 150 ms (the default): end to end",
        idle.iter().map(Ping::end_to_end),
    );
    report(
        "the server's own notice to a plain IDLE client (ping to EXISTS)",
        idle.iter().map(Ping::server),
    );
    let early = idle.iter().filter(|p| p.before_notice()).count();

    if env("BENCH_OLD_RECHECK", 1) > 0 {
        let account = format!("bench-old-{}", short_id());
        let (host_old, _db, _vhost) = host(
            &account,
            "[jobs.inbound_email_poller]\nidle_recheck = \"250ms\"\nidle_recheck_with = \"idle\"\n",
        )
        .await;
        let old = pings(&host_old, &account, pings_idle, Duration::from_secs(30)).await;
        host_old.stop_cleanly().await;
        report(
            "IMAP IDLE, DONE and IDLE every 250 ms (the old default): end to end",
            old.iter().map(Ping::end_to_end),
        );
    }

    if pings_schedule > 0 {
        let account = format!("bench-poll-{}", short_id());
        let (host_poll, _db, _vhost) =
            host(&account, "[jobs.inbound_email_poller]\nidle = false\n").await;
        let polled = pings(
            &host_poll,
            &account,
            pings_schedule,
            Duration::from_secs(30),
        )
        .await;
        host_poll.stop_cleanly().await;
        report(
            "schedule only (idle = false): end to end",
            polled.iter().map(Ping::end_to_end),
        );
    }
    println!(
        "the reply was accepted before a plain IDLE client heard of the ping in {early} of {} (the shipped recheck)",
        idle.len()
    );
    println!(
        "goal: p50 <= 100 ms and p99 <= 200 ms with the shipped defaults: {} (p50 {:.0} ms, p99 {:.0} ms)",
        if p50 <= Duration::from_millis(100) && p99 <= Duration::from_millis(200) {
            "met"
        } else {
            "NOT met"
        },
        p50.as_secs_f64() * 1000.0,
        p99.as_secs_f64() * 1000.0
    );
}
