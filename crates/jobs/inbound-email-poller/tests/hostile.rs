//! The hostile-mail corpus through the real poller, the real Dovecot and PostgreSQL: every
//! mail is recorded, stored or set aside with its reason, in bounded time and memory.
//!
//! One test in its own binary, so that the process's peak RSS is this test's.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;

use std::time::{Duration, Instant};

use common::hostile::{self, Hostile};
use common::*;
use job_inbound_email_poller::PollerConfig;
use worker_testkit::TestDb;

/// The process's resident set and its peak since the last [`reset_peak`], in KiB.
fn rss_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Resets the peak RSS (`VmHWM`) to the current RSS (Linux: `5` to `clear_refs`).
fn reset_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_hostile_mail_is_recorded_or_set_aside_in_bounded_time_and_memory()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user("hostile");
    // The corpus, and one mail of 300,000 parts (13 MB, under the default size limit of
    // 25 MB): the one whose parse costs most.
    let mut corpus = hostile::corpus();
    corpus.push(Hostile {
        name: "many-parts-13mb",
        ..hostile::many_parts(300_000)
    });
    let mut expected = Vec::new();
    let mut largest = 0;
    for mail in corpus {
        append(&u, "INBOX", &mail.raw).await?;
        largest = largest.max(mail.raw.len());
        expected.push((mail.name, mail.message_id, mail.raw.len()));
    }

    let poller = poller(
        &db.pool,
        PollerConfig {
            // The default size limit: hostile mail of a few MB gets fetched and parsed.
            max_message_bytes: PollerConfig::default().max_message_bytes,
            max_body_chars: 100_000,
            ..config(vec![account("hostile", &u, "secret")])
        },
    );
    let (before, _) = rss_kib();
    reset_peak();
    let started = Instant::now();
    let report = tokio::time::timeout(Duration::from_secs(120), poller.poll(&ctx())).await?;
    let took = started.elapsed();
    let (_, peak) = rss_kib();

    let a = &report.accounts[0];
    assert_eq!(a.failure, None, "{report:?}");
    let rows = rows(&db.pool, "hostile").await?;
    let summary: Vec<String> = rows
        .iter()
        .zip(&expected)
        .map(|(r, (name, _, _))| {
            format!(
                "{name}: {} {:?} {:?}",
                r.status,
                r.skip_reason
                    .as_deref()
                    .map(|s| s.chars().take(120).collect::<String>()),
                r.parse_error
            )
        })
        .collect();
    println!(
        "{} mails in {took:?}; RSS before {before} KiB, peak {peak} KiB\n{}",
        rows.len(),
        summary.join("\n")
    );
    assert_eq!(rows.len(), expected.len(), "{summary:#?}");

    // Structure past the limits is set aside unparsed, with a reason that names the limit.
    let set_aside = [
        ("deep-nesting", "MIME nesting"),
        ("many-parts", "MIME parts"),
        ("many-parts-13mb", "MIME parts"),
        ("megabyte-header", "header section"),
        ("many-headers", "header fields"),
        ("many-addresses", "header section"),
        ("nested-messages", "MIME nesting"),
    ];
    for (row, (name, message_id, size)) in rows.iter().zip(&expected) {
        // Dovecot stores bare line ends as CRLF: the size it reports may grow a little.
        assert!(row.raw_size as usize >= *size, "{name}: {row:?}");
        match set_aside.iter().find(|(n, _)| n == name) {
            Some((_, limit)) => {
                assert_eq!(row.status, "skipped", "{name}: {row:?}");
                let reason = row.skip_reason.as_deref().unwrap_or_default();
                assert!(
                    reason.contains(limit) && reason.contains("not parsed"),
                    "{name}: {reason}"
                );
                assert_eq!(row.event_id, None, "{name}: no event for mail set aside");
                if limit.starts_with("MIME") {
                    // Its own header section was within bounds: read for the row.
                    assert_eq!(row.message_id.as_deref(), Some(message_id.as_str()));
                }
            }
            None => {
                assert_eq!(row.status, "stored", "{name}: {row:?}");
                assert_eq!(row.message_id.as_deref(), Some(message_id.as_str()));
                assert!(row.event_id.is_some(), "{name}");
                let text = row.text_body.as_deref().unwrap_or_default();
                assert!(
                    text.chars().count() <= 100_000 && !text.contains('\0'),
                    "{name}"
                );
            }
        }
    }

    // Bounded time: generously, a few seconds a mail on a shared, unoptimised build.
    assert!(took < Duration::from_secs(60), "the corpus took {took:?}");
    // Bounded memory: the largest mail is held a few times over (the IMAP buffer, our copy),
    // never the parser's tens of times over.
    let grown = peak.saturating_sub(before);
    let bound = 8 * (largest as u64 / 1024) + 32 * 1024;
    assert!(
        grown < bound,
        "the peak RSS grew by {grown} KiB while polling, over {bound} KiB (the largest mail is {} KiB)",
        largest / 1024
    );
    Ok(())
}
