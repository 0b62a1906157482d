//! `imap-drop-fetch`: the poller's IMAP connection dropped in the middle of a `UID FETCH`.
//!
//! A [`FaultProxy`](worker_testkit::FaultProxy) cuts at a moment of its own, which a short
//! poll session rarely spends in a FETCH; so this scenario puts a small relay of its own in
//! front of Dovecot that reads the poller's commands and drops the connection right after a
//! `UID FETCH` went out, when armed.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::{Fault, Load, Scenario};
use crate::run::{Run, Setup};

/// FETCH commands dropped per repetition.
const DROPS_PER_REPETITION: u64 = 3;

/// How long a repetition waits for the poller to send the FETCHes to drop.
const DROP_WAIT: Duration = Duration::from_secs(30);

/// Bytes of the server's answer let through before the connection is closed, in the way
/// that lets some through (half a line or half a literal).
const PARTIAL_ANSWER: usize = 60;

pub fn scenario() -> Scenario {
    Scenario {
        name: "imap-drop-fetch",
        about: "The poller's IMAP connection goes through a relay of the harness in front of \
                the shared Dovecot (the account's `port` in the settings file), which reads the \
                poller's commands. At a random moment of each repetition it is armed to drop \
                the next 3 `UID FETCH` commands (the sizes fetch or a body fetch, whichever \
                comes), in turn: closed (FIN) right after the command went out, before any \
                answer; closed after the first 60 bytes of the answer; reset (RST) before any \
                answer. The repetition waits until the 3 were dropped (mail keeps arriving, so \
                the poller keeps fetching). \"Ready again\" is from the third drop.",
        fault: Some(|| Box::new(ImapDropFetch::default())),
        full: Load {
            repetitions: 20,
            per_repetition: 20,
        },
        quick: Load {
            repetitions: 1,
            per_repetition: 20,
        },
        rate_per_sec: 2.0,
        settle: Duration::from_secs(180),
        heartbeat: super::DEFAULT_HEARTBEAT,
    }
}

/// The fault: see [`scenario`]'s description.
#[derive(Default)]
struct ImapDropFetch {
    relay: Option<FetchDropper>,
}

#[async_trait::async_trait]
impl Fault for ImapDropFetch {
    async fn prepare(&mut self, _dir: &Path) -> anyhow::Result<Setup> {
        let relay = FetchDropper::start(&worker_testkit::imap_addr()).await?;
        let port = relay.addr.port();
        self.relay = Some(relay);
        Ok(Setup {
            imap_port: Some(port),
            ..Setup::default()
        })
    }

    async fn apply(&mut self, run: &mut Run) -> anyhow::Result<()> {
        let relay = self.relay.as_ref().context("the relay was not started")?;
        let target = relay.dropped() + DROPS_PER_REPETITION;
        relay.arm(DROPS_PER_REPETITION);
        let deadline = Instant::now() + DROP_WAIT;
        while relay.dropped() < target {
            if Instant::now() > deadline {
                relay.arm(0);
                anyhow::bail!(
                    "the poller sent only {} of {DROPS_PER_REPETITION} FETCHes to drop within {DROP_WAIT:?}",
                    DROPS_PER_REPETITION + relay.dropped() - target
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        run.record_ready_after(Instant::now()).await
    }

    async fn finish(&mut self, _run: &mut Run) -> anyhow::Result<()> {
        if let Some(relay) = &self.relay {
            relay.arm(0);
        }
        Ok(())
    }
}

/// How a dropped FETCH's connection ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DropWay {
    /// Bytes of the server's answer still let through.
    answer_bytes: usize,
    /// An RST instead of a FIN.
    reset: bool,
}

impl DropWay {
    /// The `n`th drop's way (0-based), in turn.
    fn nth(n: u64) -> Self {
        match n % 3 {
            0 => Self {
                answer_bytes: 0,
                reset: false,
            },
            1 => Self {
                answer_bytes: PARTIAL_ANSWER,
                reset: false,
            },
            _ => Self {
                answer_bytes: 0,
                reset: true,
            },
        }
    }
}

/// The counters shared by the relay's connections.
#[derive(Debug, Default)]
struct Counters {
    /// FETCH commands still to drop.
    armed: AtomicU64,
    /// FETCH commands dropped so far.
    dropped: AtomicU64,
}

/// A TCP relay on `127.0.0.1` (a port of its own) to the IMAP server that drops the
/// connection of an armed `UID FETCH`. Dropping it stops it and closes its connections.
struct FetchDropper {
    addr: SocketAddr,
    counters: Arc<Counters>,
    accept: JoinHandle<()>,
}

impl FetchDropper {
    async fn start(upstream: &str) -> anyhow::Result<Self> {
        let upstream: SocketAddr = tokio::net::lookup_host(upstream)
            .await
            .with_context(|| format!("resolving {upstream}"))?
            .next()
            .with_context(|| format!("{upstream} resolves to no address"))?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let counters = Arc::new(Counters::default());
        let shared = counters.clone();
        let accept = tokio::spawn(async move {
            // The connections' tasks belong to this set: aborting the accept task drops them.
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let counters = shared.clone();
                connections.spawn(async move {
                    if let Ok(server) = TcpStream::connect(upstream).await {
                        relay(client, server, &counters).await;
                    }
                });
                while connections.try_join_next().is_some() {}
            }
        });
        Ok(Self {
            addr,
            counters,
            accept,
        })
    }

    /// Drops the next `n` FETCH commands (0: none).
    fn arm(&self, n: u64) {
        self.counters.armed.store(n, Ordering::SeqCst);
    }

    fn dropped(&self) -> u64 {
        self.counters.dropped.load(Ordering::SeqCst)
    }
}

impl Drop for FetchDropper {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Forwards both ways until a side closes, or until an armed FETCH is dropped.
async fn relay(mut client: TcpStream, mut server: TcpStream, counters: &Counters) {
    let mut from_client = vec![0u8; 16 * 1024];
    let mut from_server = vec![0u8; 16 * 1024];
    let mut scanner = FetchScanner::default();
    let mut cut: Option<DropWay> = None;
    let end = loop {
        tokio::select! {
            read = client.read(&mut from_client) => {
                let n = match read {
                    Ok(0) | Err(_) => break None,
                    Ok(n) => n,
                };
                // The drop is decided before the command goes out, so that no byte of its
                // answer can pass unless the drop lets it.
                if cut.is_none() && scanner.saw_fetch(&from_client[..n]) && take_one(&counters.armed) {
                    cut = Some(DropWay::nth(counters.dropped.fetch_add(1, Ordering::SeqCst)));
                }
                if server.write_all(&from_client[..n]).await.is_err() {
                    break None;
                }
                if let Some(way) = cut && way.answer_bytes == 0 {
                    break Some(way);
                }
            }
            read = server.read(&mut from_server) => {
                let n = match read {
                    Ok(0) | Err(_) => break None,
                    Ok(n) => n,
                };
                let pass = cut.map_or(n, |way| n.min(way.answer_bytes));
                if client.write_all(&from_server[..pass]).await.is_err() {
                    break None;
                }
                if let Some(way) = cut.as_mut() {
                    way.answer_bytes -= pass;
                    if way.answer_bytes == 0 {
                        break Some(*way);
                    }
                }
            }
        }
    };
    if let Some(DropWay { reset: true, .. }) = end {
        let _ = client.set_zero_linger();
        let _ = server.set_zero_linger();
    }
}

/// Takes one from `armed` if any is left.
fn take_one(armed: &AtomicU64) -> bool {
    armed
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

/// Finds `UID FETCH` in the client's bytes, across chunk boundaries.
#[derive(Debug, Default)]
struct FetchScanner {
    /// The end of the previous chunk, after the last match.
    tail: Vec<u8>,
}

impl FetchScanner {
    const NEEDLE: &'static [u8] = b"uid fetch";

    fn saw_fetch(&mut self, chunk: &[u8]) -> bool {
        let mut text = std::mem::take(&mut self.tail);
        text.extend(chunk.iter().map(u8::to_ascii_lowercase));
        let found = text
            .windows(Self::NEEDLE.len())
            .rposition(|w| w == Self::NEEDLE);
        let keep_from = match found {
            Some(at) => at + Self::NEEDLE.len(),
            None => text.len().saturating_sub(Self::NEEDLE.len() - 1),
        };
        self.tail = text.split_off(keep_from);
        found.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fetch_is_seen_once_even_across_chunks() {
        let mut scanner = FetchScanner::default();
        assert!(!scanner.saw_fetch(b"A1 LOGIN x y\r\nA2 UID SEARCH UID 1:*\r\n"));
        assert!(scanner.saw_fetch(b"A3 UID FETCH 1 (UID RFC822.SIZE)\r\n"));
        assert!(!scanner.saw_fetch(b"A4 NOOP\r\n"));
        assert!(!scanner.saw_fetch(b"A5 UID FE"));
        assert!(scanner.saw_fetch(b"TCH 2 (UID BODY.PEEK[])\r\n"));
        assert!(!scanner.saw_fetch(b"\r\n"));
    }

    #[test]
    fn the_drops_take_turns() {
        assert_eq!(DropWay::nth(0).answer_bytes, 0);
        assert!(!DropWay::nth(0).reset);
        assert_eq!(DropWay::nth(1).answer_bytes, PARTIAL_ANSWER);
        assert!(DropWay::nth(2).reset);
        assert_eq!(DropWay::nth(3), DropWay::nth(0));
    }
}
