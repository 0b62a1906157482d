//! `FaultProxy`, one switch a test, against an echo server on loopback, and once against the
//! local PostgreSQL through sqlx.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, PgConnection};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;
use worker_testkit::FaultProxy;

/// Long enough for an answer on loopback to have come back.
const QUIET: Duration = Duration::from_millis(300);
/// The bound on anything the proxy should do at once.
const SOON: Duration = Duration::from_secs(2);

/// An echo server on loopback that counts the connections it accepted.
struct Echo {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Echo {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = accepted.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let (mut read, mut write) = stream.split();
                    let _ = tokio::io::copy(&mut read, &mut write).await;
                });
            }
        });
        Self {
            addr,
            accepted,
            task,
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn proxied() -> (Echo, FaultProxy) {
    let echo = Echo::start().await;
    let proxy = FaultProxy::start(echo.addr).await.unwrap();
    (echo, proxy)
}

async fn connect(proxy: &FaultProxy) -> TcpStream {
    timeout(SOON, TcpStream::connect(proxy.addr()))
        .await
        .unwrap()
        .unwrap()
}

/// Sends `ping` and reads its echo within `within`.
async fn ping(stream: &mut TcpStream, within: Duration) -> std::io::Result<()> {
    stream.write_all(b"ping").await?;
    let mut buf = [0u8; 4];
    timeout(within, stream.read_exact(&mut buf))
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
    assert_eq!(&buf, b"ping");
    Ok(())
}

/// What the client sees of its connection within `within`: the result of one read, or
/// `None` when nothing came.
async fn next_read(stream: &mut TcpStream, within: Duration) -> Option<std::io::Result<usize>> {
    let mut buf = [0u8; 64];
    timeout(within, stream.read(&mut buf)).await.ok()
}

fn is_closed(read: Option<std::io::Result<usize>>) -> bool {
    matches!(read, Some(Ok(0)) | Some(Err(_)))
}

async fn wait_until(what: &str, condition: impl Fn() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(started.elapsed() < SOON, "{what}: not within {SOON:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn bytes_pass_both_ways_and_connections_are_counted() {
    let (_echo, proxy) = proxied().await;
    let mut a = connect(&proxy).await;
    let mut b = connect(&proxy).await;
    ping(&mut a, SOON).await.unwrap();
    ping(&mut b, SOON).await.unwrap();
    assert_eq!((proxy.accepted(), proxy.open()), (2, 2));
    drop(a);
    wait_until("one connection closed", || proxy.open() == 1).await;
    assert_eq!(proxy.accepted(), 2);
}

#[tokio::test]
async fn cut_closes_open_connections_and_new_ones_pass() {
    let (_echo, proxy) = proxied().await;
    let mut old = connect(&proxy).await;
    ping(&mut old, SOON).await.unwrap();
    proxy.cut();
    assert!(matches!(next_read(&mut old, SOON).await, Some(Ok(0))));
    let mut new = connect(&proxy).await;
    ping(&mut new, SOON).await.unwrap();
    wait_until("only the new connection open", || proxy.open() == 1).await;
}

#[tokio::test]
async fn reset_closes_open_connections_with_an_rst() {
    let (_echo, proxy) = proxied().await;
    let mut old = connect(&proxy).await;
    ping(&mut old, SOON).await.unwrap();
    proxy.reset();
    let read = next_read(&mut old, SOON).await;
    assert!(
        matches!(&read, Some(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "{read:?}"
    );
    let mut new = connect(&proxy).await;
    ping(&mut new, SOON).await.unwrap();
}

#[tokio::test]
async fn stall_answers_nothing_and_heal_closes_the_stalled_connections() {
    let (echo, proxy) = proxied().await;
    let mut old = connect(&proxy).await;
    ping(&mut old, SOON).await.unwrap();
    proxy.stall();
    assert!(
        ping(&mut old, QUIET).await.is_err(),
        "a stalled link answered"
    );
    // A new connection is accepted but never reaches the server.
    let mut new = connect(&proxy).await;
    assert!(ping(&mut new, QUIET).await.is_err());
    assert_eq!((proxy.accepted(), echo.accepted()), (2, 1));

    proxy.heal();
    assert!(is_closed(next_read(&mut old, SOON).await));
    assert!(is_closed(next_read(&mut new, SOON).await));
    let mut again = connect(&proxy).await;
    ping(&mut again, SOON).await.unwrap();
}

#[tokio::test]
async fn blackhole_swallows_both_ways_and_closes_nothing_until_healed() {
    let (echo, proxy) = proxied().await;
    let mut old = connect(&proxy).await;
    ping(&mut old, SOON).await.unwrap();
    proxy.blackhole();
    assert!(ping(&mut old, QUIET).await.is_err());
    let mut new = connect(&proxy).await;
    assert!(ping(&mut new, QUIET).await.is_err());
    // Nothing is closed, nothing is answered: the reads just wait.
    assert!(next_read(&mut old, QUIET).await.is_none());
    assert!(next_read(&mut new, QUIET).await.is_none());
    assert_eq!((proxy.open(), echo.accepted()), (2, 1));

    proxy.heal();
    assert!(is_closed(next_read(&mut old, SOON).await));
    assert!(is_closed(next_read(&mut new, SOON).await));
    let mut again = connect(&proxy).await;
    ping(&mut again, SOON).await.unwrap();
}

#[tokio::test]
async fn slow_delays_every_chunk_each_way_until_healed() {
    let (_echo, proxy) = proxied().await;
    let mut old = connect(&proxy).await;
    proxy.slow(Duration::from_millis(250));
    // There and back: two chunks, each delayed.
    let started = Instant::now();
    ping(&mut old, SOON).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(500));
    let mut new = connect(&proxy).await;
    let started = Instant::now();
    ping(&mut new, SOON).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(500));

    proxy.heal();
    let started = Instant::now();
    ping(&mut old, SOON).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "still delayed"
    );
}

/// Waits until a connection to `addr` is refused (`true`) or accepted (`false`).
async fn wait_refused(addr: SocketAddr, refused: bool) {
    let started = Instant::now();
    loop {
        let attempt = TcpStream::connect(addr).await;
        let now = matches!(&attempt, Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused);
        if now == refused {
            return;
        }
        assert!(
            started.elapsed() < SOON,
            "refused is still {now} after {SOON:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn refuse_stops_listening_and_heal_listens_again_on_the_same_port() {
    let (_echo, proxy) = proxied().await;
    let mut old = connect(&proxy).await;
    proxy.refuse();
    wait_refused(proxy.addr(), true).await;
    // The connection accepted before goes on.
    ping(&mut old, SOON).await.unwrap();

    proxy.heal();
    wait_refused(proxy.addr(), false).await;
    let mut new = connect(&proxy).await;
    ping(&mut new, SOON).await.unwrap();
    ping(&mut old, SOON).await.unwrap();
}

#[tokio::test]
async fn dropping_the_proxy_closes_its_port_and_connections() {
    let (_echo, proxy) = proxied().await;
    let addr = proxy.addr();
    let mut old = connect(&proxy).await;
    ping(&mut old, SOON).await.unwrap();
    drop(proxy);
    assert!(is_closed(next_read(&mut old, SOON).await));
    assert!(TcpStream::connect(addr).await.is_err());
}

/// The local PostgreSQL (`WH_TEST_DATABASE_URL`) through the proxy: a cut fails the query in
/// flight and a new connection works; a blackhole leaves a query unanswered; after a heal,
/// queries work again.
#[tokio::test]
async fn postgres_through_the_proxy_fails_on_cut_hangs_in_a_blackhole_and_recovers() {
    let direct: PgConnectOptions = worker_testkit::database_url().parse().unwrap();
    let upstream = format!("{}:{}", direct.get_host(), direct.get_port());
    let proxy = FaultProxy::start(upstream.as_str()).await.unwrap();
    let options = direct.host("127.0.0.1").port(proxy.port());
    let select_one = |mut conn: PgConnection| async move {
        let one: i32 = sqlx::query_scalar("SELECT 1").fetch_one(&mut conn).await?;
        assert_eq!(one, 1);
        Ok::<_, sqlx::Error>(conn)
    };

    let conn = timeout(SOON, options.connect()).await.unwrap().unwrap();
    let conn = timeout(SOON, select_one(conn)).await.unwrap().unwrap();
    proxy.cut();
    let failed = timeout(SOON, select_one(conn)).await.unwrap();
    assert!(failed.is_err(), "a query on a cut connection succeeded");
    let conn = timeout(SOON, options.connect()).await.unwrap().unwrap();
    let mut conn = timeout(SOON, select_one(conn)).await.unwrap().unwrap();

    proxy.blackhole();
    let unanswered = timeout(
        Duration::from_secs(1),
        sqlx::query("SELECT 1").execute(&mut conn),
    )
    .await;
    assert!(unanswered.is_err(), "a blackholed query answered");

    proxy.heal();
    let conn = timeout(SOON, options.connect()).await.unwrap().unwrap();
    let conn = timeout(SOON, select_one(conn)).await.unwrap().unwrap();
    timeout(SOON, conn.close()).await.unwrap().unwrap();
    assert_eq!(proxy.accepted(), 3);
}

#[tokio::test]
async fn an_upstream_that_refuses_closes_the_client_connection() {
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = closed.local_addr().unwrap();
    drop(closed);
    let proxy = FaultProxy::start(upstream).await.unwrap();
    let mut client = connect(&proxy).await;
    assert!(is_closed(next_read(&mut client, SOON).await));
    wait_until("nothing open", || proxy.open() == 0).await;
    assert_eq!(proxy.accepted(), 1);
}

#[tokio::test]
async fn retarget_closes_open_connections_and_sends_new_ones_to_the_new_upstream() {
    let (first, proxy) = proxied().await;
    let second = Echo::start().await;
    let mut before = connect(&proxy).await;
    ping(&mut before, SOON).await.unwrap();

    proxy.retarget(second.addr);
    assert!(is_closed(next_read(&mut before, SOON).await));
    assert_eq!(proxy.upstream(), second.addr);
    let mut after = connect(&proxy).await;
    ping(&mut after, SOON).await.unwrap();
    assert_eq!((first.accepted(), second.accepted()), (1, 1));
}
