//! IMAP IDLE against the real Dovecot: news wakes the poller at once, one replica idles at a
//! time and another takes over when it goes, a connection gone silent is found at the next
//! refresh and reconnected, and a server without IDLE is left to the schedule.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;

use std::time::{Duration, Instant};

use common::idling::{Idling, rows_reach};
use common::*;
use job_inbound_email_poller::{IdleConfig, Idler, PollerConfig, RecheckWith};
use tokio::sync::Notify;
use worker_testkit::{Dovecot, FaultProxy, TestDb};

/// A quick idle: rechecked every 100 ms (the shipped way, `NOOP`), refreshed every second, the
/// lease tried every 200 ms, reconnects at most a second apart.
fn quick(mut config: PollerConfig) -> PollerConfig {
    config.message_timeout = Duration::from_secs(2);
    config.idle = IdleConfig {
        enabled: true,
        refresh: Duration::from_secs(1),
        recheck: Some(Duration::from_millis(100)),
        recheck_with: RecheckWith::default(),
        lease_retry: Duration::from_millis(200),
        reconnect_max: Duration::from_secs(1),
    };
    config
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

/// The server's own notification, with no recheck. The account was never polled, so the
/// session does not fetch (where the mailbox starts is the first poll's to say): the news
/// wakes the tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_mail_wakes_the_poller_at_once() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let mailbox = user("idle-news");
    let mut config = quick(config(vec![account("news", &mailbox, "secret")]));
    config.idle.recheck = Some(Duration::ZERO);
    let poller = poller(&db.pool, config);
    let idling = Idling::start(poller.idler(), &db);
    assert_eq!(idle_state(&idling.idler, "news", "idling").await, "idling");
    // The wake of the (re)connect itself, for mail that came while nobody idled.
    assert!(woken(&idling.wake, Duration::from_secs(5)).await);

    send(&mailbox, "alice@example.com", "ping idle", "are you there?").await?;
    assert!(
        woken(&idling.wake, Duration::from_secs(5)).await,
        "the server's news woke the poller"
    );
    assert!(idling.news("news").await >= 1);
    // The poll it wakes finds the mail.
    assert_eq!(poll(&poller).await.totals().stored, 1);
    idling.end().await;
    Ok(())
}

/// Five mails one after another, each fetched on the IDLE session (after the first poll, the
/// tick's); how long each took from its acceptance to its row, sorted.
async fn burst(with: RecheckWith, name: &str) -> anyhow::Result<Vec<Duration>> {
    let db = TestDb::create().await?;
    let mailbox = user(name);
    let mut config = quick(config(vec![account("burst", &mailbox, "secret")]));
    config.idle.recheck_with = with;
    // Only the recheck, not a refresh's new IDLE, has the server look early.
    config.idle.refresh = Duration::from_secs(60);
    let poller = poller(&db.pool, config);
    let idling = Idling::start(poller.idler(), &db);
    assert_eq!(idle_state(&idling.idler, "burst", "idling").await, "idling");
    assert!(
        woken(&idling.wake, Duration::from_secs(5)).await,
        "the connect's own wake"
    );
    // The first poll is the tick's: it decides where the mailbox starts.
    assert_eq!(poll(&poller).await.totals().recorded(), 0);
    let mut waits = Vec::new();
    for i in 0..5 {
        // The last fetch moved nothing on the server (read-only, BODY.PEEK), but a mail
        // arriving within Dovecot's 500 ms delay of the last change would be reported at its
        // end: early, whatever the recheck.
        tokio::time::sleep(Duration::from_millis(600)).await;
        send(&mailbox, "dave@example.com", &format!("ping {i}"), "x").await?;
        let sent = Instant::now();
        let stored = rows_reach(&db.pool, "burst", i + 1).await?;
        assert_eq!(stored.len(), i + 1, "mail {i} stored");
        waits.push(sent.elapsed());
    }
    assert_eq!(outbox_count(&db.pool).await?, 5, "each mail announced once");
    assert!(idling.news("burst").await >= 5, "each mail counted as news");
    assert_eq!(
        idling.idler.stats().account("burst").unwrap().stored,
        5,
        "each fetched on the IDLE session"
    );
    assert!(
        !woken(&idling.wake, Duration::ZERO).await,
        "no tick was needed"
    );
    idling.end().await;
    waits.sort();
    Ok(waits)
}

/// The recheck's path with `DONE` and a new IDLE: the news comes in the answers between two
/// IDLEs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rechecking_idle_sees_every_mail_of_a_burst() -> anyhow::Result<()> {
    burst(RecheckWith::Idle, "idle-burst").await?;
    Ok(())
}

/// The shipped recheck, a `NOOP` on a session out of IDLE: the news comes in its answer, and
/// sooner than Dovecot's own notice could (it holds every one back 500 ms, and no IDLE is
/// asked for here): the median of five stored within 450 ms, for a recheck every 100 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_noop_recheck_sees_every_mail_of_a_burst_before_the_servers_notice() -> anyhow::Result<()>
{
    let waits = burst(RecheckWith::Noop, "idle-noop-burst").await?;
    assert!(
        waits[2] < Duration::from_millis(450),
        "the NOOP's answer carried the news: {waits:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_idles_and_another_takes_over_when_it_goes() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let mailbox = user("idle-lease");
    let accounts = || quick(config(vec![account("shared", &mailbox, "secret")]));
    let first = Idling::start(poller(&db.pool, accounts()).idler(), &db);
    assert_eq!(idle_state(&first.idler, "shared", "idling").await, "idling");
    let second = Idling::start(poller(&db.pool, accounts()).idler(), &db);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        second.idler.stats().account("shared").unwrap().idle,
        None,
        "only the lease holder idles"
    );

    // The holder goes; the other takes the lease within its retry and idles.
    first.end().await;
    let gone = Instant::now();
    assert_eq!(
        idle_state(&second.idler, "shared", "idling").await,
        "idling"
    );
    assert!(
        gone.elapsed() < Duration::from_secs(3),
        "taken over in {:?}",
        gone.elapsed()
    );
    send(&mailbox, "bob@example.com", "ping after", "x").await?;
    assert!(
        second.news("shared").await >= 1,
        "the new holder hears the news"
    );
    second.end().await;
    Ok(())
}

/// Rechecked with `DONE` and IDLE, the unanswered `DONE` of the refresh (or recheck) finds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_gone_silent_is_found_at_the_refresh_and_reconnected() -> anyhow::Result<()> {
    gone_silent(RecheckWith::Idle, "idle-silent").await
}

/// Rechecked with `NOOP`, the unanswered `NOOP` finds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_gone_silent_is_found_at_a_noop_recheck_and_reconnected() -> anyhow::Result<()>
{
    gone_silent(RecheckWith::Noop, "idle-noop-silent").await
}

async fn gone_silent(with: RecheckWith, name: &str) -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let mailbox = user(name);
    let proxy = FaultProxy::start(worker_testkit::imap_addr()).await?;
    let mut through = account("silent", &mailbox, "secret");
    through.port = proxy.port();
    let mut config = quick(config(vec![through]));
    config.idle.recheck_with = with;
    let idling = Idling::start(poller(&db.pool, config).idler(), &db);
    assert_eq!(
        idle_state(&idling.idler, "silent", "idling").await,
        "idling"
    );

    proxy.blackhole();
    let state = idle_state(&idling.idler, "silent", "reconnecting").await;
    assert!(
        state.starts_with("reconnecting"),
        "a DONE with no answer is a dead connection: {state}"
    );
    proxy.heal();
    assert_eq!(
        idle_state(&idling.idler, "silent", "idling").await,
        "idling",
        "back after the wait"
    );
    send(&mailbox, "carol@example.com", "ping back", "x").await?;
    assert!(idling.news("silent").await >= 1);
    idling.end().await;
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
    let idling = Idling::start(poller.idler(), &db);
    let state = idle_state(&idling.idler, "no-idle", "not offered").await;
    assert!(state.starts_with("not offered"), "{state}");
    // The idler ended on its own: nothing holds the lease or the account any more.
    idling.tracker.close();
    tokio::time::timeout(BOUND, idling.tracker.wait()).await?;
    let report = poll(&poller).await;
    assert!(
        report.failed().next().is_none(),
        "the schedule still polls it"
    );
    server.stop().await?;
    Ok(())
}
