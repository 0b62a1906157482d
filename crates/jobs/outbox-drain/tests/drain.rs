//! The outbox drain on the real services: nothing published without a commit, a published row
//! deleted (its publication kept), at least once across a crash, no duplicates between two
//! healthy replicas, poisoned rows that end `failed` without holding back the others, the
//! LISTEN/NOTIFY wake-up and its gather window.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use worker_core::TickOutcome;
use worker_store::outbox::{self, RetryResult};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_transaction_publishes_nothing() -> anyhow::Result<()> {
    let env = Env::create().await?;
    let recorder = Recorder::start(&env, None).await?;
    let drain = env.drain(None, settings(50, 3)).await?;

    let mut tx = env.db.pool.begin().await?;
    outbox::enqueue(&mut tx, EXCHANGE, ROUTED, &message("rolled-back")).await?;
    tx.rollback().await?;
    let mut tx = env.db.pool.begin().await?;
    outbox::enqueue(&mut tx, EXCHANGE, ROUTED, &message("committed")).await?;
    tx.commit().await?;

    assert_eq!(tick_until_idle(&drain, 5).await?, 1);
    recorder
        .wait_until(Duration::from_secs(10), "the committed message", |s| {
            s.counts.contains_key("committed")
        })
        .await?;
    // Give a stray publish time to arrive before asserting it did not.
    tokio::time::sleep(ms(300)).await;
    let seen = recorder.seen.lock().unwrap().counts.clone();
    assert_eq!(seen, HashMap::from([("committed".to_string(), 1)]));
    assert_eq!(env.statuses().await?, HashMap::new(), "published: deleted");
    assert_eq!(env.publications().await?, 1);
    recorder.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_publish_and_delete_publishes_again_and_the_guard_applies_once()
-> anyhow::Result<()> {
    let env = Env::create().await?;
    let recorder = Recorder::start(&env, Some(env.db.pool.clone())).await?;
    let drain = env.drain(None, settings(100, 3)).await?;
    env.enqueue("crash", 20, ROUTED).await?;

    // The first replica claims and publishes, then "dies" before its deletes commit.
    {
        let mut tx = env.db.pool.begin().await?;
        let batch = drain
            .publish_batch(&mut tx, &CancellationToken::new())
            .await?;
        assert_eq!(batch.published_ids().len(), 20);
        drop(tx);
    }
    recorder
        .wait_until(Duration::from_secs(10), "the first 20 deliveries", |s| {
            s.deliveries >= 20
        })
        .await?;
    assert_eq!(
        env.statuses().await?.get("pending"),
        Some(&20),
        "the deletes rolled back"
    );
    assert_eq!(env.publications().await?, 0, "and their publications");

    // On restart the rows are published again: at least once.
    let replica = env.drain(None, settings(100, 3)).await?;
    assert_eq!(tick_until_idle(&replica, 5).await?, 20);
    recorder
        .wait_until(Duration::from_secs(10), "the 20 redeliveries", |s| {
            s.deliveries >= 40
        })
        .await?;
    {
        let seen = recorder.seen.lock().unwrap();
        assert_eq!(seen.counts.len(), 20);
        assert!(seen.counts.values().all(|&n| n == 2), "{:?}", seen.counts);
        assert_eq!(seen.effects, 20, "the guard applies each effect once");
    }
    let effects: i64 = sqlx::query_scalar("SELECT count(DISTINCT message_id) FROM effects")
        .fetch_one(&env.db.pool)
        .await?;
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM effects")
        .fetch_one(&env.db.pool)
        .await?;
    assert_eq!((effects, rows), (20, 20));
    assert_eq!(env.statuses().await?, HashMap::new());
    assert_eq!(env.publications().await?, 20, "one publication each");
    recorder.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_drains_publish_ten_thousand_rows_each_exactly_once() -> anyhow::Result<()> {
    const N: usize = 10_000;
    let env = Env::create().await?;
    let recorder = Recorder::start(&env, None).await?;
    env.enqueue("r", N, ROUTED).await?;
    let a = env
        .drain(Some(env.db.another_pool(5).await?), settings(250, 3))
        .await?;
    let b = env
        .drain(Some(env.db.another_pool(5).await?), settings(250, 3))
        .await?;

    let started = Instant::now();
    let (from_a, from_b) = tokio::try_join!(tick_until_idle(&a, 50), tick_until_idle(&b, 50))?;
    let took = started.elapsed();
    println!(
        "two drains: {from_a} + {from_b} rows in {took:.2?} ({:.0} rows/s)",
        N as f64 / took.as_secs_f64()
    );
    assert_eq!(from_a + from_b, N as u64);
    assert!(
        from_a > 0 && from_b > 0,
        "both replicas drained: {from_a} / {from_b}"
    );

    recorder
        .wait_until(Duration::from_secs(60), "10 000 messages", |s| {
            s.counts.len() >= N
        })
        .await?;
    tokio::time::sleep(ms(300)).await;
    {
        let seen = recorder.seen.lock().unwrap();
        let twice: Vec<_> = seen.counts.iter().filter(|(_, n)| **n > 1).collect();
        assert!(twice.is_empty(), "published more than once: {twice:?}");
        assert_eq!(seen.counts.len(), N);
        assert_eq!(seen.deliveries, N as u64);
    }
    assert_eq!(env.statuses().await?, HashMap::new());
    assert_eq!(env.publications().await?, N as i64);
    recorder.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poisoned_rows_end_failed_without_holding_back_the_rows_behind_them() -> anyhow::Result<()>
{
    let env = Env::create().await?;
    let recorder = Recorder::start(&env, None).await?;
    let drain = env.drain(None, settings(10, 3)).await?;

    // In id order: an unroutable row, 4 good ones, a row for an exchange that does not exist
    // (it closes the channel under the whole batch), then 24 more good ones.
    let mut tx = env.db.pool.begin().await?;
    let unroutable =
        outbox::enqueue(&mut tx, EXCHANGE, "nobody.listens", &message("unroutable")).await?;
    tx.commit().await?;
    env.enqueue("good-a", 4, ROUTED).await?;
    let mut tx = env.db.pool.begin().await?;
    let missing = outbox::enqueue(&mut tx, "no-such-exchange", ROUTED, &message("missing")).await?;
    tx.commit().await?;
    env.enqueue("good-b", 24, ROUTED).await?;

    // One tick publishes every good row, however the batches fall.
    let busy = worker_core::SkipIfBusy::new("outbox-drain");
    let ctx = worker_core::WorkContext::new("outbox-drain", CancellationToken::new());
    let first = worker_core::tick_once(
        &drain,
        &busy,
        None::<&worker_core::NoLease>,
        Duration::from_secs(30),
        &ctx,
    )
    .await;
    let TickOutcome::Ran(report) = &first else {
        panic!("{first:?}")
    };
    println!("first tick: {report:?}");
    assert_eq!(report.items, 28);
    recorder
        .wait_until(Duration::from_secs(10), "the 28 good rows", |s| {
            s.counts.len() >= 28
        })
        .await?;
    let good_attempts: Vec<i32> = sqlx::query_scalar(
        // A good row is deleted once published: any left behind was charged or kept.
        "SELECT attempts FROM outbox WHERE id <> ALL($1)",
    )
    .bind(vec![unroutable, missing])
    .fetch_all(&env.db.pool)
    .await?;
    assert!(
        good_attempts.is_empty(),
        "good rows were charged attempts: {good_attempts:?}"
    );

    // The poisoned rows back off, then give up with their errors.
    let deadline = Instant::now() + Duration::from_secs(20);
    while outbox::status(&env.db.pool).await?.failed < 2 {
        assert!(Instant::now() < deadline, "the poisoned rows never gave up");
        tick_until_idle(&drain, 5).await?;
        tokio::time::sleep(ms(50)).await;
    }
    let failed = outbox::failed(&env.db.pool, 10).await?;
    println!("{failed:#?}");
    let by_id: HashMap<i64, _> = failed.iter().map(|f| (f.id, f)).collect();
    let u = by_id[&unroutable];
    assert_eq!(u.attempts, 3);
    assert!(
        u.last_error.as_deref().unwrap_or("").contains("unroutable"),
        "{u:?}"
    );
    let m = by_id[&missing];
    assert_eq!(m.attempts, 3);
    assert!(
        m.last_error
            .as_deref()
            .unwrap_or("")
            .contains("no-such-exchange"),
        "{m:?}"
    );
    let status = outbox::status(&env.db.pool).await?;
    assert_eq!((status.pending, status.failed), (0, 2));
    assert_eq!(
        recorder.seen.lock().unwrap().counts.len(),
        28,
        "no poisoned row was delivered"
    );

    // An operator fixes the routing and replays.
    let connection = env.connection().await?;
    let channel = connection.create_channel().await?;
    channel
        .queue_bind(
            QUEUE.into(),
            EXCHANGE.into(),
            "nobody.*".into(),
            Default::default(),
            Default::default(),
        )
        .await?;
    assert_eq!(
        outbox::retry(
            &env.db.pool,
            unroutable,
            &worker_store::audit::Actor::new("test", "test-host")
        )
        .await?,
        RetryResult::Requeued
    );
    assert_eq!(tick_until_idle(&drain, 5).await?, 1);
    recorder
        .wait_until(Duration::from_secs(10), "the replayed row", |s| {
            s.counts.contains_key("unroutable")
        })
        .await?;
    assert_eq!(
        outbox::retry_all_failed(
            &env.db.pool,
            &worker_store::audit::Actor::new("test", "test-host")
        )
        .await?,
        1
    );
    let status = outbox::status(&env.db.pool).await?;
    assert_eq!((status.pending, status.failed), (1, 0));
    recorder.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_stops_on_its_budget_and_asks_for_the_next_at_once() -> anyhow::Result<()> {
    let env = Env::create().await?;
    let recorder = Recorder::start(&env, None).await?;
    let wake = Arc::new(Notify::new());
    let drain = env
        .drain(
            None,
            job_outbox_drain::OutboxDrainSettings {
                tick_budget: ms(1),
                ..settings(100, 3)
            },
        )
        .await?
        .wake_on_backlog(wake.clone());
    env.enqueue("budget", 2_000, ROUTED).await?;

    let busy = worker_core::SkipIfBusy::new("outbox-drain");
    let ctx = worker_core::WorkContext::new("outbox-drain", CancellationToken::new());
    let mut ticks = 0;
    let mut published = 0;
    loop {
        let outcome = worker_core::tick_once(
            &drain,
            &busy,
            None::<&worker_core::NoLease>,
            Duration::from_secs(30),
            &ctx,
        )
        .await;
        let TickOutcome::Ran(report) = outcome else {
            panic!("{outcome:?}")
        };
        ticks += 1;
        published += report.items;
        // Each tick but the last asks for the next one at once.
        if tokio::time::timeout(ms(1), wake.notified()).await.is_err() {
            break;
        }
        assert!(ticks < 100, "the backlog never drained");
    }
    println!("2000 rows in {ticks} ticks of a 1 ms budget");
    assert!(ticks > 1, "the budget never stopped a tick");
    assert_eq!(published, 2_000);
    recorder
        .wait_until(Duration::from_secs(20), "2000 messages", |s| {
            s.counts.len() >= 2_000
        })
        .await?;
    {
        let seen = recorder.seen.lock().unwrap();
        assert_eq!(
            seen.deliveries, 2_000,
            "a tick stopped on its budget publishes nothing twice"
        );
    }
    recorder.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_outage_burns_no_attempts() -> anyhow::Result<()> {
    let env = Env::create().await?;
    let connection = env.connection().await?;
    let session = worker_broker::Session::new(connection);
    let sessions = session.clone().fixed();
    let publisher = worker_broker::Publisher::new(
        sessions,
        worker_broker::PublisherSettings {
            connect_wait: ms(200),
            ..Default::default()
        },
    );
    let drain = job_outbox_drain::OutboxDrain::new(env.db.pool.clone(), publisher, settings(10, 2));
    env.enqueue("outage", 5, ROUTED).await?;
    session
        .connection()
        .close(200, "simulated outage".into())
        .await?;

    for _ in 0..3 {
        let result = drain.drain(&CancellationToken::new()).await;
        let failure = result.expect_err("no broker, no success");
        assert!(failure.class().is_retryable(), "{failure}");
        assert!(failure.to_string().contains("not connected"), "{failure}");
    }
    let attempts: Vec<i32> =
        sqlx::query_scalar("SELECT attempts FROM outbox WHERE status = 'pending'")
            .fetch_all(&env.db.pool)
            .await?;
    assert_eq!(attempts, vec![0; 5]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_notify_wakes_the_drain_on_commit() -> anyhow::Result<()> {
    let env = Env::create().await?;
    let recorder = Recorder::start(&env, None).await?;
    let drain = Arc::new(env.drain(None, settings(100, 3)).await?);
    let wake = Arc::new(Notify::new());
    let stop = CancellationToken::new();
    let listener = tokio::spawn(job_outbox_drain::listen(
        env.db.pool.clone(),
        job_outbox_drain::ListenerSettings::default(),
        wake.clone(),
        stop.clone(),
    ));
    // The schedule is far off: only a notification can make the drain tick in time.
    let (ticker, mut ticks) = spawn_tick_loop(drain, wake, Duration::from_secs(600), stop.clone());
    // The listener signals once when it has subscribed.
    tokio::time::timeout(Duration::from_secs(10), ticks.recv()).await?;

    let mut latencies = Vec::new();
    for i in 0..20 {
        let id = format!("wake-{i}");
        let mut tx = env.db.pool.begin().await?;
        outbox::enqueue(&mut tx, EXCHANGE, ROUTED, &message(&id)).await?;
        tx.commit().await?;
        let committed = Instant::now();
        recorder
            .wait_until(Duration::from_secs(10), &id, |s| s.counts.contains_key(&id))
            .await?;
        let seen_at = recorder.seen.lock().unwrap().first_at[&id];
        latencies.push(seen_at.saturating_duration_since(committed));
        tokio::time::sleep(ms(20)).await;
    }

    // The listener's connection is killed: it reconnects by itself, and a row committed
    // meanwhile is still drained without waiting for the schedule.
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND application_name = 'worker-host outbox listener'",
    )
    .fetch_all(&env.db.pool)
    .await?;
    assert_eq!(killed, vec![true]);
    let mut tx = env.db.pool.begin().await?;
    outbox::enqueue(&mut tx, EXCHANGE, ROUTED, &message("after-reconnect")).await?;
    tx.commit().await?;
    let committed = Instant::now();
    recorder
        .wait_until(Duration::from_secs(10), "after-reconnect", |s| {
            s.counts.contains_key("after-reconnect")
        })
        .await?;
    let after_reconnect = recorder.seen.lock().unwrap().first_at["after-reconnect"] - committed;

    stop.cancel();
    tokio::time::timeout(Duration::from_secs(10), listener).await??;
    tokio::time::timeout(Duration::from_secs(10), ticker).await??;
    recorder.stop().await;

    latencies.sort();
    let median = latencies[latencies.len() / 2];
    println!(
        "commit -> consumer, LISTEN/NOTIFY: min {:.2?}, median {median:.2?}, max {:.2?} over {} rows; \
         a row committed while the listener reconnected: {after_reconnect:.2?}",
        latencies[0],
        latencies[latencies.len() - 1],
        latencies.len()
    );
    assert!(median < Duration::from_secs(1), "median {median:?}");
    assert!(
        latencies.iter().all(|l| *l < Duration::from_secs(3)),
        "{latencies:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_commits_without_waiting_for_the_wal_flush_and_the_setting_ends_with_it()
-> anyhow::Result<()> {
    let env = Env::create().await?;
    let drain = env.drain(None, settings(50, 1)).await?;
    async fn setting(conn: &mut sqlx::PgConnection) -> sqlx::Result<String> {
        sqlx::query_scalar("SHOW synchronous_commit")
            .fetch_one(conn)
            .await
    }
    let mut tx = drain.begin().await.map_err(|f| anyhow::anyhow!("{f}"))?;
    assert_eq!(setting(&mut tx).await?, "off");
    tx.commit().await?;
    // The rest of the pool commits durably, as the enqueuing transactions must.
    let mut conn = env.db.pool.acquire().await?;
    assert_eq!(setting(&mut conn).await?, "on");
    Ok(())
}

/// At a trickle, a row committed after a quiet spell is claimed at once: the gather window
/// would take nothing more into its claim, and was a wait on every hop of every mail (issue
/// 41).
#[tokio::test]
async fn a_row_after_a_quiet_spell_is_claimed_without_gathering() -> anyhow::Result<()> {
    let env = Env::create().await?;
    let recorder = Recorder::start(&env, None).await?;
    let gather = ms(500);
    let drain = env
        .drain(
            None,
            job_outbox_drain::OutboxDrainSettings {
                gather,
                ..settings(100, 3)
            },
        )
        .await?;
    let cancel = CancellationToken::new();
    for i in 0..2 {
        if i > 0 {
            // The quiet spell: longer than the window since the last drain ended.
            tokio::time::sleep(gather + ms(100)).await;
        }
        env.enqueue(&format!("quiet-{i}"), 1, ROUTED).await?;
        let started = Instant::now();
        let report = drain.drain(&cancel).await?;
        let took = started.elapsed();
        assert_eq!(report.claimed, 1, "{report:?}");
        assert!(took < gather, "drain {i} waited {took:?} for a lone row");
    }
    recorder
        .wait_until(Duration::from_secs(10), "the two", |s| s.counts.len() >= 2)
        .await?;
    recorder.stop().await;
    Ok(())
}

/// A wake for one row right after a drain (rows are coming) waits the gather window, and one
/// claim takes the rows committed 1 ms apart right after it; a drain that follows a full
/// batch with more due does not wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gather_window_takes_rows_written_a_millisecond_apart_in_one_claim()
-> anyhow::Result<()> {
    let env = Env::create().await?;
    let recorder = Recorder::start(&env, None).await?;
    let drain = Arc::new(
        env.drain(
            None,
            // Wider than the shipped 5 ms, so that four commits on a loaded test machine fit.
            job_outbox_drain::OutboxDrainSettings {
                gather: ms(250),
                ..settings(100, 3)
            },
        )
        .await?,
    );
    let one = |i: usize| {
        let pool = env.db.pool.clone();
        async move {
            let mut tx = pool.begin().await?;
            outbox::enqueue(&mut tx, EXCHANGE, ROUTED, &message(&format!("g-{i}"))).await?;
            tx.commit().await?;
            anyhow::Ok(())
        }
    };
    one(0).await?;
    // The drain before: the next wake follows it within the window, so it gathers.
    let before = drain.drain(&CancellationToken::new()).await?;
    assert_eq!(before.claimed, 1, "{before:?}");
    one(1).await?;
    // Woken by that commit, as the listener would.
    let woken = tokio::spawn({
        let drain = drain.clone();
        async move { drain.drain(&CancellationToken::new()).await }
    });
    let writing = Instant::now();
    for i in 2..6 {
        tokio::time::sleep(ms(1)).await;
        one(i).await?;
    }
    println!("four more rows written in {:?}", writing.elapsed());
    let report = woken.await??;
    assert_eq!(
        (report.batches, report.claimed, report.published),
        (1, 5, 5),
        "{report:?}"
    );
    recorder
        .wait_until(Duration::from_secs(10), "the six", |s| s.counts.len() >= 6)
        .await?;

    // A full batch ending on the tick budget leaves more due: the next drain claims at once.
    let full = env
        .drain(
            None,
            job_outbox_drain::OutboxDrainSettings {
                gather: ms(500),
                tick_budget: ms(1),
                ..settings(10, 3)
            },
        )
        .await?;
    env.enqueue("full", 200, ROUTED).await?;
    let cancel = CancellationToken::new();
    let started = Instant::now();
    let first = full.drain(&cancel).await?;
    assert!(first.more_due, "{first:?}");
    assert!(
        started.elapsed() < ms(500),
        "the first drain, with no drain before it, waited {:?}",
        started.elapsed()
    );
    let again = Instant::now();
    let second = full.drain(&cancel).await?;
    assert!(second.claimed > 0, "{second:?}");
    assert!(
        again.elapsed() < ms(500),
        "a drain after a full batch waited {:?}",
        again.elapsed()
    );
    recorder.stop().await;
    Ok(())
}
