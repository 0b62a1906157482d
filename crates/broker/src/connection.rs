//! The connection to RabbitMQ and its supervision.
//!
//! lapin's own recovery has open defects (amqp-rs/lapin #450: no reconnection after a broker
//! restart; #434: acks sent during recovery), so it stays off and the [`Supervisor`] does the
//! job instead: it connects with a timeout, declares the topology, hands the live connection
//! out as a [`Session`], watches it (connection errors, missed heartbeats, `connection.blocked`,
//! and its state, polled, since a server-initiated close raises no event), and when it is lost,
//! withdraws the session, waits a capped, jittered backoff and starts again.
//!
//! A cluster is reached through the list of its nodes' addresses ([`ConnectionSettings::addresses`]):
//! each reconnect tries them in turn ([`Rotation`]), starting after the node that failed or
//! went away, so that losing one node costs a reconnect to the next, not a wait for the lost
//! one to return. Quorum queues keep their messages on the nodes that remain.
//!
//! Consumers and publishers never keep a connection of their own: they take the current
//! session from [`Supervisor::sessions`] and, when it dies, wait for the next one. Unacked
//! deliveries of a lost channel return to their queue on the broker's side, and the dedup guard
//! absorbs the redelivered duplicates.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use lapin::types::LongString;
use lapin::uri::{AMQPAuthority, AMQPQueryString, AMQPScheme, AMQPUri, AMQPUserInfo};
use lapin::{Connection, ConnectionProperties, Event};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::address::{BrokerAddress, Rotation};
use crate::topology::{self, Topology, TopologyError};

/// How to reach RabbitMQ: `[broker.connection]`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConnectionSettings {
    /// The nodes to connect to, tried in turn (see [`Rotation`]): one for a single broker,
    /// any number of a cluster's nodes.
    pub addresses: Vec<BrokerAddress>,
    pub vhost: String,
    pub username: String,
    /// Never printed: `Debug` redacts it and it is not serialized back.
    #[serde(skip_serializing)]
    pub password: String,
    /// `amqps` instead of `amqp`. The server's certificate is always verified, against the
    /// system's CA certificates and those in `ca_file`, and must name the host of the address
    /// it is reached at.
    pub tls: bool,
    /// CA certificates (PEM) trusted for `amqps` besides the system's: a private CA.
    pub ca_file: Option<PathBuf>,
    /// Heartbeat interval; a silent broker is noticed within two of them. Zero disables them.
    #[serde(with = "humantime_serde")]
    pub heartbeat: Duration,
    /// The largest frame asked of the broker, in bytes (at least 4096): lapin keeps 32 frames
    /// of receive and of send buffer per connection, zeroed, so this sets the connection's
    /// memory (16 KiB: 1 MiB; the broker's default of 128 KiB: 8 MiB). A larger message goes
    /// in several frames.
    pub frame_max: u32,
    /// Bound on TCP connect, AMQP handshake and topology declaration.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// The name the management UI shows for the connection.
    pub connection_name: String,
    /// First wait between reconnection attempts; doubles each time.
    #[serde(with = "humantime_serde")]
    pub reconnect_min: Duration,
    /// Cap on the wait between reconnection attempts.
    #[serde(with = "humantime_serde")]
    pub reconnect_max: Duration,
    /// On shutdown, how long the connection stays up for consumers to settle their last
    /// deliveries (should exceed the consumers' shutdown grace).
    #[serde(with = "humantime_serde")]
    pub close_wait: Duration,
}

/// The frame size the host asks for unless told otherwise: 1 MiB of lapin buffers per
/// connection instead of the 8 MiB the broker's 128 KiB default costs.
pub const DEFAULT_FRAME_MAX: u32 = 16 * 1024;

/// The smallest frame AMQP 0-9-1 allows.
pub const FRAME_MAX_MIN: u32 = 4096;

impl Default for ConnectionSettings {
    fn default() -> Self {
        Self {
            addresses: vec![BrokerAddress::new("127.0.0.1", 5672)],
            vhost: "/".into(),
            username: "guest".into(),
            password: "guest".into(),
            tls: false,
            ca_file: None,
            heartbeat: Duration::from_secs(10),
            frame_max: DEFAULT_FRAME_MAX,
            connect_timeout: Duration::from_secs(10),
            connection_name: "worker-host".into(),
            reconnect_min: Duration::from_millis(500),
            reconnect_max: Duration::from_secs(30),
            close_wait: Duration::from_secs(60),
        }
    }
}

impl fmt::Debug for ConnectionSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionSettings")
            .field("addresses", &self.addresses)
            .field("vhost", &self.vhost)
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .field("tls", &self.tls)
            .field("ca_file", &self.ca_file)
            .field("heartbeat", &self.heartbeat)
            .field("frame_max", &self.frame_max)
            .field("connect_timeout", &self.connect_timeout)
            .field("connection_name", &self.connection_name)
            .field("reconnect_min", &self.reconnect_min)
            .field("reconnect_max", &self.reconnect_max)
            .field("close_wait", &self.close_wait)
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("invalid AMQP URI: {0}")]
    InvalidUri(String),
    #[error("the broker's CA file {}: {source}", path.display())]
    CaFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("connecting to {server} timed out after {}", humantime::format_duration(*after))]
    Timeout { server: String, after: Duration },
    #[error("connecting to {server}: {source}")]
    Broker {
        server: String,
        #[source]
        source: lapin::Error,
    },
    #[error(transparent)]
    Topology(#[from] TopologyError),
    /// The settings list no address at all.
    #[error("no broker address to connect to")]
    NoAddress,
    /// Every address of a list of more than one failed, each for its own reason.
    #[error("no RabbitMQ node answered: {}", failures.iter().map(|e| worker_core::error_chain(e)).collect::<Vec<_>>().join("; "))]
    NoNodeAnswered { failures: Vec<ConnectError> },
}

impl ConnectError {
    /// The failure of a pass over the addresses: the one failure as it is when there was
    /// one address, else all of them.
    fn of_pass(mut failures: Vec<ConnectError>) -> Self {
        match failures.len() {
            0 => Self::NoAddress,
            1 => failures.remove(0),
            _ => Self::NoNodeAnswered { failures },
        }
    }
}

impl ConnectionSettings {
    /// Settings from an `amqp://user:password@host:port/vhost` URI (the vhost percent-encoded),
    /// with the other fields at their defaults.
    pub fn from_uri(uri: &str) -> Result<Self, ConnectError> {
        let parsed: AMQPUri = uri.parse().map_err(ConnectError::InvalidUri)?;
        Ok(Self {
            addresses: vec![BrokerAddress::new(
                parsed.authority.host,
                parsed.authority.port,
            )],
            vhost: parsed.vhost,
            username: parsed.authority.userinfo.username,
            password: parsed.authority.userinfo.password,
            tls: parsed.scheme == AMQPScheme::AMQPS,
            ..Self::default()
        })
    }

    /// `host:port/vhost` (the addresses separated by commas), for logs and errors: no
    /// credentials.
    pub fn server(&self) -> String {
        let addresses: Vec<String> = self.addresses.iter().map(ToString::to_string).collect();
        format!("{}/{}", addresses.join(","), self.vhost)
    }

    /// `host:port/vhost` of one address, for logs and errors: no credentials.
    pub fn server_at(&self, address: &BrokerAddress) -> String {
        format!("{address}/{}", self.vhost)
    }

    fn uri(&self, address: &BrokerAddress) -> AMQPUri {
        AMQPUri {
            scheme: if self.tls {
                AMQPScheme::AMQPS
            } else {
                AMQPScheme::AMQP
            },
            authority: AMQPAuthority {
                userinfo: AMQPUserInfo {
                    username: self.username.clone(),
                    password: self.password.clone(),
                },
                host: address.host.clone(),
                port: address.port,
            },
            vhost: self.vhost.clone(),
            query: AMQPQueryString {
                frame_max: Some(self.frame_max.max(FRAME_MAX_MIN)),
                heartbeat: Some(u16::try_from(self.heartbeat.as_secs()).unwrap_or(u16::MAX)),
                connection_timeout: Some(
                    u64::try_from(self.connect_timeout.as_millis()).unwrap_or(u64::MAX),
                ),
                ..AMQPQueryString::default()
            },
        }
    }

    /// The PEM text of `ca_file`, read at each connect so that a renewed CA is picked up.
    fn ca_chain(&self) -> Result<Option<String>, ConnectError> {
        let Some(path) = &self.ca_file else {
            return Ok(None);
        };
        std::fs::read_to_string(path)
            .map(Some)
            .map_err(|source| ConnectError::CaFile {
                path: path.clone(),
                source,
            })
    }

    /// Opens one connection, without supervision (tools, tests, benchmarks): to the first of
    /// the addresses that answers, trying each once in order.
    pub async fn connect(&self) -> Result<Connection, ConnectError> {
        let mut failures = Vec::new();
        for address in &self.addresses {
            match self.connect_to(address).await {
                Ok(connection) => return Ok(connection),
                Err(err) => failures.push(err),
            }
        }
        Err(ConnectError::of_pass(failures))
    }

    /// Opens one connection to `address` (one of [`Self::addresses`], or any other node of the
    /// same broker), without supervision.
    pub async fn connect_to(&self, address: &BrokerAddress) -> Result<Connection, ConnectError> {
        let server = self.server_at(address);
        let properties = ConnectionProperties::default()
            .with_connection_name(LongString::from(self.connection_name.as_str()));
        let tls = lapin::tcp::OwnedTLSConfig {
            identity: None,
            cert_chain: self.ca_chain()?,
        };
        let runtime = lapin::runtime::default_runtime().map_err(|source| ConnectError::Broker {
            server: server.clone(),
            source,
        })?;
        match tokio::time::timeout(
            self.connect_timeout,
            Connection::connect_uri_with_config(self.uri(address), properties, tls, runtime),
        )
        .await
        {
            Err(_) => Err(ConnectError::Timeout {
                server,
                after: self.connect_timeout,
            }),
            Ok(Err(source)) => Err(ConnectError::Broker { server, source }),
            Ok(Ok(connection)) => Ok(connection),
        }
    }
}

/// A live connection handed out by the [`Supervisor`], numbered so that users can tell a new
/// connection from the one they lost.
#[derive(Clone)]
pub struct Session {
    connection: Arc<Connection>,
    generation: u64,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("generation", &self.generation)
            .field("connected", &self.is_open())
            .finish()
    }
}

impl Session {
    /// A session over a connection opened elsewhere (tests, tools).
    pub fn new(connection: Connection) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1_000_000);
        Self {
            connection: Arc::new(connection),
            generation: NEXT.fetch_add(1, Ordering::Relaxed),
        }
    }

    pub fn connection(&self) -> &Connection {
        &self.connection
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn is_open(&self) -> bool {
        self.connection.status().connected()
    }

    /// Declares `topology` on a channel of its own (see [`topology::declare`]), closed again
    /// once the declare succeeded: a failed declare has closed it already.
    pub async fn declare(&self, topology: &Topology) -> Result<(), TopologyError> {
        let channel =
            self.connection
                .create_channel()
                .await
                .map_err(|source| TopologyError::Broker {
                    what: "the topology (no channel opened)".into(),
                    source,
                })?;
        topology::declare(&channel, topology).await?;
        // Closed before the connection, so that lapin does not report a channel torn down
        // under it as a connection error.
        let _ = channel.close(200, "topology declared".into()).await;
        Ok(())
    }

    /// Closes the connection (a session opened for one command, say).
    pub async fn close(&self, reason: &str) -> Result<(), lapin::Error> {
        self.connection.close(200, reason.into()).await
    }

    /// The broker's count of ready messages in each of `queues`, through passive declares on
    /// a short-lived channel. A queue that does not exist fails its passive declare, which
    /// closes the channel: the counts stop there, with what was read. `None` when no channel
    /// opens.
    pub async fn queue_depths<'a>(
        &self,
        queues: impl IntoIterator<Item = &'a str>,
    ) -> Option<std::collections::BTreeMap<String, u64>> {
        use lapin::options::QueueDeclareOptions;
        use lapin::types::{FieldTable, ShortString};
        let channel = self.connection.create_channel().await.ok()?;
        let mut depths = std::collections::BTreeMap::new();
        let options = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        for name in queues {
            let Ok(queue) = ShortString::try_new(name) else {
                continue;
            };
            match channel
                .queue_declare(queue, options, FieldTable::default())
                .await
            {
                Ok(declared) => {
                    depths.insert(name.to_owned(), u64::from(declared.message_count()));
                }
                Err(_) => return Some(depths),
            }
        }
        let _ = channel.close(200, "sampled".into()).await;
        Some(depths)
    }

    /// A source of sessions that only ever holds this one (a publisher or consumer bound to
    /// one connection).
    pub fn fixed(self) -> watch::Receiver<Option<Session>> {
        let (tx, rx) = watch::channel(Some(self));
        // The receiver keeps the last value after the sender is gone, which is all we need.
        drop(tx);
        rx
    }
}

/// What the connection is doing, for `/readyz` and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkState {
    /// Not connected yet, since start.
    Connecting,
    Connected,
    /// Connected, but the broker refuses publishes (memory or disk alarm). Consuming goes on.
    Blocked,
    /// Lost; reconnecting with backoff.
    Disconnected,
    /// The supervisor has stopped.
    Stopped,
}

impl LinkState {
    pub const fn as_str(&self) -> &'static str {
        match self {
            Self::Connecting => "connecting",
            Self::Connected => "connected",
            Self::Blocked => "blocked",
            Self::Disconnected => "disconnected",
            Self::Stopped => "stopped",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerStatus {
    pub state: LinkState,
    /// Connections made after the first one.
    pub reconnects: u64,
    /// Why the last connection attempt or connection failed.
    pub last_error: Option<String>,
    /// The address (`host:port`) of the node the current connection is to, or the last one
    /// was to; `None` before the first.
    pub address: Option<String>,
}

impl BrokerStatus {
    /// Whether the host should report ready: connected and not blocked.
    pub fn is_ready(&self) -> bool {
        self.state == LinkState::Connected
    }
}

/// Owns the connection to RabbitMQ and keeps one up; see the module docs.
///
/// ```no_run
/// # async fn f(settings: worker_broker::ConnectionSettings, topology: worker_broker::Topology) {
/// let token = tokio_util::sync::CancellationToken::new();
/// let supervisor = worker_broker::Supervisor::new(settings, topology);
/// let task = tokio::spawn(supervisor.clone().run(token.clone()));
/// let ready = supervisor.status().borrow().is_ready();
/// # }
/// ```
#[derive(Clone)]
pub struct Supervisor {
    inner: Arc<SupervisorInner>,
}

struct SupervisorInner {
    settings: ConnectionSettings,
    topology: Topology,
    sessions: watch::Sender<Option<Session>>,
    status: watch::Sender<BrokerStatus>,
    /// Users that need the connection to outlive shutdown a little: consumers settling their
    /// last deliveries.
    holds: watch::Sender<usize>,
}

/// Keeps the supervisor from closing the connection on shutdown until dropped (or until its
/// close wait is over), so that a consumer can still ack what its handlers finish in the
/// grace period.
#[derive(Debug)]
pub struct Hold {
    holds: watch::Sender<usize>,
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.holds.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Supervisor")
            .field("server", &self.inner.settings.server())
            .field("status", &*self.inner.status.borrow())
            .finish()
    }
}

/// How often the supervisor looks at the connection's state, in addition to its events: a
/// close initiated by the server (`rabbitmqctl close_all_connections`) raises none.
const POLL: Duration = Duration::from_millis(250);

impl Supervisor {
    pub fn new(settings: ConnectionSettings, topology: Topology) -> Self {
        let (sessions, _) = watch::channel(None);
        let (status, _) = watch::channel(BrokerStatus {
            state: LinkState::Connecting,
            reconnects: 0,
            last_error: None,
            address: None,
        });
        Self {
            inner: Arc::new(SupervisorInner {
                settings,
                topology,
                sessions,
                status,
                holds: watch::channel(0).0,
            }),
        }
    }

    /// A confirmed publisher over this supervisor's connections: it waits (up to its
    /// `connect_wait`) for a connection while there is none.
    pub fn publisher(
        &self,
        settings: crate::publisher::PublisherSettings,
    ) -> crate::publisher::Publisher {
        crate::publisher::Publisher::new(self.sessions(), settings)
    }

    /// See [`Hold`].
    pub fn hold(&self) -> Hold {
        self.inner.holds.send_modify(|n| *n += 1);
        Hold {
            holds: self.inner.holds.clone(),
        }
    }

    /// The connection's state, updated as it changes.
    pub fn status(&self) -> watch::Receiver<BrokerStatus> {
        self.inner.status.subscribe()
    }

    /// The current session (`None` while disconnected), updated as it changes.
    pub fn sessions(&self) -> watch::Receiver<Option<Session>> {
        self.inner.sessions.subscribe()
    }

    pub fn topology(&self) -> &Topology {
        &self.inner.topology
    }

    pub fn settings(&self) -> &ConnectionSettings {
        &self.inner.settings
    }

    /// Keeps a connection up until `shutdown` fires, then closes it. Spawn it on the host's
    /// task tracker; it returns only on shutdown.
    pub async fn run(self, shutdown: CancellationToken) {
        let settings = &self.inner.settings;
        let mut backoff = worker_core::Backoff::doubling(
            settings.reconnect_min.max(Duration::from_millis(10)),
            settings.reconnect_max,
        );
        let mut rotation = Rotation::new(settings.addresses.len());
        let mut generation = 0u64;
        while !shutdown.is_cancelled() {
            let attempt = tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                attempt = self.open_next(&mut rotation) => attempt,
            };
            match attempt {
                Ok((connection, index, address)) => {
                    generation += 1;
                    backoff.reset();
                    let server = settings.server_at(&address);
                    let session = Session {
                        connection: Arc::new(connection),
                        generation,
                    };
                    tracing::info!(%server, generation, "connected to RabbitMQ");
                    let mut events = session.connection.events_listener();
                    self.inner.sessions.send_replace(Some(session.clone()));
                    self.set_connected(generation, &address);
                    let lost = tokio::select! {
                        biased;
                        () = shutdown.cancelled() => None,
                        why = self.watch(&session, &mut events, generation) => Some(why),
                    };
                    self.inner.sessions.send_replace(None);
                    match lost {
                        None => {
                            // Consumers still settle what their handlers finish in the grace
                            // period: keep the connection up until they let go.
                            let mut holds = self.inner.holds.subscribe();
                            let _ = tokio::time::timeout(
                                settings.close_wait,
                                holds.wait_for(|n| *n == 0),
                            )
                            .await;
                            let _ = tokio::time::timeout(
                                Duration::from_secs(5),
                                session
                                    .connection
                                    .close(200, "worker host shutting down".into()),
                            )
                            .await;
                            break;
                        }
                        Some(why) => {
                            // The node may be gone for a while (stopped, partitioned): the
                            // reconnect goes to the next one first.
                            rotation.leave(index);
                            tracing::warn!(%server, error = %why, "lost the RabbitMQ connection; reconnecting");
                            self.set_status(LinkState::Disconnected, generation, Some(why));
                        }
                    }
                }
                Err(err) => {
                    let why = worker_core::error_chain(&err);
                    tracing::warn!(server = %settings.server(), error = %why, retry_in = %humantime::format_duration(backoff.current()), "cannot connect to RabbitMQ");
                    self.set_status(LinkState::Disconnected, generation, Some(why));
                }
            }
            let wait = jittered(backoff.next_wait());
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(wait) => {}
            }
        }
        self.inner.sessions.send_replace(None);
        self.inner
            .status
            .send_modify(|s| s.state = LinkState::Stopped);
    }

    /// One pass over the addresses, from the rotation's cursor: connects (and declares) at
    /// the first that answers; each that does not is left behind, so the next pass starts
    /// after it.
    async fn open_next(
        &self,
        rotation: &mut Rotation,
    ) -> Result<(Connection, usize, BrokerAddress), ConnectError> {
        let settings = &self.inner.settings;
        let pass = rotation.pass();
        let mut failures = Vec::new();
        for index in pass.iter().copied() {
            let Some(address) = settings.addresses.get(index) else {
                continue;
            };
            match self.open(address).await {
                Ok(connection) => return Ok((connection, index, address.clone())),
                Err(err) => {
                    if pass.len() > 1 {
                        tracing::warn!(server = %settings.server_at(address), error = %worker_core::error_chain(&err), "cannot connect to this RabbitMQ node; trying the next");
                    }
                    rotation.leave(index);
                    failures.push(err);
                }
            }
        }
        Err(ConnectError::of_pass(failures))
    }

    /// Connects to `address` and declares the topology, all within the connect timeout.
    async fn open(&self, address: &BrokerAddress) -> Result<Connection, ConnectError> {
        let settings = &self.inner.settings;
        let connection = settings.connect_to(address).await?;
        let server = || settings.server_at(address);
        let declared = tokio::time::timeout(settings.connect_timeout, async {
            let channel =
                connection
                    .create_channel()
                    .await
                    .map_err(|source| ConnectError::Broker {
                        server: server(),
                        source,
                    })?;
            topology::declare(&channel, &self.inner.topology).await?;
            let _ = channel.close(200, "topology declared".into()).await;
            Ok::<_, ConnectError>(())
        })
        .await;
        let result = match declared {
            Err(_) => Err(ConnectError::Timeout {
                server: server(),
                after: settings.connect_timeout,
            }),
            Ok(result) => result,
        };
        if let Err(err) = result {
            let _ = connection
                .close(200, "topology declaration failed".into())
                .await;
            return Err(err);
        }
        Ok(connection)
    }

    /// Returns when the session's connection is lost, with why; tracks blocked/unblocked.
    async fn watch(
        &self,
        session: &Session,
        events: &mut (impl futures::Stream<Item = Event> + Unpin),
        generation: u64,
    ) -> String {
        let mut poll = tokio::time::interval(POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                event = events.next() => match event {
                    Some(Event::Error(err)) => return worker_core::error_chain(&err),
                    Some(Event::ConnectionBlocked(reason)) => {
                        tracing::warn!(%reason, "RabbitMQ blocked the connection: publishes wait until it is unblocked");
                        self.set_status(LinkState::Blocked, generation, Some(format!("blocked: {reason}")));
                    }
                    Some(Event::ConnectionUnblocked) => {
                        tracing::info!("RabbitMQ unblocked the connection");
                        self.set_status(LinkState::Connected, generation, None);
                    }
                    Some(_) => {}
                    None => return "the connection's event stream ended".into(),
                },
                _ = poll.tick() => {
                    if !session.is_open() {
                        return "the connection was closed".into();
                    }
                }
            }
        }
    }

    fn set_connected(&self, generation: u64, address: &BrokerAddress) {
        self.inner.status.send_modify(|s| {
            s.state = LinkState::Connected;
            s.reconnects = generation.saturating_sub(1);
            s.last_error = None;
            s.address = Some(address.to_string());
        });
    }

    fn set_status(&self, state: LinkState, generation: u64, last_error: Option<String>) {
        self.inner.status.send_modify(|s| {
            s.state = state;
            s.reconnects = generation.saturating_sub(1);
            if last_error.is_some() || state == LinkState::Connected {
                s.last_error = last_error;
            }
        });
    }
}

/// `d` spread over `[d/2, d]`, so that replicas cut off together do not reconnect in lock step.
fn jittered(d: Duration) -> Duration {
    let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|t| t.subsec_nanos())
        .unwrap_or(0);
    let half = nanos / 2;
    Duration::from_nanos(half + u64::from(seed) % half.max(1))
}

/// Waits for an open session other than generation `not` (the one just lost); `None` once the
/// supervisor is gone. What a consume loop calls to resume on the next connection.
pub async fn next_session(
    sessions: &mut watch::Receiver<Option<Session>>,
    not: Option<u64>,
) -> Option<Session> {
    loop {
        if let Some(s) = sessions.borrow_and_update().clone()
            && s.is_open()
            && Some(s.generation()) != not
        {
            return Some(s);
        }
        if sessions.changed().await.is_err() {
            return None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_redacts_the_password() {
        let settings = ConnectionSettings {
            password: "hunter2".into(),
            ..ConnectionSettings::default()
        };
        let shown = format!("{settings:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("<redacted>"));
        let toml = toml::to_string(&settings).unwrap();
        assert!(!toml.contains("hunter2"), "{toml}");
    }

    #[test]
    fn settings_from_a_uri() {
        let s = ConnectionSettings::from_uri("amqp://u:p@10.0.0.1:5673/wh_test").unwrap();
        assert_eq!(s.addresses, [BrokerAddress::new("10.0.0.1", 5673)]);
        assert_eq!(
            (s.vhost.as_str(), s.username.as_str(), s.password.as_str()),
            ("wh_test", "u", "p")
        );
        assert_eq!(s.server(), "10.0.0.1:5673/wh_test");
        let uri = s.uri(&s.addresses[0]);
        assert_eq!(uri.query.heartbeat, Some(10));
        assert_eq!(uri.query.frame_max, Some(DEFAULT_FRAME_MAX));
    }

    #[test]
    fn several_addresses_show_as_one_server_and_each_as_its_own() {
        let s = ConnectionSettings {
            addresses: vec![
                BrokerAddress::new("mq-1", 5672),
                BrokerAddress::new("mq-2", 5673),
            ],
            vhost: "wh".into(),
            ..ConnectionSettings::default()
        };
        assert_eq!(s.server(), "mq-1:5672,mq-2:5673/wh");
        assert_eq!(s.server_at(&s.addresses[1]), "mq-2:5673/wh");
        let uri = s.uri(&s.addresses[1]);
        assert_eq!(
            (uri.authority.host.as_str(), uri.authority.port),
            ("mq-2", 5673)
        );
    }

    #[test]
    fn a_failed_pass_reports_each_node_or_the_one() {
        let timeout = |server: &str| ConnectError::Timeout {
            server: server.into(),
            after: Duration::from_secs(1),
        };
        assert!(matches!(
            ConnectError::of_pass(vec![]),
            ConnectError::NoAddress
        ));
        let one = ConnectError::of_pass(vec![timeout("a:1/v")]).to_string();
        assert_eq!(one, "connecting to a:1/v timed out after 1s");
        let two = ConnectError::of_pass(vec![timeout("a:1/v"), timeout("b:2/v")]).to_string();
        assert!(two.starts_with("no RabbitMQ node answered: "), "{two}");
        assert!(two.contains("a:1/v") && two.contains("b:2/v"), "{two}");
    }

    #[tokio::test]
    async fn a_connect_that_no_address_answers_names_every_address() {
        // A port nothing listens on refuses at once: connect tries the second address after
        // the first, and both failures come back, each naming its address.
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let s = ConnectionSettings {
            addresses: vec![
                BrokerAddress::new("127.0.0.1", closed),
                BrokerAddress::new("localhost", closed),
            ],
            connect_timeout: Duration::from_secs(2),
            ..ConnectionSettings::default()
        };
        let err = worker_core::error_chain(&s.connect().await.unwrap_err());
        assert!(err.contains(&format!("127.0.0.1:{closed}")), "{err}");
        assert!(err.contains(&format!("localhost:{closed}")), "{err}");
    }

    #[test]
    fn jitter_stays_within_half_and_whole() {
        for ms in [1u64, 10, 500, 30_000] {
            let d = Duration::from_millis(ms);
            let j = jittered(d);
            assert!(j >= d / 2 && j <= d, "{j:?} for {d:?}");
        }
    }
}
