//! A consumer job paused across replicas: three replicas of the host on one database and
//! vhost; an operator pauses `email-send` from one replica's console in Chromium, with a
//! reason; every replica stops taking deliveries from `email.send` (its consumers leave the
//! queue, the replies wait in it), nothing is returned or redelivered, and after the resume
//! every reply is sent once. Beside it: a pause set from the command line, with and without
//! `--reason`, and a pause that holds across a restart.
//!
//! The pause's reaction time (the click, to each replica's consumer gone from the queue, by
//! passive declare) is printed: `cargo test -p worker-host --test console_pause_browser --
//! --nocapture` shows `reaction time` lines. With `WH_CONSOLE_SCREENSHOTS=docs/console` the
//! job page's screenshot is written there (`job-paused.png`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::time::{Duration, Instant};

use support::Host;
use support::browser::{element, screenshot_dir, text_of};
use support::console::{Operator, Setup, TOKEN, World};
use support::pause::{QUEUE, QueueWatch, acked_and_redelivered};
use support::{SERIAL, publish_pings, short_id, wait_for};
use worker_testkit::Browser;

/// Replies the pings ask for while the job is paused.
const MAILS: usize = 6;

/// `workers.pause_poll` (its default) and a second: the most a replica may take to stop.
const BOUND: Duration = Duration::from_secs(6);

/// Pauses and resumes timed after the browser's, each from the next replica's console.
const CYCLES: usize = 6;

/// Waits until `count` replies to `local`@localhost were delivered by the sink.
async fn delivered(world: &World, local: &str, count: usize) {
    wait_for(
        &format!("{count} replies to {local}"),
        || world.host.log_tail(),
        || async { Ok((world.sink.delivered(local).len() >= count).then_some(())) },
    )
    .await;
}

/// Publishes `count` pings from `local`@localhost and waits until their replies wait in
/// `email.send`, which nobody consumes (the job is paused).
async fn waiting_replies(
    world: &World,
    watch: &QueueWatch,
    local: &str,
    count: u32,
) -> anyhow::Result<()> {
    publish_pings(&world.vhost, &format!("{local}@localhost"), count as usize).await?;
    wait_for(
        "the replies waiting in email.send",
        || world.host.log_tail(),
        || async {
            let (ready, consumers) = watch.counts(QUEUE).await?;
            assert_eq!(consumers, 0, "no consumer while paused");
            Ok((ready >= count).then_some(()))
        },
    )
    .await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_job_paused_from_one_console_stops_on_every_replica_and_resumes()
-> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let (shots, _temporary) = screenshot_dir();
    let world = World::start("CONSOLE_PAUSE_SHOW_LOG", Setup::with_token()).await?;
    let (r2, r3) = tokio::join!(
        world.replica("CONSOLE_PAUSE_SHOW_LOG", "r2"),
        world.replica("CONSOLE_PAUSE_SHOW_LOG", "r3")
    );
    let (r2, r3) = (r2?, r3?);
    let watch = QueueWatch::open(&world.vhost).await?;
    watch
        .wait_consumers(QUEUE, 3, Duration::from_secs(10))
        .await?;

    let browser = Browser::start().await?;
    let client = &browser.client;
    let base = world.host.url("");
    client.goto(&format!("{base}/sign-in")).await?;
    element(client, "#name").await.send_keys("olga").await?;
    element(client, "#password").await.send_keys(TOKEN).await?;
    element(client, "#submit").await.click().await?;
    text_of(client, "#operator", "olga").await;

    // Pause from r1's console; time each replica's consumer leaving the queue.
    client.goto(&format!("{base}/jobs/email-send")).await?;
    element(client, "#pause-reason")
        .await
        .send_keys("SMTP relay maintenance")
        .await?;
    let pause = element(client, "#pause").await;
    let clicked = Instant::now();
    let (click, gone) = tokio::join!(
        pause.click(),
        watch.each_gone(QUEUE, 3, clicked, Duration::from_secs(10))
    );
    click?;
    let gone = gone?;
    assert!(
        gone.iter().all(|at| *at < BOUND),
        "every replica stops within workers.pause_poll and a second: {gone:?}"
    );
    println!(
        "reaction time (pause click to each replica's consumer gone, ms): {:?}",
        gone.iter().map(Duration::as_millis).collect::<Vec<_>>()
    );
    // The page the pause redirected to may have been drawn before this replica's own consumer
    // stopped ("still stopping"); it is looked at again below, once every consumer is gone.
    text_of(client, "#paused-by", "SMTP relay maintenance").await;

    // Replies wait in the queue while every replica holds back.
    let local = format!("paused-{}", short_id());
    publish_pings(&world.vhost, &format!("{local}@localhost"), MAILS).await?;
    wait_for(
        "the replies waiting in email.send",
        || world.host.log_tail(),
        || async {
            let (ready, consumers) = watch.counts(QUEUE).await?;
            assert_eq!(consumers, 0, "no replica consumes while paused");
            Ok((ready as usize >= MAILS).then_some(()))
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(watch.counts(QUEUE).await?, (MAILS as u32, 0), "they stay");
    assert!(
        world.sink.delivered(&local).is_empty(),
        "nothing sent while paused"
    );

    client.goto(&format!("{base}/jobs/email-send")).await?;
    text_of(client, "#stopped-here", "not consuming").await;
    browser.screenshot(&shots.join("job-paused.png")).await?;
    client.goto(&format!("{base}/")).await?;
    text_of(client, "#jobs", "SMTP relay maintenance").await;
    // The other replicas show it too, from the shared database.
    let page = reqwest::get(r3.url("/api/jobs/email-send"))
        .await?
        .text()
        .await?;
    assert!(page.contains("SMTP relay maintenance"), "r3's page: {page}");

    // Resume: every replica consumes again, and every reply goes out once.
    client.goto(&format!("{base}/jobs/email-send")).await?;
    element(client, "#resume").await.click().await?;
    watch
        .wait_consumers(QUEUE, 3, Duration::from_secs(10))
        .await?;
    delivered(&world, &local, MAILS).await;
    assert_eq!(world.sink.delivered(&local).len(), MAILS, "each reply once");
    let (acked, redelivered) =
        acked_and_redelivered(&world.vhost, QUEUE, MAILS as u64, Duration::from_secs(15)).await?;
    assert!(
        acked >= MAILS as u64,
        "the management API caught up: {acked} acks"
    );
    assert_eq!(redelivered, 0, "no delivery was returned to the queue");
    let dead: i64 = sqlx::query_scalar("SELECT count(*) FROM dead_letters")
        .fetch_one(&world.db.pool)
        .await?;
    assert_eq!(dead, 0, "nothing dead-lettered");
    let trail: Vec<(String, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT action, filter ->> 'reason', actor FROM dead_letter_actions \
         WHERE filter ->> 'job' = 'email-send' ORDER BY id",
    )
    .fetch_all(&world.db.pool)
    .await?;
    assert_eq!(
        trail,
        vec![
            (
                "pause".into(),
                Some("SMTP relay maintenance".into()),
                Some("olga".into())
            ),
            ("resume".into(), None, Some("olga".into())),
        ]
    );

    browser.close().await;
    reaction_times(&watch, [&world.host, &r2, &r3]).await?;
    for host in [r2, r3] {
        host.stop_cleanly().await;
    }
    world.host.stop_cleanly().await;
    Ok(())
}

/// Pauses `email-send` [`CYCLES`] times, each from the next replica's console (its form's
/// target, as the browser posts it), and times each replica's consumer leaving the queue;
/// prints the figures and their p50 and max.
async fn reaction_times(watch: &QueueWatch, hosts: [&Host; 3]) -> anyhow::Result<()> {
    let mut operators = Vec::new();
    for host in hosts {
        operators.push(Operator::sign_in(&host.url(""), TOKEN, "olga").await?);
    }
    let mut every = Vec::new();
    let mut last = Vec::new();
    for cycle in 0..CYCLES {
        let operator = &operators[cycle % operators.len()];
        let start = Instant::now();
        let (posted, gone) = tokio::join!(
            operator.post_redirected("/jobs/email-send/pause", &[("reason", "timing")]),
            watch.each_gone(QUEUE, 3, start, Duration::from_secs(10))
        );
        posted?;
        let gone = gone?;
        assert!(gone.iter().all(|at| *at < BOUND), "cycle {cycle}: {gone:?}");
        last.extend(gone.last().copied());
        every.extend(gone);
        operator
            .post_redirected("/jobs/email-send/resume", &[])
            .await?;
        watch
            .wait_consumers(QUEUE, 3, Duration::from_secs(10))
            .await?;
    }
    let ms = |mut d: Vec<Duration>| {
        d.sort();
        let p50 = d[d.len() / 2].as_millis();
        let max = d.last().copied().unwrap_or_default().as_millis();
        (p50, max)
    };
    let (p50, max) = ms(every.clone());
    let (last_p50, last_max) = ms(last);
    println!(
        "reaction time over {CYCLES} pauses on 3 replicas (request to a replica's consumer gone): \
         each replica p50 {p50} ms, max {max} ms; all three gone p50 {last_p50} ms, max {last_max} ms; \
         every figure (ms): {:?}",
        every.iter().map(Duration::as_millis).collect::<Vec<_>>()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_job_is_paused_and_resumed_from_the_command_line_with_a_reason()
-> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::start("CONSOLE_PAUSE_SHOW_LOG", Setup::with_token()).await?;
    let host = &world.host;
    let watch = QueueWatch::open(&world.vhost).await?;
    watch
        .wait_consumers(QUEUE, 1, Duration::from_secs(10))
        .await?;

    let (code, out, err) = host
        .cli(&["jobs", "pause", "email-send", "--reason", "bounce storm"])
        .await?;
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains("email-send is paused on every replica"),
        "{out}"
    );
    watch
        .wait_consumers(QUEUE, 0, Duration::from_secs(6))
        .await?;
    // As before the flag: no reason, and the pause it finds stays as it was.
    let (code, out, err) = host.cli(&["jobs", "pause", "email-send"]).await?;
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("was paused already"), "{out}");
    let (_, list, _) = host.cli(&["jobs", "list"]).await?;
    let line = list
        .lines()
        .find(|l| l.starts_with("email-send"))
        .unwrap_or_default();
    assert!(
        line.contains("paused since") && line.contains(": bounce storm"),
        "{list}"
    );

    host.wait_for("the pause's age as a metric", || async {
        let scrape = host.metrics().await?;
        let age = scrape.sum("worker_job_paused_seconds", &[("worker_job", "email-send")]);
        let other = scrape.sum(
            "worker_job_paused_seconds",
            &[("worker_job", "automation-action")],
        );
        assert_eq!(other, 0.0, "a job not paused");
        Ok((age > 0.0).then_some(()))
    })
    .await;

    let (code, out, err) = host.cli(&["jobs", "resume", "email-send"]).await?;
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("email-send consumes its queue again"), "{out}");
    watch
        .wait_consumers(QUEUE, 1, Duration::from_secs(6))
        .await?;
    let (code, _, err) = host
        .cli(&["jobs", "pause", "db-health", "--reason", "x"])
        .await?;
    assert_eq!(code, Some(64), "the probe drives readiness: {err}");
    world.host.stop_cleanly().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_finishes_the_deliveries_held_and_returns_none() -> anyhow::Result<()> {
    // More than email-send's concurrency (8), under its prefetch (50) and under the demo
    // automation's reply limit per address (10): at the pause, 8 sends are in flight and one
    // delivery is prefetched, not started.
    const HELD: u32 = 9;
    let _serial = SERIAL.lock().await;
    let world = World::start("CONSOLE_PAUSE_SHOW_LOG", Setup::with_token()).await?;
    let host = &world.host;
    let watch = QueueWatch::open(&world.vhost).await?;
    watch
        .wait_consumers(QUEUE, 1, Duration::from_secs(10))
        .await?;
    let local = format!("held-{}", short_id());
    world
        .sink
        .delay_answer(&format!("{local}@localhost"), Duration::from_secs(2))?;
    publish_pings(&world.vhost, &format!("{local}@localhost"), HELD as usize).await?;
    let db = &world.db.pool;
    let count = |sql: &'static str| async move {
        anyhow::Ok(sqlx::query_scalar::<_, i64>(sql).fetch_one(db).await?)
    };
    wait_for(
        "every reply published and sends in flight",
        || host.log_tail(),
        || async {
            let published =
                count("SELECT count(*) FROM publications WHERE routing_key = 'email.send'").await?;
            let sending =
                count("SELECT count(*) FROM outbound_emails WHERE status = 'sending'").await?;
            Ok((published == i64::from(HELD) && sending > 0).then_some(()))
        },
    )
    .await;
    let (code, out, err) = host
        .cli(&["jobs", "pause", "email-send", "--reason", "mid-flight"])
        .await?;
    assert_eq!(code, Some(0), "{out}{err}");
    watch
        .wait_consumers(QUEUE, 0, Duration::from_secs(6))
        .await?;

    // Everything the consumer held, in flight or prefetched, is sent while it is paused;
    // nothing went back to the queue.
    wait_for(
        "the held deliveries finished",
        || host.log_tail(),
        || async {
            let (ready, consumers) = watch.counts(QUEUE).await?;
            assert_eq!(consumers, 0, "no consumer while paused");
            assert_eq!(ready, 0, "no delivery returned to the queue");
            let sent = count("SELECT count(*) FROM outbound_emails WHERE status = 'sent'").await?;
            Ok((sent == i64::from(HELD)).then_some(()))
        },
    )
    .await;
    assert_eq!(
        world.sink.delivered(&local).len(),
        HELD as usize,
        "each once"
    );
    assert_eq!(watch.counts(QUEUE).await?, (0, 0));

    let (code, out, err) = host.cli(&["jobs", "resume", "email-send"]).await?;
    assert_eq!(code, Some(0), "{out}{err}");
    watch
        .wait_consumers(QUEUE, 1, Duration::from_secs(6))
        .await?;
    world.host.stop_cleanly().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_consumer_job_stays_paused_across_a_restart() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let mut world = World::start("CONSOLE_PAUSE_SHOW_LOG", Setup::with_token()).await?;
    let watch = QueueWatch::open(&world.vhost).await?;
    watch
        .wait_consumers(QUEUE, 1, Duration::from_secs(10))
        .await?;
    let (code, out, err) = world
        .host
        .cli(&["jobs", "pause", "email-send", "--reason", "restart test"])
        .await?;
    assert_eq!(code, Some(0), "{out}{err}");
    watch
        .wait_consumers(QUEUE, 0, Duration::from_secs(6))
        .await?;

    let local = format!("restart-{}", short_id());
    waiting_replies(&world, &watch, &local, 2).await?;

    let stopped = world.host.stop().await;
    assert_eq!(stopped, Some(0), "a clean stop");
    world.host = world.replica("CONSOLE_PAUSE_SHOW_LOG", "r1").await?;
    // Ready, consuming its other queues, and still not email.send: the replies wait.
    watch
        .wait_consumers("automation.action", 1, Duration::from_secs(10))
        .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        watch.counts(QUEUE).await?,
        (2, 0),
        "the restarted replica takes nothing from the paused job's queue"
    );
    assert!(world.sink.delivered(&local).is_empty());

    let (code, out, err) = world.host.cli(&["jobs", "resume", "email-send"]).await?;
    assert_eq!(code, Some(0), "{out}{err}");
    delivered(&world, &local, 2).await;
    world.host.stop_cleanly().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_consumer_job_stays_paused_when_the_broker_connection_recovers()
-> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::start("CONSOLE_PAUSE_SHOW_LOG", Setup::with_token()).await?;
    let host = &world.host;
    let watch = QueueWatch::open(&world.vhost).await?;
    watch
        .wait_consumers(QUEUE, 1, Duration::from_secs(10))
        .await?;
    let (code, out, err) = host
        .cli(&["jobs", "pause", "email-send", "--reason", "recovery test"])
        .await?;
    assert_eq!(code, Some(0), "{out}{err}");
    watch
        .wait_consumers(QUEUE, 0, Duration::from_secs(6))
        .await?;

    let local = format!("recovery-{}", short_id());
    waiting_replies(&world, &watch, &local, 2).await?;

    // The broker closes the host's connections; its supervisor reconnects and its consume
    // loops resume on the new connection, all but the paused one. The management API lists
    // connections from statistics that lag: close what it lists until the host reconnected.
    let reconnects = || async {
        anyhow::Ok(
            host.metrics()
                .await?
                .sum("worker_broker_reconnects_total", &[]),
        )
    };
    let before = reconnects().await?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while reconnects().await? <= before {
        assert!(
            Instant::now() < deadline,
            "the host's connection was never closed"
        );
        let connections = world
            .vhost
            .api(reqwest::Method::GET, "vhosts/{vhost}/connections", None)
            .await?;
        for name in connections
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["name"].as_str())
        {
            let path = format!("connections/{}", urlencode(name));
            // One already gone (listed from stale statistics) answers 404.
            let _ = world.vhost.api(reqwest::Method::DELETE, &path, None).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Ours went with them.
    let watch = QueueWatch::open(&world.vhost).await?;
    watch
        .wait_consumers("automation.action", 1, Duration::from_secs(10))
        .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        watch.counts(QUEUE).await?,
        (2, 0),
        "the recovered connection does not resume the paused consumer: the replies wait"
    );
    assert!(world.sink.delivered(&local).is_empty());

    let (code, out, err) = host.cli(&["jobs", "resume", "email-send"]).await?;
    assert_eq!(code, Some(0), "{out}{err}");
    delivered(&world, &local, 2).await;
    world.host.stop_cleanly().await;
    Ok(())
}

/// `name` as one segment of a management API path.
fn urlencode(name: &str) -> String {
    name.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_whose_notice_is_lost_takes_effect_within_the_poll() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::start("CONSOLE_PAUSE_SHOW_LOG", Setup::with_token()).await?;
    let watch = QueueWatch::open(&world.vhost).await?;
    watch
        .wait_consumers(QUEUE, 1, Duration::from_secs(10))
        .await?;
    // Written past the store, so that no notice is sent: only the poll can see it.
    sqlx::query(
        "WITH a AS (INSERT INTO dead_letter_actions (action, actor_user, actor_host, filter) \
         VALUES ('pause', 'test', 'test', '{\"job\": \"email-send\"}') RETURNING id) \
         INSERT INTO job_pauses (job, action_id) SELECT 'email-send', id FROM a",
    )
    .execute(&world.db.pool)
    .await?;
    let stopped = watch.wait_consumers(QUEUE, 0, BOUND).await?;
    sqlx::query("DELETE FROM job_pauses")
        .execute(&world.db.pool)
        .await?;
    let started = watch.wait_consumers(QUEUE, 1, BOUND).await?;
    println!(
        "without a notice (workers.pause_poll 5 s): stopped after {} ms, consuming again after {} ms",
        stopped.as_millis(),
        started.as_millis()
    );
    world.host.stop_cleanly().await;
    Ok(())
}
