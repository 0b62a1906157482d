//! [`Supervisor`]: connects, declares, watches the connection and reconnects; see the
//! module docs of [`connection`](super).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use lapin::{Connection, Event};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::error::ConnectError;
use super::session::Session;
use super::settings::ConnectionSettings;
use super::status::{BrokerStatus, LinkState};
use crate::address::{BrokerAddress, Rotation};
use crate::topology::{self, Topology};

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
        // Jittered, so that replicas cut off together do not reconnect in lock step.
        let mut backoff = worker_core::Backoff::doubling(
            settings.reconnect_min.max(Duration::from_millis(10)),
            settings.reconnect_max,
        )
        .jittered();
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
                    let session = Session::numbered(connection, generation);
                    tracing::info!(%server, generation, "connected to RabbitMQ");
                    let mut events = session.connection().events_listener();
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
                                    .connection()
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
            let wait = backoff.next_wait();
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
