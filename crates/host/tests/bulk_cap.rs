//! The bulk-run cap on the real binary and the real services: starts sent at once, over the
//! API, never run more bulk actions on one replica than its cap (two); the others are
//! answered 429 Busy, and the audit trail records only the runs admitted.
//!
//! `BULK_CAP_SHOW_LOG=1` prints the host's log when it stops.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::time::Duration;

use reqwest::StatusCode;
use support::SERIAL;
use support::console::{TOKEN, World};

/// The cap of `console/bulk.rs`.
const RUNNING_MAX: usize = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purges_started_at_once_never_run_more_than_the_cap() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::with_token("BULK_CAP_SHOW_LOG").await?;
    world.dead_letters(3).await?;
    let url = world.host.url("/api/dead-letters/purge/run");
    // One a second over three dead letters: each run admitted lasts a few seconds, far longer
    // than the starts take to arrive.
    let starts: Vec<_> = (0..6)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                let answer = reqwest::Client::new()
                    .post(url)
                    .bearer_auth(TOKEN)
                    .form(&[("queue", "email.send"), ("rate", "1"), ("planned", "3")])
                    .timeout(Duration::from_secs(30))
                    .send()
                    .await
                    .unwrap();
                let status = answer.status();
                (status, answer.text().await.unwrap())
            })
        })
        .collect();
    let mut answers = Vec::new();
    for start in starts {
        answers.push(start.await?);
    }
    let admitted = answers
        .iter()
        .filter(|(status, _)| *status == StatusCode::OK)
        .count();
    let busy = answers
        .iter()
        .filter(|(status, body)| *status == StatusCode::TOO_MANY_REQUESTS && body.contains("Busy"))
        .count();
    assert!(
        (1..=RUNNING_MAX).contains(&admitted) && admitted + busy == answers.len(),
        "at most {RUNNING_MAX} admitted, the others busy: {answers:?}"
    );
    let recorded: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM dead_letter_actions WHERE action = 'purge' AND NOT dry_run",
    )
    .fetch_one(&world.db.pool)
    .await?;
    assert_eq!(recorded, i64::try_from(admitted)?, "one audit row per run");
    world.host.stop_cleanly().await;
    Ok(())
}
