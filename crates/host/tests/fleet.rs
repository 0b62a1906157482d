//! The fleet view (`worker-host fleet`, the real binary) against installations that misbehave:
//! one that streams an answer without end is shown failing, and is read only up to the
//! view's bound, never whole.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use support::fleet::FleetView;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What the streaming installation sends at most: far past the view's bound (4 MiB), so that a
/// view reading it whole is seen to.
const STREAM_MAX: u64 = 64 * 1024 * 1024;

/// What the view may have taken before it stopped reading: its bound, plus what loopback's
/// socket buffers hold on the way.
const READ_AT_MOST: u64 = 20 * 1024 * 1024;

/// An installation that answers 200 and streams a JSON overview that never ends (chunked, no
/// length), until the reader closes the connection or [`STREAM_MAX`] is sent. Counts what it
/// sent, and says when the reader closed.
struct Streamer {
    addr: std::net::SocketAddr,
    sent: Arc<AtomicU64>,
    closed: Arc<AtomicBool>,
}

impl Streamer {
    async fn start() -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let sent = Arc::new(AtomicU64::new(0));
        let closed = Arc::new(AtomicBool::new(false));
        let (counted, seen_closed) = (sent.clone(), closed.clone());
        tokio::spawn(async move {
            // The first connection only: one reading is enough.
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let mut request = [0_u8; 8192];
            let _ = socket.read(&mut request).await;
            let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                        transfer-encoding: chunked\r\n\r\n";
            if socket.write_all(head.as_bytes()).await.is_err() {
                seen_closed.store(true, Ordering::SeqCst);
                return;
            }
            let mut payload = b"{\"status\": {\"installation\": \"".to_vec();
            payload.resize(64 * 1024, b'a');
            let mut chunk = format!("{:x}\r\n", payload.len()).into_bytes();
            chunk.extend_from_slice(&payload);
            chunk.extend_from_slice(b"\r\n");
            while counted.load(Ordering::SeqCst) < STREAM_MAX {
                if socket.write_all(&chunk).await.is_err() {
                    seen_closed.store(true, Ordering::SeqCst);
                    return;
                }
                counted.fetch_add(payload.len() as u64, Ordering::SeqCst);
            }
            // Sent everything and the reader is still there: hold the line until it goes.
            let _ = socket.read(&mut request).await;
        });
        Ok(Self { addr, sent, closed })
    }
}

/// The row of installation `name` on `/api/fleet`, once its state is not `waiting`.
async fn row_of(view: &FleetView, name: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let fleet: serde_json::Value = reqwest::get(view.url("/api/fleet"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let row = fleet["installations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["name"] == name)
            .cloned()
            .unwrap();
        if row["state"] != "waiting" {
            return row;
        }
        assert!(
            Instant::now() < deadline,
            "no reading of {name} within 30 s:\n{}",
            view.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_installation_streaming_an_endless_answer_is_failing_and_read_only_to_the_bound()
-> anyhow::Result<()> {
    let streamer = Streamer::start().await?;
    let view = FleetView::start(&format!(
        "refresh = \"30s\"\ntimeout = \"10s\"\n\n[[installations]]\nname = \"endless\"\nurl = \"http://{}\"\ntoken = \"a-viewer-token\"\nenvironment = \"staging\"\n",
        streamer.addr
    ))
    .await?;
    let row = row_of(&view, "endless").await;
    assert_eq!(row["state"], "unreachable", "{row}");
    let error = row["last_error"].as_str().unwrap_or_default();
    assert!(error.contains("answer over 4194304 bytes"), "{row}");
    // The view dropped the answer: the installation sees its connection closed, having sent
    // its bound and what the socket buffers hold, far short of everything it had.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !streamer.closed.load(Ordering::SeqCst) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let sent = streamer.sent.load(Ordering::SeqCst);
    assert!(
        streamer.closed.load(Ordering::SeqCst),
        "the view never closed the connection; {sent} bytes sent"
    );
    assert!(
        sent < READ_AT_MOST,
        "the view read {sent} bytes before it stopped"
    );
    Ok(())
}

/// The fleet view answers only requests that name it (`allowed_hosts`, against DNS
/// rebinding): another `Host` is refused on every path with 421; loopback and a listed name
/// are answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_naming_another_host_is_refused_by_the_fleet_view() -> anyhow::Result<()> {
    let (silent, _held) = support::fleet::silent_listener().await?;
    let view = FleetView::start(&format!(
        "allowed_hosts = [\"fleet.example.net\"]\n\n[[installations]]\nname = \"quiet\"\nurl = \"http://{silent}\"\ntoken = \"a-viewer-token\"\nenvironment = \"staging\"\n"
    ))
    .await?;
    let client = reqwest::Client::new();
    let get_as = |path: &str, host: &str| {
        client
            .get(view.url(path))
            .header(reqwest::header::HOST, host)
            .send()
    };
    for path in ["/", "/api/fleet", "/console.css", "/healthz"] {
        let refused = get_as(path, "evil.example").await?;
        assert_eq!(refused.status().as_u16(), 421, "{path}");
        let body = refused.text().await?;
        assert!(
            body.contains("evil.example") && body.contains("allowed_hosts"),
            "{path}: {body}"
        );
        for ours in [
            format!("127.0.0.1:{}", view.port),
            "localhost".to_string(),
            "fleet.example.net".to_string(),
        ] {
            let answer = get_as(path, &ours).await?;
            assert_eq!(answer.status().as_u16(), 200, "{path} with Host {ours}");
        }
    }
    Ok(())
}

/// An installation whose overview has the relay's circuit open: answers every reading with
/// that overview.
async fn installation_with_an_open_circuit() -> anyhow::Result<std::net::SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let overview = serde_json::json!({
        "status": {"installation": "relay-down", "broker": {"state": "connected"}, "database": {"healthy": true}},
        "circuits": [{"dependency": "smtp-relay", "reason": "535 5.7.8 Authentication credentials invalid", "opened_at": "2026-12-04T10:00:00Z"}],
    })
    .to_string();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut request = [0_u8; 8192];
            let _ = socket.read(&mut request).await;
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{overview}",
                overview.len()
            );
            let _ = socket.write_all(answer.as_bytes()).await;
        }
    });
    Ok(addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_installation_with_an_open_circuit_is_degraded_and_shows_it_with_its_reason()
-> anyhow::Result<()> {
    let addr = installation_with_an_open_circuit().await?;
    let view = FleetView::start(&format!(
        "[[installations]]\nname = \"relay-down\"\nurl = \"http://{addr}\"\ntoken = \"a-viewer-token\"\nenvironment = \"staging\"\n"
    ))
    .await?;
    let row = row_of(&view, "relay-down").await;
    assert_eq!(row["state"], "degraded", "{row}");
    assert_eq!(
        row["reading"]["circuits"][0]["dependency"], "smtp-relay",
        "{row}"
    );
    let page = reqwest::get(view.url("/")).await?.text().await?;
    assert!(
        page.contains("Circuit open: smtp-relay")
            && page.contains("535 5.7.8 Authentication credentials invalid"),
        "{page}"
    );
    Ok(())
}
