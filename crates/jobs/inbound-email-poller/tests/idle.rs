//! IMAP IDLE against the real Dovecot: news wakes the poller at once, one replica idles at a
//! time and another takes over when it goes, a connection gone silent is found at the next
//! refresh and reconnected, and a server without IDLE is left to the schedule.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use job_inbound_email_poller::{IdleConfig, Idler, PollerConfig};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use worker_store::AdvisoryLease;
use worker_testkit::{Dovecot, FaultProxy, TestDb};

/// A quick idle: rechecked every 100 ms, refreshed every second, the lease tried every 200 ms,
/// reconnects at most a second apart.
fn quick(mut config: PollerConfig) -> PollerConfig {
    config.message_timeout = Duration::from_secs(2);
    config.idle = IdleConfig {
        enabled: true,
        refresh: Duration::from_secs(1),
        recheck: Duration::from_millis(100),
        lease_retry: Duration::from_millis(200),
        reconnect_max: Duration::from_secs(1),
    };
    config
}

/// Runs `idler` on `tracker` until `stop`, waking `wake`.
fn idle(
    idler: Idler,
    db: &TestDb,
    wake: &Arc<Notify>,
    stop: &CancellationToken,
    tracker: &TaskTracker,
) {
    let lease = Arc::new(AdvisoryLease::new(db.pool.clone()));
    tracker.spawn(idler.run(lease, wake.clone(), stop.clone()));
}

/// Waits up to `within` for the wake.
async fn woken(wake: &Notify, within: Duration) -> bool {
    tokio::time::timeout(within, wake.notified()).await.is_ok()
}

/// The account's idle state as its stats say, once it says `wanted`, within 20 s.
async fn idle_state(idler: &Idler, account: &str, wanted: &str) -> String {
    let deadline = Instant::now() + BOUND;
    loop {
        let state = idler
            .stats()
            .account(account)
            .and_then(|s| s.idle)
            .unwrap_or_default();
        if state.starts_with(wanted) || Instant::now() > deadline {
            return state;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_mail_wakes_the_poller_at_once() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let mailbox = user("idle-news");
    let poller = poller(
        &db.pool,
        quick(config(vec![account("news", &mailbox, "secret")])),
    );
    let idler = poller.idler();
    let (wake, stop, tracker) = (
        Arc::new(Notify::new()),
        CancellationToken::new(),
        TaskTracker::new(),
    );
    idle(idler.clone(), &db, &wake, &stop, &tracker);
    assert_eq!(idle_state(&idler, "news", "idling").await, "idling");
    // The wake of the (re)connect itself, for mail that came while nobody idled.
    assert!(woken(&wake, Duration::from_secs(5)).await);

    let sent = Instant::now();
    send(&mailbox, "alice@example.com", "ping idle", "are you there?").await?;
    assert!(
        woken(&wake, Duration::from_secs(5)).await,
        "the server's news woke the poller"
    );
    let took = sent.elapsed();
    assert!(idler.stats().account("news").unwrap().idle_news >= 1);
    // The poll it wakes finds the mail.
    let report = poll(&poller).await;
    assert_eq!(report.totals().stored, 1, "{took:?}");
    stop.cancel();
    tracker.close();
    tracker.wait().await;
    Ok(())
}

/// The recheck's path: the news comes in the answers between two IDLEs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rechecking_idle_sees_every_mail_of_a_burst() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let mailbox = user("idle-burst");
    let poller = poller(
        &db.pool,
        quick(config(vec![account("burst", &mailbox, "secret")])),
    );
    let idler = poller.idler();
    let (wake, stop, tracker) = (
        Arc::new(Notify::new()),
        CancellationToken::new(),
        TaskTracker::new(),
    );
    idle(idler.clone(), &db, &wake, &stop, &tracker);
    assert_eq!(idle_state(&idler, "burst", "idling").await, "idling");
    assert!(
        woken(&wake, Duration::from_secs(5)).await,
        "the connect's own wake"
    );
    let mut stored = 0;
    for i in 0..5 {
        send(&mailbox, "dave@example.com", &format!("ping {i}"), "x").await?;
        assert!(
            woken(&wake, Duration::from_secs(5)).await,
            "mail {i} woke the poller"
        );
        stored += poll(&poller).await.totals().stored;
    }
    assert_eq!(stored, 5, "each wake found its mail");
    stop.cancel();
    tracker.close();
    tracker.wait().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_idles_and_another_takes_over_when_it_goes() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let mailbox = user("idle-lease");
    let accounts = || quick(config(vec![account("shared", &mailbox, "secret")]));
    let (first, second) = (
        poller(&db.pool, accounts()).idler(),
        poller(&db.pool, accounts()).idler(),
    );
    let tracker = TaskTracker::new();
    let (wake_first, wake_second) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let (stop_first, stop_second) = (CancellationToken::new(), CancellationToken::new());
    idle(first.clone(), &db, &wake_first, &stop_first, &tracker);
    assert_eq!(idle_state(&first, "shared", "idling").await, "idling");
    idle(second.clone(), &db, &wake_second, &stop_second, &tracker);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        second.stats().account("shared").unwrap().idle,
        None,
        "only the lease holder idles"
    );

    // The holder goes; the other takes the lease within its retry and idles.
    stop_first.cancel();
    let gone = Instant::now();
    assert_eq!(idle_state(&second, "shared", "idling").await, "idling");
    assert!(
        gone.elapsed() < Duration::from_secs(3),
        "taken over in {:?}",
        gone.elapsed()
    );
    send(&mailbox, "bob@example.com", "ping after", "x").await?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while second.stats().account("shared").unwrap().idle_news == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        second.stats().account("shared").unwrap().idle_news >= 1,
        "the new holder hears the news"
    );
    stop_second.cancel();
    tracker.close();
    tracker.wait().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_gone_silent_is_found_at_the_refresh_and_reconnected() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let mailbox = user("idle-silent");
    let proxy = FaultProxy::start(worker_testkit::imap_addr()).await?;
    let mut through = account("silent", &mailbox, "secret");
    through.port = proxy.port();
    let poller = poller(&db.pool, quick(config(vec![through])));
    let idler = poller.idler();
    let (wake, stop, tracker) = (
        Arc::new(Notify::new()),
        CancellationToken::new(),
        TaskTracker::new(),
    );
    idle(idler.clone(), &db, &wake, &stop, &tracker);
    assert_eq!(idle_state(&idler, "silent", "idling").await, "idling");

    proxy.blackhole();
    let state = idle_state(&idler, "silent", "reconnecting").await;
    assert!(
        state.starts_with("reconnecting"),
        "a DONE with no answer is a dead connection: {state}"
    );
    proxy.heal();
    assert_eq!(
        idle_state(&idler, "silent", "idling").await,
        "idling",
        "back after the wait"
    );
    send(&mailbox, "carol@example.com", "ping back", "x").await?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while idler.stats().account("silent").unwrap().idle_news == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(idler.stats().account("silent").unwrap().idle_news >= 1);
    stop.cancel();
    tracker.close();
    tracker.wait().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_idle_is_left_to_the_schedule() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let dir = tempfile::tempdir()?;
    let mut server = Dovecot::configure(dir.path())?;
    server.add_setting(
        "imap_capability = IMAP4rev1 LITERAL+ SASL-IR LOGIN-REFERRALS ID ENABLE UIDPLUS",
    )?;
    server.start().await?;
    let mailbox = user("idle-none");
    let mut plain = account("no-idle", &mailbox, "secret");
    plain.port = server.port;
    let poller = poller(&db.pool, quick(config(vec![plain])));
    let idler = poller.idler();
    let (wake, stop, tracker) = (
        Arc::new(Notify::new()),
        CancellationToken::new(),
        TaskTracker::new(),
    );
    idle(idler.clone(), &db, &wake, &stop, &tracker);
    let state = idle_state(&idler, "no-idle", "not offered").await;
    assert!(state.starts_with("not offered"), "{state}");
    // The idler ended on its own: nothing holds the lease or the account any more.
    tracker.close();
    tokio::time::timeout(BOUND, tracker.wait()).await?;
    let report = poll(&poller).await;
    assert!(
        report.failed().next().is_none(),
        "the schedule still polls it"
    );
    server.stop().await?;
    Ok(())
}
