//! An IMAP account's circuit (`imap:<account>`) against the real Dovecot and PostgreSQL: a
//! refused login opens it at once, a tick skips the account while it is open without
//! connecting, and after the cool-down the next tick's sign-in is the probe that closes it.
//! The account is reached through a local TCP relay that counts the connections made to it.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use job_inbound_email_poller::ImapAccount;
use tokio::net::{TcpListener, TcpStream};
use worker_core::circuit::CircuitSettings;
use worker_store::circuits::Circuits;
use worker_testkit::TestDb;

/// A relay on loopback to the local Dovecot, counting the connections it is asked for.
async fn counting_relay() -> anyhow::Result<(u16, Arc<AtomicUsize>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                if let Ok(mut outbound) = TcpStream::connect(worker_testkit::imap_addr()).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    Ok((port, connections))
}

fn through(port: u16, mut account: ImapAccount) -> ImapAccount {
    account.host = "127.0.0.1".into();
    account.port = port;
    account
}

/// Short enough for a test: a probe two seconds after the circuit opened.
fn circuits(db: &TestDb) -> Circuits {
    let settings = CircuitSettings {
        cool_down: Duration::from_secs(2),
        max_cool_down: Duration::from_secs(2),
        ..CircuitSettings::default()
    };
    Circuits::new(db.pool.clone(), settings, "circuit-test")
}

#[tokio::test]
async fn a_refused_login_opens_the_accounts_circuit_until_a_probe_signs_in() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let circuits = circuits(&db);
    let (port, connections) = counting_relay().await?;
    let locked = user("circuit-locked");
    let other = user("circuit-other");
    send(
        &locked,
        "alice@example.com",
        "waiting",
        "for the right password",
    )
    .await?;
    send(&other, "bob@example.com", "meanwhile", "still polled").await?;
    wait_for_messages(&locked, "INBOX", 1).await?;
    wait_for_messages(&other, "INBOX", 1).await?;

    // A wrong password: Dovecot refuses the LOGIN, which opens the circuit at once.
    let wrong = poller(
        &db.pool,
        config(vec![
            through(port, account("locked", &locked, "not-the-password")),
            account("other", &other, "secret"),
        ]),
    )
    .with_circuits(circuits.clone());
    let first = poll(&wrong).await;
    let refused = first.accounts[0].failure.as_ref().expect("a refused login");
    assert_eq!(refused.reason(), "imap-auth-failed", "{refused}");
    assert_eq!(first.accounts[1].counts.stored, 1, "{first:?}");
    assert_eq!(connections.load(Ordering::SeqCst), 1);
    let open = circuits
        .open_circuit("imap:locked")
        .expect("one refused login opens the account's circuit");
    assert!(open.reason.contains("LOGIN"), "{open:?}");
    assert!(circuits.open_circuit("imap:other").is_none());

    // The password is put right, but the circuit is open: the account is skipped, without
    // a connection, and the tick goes on with the other account.
    let fixed = poller(
        &db.pool,
        config(vec![
            through(port, account("locked", &locked, "secret")),
            account("other", &other, "secret"),
        ]),
    )
    .with_circuits(circuits.clone());
    send(&other, "bob@example.com", "again", "still polled").await?;
    wait_for_messages(&other, "INBOX", 2).await?;
    let second = poll(&fixed).await;
    let skipped = second.accounts[0]
        .circuit_open
        .as_ref()
        .expect("skipped for its open circuit");
    assert!(second.accounts[0].failure.is_none(), "{second:?}");
    assert!(skipped.probe_in <= Duration::from_secs(2), "{skipped:?}");
    assert_eq!(second.accounts[1].counts.stored, 1, "{second:?}");
    assert_eq!(
        connections.load(Ordering::SeqCst),
        1,
        "no connection while open"
    );
    assert!(
        second
            .summary()
            .contains("1 skipped, their circuit open: locked"),
        "{}",
        second.summary()
    );
    let status = fixed.stats().account("locked").unwrap_or_default();
    assert_eq!(
        (status.circuit_skips, status.polls, status.failures),
        (1, 0, 0)
    );

    // After the cool-down the next tick's sign-in is the probe: it closes the circuit, and
    // the mail that waited is fetched.
    tokio::time::sleep(skipped.probe_in + Duration::from_millis(200)).await;
    let third = poll(&fixed).await;
    assert!(third.accounts[0].failure.is_none(), "{third:?}");
    assert!(third.accounts[0].circuit_open.is_none(), "{third:?}");
    assert_eq!(third.accounts[0].counts.stored, 1, "{third:?}");
    assert_eq!(connections.load(Ordering::SeqCst), 2);
    assert!(circuits.open_circuit("imap:locked").is_none());
    assert!(worker_store::circuits::list(&db.pool).await?.is_empty());
    assert_eq!(rows(&db.pool, "locked").await?.len(), 1);
    Ok(())
}

/// The account's IDLE session, refused its login, waits for the circuit's probe instead of
/// reconnecting on its own doubling wait (which would be after 1 s, then 2 s): the probe,
/// after the cool-down, is its one connection until then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_session_waits_for_the_probe_of_its_accounts_open_circuit() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let settings = CircuitSettings {
        cool_down: Duration::from_secs(4),
        max_cool_down: Duration::from_secs(4),
        ..CircuitSettings::default()
    };
    let circuits = Circuits::new(db.pool.clone(), settings, "circuit-test");
    let (port, connections) = counting_relay().await?;
    let locked = user("circuit-idle");
    let idler = poller(
        &db.pool,
        config(vec![through(
            port,
            account("idle-locked", &locked, "wrong"),
        )]),
    )
    .with_circuits(circuits.clone())
    .idler();
    let started = tokio::time::Instant::now();
    let idling = common::idling::Idling::start(idler, &db);

    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        connections.load(Ordering::SeqCst),
        1,
        "no reconnect while open"
    );
    let state = idling
        .idler
        .stats()
        .account("idle-locked")
        .and_then(|s| s.idle)
        .unwrap_or_default();
    assert!(state.starts_with("waiting: its circuit is open"), "{state}");

    // The probe, once the cool-down is over: one connection, refused again, and the circuit
    // stays open with the probe counted.
    while connections.load(Ordering::SeqCst) < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the probe never came"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let open = circuits
        .open_circuit("imap:idle-locked")
        .expect("still open");
    assert_eq!(open.failed_probes, 1, "{open:?}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        connections.load(Ordering::SeqCst),
        2,
        "the next probe waits its cool-down"
    );
    idling.end().await;
    Ok(())
}
