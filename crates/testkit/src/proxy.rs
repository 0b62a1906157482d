//! [`FaultProxy`]: a TCP proxy on loopback in front of one service, with switches for the
//! network faults an installation meets (a cut, a reset, a stall, a partition, a slow link,
//! a refused port).
//!
//! Every switch takes effect at once on the connections already open and on the new ones;
//! [`FaultProxy::heal`] turns the faults off. The proxy holds no thread: its tasks run on the
//! caller's runtime and end when the value is dropped.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpSocket, TcpStream, ToSocketAddrs};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// The size of the chunks the proxy reads and forwards.
const CHUNK: usize = 16 * 1024;

/// What the proxy does with the bytes of its connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Forward both ways (after the delay, if any).
    Pass,
    /// Read nothing, write nothing; new connections are accepted and left unanswered.
    Stall,
    /// Read both ways and drop what was read; close nothing.
    Blackhole,
}

/// The switches, shared with every task through a watch channel. The counters of cuts,
/// resets and heals are events: a connection acts on a change of them, not on their value.
#[derive(Clone, Copy, Debug)]
struct Control {
    /// Where new connections go ([`FaultProxy::retarget`] moves it).
    upstream: SocketAddr,
    mode: Mode,
    delay: Duration,
    listening: bool,
    cuts: u64,
    resets: u64,
    heals: u64,
}

/// How a connection ends when the proxy ends it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    /// A peer closed it or failed, or the proxy cut it or healed it: an orderly close.
    Close,
    /// The proxy reset it: both sockets are closed with an RST (`SO_LINGER` 0).
    Reset,
}

#[derive(Debug, Default)]
struct Counters {
    accepted: AtomicU64,
    open: AtomicU64,
}

/// Counts a connection as open for as long as it is held.
struct OpenGuard(Arc<Counters>);

impl OpenGuard {
    /// Counts a connection just accepted.
    fn accepted(counters: &Arc<Counters>) -> Self {
        counters.accepted.fetch_add(1, Ordering::SeqCst);
        counters.open.fetch_add(1, Ordering::SeqCst);
        Self(counters.clone())
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A TCP proxy on `127.0.0.1` (a port of its own) in front of one upstream service, with
/// runtime switches for network faults. Point the client at [`FaultProxy::addr`].
///
/// | switch | open connections | new connections |
/// |---|---|---|
/// | [`cut`](Self::cut) | closed now (FIN) | pass |
/// | [`reset`](Self::reset) | closed now with an RST | pass |
/// | [`stall`](Self::stall) | stop forwarding (nothing read, nothing written) | accepted, never connected upstream, never answered |
/// | [`blackhole`](Self::blackhole) | bytes read and dropped both ways, nothing closed | the same, never connected upstream |
/// | [`slow`](Self::slow) | every chunk forwarded after the delay | the same |
/// | [`refuse`](Self::refuse) | unchanged | refused: the port stops listening |
/// | [`heal`](Self::heal) | stalled and blackholed ones closed (clients reconnect), the others unchanged | pass |
/// | [`retarget`](Self::retarget) | closed now (FIN) | pass, to the new upstream |
///
/// `cut` and `reset` are events, the others are states: `refuse` and `slow` combine with
/// the rest; `stall` and `blackhole` replace each other. A connection stalled on its client
/// side does not notice that client closing until it is cut, reset or healed.
///
/// The switches return at once; the proxy's tasks act on them at their next turn, so a test
/// that needs the effect waits for what its client sees (a read that ends, a refused connect).
///
/// Dropping the proxy closes its port and every connection.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    control: watch::Sender<Control>,
    counters: Arc<Counters>,
    accept: JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy to `upstream` (a `SocketAddr` or `"host:port"`), listening on
    /// `127.0.0.1` on a free port, forwarding normally.
    pub async fn start(upstream: impl ToSocketAddrs) -> anyhow::Result<Self> {
        let upstream = tokio::net::lookup_host(upstream)
            .await
            .context("resolving the proxy's upstream")?
            .next()
            .context("the proxy's upstream resolves to no address")?;
        let listener = listen(SocketAddr::from(([127, 0, 0, 1], 0)))?;
        let addr = listener.local_addr()?;
        let (control, watcher) = watch::channel(Control {
            upstream,
            mode: Mode::Pass,
            delay: Duration::ZERO,
            listening: true,
            cuts: 0,
            resets: 0,
            heals: 0,
        });
        let counters = Arc::new(Counters::default());
        let accept = tokio::spawn(accept_loop(listener, addr, watcher, counters.clone()));
        Ok(Self {
            addr,
            control,
            counters,
            accept,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port clients connect to (on `127.0.0.1`).
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The service the proxy forwards new connections to.
    pub fn upstream(&self) -> SocketAddr {
        self.control.borrow().upstream
    }

    /// Forwards new connections to `upstream` from now on, and closes the open ones (their
    /// clients reconnect, to it), as a name moved to a promoted server would look.
    pub fn retarget(&self, upstream: SocketAddr) {
        self.control.send_modify(|c| {
            c.upstream = upstream;
            c.cuts += 1;
        });
    }

    /// How many connections the proxy has accepted since it started.
    pub fn accepted(&self) -> u64 {
        self.counters.accepted.load(Ordering::SeqCst)
    }

    /// How many accepted connections are open now.
    pub fn open(&self) -> u64 {
        self.counters.open.load(Ordering::SeqCst)
    }

    /// Closes every open connection now, both sides, as a dead peer host would look from the
    /// other side once its kernel answered. New connections still pass.
    pub fn cut(&self) {
        self.control.send_modify(|c| c.cuts += 1);
    }

    /// Closes every open connection now with an RST (`SO_LINGER` 0) on both sides. New
    /// connections still pass.
    pub fn reset(&self) {
        self.control.send_modify(|c| c.resets += 1);
    }

    /// Open connections stop forwarding; new ones are accepted and never answered (nothing
    /// is connected upstream), as a frozen server would look.
    pub fn stall(&self) {
        self.control.send_modify(|c| c.mode = Mode::Stall);
    }

    /// Every connection, open or new, swallows the bytes both ways and closes nothing, as a
    /// network partition would look.
    pub fn blackhole(&self) {
        self.control.send_modify(|c| c.mode = Mode::Blackhole);
    }

    /// Every chunk forwarded from now on, either way, waits `delay` first.
    pub fn slow(&self, delay: Duration) {
        self.control.send_modify(|c| c.delay = delay);
    }

    /// Stops listening: new connections are refused. Open connections are unchanged.
    pub fn refuse(&self) {
        self.control.send_modify(|c| c.listening = false);
    }

    /// Back to normal: listening, forwarding without delay. Connections that were stalled or
    /// blackholed are closed, so that their clients notice and reconnect.
    pub fn heal(&self) {
        self.control.send_modify(|c| {
            c.mode = Mode::Pass;
            c.delay = Duration::ZERO;
            c.listening = true;
            c.heals += 1;
        });
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // The accept task owns the connections' tasks: aborting it drops them all.
        self.accept.abort();
    }
}

/// A listener with `SO_REUSEADDR`, so that the same port can be bound again after
/// [`FaultProxy::refuse`] while connections accepted on it are still open.
fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(128)
}

async fn accept_loop(
    listener: TcpListener,
    addr: SocketAddr,
    mut control: watch::Receiver<Control>,
    counters: Arc<Counters>,
) {
    let mut connections = JoinSet::new();
    let mut listener = Some(listener);
    loop {
        let listening = control.borrow_and_update().listening;
        match (listening, listener.take()) {
            (false, Some(closing)) => {
                // Connections the kernel completed before the switch are open to their
                // clients already: take them, then stop listening.
                while let Ok(Ok((client, _))) =
                    tokio::time::timeout(Duration::ZERO, closing.accept()).await
                {
                    connections.spawn(connection(
                        client,
                        control.clone(),
                        OpenGuard::accepted(&counters),
                    ));
                }
            }
            (true, None) => match listen(addr) {
                Ok(bound) => listener = Some(bound),
                Err(_) => {
                    // The port is briefly held elsewhere: try again shortly.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            (_, current) => listener = current,
        }
        tokio::select! {
            changed = control.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            accepted = accept(listener.as_ref()) => match accepted {
                Ok((client, _)) => {
                    let open = OpenGuard::accepted(&counters);
                    connections.spawn(connection(client, control.clone(), open));
                }
                // Out of descriptors, or the like: do not spin on it.
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn accept(listener: Option<&TcpListener>) -> std::io::Result<(TcpStream, SocketAddr)> {
    match listener {
        Some(listener) => listener.accept().await,
        None => std::future::pending().await,
    }
}

/// One proxied connection, from its acceptance to its close.
async fn connection(
    mut client: TcpStream,
    mut control: watch::Receiver<Control>,
    _open: OpenGuard,
) {
    let start = *control.borrow_and_update();
    let upstream = start.upstream;
    let mut affected = start.mode != Mode::Pass;
    let mut server = None;
    if !affected {
        let connected = tokio::select! {
            connected = TcpStream::connect(upstream) => connected.ok(),
            end = ended(&mut control, start, &mut affected) => {
                close(client, None, end);
                return;
            }
        };
        match connected {
            Some(stream) => server = Some(stream),
            // The upstream is down: the client sees its connection closed.
            None => return,
        }
    }
    let end = {
        let (client_read, client_write) = client.split();
        let (server_read, server_write) = match server.as_mut() {
            Some(server) => {
                let (read, write) = server.split();
                (Some(read), Some(write))
            }
            None => (None, None),
        };
        let to_server = forward(client_read, server_write, control.clone(), true);
        let to_client = forward_or_park(server_read, client_write, control.clone());
        tokio::select! {
            () = to_server => End::Close,
            () = to_client => End::Close,
            end = ended(&mut control, start, &mut affected) => end,
        }
    };
    close(client, server, end);
}

fn close(client: TcpStream, server: Option<TcpStream>, end: End) {
    if end == End::Reset {
        let _ = client.set_zero_linger();
        if let Some(server) = &server {
            let _ = server.set_zero_linger();
        }
    }
}

/// Waits for the proxy to end this connection: a cut, a reset, a heal once the connection
/// was stalled or blackholed, or the proxy dropped.
async fn ended(control: &mut watch::Receiver<Control>, start: Control, affected: &mut bool) -> End {
    let mut heals = start.heals;
    loop {
        let now = *control.borrow_and_update();
        if now.resets != start.resets {
            return End::Reset;
        }
        if now.cuts != start.cuts {
            return End::Close;
        }
        if now.heals != heals {
            if *affected {
                return End::Close;
            }
            heals = now.heals;
        }
        *affected |= now.mode != Mode::Pass;
        if control.changed().await.is_err() {
            return End::Close;
        }
    }
}

/// The server-to-client direction; a connection without a server (accepted while stalled
/// or blackholed) has nothing to read on that side and waits for its end.
async fn forward_or_park(
    from: Option<ReadHalf<'_>>,
    to: WriteHalf<'_>,
    control: watch::Receiver<Control>,
) {
    match from {
        Some(from) => forward(from, Some(to), control, false).await,
        None => std::future::pending().await,
    }
}

/// Copies one direction under the switches; returns when the connection should close (the
/// reader's end closed or failed, or a write failed).
///
/// `from_client`: the client's closing ends the connection in every mode; the server's
/// closing is not passed on while blackholed (a partition would not pass it either).
async fn forward(
    mut from: ReadHalf<'_>,
    mut to: Option<WriteHalf<'_>>,
    mut control: watch::Receiver<Control>,
    from_client: bool,
) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        let mode = control.borrow_and_update().mode;
        if mode == Mode::Stall {
            if control.changed().await.is_err() {
                return;
            }
            continue;
        }
        let read = tokio::select! {
            read = from.read(&mut buf) => read,
            changed = control.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
        };
        let n = match read {
            Ok(n) if n > 0 => n,
            _ if from_client || mode == Mode::Pass => return,
            // The server closed while blackholed: say nothing to the client; the heal that
            // ends the blackhole closes the connection.
            _ => std::future::pending().await,
        };
        let delay = control.borrow().delay;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        // A stall that began meanwhile holds the chunk; a blackhole drops it.
        let Ok(now) = control
            .wait_for(|c| c.mode != Mode::Stall)
            .await
            .map(|c| *c)
        else {
            return;
        };
        if now.mode == Mode::Blackhole {
            continue;
        }
        // Without a server (accepted while stalled or blackholed), the bytes are swallowed.
        if let Some(to) = to.as_mut()
            && to.write_all(&buf[..n]).await.is_err()
        {
            return;
        }
    }
}
