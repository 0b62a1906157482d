//! The fetch on the IDLE session, against the real Dovecot and Cyrus: a mail the session
//! hears of is stored over the connection it holds, with no new login (the connections are
//! counted through a proxy); a fetch on the IDLE session and a tick racing on the same
//! account store each mail once; a changed UIDVALIDITY and a mail over the size limit end as
//! on the tick's path.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::idling::{Host, Idling, rows_reach};
use common::*;
use job_inbound_email_poller::{IdleConfig, ImapAccount, PollerConfig, RecheckWith};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use worker_testkit::{FaultProxy, TestDb};

/// A quick idle: rechecked with `NOOP` every `recheck`, the lease tried every 200 ms.
fn quick(mut config: PollerConfig, recheck: Duration) -> PollerConfig {
    config.message_timeout = Duration::from_secs(2);
    config.idle = IdleConfig {
        enabled: true,
        refresh: Duration::from_secs(60),
        recheck: Some(recheck),
        recheck_with: RecheckWith::Noop,
        lease_retry: Duration::from_millis(200),
        reconnect_max: Duration::from_secs(1),
    };
    config
}

/// `host:port` of Cyrus's plain IMAP port.
fn cyrus_addr() -> String {
    std::env::var("WH_TEST_CYRUS").unwrap_or_else(|_| "127.0.0.1:10146".into())
}

/// Which server an account is on, and how mail is put in there.
#[derive(Clone, Copy)]
enum Server {
    Dovecot,
    Cyrus,
}

impl Server {
    fn addr(self) -> String {
        match self {
            Self::Dovecot => worker_testkit::imap_addr(),
            Self::Cyrus => cyrus_addr(),
        }
    }

    async fn put(self, user: &str, raw: &[u8]) -> anyhow::Result<()> {
        append_at(&self.addr(), user, "INBOX", raw).await
    }
}

/// An account on `server` reached through a proxy that counts its connections.
async fn proxied(
    server: Server,
    name: &str,
    user: &str,
) -> anyhow::Result<(ImapAccount, FaultProxy)> {
    let proxy = FaultProxy::start(server.addr()).await?;
    let (host, _) = host_port(&server.addr());
    let through = ImapAccount {
        host,
        port: proxy.port(),
        ..account(name, user, "secret")
    };
    Ok((through, proxy))
}

async fn stored_without_a_new_login(server: Server, prefix: &str) -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user(prefix);
    let (through, proxy) = proxied(server, "quiet", &u).await?;
    let config = quick(config(vec![through]), Duration::from_millis(100));
    let host = Host::start(poller(&db.pool, config), &db);
    host.settled("quiet").await;
    let logins = proxy.accepted();
    assert_eq!(logins, 2, "the IDLE session's and the first tick's");

    for i in 1..=3 {
        let mail = raw_mail(
            &format!("m{i}@{prefix}"),
            "a@example.com",
            &format!("ping {i}"),
            "x",
        );
        server.put(&u, &mail).await?;
        let r = rows_reach(&db.pool, "quiet", i).await?;
        assert_eq!(r.len(), i, "mail {i} stored");
        assert_eq!(r[i - 1].status, "stored");
    }
    assert_eq!(
        proxy.accepted(),
        logins,
        "each mail was fetched on the IDLE session: no new connection, no new login"
    );
    assert_eq!(
        host.stored_by_ticks(),
        0,
        "{:?}",
        host.ticks.lock().unwrap()
    );
    assert_eq!(outbox_count(&db.pool).await?, 3);
    // A tick after the fetches finds nothing again: the last UID moved as a tick moves it.
    let after = poll(&host.poller).await;
    assert_eq!(after.totals().recorded(), 0, "{after:?}");
    assert_eq!(after.totals().duplicates, 0, "{after:?}");
    let state: (i64,) = sqlx::query_as("SELECT last_uid FROM imap_poll_state")
        .fetch_one(&db.pool)
        .await?;
    assert_eq!(state.0, 3);
    host.end().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mail_heard_while_idling_is_stored_without_a_new_login_on_dovecot() -> anyhow::Result<()>
{
    stored_without_a_new_login(Server::Dovecot, "fetch-quiet").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mail_heard_while_idling_is_stored_without_a_new_login_on_cyrus() -> anyhow::Result<()> {
    stored_without_a_new_login(Server::Cyrus, "cyrus-fetch-quiet").await
}

/// A mail that comes right after one was fetched on the IDLE session is found by a recheck
/// half the interval after the last, not a whole interval: with a 4 s recheck it is stored
/// within 3 s (2 s, and a second of slack for a loaded machine), where a fixed interval leaves
/// it waiting about 4 s.
async fn the_next_mail_after_news_comes_sooner(server: Server, prefix: &str) -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user(prefix);
    let (through, _proxy) = proxied(server, "busy", &u).await?;
    let config = quick(config(vec![through]), Duration::from_secs(4));
    let host = Host::start(poller(&db.pool, config), &db);
    host.settled("busy").await;
    let first = raw_mail(&format!("m1@{prefix}"), "a@example.com", "ping 1", "x");
    server.put(&u, &first).await?;
    assert_eq!(rows_reach(&db.pool, "busy", 1).await?.len(), 1);
    let fetched = std::time::Instant::now();
    let second = raw_mail(&format!("m2@{prefix}"), "a@example.com", "ping 2", "x");
    server.put(&u, &second).await?;
    assert_eq!(rows_reach(&db.pool, "busy", 2).await?.len(), 2);
    let waited = fetched.elapsed();
    assert!(
        waited < Duration::from_secs(3),
        "the second mail waited {waited:?} after the first was stored"
    );
    assert_eq!(host.stored_by_ticks(), 0, "both were fetched while idling");
    host.end().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_news_the_next_recheck_comes_sooner_on_dovecot() -> anyhow::Result<()> {
    the_next_mail_after_news_comes_sooner(Server::Dovecot, "fetch-sooner").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_news_the_next_recheck_comes_sooner_on_cyrus() -> anyhow::Result<()> {
    the_next_mail_after_news_comes_sooner(Server::Cyrus, "cyrus-fetch-sooner").await
}

/// Mails sent while the IDLE session rechecks every 20 ms and ticks come every 60 ms: each
/// mail has one row and one event, and is counted stored once between the two paths.
const RACED: usize = 12;

async fn send_spaced(u: &str) -> anyhow::Result<()> {
    for i in 0..RACED {
        send(u, "race@example.com", &format!("race {i}"), "x").await?;
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    Ok(())
}

async fn each_once(pool: &PgPool, account: &str) -> anyhow::Result<()> {
    let r = rows_reach(pool, account, RACED).await?;
    // Whatever is still in flight lands.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let r2 = rows(pool, account).await?;
    assert_eq!((r.len(), r2.len()), (RACED, RACED), "{r2:?}");
    assert!(r2.iter().all(|r| r.status == "stored"), "{r2:?}");
    let mut ids: Vec<_> = r2.iter().filter_map(|r| r.message_id.clone()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), RACED, "one row a mail");
    assert_eq!(
        outbox_count(pool).await? as usize,
        RACED,
        "one event a mail"
    );
    Ok(())
}

/// Two replicas: one holds the idle lease and fetches on its sessions, the other ticks. Only
/// the batch statement stands between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_fetch_and_another_replicas_tick_racing_store_each_mail_once() -> anyhow::Result<()>
{
    let db = TestDb::create().await?;
    let u = user("fetch-race2");
    let configured = || {
        quick(
            config(vec![account("race", &u, "secret")]),
            Duration::from_millis(20),
        )
    };
    let idling_replica = poller(&db.pool, configured());
    let idling = Idling::start(idling_replica.idler(), &db);
    let ticking_replica = Arc::new(poller(&db.pool, configured()));
    // The first poll, before any mail, so that none is history.
    assert_eq!(poll(&ticking_replica).await.totals().recorded(), 0);
    let stop = CancellationToken::new();
    let ticker = tokio::spawn({
        let (poller, stop) = (ticking_replica.clone(), stop.clone());
        async move {
            let mut reports = Vec::new();
            while !stop.is_cancelled() {
                reports.push(poll(&poller).await);
                tokio::time::sleep(Duration::from_millis(60)).await;
            }
            reports
        }
    });

    send_spaced(&u).await?;
    each_once(&db.pool, "race").await?;
    stop.cancel();
    let reports = ticker.await?;
    let by_ticks: u64 = reports.iter().map(|r| r.totals().stored).sum();
    let raced: u64 = reports.iter().map(|r| r.totals().duplicates).sum();
    let by_idle = idling.idler.stats().account("race").unwrap().stored;
    assert_eq!(
        by_idle + by_ticks,
        RACED as u64,
        "each mail counted stored once (the IDLE session {by_idle}, the ticks {by_ticks}, {raced} read by both)"
    );
    assert!(by_idle > 0, "the IDLE session fetched some: {by_idle}");
    idling.end().await;
    Ok(())
}

/// One replica: its IDLE session and its own ticks take the account's lock in turn, so they
/// never read the same mail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_fetch_and_this_replicas_tick_racing_store_each_mail_once() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user("fetch-race1");
    let config = quick(
        config(vec![account("race", &u, "secret")]),
        Duration::from_millis(20),
    );
    let host = Host::start(poller(&db.pool, config), &db);
    host.settled("race").await;
    let stop = CancellationToken::new();
    let ticker = tokio::spawn({
        let (poller, stop) = (host.poller.clone(), stop.clone());
        async move {
            let mut reports = Vec::new();
            while !stop.is_cancelled() {
                reports.push(poll(&poller).await);
                tokio::time::sleep(Duration::from_millis(60)).await;
            }
            reports
        }
    });

    send_spaced(&u).await?;
    each_once(&db.pool, "race").await?;
    stop.cancel();
    let reports = ticker.await?;
    let by_ticks: u64 =
        reports.iter().map(|r| r.totals().stored).sum::<u64>() + host.stored_by_ticks();
    let read_twice: u64 = reports.iter().map(|r| r.totals().duplicates).sum();
    let stored = host.poller.stats().account("race").unwrap().stored;
    assert_eq!(stored, RACED as u64, "each mail counted stored once");
    assert!(
        stored > by_ticks,
        "the IDLE session fetched some: {} of {stored}",
        stored - by_ticks
    );
    assert_eq!(read_twice, 0, "the account's lock kept the two apart");
    host.end().await;
    Ok(())
}

/// The mailbox rebuilt under the IDLE session (a new UIDVALIDITY): the tick starts it over,
/// as on the tick's path alone (`poller.rs`, a_changed_uidvalidity_rescans...), and the
/// next mail is fetched on the IDLE session under the new UIDVALIDITY.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_uidvalidity_under_the_idle_session_is_started_over_as_by_a_tick()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user("fetch-uv");
    command(&u, "CREATE Work").await?;
    let one = raw_mail("one@test", "a@example.com", "one", "1");
    let two = raw_mail("two@test", "a@example.com", "two", "2");
    let three = raw_mail("three@test", "a@example.com", "three", "3");
    append(&u, "Work", &one).await?;
    append(&u, "Work", &two).await?;
    let (before, _) = examine(&u, "Work").await?;
    let (mut work, proxy) = proxied(Server::Dovecot, "work", &u).await?;
    work.mailbox = "Work".into();
    let host = Host::start(
        poller(
            &db.pool,
            quick(config(vec![work]), Duration::from_millis(100)),
        ),
        &db,
    );
    host.settled("work").await;
    assert_eq!(rows(&db.pool, "work").await?.len(), 2);

    command(&u, "DELETE Work").await?;
    command(&u, "CREATE Work").await?;
    for mail in [&one, &two, &three] {
        append(&u, "Work", mail).await?;
    }
    let (after, _) = examine(&u, "Work").await?;
    assert_ne!(before, after);
    // Dovecot often tells the IDLE session nothing of its mailbox deleted and made again (no
    // news comes), so it is the schedule's tick, rung here, that finds the new UIDVALIDITY and
    // starts the mailbox over, as it always has; and has the session open the new mailbox.
    host.idling.wake.notify_one();
    let all = rows_reach(&db.pool, "work", 5).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let all2 = rows(&db.pool, "work").await?;
    assert_eq!(
        (all.len(), all2.len()),
        (5, 5),
        "{all2:?}\nidle: {:?}\nticks: {:?}",
        host.poller.stats().account("work"),
        host.ticks.lock().unwrap()
    );
    let stored: Vec<_> = all2.iter().filter(|r| r.status == "stored").collect();
    let ids: Vec<_> = stored
        .iter()
        .filter_map(|r| r.message_id.as_deref())
        .collect();
    assert_eq!(ids, ["one@test", "two@test", "three@test"]);
    assert_eq!(stored[2].uidvalidity, i64::from(after));
    assert_eq!(outbox_count(&db.pool).await?, 3);
    let rescanned = host
        .ticks
        .lock()
        .unwrap()
        .iter()
        .any(|r| r.accounts[0].rescanned);
    assert!(rescanned, "a tick started the mailbox over");
    let state: (i64, i64) = sqlx::query_as("SELECT uidvalidity, last_uid FROM imap_poll_state")
        .fetch_one(&db.pool)
        .await?;
    assert_eq!(state, (i64::from(after), 3));

    // Back to the steady state, once the session opened the new mailbox (a new connection,
    // and the tick it wakes): the next mail comes over the IDLE session.
    let logins = settled_connections(&proxy).await;
    assert!(
        logins >= 4,
        "the session opened the mailbox again: {logins} connections"
    );
    host.settled("work").await;
    append(
        &u,
        "Work",
        &raw_mail("four@test", "a@example.com", "four", "4"),
    )
    .await?;
    let all = rows_reach(&db.pool, "work", 6).await?;
    assert_eq!(all.len(), 6);
    assert_eq!(all[5].message_id.as_deref(), Some("four@test"));
    assert_eq!(all[5].uidvalidity, i64::from(after));
    assert_eq!(proxy.accepted(), logins, "fetched without a new login");
    assert_eq!(outbox_count(&db.pool).await?, 4);
    host.end().await;
    Ok(())
}

/// The proxy's count of connections, once it has not moved for a second.
async fn settled_connections(proxy: &FaultProxy) -> u64 {
    let deadline = tokio::time::Instant::now() + BOUND;
    let mut last = proxy.accepted();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = proxy.accepted();
        if now == last || tokio::time::Instant::now() > deadline {
            return now;
        }
        last = now;
    }
}

/// A stored UIDVALIDITY that is not the session's (set by hand here): the IDLE session writes
/// nothing under either and leaves the mailbox to the tick, which starts it over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_uidvalidity_other_than_the_sessions_is_left_to_the_tick() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user("fetch-uv-db");
    let config = quick(
        config(vec![account("uvdb", &u, "secret")]),
        Duration::from_millis(100),
    );
    let host = Host::start(poller(&db.pool, config), &db);
    host.settled("uvdb").await;
    send(&u, "a@example.com", "first", "1").await?;
    assert_eq!(rows_reach(&db.pool, "uvdb", 1).await?.len(), 1);
    let (uidvalidity, _) = examine(&u, "INBOX").await?;

    sqlx::query("UPDATE imap_poll_state SET uidvalidity = 1")
        .execute(&db.pool)
        .await?;
    send(&u, "a@example.com", "second", "2").await?;
    let all = rows_reach(&db.pool, "uvdb", 2).await?;
    assert_eq!(all.len(), 2, "{all:?}");
    assert!(all.iter().all(|r| r.uidvalidity == i64::from(uidvalidity)));
    let ticks = host.ticks.lock().unwrap().clone();
    let rescan = ticks
        .iter()
        .find(|r| r.accounts[0].rescanned)
        .expect("a tick started the mailbox over");
    assert_eq!(
        (rescan.totals().stored, rescan.totals().duplicates),
        (1, 1),
        "{rescan:?}"
    );
    assert_eq!(outbox_count(&db.pool).await?, 2);

    // Started over, the state is the session's again: the next mail comes over it.
    host.settled("uvdb").await;
    let ticks = host.ticks.lock().unwrap().len();
    send(&u, "a@example.com", "third", "3").await?;
    let all = rows_reach(&db.pool, "uvdb", 3).await?;
    assert_eq!(all.len(), 3, "{all:?}");
    assert_eq!(all[2].status, "stored");
    assert_eq!(
        host.ticks.lock().unwrap().len(),
        ticks,
        "fetched on the IDLE session, with no tick"
    );
    assert_eq!(outbox_count(&db.pool).await?, 3);
    host.end().await;
    Ok(())
}

/// A mail over the size limit heard while idling: recorded skipped, its header read and its
/// body not, as the tick records it (`poller.rs`, cyrus.rs); the mail after it is stored.
async fn over_the_size_limit(server: Server, prefix: &str) -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user(prefix);
    let (through, proxy) = proxied(server, "big", &u).await?;
    let config = quick(config(vec![through]), Duration::from_millis(100));
    let host = Host::start(poller(&db.pool, config), &db);
    host.settled("big").await;
    let logins = proxy.accepted();

    let big_body = "x".repeat(200 * 1024);
    server
        .put(
            &u,
            &raw_mail("big@test", "big@example.com", "a big one", &big_body),
        )
        .await?;
    server
        .put(
            &u,
            &raw_mail("after@test", "b@example.com", "after", "small"),
        )
        .await?;
    let r = rows_reach(&db.pool, "big", 2).await?;
    assert_eq!(r.len(), 2, "{r:?}");
    assert_eq!(r[0].status, "skipped");
    let reason = r[0].skip_reason.as_deref().unwrap_or_default();
    assert!(
        reason.contains("over the limit of 102400 bytes"),
        "{reason}"
    );
    assert!(r[0].raw_size > 200 * 1024);
    assert_eq!(r[0].subject.as_deref(), Some("a big one"));
    assert_eq!(r[0].message_id.as_deref(), Some("big@test"));
    assert_eq!((r[0].text_body.as_deref(), r[0].event_id), (None, None));
    assert_eq!(
        (r[1].status.as_str(), r[1].subject.as_deref()),
        ("stored", Some("after"))
    );
    assert_eq!(outbox_count(&db.pool).await?, 1);
    assert_eq!(proxy.accepted(), logins, "fetched without a new login");
    let status = host.poller.stats().account("big").unwrap();
    assert_eq!((status.stored, status.skipped), (1, 1));
    host.end().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mail_over_the_size_limit_heard_while_idling_is_skipped_as_by_a_tick_on_dovecot()
-> anyhow::Result<()> {
    over_the_size_limit(Server::Dovecot, "fetch-big").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mail_over_the_size_limit_heard_while_idling_is_skipped_as_by_a_tick_on_cyrus()
-> anyhow::Result<()> {
    over_the_size_limit(Server::Cyrus, "cyrus-fetch-big").await
}
