//! Connection supervision through a TCP proxy the test controls: a frozen broker (a stalled
//! [`FaultProxy`]) is noticed by heartbeats, a cut connection (what a `kill -9` of the broker
//! looks like from here) is replaced, and `connection.blocked` (injected by a proxy of this
//! file) shows as a state. None of it touches the shared broker.

// Helpers outside #[test] functions assert too: a failed expectation fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Mutex, mpsc};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use worker_broker::{BrokerAddress, LinkState, Outgoing, Publisher, PublisherSettings, Supervisor};
use worker_testkit::{FaultProxy, TestVhost};

/// The local broker's AMQP address, as the tests' connection settings name it.
fn broker() -> String {
    std::env::var("WH_TEST_AMQP_HOST").unwrap_or_else(|_| "127.0.0.1:5672".into())
}

/// A proxy to the local broker that injects frames towards the client, which
/// [`FaultProxy`] does not do (it knows nothing of AMQP).
struct InjectingProxy {
    port: u16,
    inject: Arc<Mutex<Vec<mpsc::UnboundedSender<Vec<u8>>>>>,
    _accept: tokio::task::JoinHandle<()>,
}

impl InjectingProxy {
    async fn start() -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let inject: Arc<Mutex<Vec<mpsc::UnboundedSender<Vec<u8>>>>> = Arc::default();
        let accept = {
            let inject = inject.clone();
            tokio::spawn(async move {
                let mut links = JoinSet::new();
                while let Ok((client, _)) = listener.accept().await {
                    let Ok(server) = TcpStream::connect(broker()).await else {
                        continue;
                    };
                    let (tx, rx) = mpsc::unbounded_channel();
                    inject.lock().await.push(tx);
                    links.spawn(link(client, server, rx));
                }
            })
        };
        Ok(Self {
            port,
            inject,
            _accept: accept,
        })
    }

    /// Sends `frame` to every client, between two server frames.
    async fn inject(&self, frame: Vec<u8>) {
        for tx in self.inject.lock().await.iter() {
            let _ = tx.send(frame.clone());
        }
    }
}

/// Copies both ways. Frames from `inject` go to the client at a frame boundary of the
/// server's stream.
async fn link(client: TcpStream, server: TcpStream, mut inject: mpsc::UnboundedReceiver<Vec<u8>>) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let up = async move {
        let _ = tokio::io::copy(&mut cr, &mut sw).await;
    };
    let down = async move {
        // Server to client, frame by frame: type (1), channel (2), size (4), payload, 0xCE.
        loop {
            let mut header = [0u8; 7];
            if sr.read_exact(&mut header).await.is_err() {
                return;
            }
            let size = u32::from_be_bytes([header[3], header[4], header[5], header[6]]) as usize;
            let mut rest = vec![0u8; size + 1];
            if sr.read_exact(&mut rest).await.is_err() {
                return;
            }
            while let Ok(frame) = inject.try_recv() {
                if cw.write_all(&frame).await.is_err() {
                    return;
                }
            }
            if cw.write_all(&header).await.is_err() || cw.write_all(&rest).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}

/// A method frame on channel 0 (class 10, connection).
fn connection_method(method: u16, args: &[u8]) -> Vec<u8> {
    let mut payload = Vec::new();
    payload.extend_from_slice(&10u16.to_be_bytes());
    payload.extend_from_slice(&method.to_be_bytes());
    payload.extend_from_slice(args);
    let mut frame = vec![1u8, 0, 0];
    frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    frame.extend_from_slice(&payload);
    frame.push(0xCE);
    frame
}

async fn supervised(
    vhost: &TestVhost,
    proxy_port: u16,
) -> anyhow::Result<(Supervisor, CancellationToken, tokio::task::JoinHandle<()>)> {
    let mut settings = connection_settings(vhost)?;
    settings.addresses = vec![BrokerAddress::new("127.0.0.1", proxy_port)];
    settings.heartbeat = Duration::from_secs(1);
    settings.connect_timeout = Duration::from_secs(3);
    settings.reconnect_min = ms(100);
    settings.reconnect_max = ms(500);
    let supervisor = Supervisor::new(settings, topology(&queue_settings(&[200], 5))?);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(supervisor.clone().run(shutdown.clone()));
    let mut status = supervisor.status();
    tokio::time::timeout(Duration::from_secs(10), status.wait_for(|s| s.is_ready())).await??;
    Ok((supervisor, shutdown, task))
}

async fn wait_state(
    supervisor: &Supervisor,
    within: Duration,
    want: impl Fn(LinkState) -> bool,
) -> anyhow::Result<Duration> {
    let started = tokio::time::Instant::now();
    let mut status = supervisor.status();
    tokio::time::timeout(within, status.wait_for(|s| want(s.state)))
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "state still {:?} after {within:?}",
                supervisor.status().borrow()
            )
        })??;
    Ok(started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_broker_is_noticed_within_two_heartbeats_and_the_link_comes_back()
-> anyhow::Result<()> {
    let vhost = TestVhost::create().await?;
    let proxy = FaultProxy::start(broker()).await?;
    let (supervisor, shutdown, task) = supervised(&vhost, proxy.port()).await?;

    proxy.stall();
    let noticed = wait_state(&supervisor, Duration::from_secs(6), |s| {
        s == LinkState::Disconnected
    })
    .await?;
    assert!(!supervisor.status().borrow().is_ready());
    assert!(
        noticed <= Duration::from_millis(3500),
        "noticed after {noticed:?} with a 1 s heartbeat"
    );
    assert!(
        supervisor.sessions().borrow().is_none(),
        "no session is handed out while down"
    );

    // The stalled connections are closed, new ones pass.
    proxy.heal();
    wait_state(&supervisor, Duration::from_secs(10), |s| {
        s == LinkState::Connected
    })
    .await?;
    assert_eq!(supervisor.status().borrow().reconnects, 1);
    shutdown.cancel();
    task.await?;
    assert_eq!(supervisor.status().borrow().state, LinkState::Stopped);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_connection_is_replaced_and_publishing_resumes() -> anyhow::Result<()> {
    let vhost = TestVhost::create().await?;
    let proxy = FaultProxy::start(broker()).await?;
    let (supervisor, shutdown, task) = supervised(&vhost, proxy.port()).await?;
    let publisher = Publisher::new(
        supervisor.sessions(),
        PublisherSettings {
            connect_wait: Duration::from_secs(10),
            ..PublisherSettings::default()
        },
    );
    publisher
        .publish(&Outgoing::new("commands", QUEUE, b"{}".to_vec()))
        .await?;

    // The broker is unreachable for a while, as during a restart after kill -9.
    proxy.refuse();
    proxy.cut();
    wait_state(&supervisor, Duration::from_secs(5), |s| {
        s == LinkState::Disconnected
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(supervisor.status().borrow().last_error.is_some());
    proxy.heal();

    // A publish made while down waits for the new connection.
    publisher
        .publish(&Outgoing::new("commands", QUEUE, b"{}".to_vec()))
        .await?;
    assert!(supervisor.status().borrow().is_ready());
    assert_eq!(supervisor.status().borrow().reconnects, 1);
    shutdown.cancel();
    task.await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_connection_is_a_state_of_its_own() -> anyhow::Result<()> {
    let vhost = TestVhost::create().await?;
    let proxy = InjectingProxy::start().await?;
    let (supervisor, shutdown, task) = supervised(&vhost, proxy.port).await?;

    let reason = b"low on memory";
    let mut args = vec![reason.len() as u8];
    args.extend_from_slice(reason);
    proxy.inject(connection_method(60, &args)).await;
    wait_state(&supervisor, Duration::from_secs(5), |s| {
        s == LinkState::Blocked
    })
    .await?;
    let status = supervisor.status().borrow().clone();
    assert!(!status.is_ready());
    assert!(status.last_error.unwrap().contains("low on memory"));

    proxy.inject(connection_method(61, &[])).await;
    wait_state(&supervisor, Duration::from_secs(5), |s| {
        s == LinkState::Connected
    })
    .await?;
    assert_eq!(
        supervisor.status().borrow().reconnects,
        0,
        "blocking is not a reconnect"
    );
    shutdown.cancel();
    task.await?;
    Ok(())
}
