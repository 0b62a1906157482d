//! The SMTP client: a small pool of lettre [`AsyncSmtpConnection`]s that never hands out a
//! connection whose last command was cut off.
//!
//! lettre's own pool (0.11) takes a connection back when the send future is dropped (a
//! timeout, a cancelled handler) unless a command had returned an error, so a connection can
//! go back with the server's answer to the end of DATA still unread, and the next mail then
//! reads the previous mail's answer. Here a connection is owned by the send that uses it and
//! goes back to the idle list only after a whole mail transaction ended with the server's
//! positive answer read; any error, timeout or drop closes it.
//!
//! Each send also reports where it stopped: before the final "." of DATA (the server cannot
//! have taken the mail) or after it with no answer (it may have).
//!
//! A connection used within [`NOOP_AFTER_IDLE`] is reused without a NOOP first: the NOOP was
//! a round trip on every mail (to a remote relay, tens of milliseconds), and a connection
//! used a moment ago is as good as its last answer. Should the server have dropped it all the
//! same, the mail fails before its final "." (the server cannot have taken it), and it is
//! tried once more on a new connection.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lettre::Message;
use lettre::transport::smtp::client::{AsyncSmtpConnection, TlsParameters};
use lettre::transport::smtp::commands::{Data, Mail, Rcpt};
use lettre::transport::smtp::extension::{ClientId, Extension, MailBodyParameter, MailParameter};
use lettre::transport::smtp::response::Response;
use tokio::sync::Semaphore;
use worker_core::error_chain;

use crate::auth::{Login, Peer};
use crate::error::SendError;

/// An idle connection older than this is closed rather than reused: servers drop idle
/// clients after a few minutes, and a NOOP on a dead one costs a round trip.
const IDLE_MAX: Duration = Duration::from_secs(60);

/// An idle connection is checked with a NOOP before reuse only once it has sat idle this
/// long. Servers drop idle clients after minutes (Postfix's `smtpd_timeout` is 300 s), and
/// NAT tables forget a flow after tens of seconds at the soonest: within a few seconds a
/// connection is almost surely alive, and one that is not fails its `MAIL` and is replaced
/// (see the module's docs). Past it, the NOOP (bounded by the connect timeout) also catches
/// a connection dropped silently, which a `MAIL` would wait on until the send's timeout.
const NOOP_AFTER_IDLE: Duration = Duration::from_secs(5);

/// How the connection is protected, with what lettre needs for it.
pub(crate) enum Security {
    Plain,
    Starttls(TlsParameters),
    Tls(TlsParameters),
}

/// Where the server is and how to log in.
pub(crate) struct Server {
    pub host: String,
    pub port: u16,
    pub security: Security,
    pub login: Login,
    /// Bounds connecting, the greeting, STARTTLS and AUTH together, and the NOOP that checks
    /// an idle connection.
    pub connect_timeout: Duration,
}

struct Idle {
    connection: AsyncSmtpConnection,
    since: Instant,
    /// When the token it signed in with is renewed: it is not used after that.
    renew_at: Option<tokio::time::Instant>,
}

/// At most `pool_size` connections, each used by one send at a time.
pub(crate) struct SmtpPool {
    server: Server,
    hello: ClientId,
    permits: Semaphore,
    idle: Mutex<Vec<Idle>>,
    /// Whether the server offered DSN at the last connection: then each mail asks for its
    /// reports by `ENVID` ([`crate::dsn`]).
    dsn: AtomicBool,
}

impl SmtpPool {
    pub(crate) fn new(server: Server, pool_size: usize) -> Self {
        Self {
            server,
            hello: ClientId::default(),
            permits: Semaphore::new(pool_size.min(Semaphore::MAX_PERMITS)),
            idle: Mutex::new(Vec::new()),
            dsn: AtomicBool::new(false),
        }
    }

    /// Sends `message` under `timeout` (waiting for a connection, connecting and the whole
    /// transaction). A timeout before the final "." of DATA is [`SendError::TimedOut`]; after
    /// it, [`SendError::AnswerLost`].
    pub(crate) async fn send(
        &self,
        message: &Message,
        timeout: Duration,
    ) -> Result<Response, SendError> {
        let final_dot = AtomicBool::new(false);
        match tokio::time::timeout(timeout, self.transaction(message, &final_dot)).await {
            Ok(result) => result,
            Err(_elapsed) if final_dot.load(Ordering::SeqCst) => {
                Err(SendError::AnswerLost(format!(
                    "no answer to the end of DATA within the send timeout of {}",
                    humantime::format_duration(timeout)
                )))
            }
            Err(_elapsed) => Err(SendError::TimedOut(timeout)),
        }
    }

    async fn transaction(
        &self,
        message: &Message,
        final_dot: &AtomicBool,
    ) -> Result<Response, SendError> {
        // The permit lives until the connection is back in the idle list or closed.
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| SendError::Connection("the SMTP pool is closed".into()))?;
        let (connection, renew_at, reused) = self.checkout().await?;
        match self.mail(connection, renew_at, message, final_dot).await {
            Err(err) if reused && dropped_before_the_dot(&err, final_dot) => {
                // A reused connection the server had dropped (it was not checked with a NOOP):
                // the server cannot have taken the mail, so it is sent once on a new one.
                tracing::debug!(error = %err, "the reused SMTP connection had been dropped; sending on a new one");
                let (connection, renew_at) = self.connect().await?;
                self.mail(connection, renew_at, message, final_dot).await
            }
            sent => sent,
        }
    }

    /// One mail transaction on `connection`, which goes back to the idle list only when the
    /// server's answer to the final "." was read.
    async fn mail(
        &self,
        mut connection: AsyncSmtpConnection,
        renew_at: Option<tokio::time::Instant>,
        message: &Message,
        final_dot: &AtomicBool,
    ) -> Result<Response, SendError> {
        let envelope = message.envelope();
        let body = message.formatted();
        let mut options = Vec::new();
        let ascii_addresses = envelope
            .to()
            .iter()
            .chain(envelope.from())
            .all(|a| <lettre::Address as AsRef<str>>::as_ref(a).is_ascii());
        if !ascii_addresses {
            if !connection
                .server_info()
                .supports_feature(Extension::SmtpUtfEight)
            {
                return Err(SendError::Client(
                    "an address is not ASCII and the server does not support SMTPUTF8".into(),
                ));
            }
            options.push(MailParameter::SmtpUtfEight);
        }
        if !body.is_ascii() {
            if !connection
                .server_info()
                .supports_feature(Extension::EightBitMime)
            {
                return Err(SendError::Client(
                    "the message is not ASCII and the server does not support 8BITMIME".into(),
                ));
            }
            options.push(MailParameter::Body(MailBodyParameter::EightBitMime));
        }
        if self.dsn.load(Ordering::Relaxed) {
            options.extend(crate::dsn::envelope_id(message));
        }

        connection
            .command(Mail::new(envelope.from().cloned(), options))
            .await
            .map_err(SendError::Smtp)?;
        for recipient in envelope.to() {
            connection
                .command(Rcpt::new(recipient.clone(), Vec::new()))
                .await
                .map_err(SendError::Smtp)?;
        }
        connection.command(Data).await.map_err(SendError::Smtp)?;
        // lettre writes the parts, asks for the next one, then writes the final "." and reads
        // the answer: the flag is set once the whole body is out and the "." is next.
        let parts = std::iter::once(body.as_slice()).chain(std::iter::from_fn(|| {
            final_dot.store(true, Ordering::SeqCst);
            None
        }));
        match connection.message_iter(parts).await {
            Ok(response) => {
                self.give_back(connection, renew_at);
                Ok(response)
            }
            // The server's own answer: it took the mail or refused it, either way known.
            Err(err) if err.status().is_some() => Err(SendError::Smtp(err)),
            Err(err) if final_dot.load(Ordering::SeqCst) => Err(SendError::AnswerLost(format!(
                "the connection failed after the end of DATA: {}",
                error_chain(&err)
            ))),
            Err(err) => Err(SendError::Smtp(err)),
        }
    }

    /// An idle connection (checked with a NOOP once idle [`NOOP_AFTER_IDLE`]), or a new one;
    /// and whether it was reused.
    async fn checkout(
        &self,
    ) -> Result<(AsyncSmtpConnection, Option<tokio::time::Instant>, bool), SendError> {
        loop {
            let idle = self.idle.lock().map(|mut idle| idle.pop()).ok().flatten();
            let Some(Idle {
                mut connection,
                since,
                renew_at,
            }) = idle
            else {
                let (connection, renew_at) = self.connect().await?;
                return Ok((connection, renew_at, false));
            };
            // A session outliving its token may be ended by the server (Microsoft does so
            // for IMAP): one signed in with a token is used until the token is renewed.
            let renewed = renew_at.is_some_and(|at| tokio::time::Instant::now() >= at);
            if since.elapsed() > IDLE_MAX || renewed {
                continue;
            }
            if since.elapsed() < NOOP_AFTER_IDLE {
                return Ok((connection, renew_at, true));
            }
            let alive =
                tokio::time::timeout(self.server.connect_timeout, connection.test_connected())
                    .await;
            if matches!(alive, Ok(true)) {
                return Ok((connection, renew_at, true));
            }
        }
    }

    /// Connects, greets, protects and logs in, all within the connect timeout.
    /// A new connection, and when the token it signed in with is renewed (if it used one).
    pub(crate) async fn connect(
        &self,
    ) -> Result<(AsyncSmtpConnection, Option<tokio::time::Instant>), SendError> {
        let server = &self.server;
        let connect = async {
            let mut connection = match &server.security {
                Security::Tls(params) => AsyncSmtpConnection::connect_tokio1(
                    (server.host.as_str(), server.port),
                    Some(server.connect_timeout),
                    &self.hello,
                    Some(params.clone()),
                    None,
                )
                .await
                .map_err(SendError::Smtp)?,
                Security::Plain | Security::Starttls(_) => {
                    let tcp = self.socket().await?;
                    AsyncSmtpConnection::connect_with_transport(Box::new(tcp), &self.hello)
                        .await
                        .map_err(SendError::Smtp)?
                }
            };
            if let Security::Starttls(params) = &server.security {
                connection
                    .starttls(params.clone(), &self.hello)
                    .await
                    .map_err(SendError::Smtp)?;
            }
            let dsn = crate::dsn::offers_dsn(&mut connection, &self.hello)
                .await
                .map_err(SendError::Smtp)?;
            self.dsn.store(dsn, Ordering::Relaxed);
            let peer = Peer {
                host: &server.host,
                port: server.port,
            };
            let renew_at = crate::auth::sign_in(&mut connection, &server.login, peer).await?;
            Ok::<_, SendError>((connection, renew_at))
        };
        match tokio::time::timeout(server.connect_timeout, connect).await {
            Ok(Err(SendError::Smtp(err))) if is_certificate_error(&err) => {
                let refusal = error_chain(&err);
                let advice = worker_core::certificate_advice(&format!("{refusal} {err:?}"))
                    .map(|advice| format!(": {advice}"))
                    .unwrap_or_default();
                Err(SendError::Certificate(format!(
                    "the TLS handshake with {}:{} failed: {refusal}{advice}",
                    server.host, server.port,
                )))
            }
            Ok(result) => result,
            Err(_elapsed) => Err(SendError::Connection(format!(
                "could not connect to {}:{} within {}",
                server.host,
                server.port,
                humantime::format_duration(server.connect_timeout)
            ))),
        }
    }

    /// The TCP connection of a plain or STARTTLS session, with Nagle's algorithm off: lettre
    /// writes a mail's body and its final "." apart, and with Nagle the "." waits for the
    /// body's acknowledgement, which the server delays (40 ms on Linux): a stall per mail.
    /// (Implicit TLS keeps lettre's own socket, which it does not expose.)
    async fn socket(&self) -> Result<tokio::net::TcpStream, SendError> {
        let server = &self.server;
        let tcp = tokio::net::TcpStream::connect((server.host.as_str(), server.port))
            .await
            .map_err(|e| {
                SendError::Connection(format!(
                    "could not connect to {}:{}: {e}",
                    server.host, server.port
                ))
            })?;
        tcp.set_nodelay(true).map_err(|e| {
            SendError::Connection(format!(
                "could not set up the connection to {}:{}: {e}",
                server.host, server.port
            ))
        })?;
        Ok(tcp)
    }

    /// Back to the idle list: only after a whole transaction ended with its answer read.
    fn give_back(&self, connection: AsyncSmtpConnection, renew_at: Option<tokio::time::Instant>) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.push(Idle {
                connection,
                since: Instant::now(),
                renew_at,
            });
        }
    }
}

/// Connects to the server of `[smtp]`, secures the connection and signs in, as
/// `worker-host mail-auth test smtp` does: what the server offered, or why it failed
/// (classified as the sender would).
pub async fn try_sign_in(
    smtp: &crate::SmtpSettings,
    oauth: &worker_mail_auth::TokenSources,
) -> Result<String, worker_core::Failure> {
    let server = smtp
        .server(oauth)
        .map_err(|e| worker_core::Failure::permanent("smtp-config", e))?;
    let how = match &server.login {
        Login::None => "no sign-in".to_string(),
        Login::Password(_) => "AUTH with a password".to_string(),
        Login::Token { method, user, .. } => format!("AUTH {} as {user}", method.mechanism()),
    };
    let pool = SmtpPool::new(server, 1);
    let (mut connection, _) = pool.connect().await.map_err(|e| crate::classify(&e))?;
    let offered = connection.server_info().to_string();
    connection.quit().await.ok();
    Ok(format!("signed in with {how}; the server: {offered}"))
}

/// Whether a send failed as a connection the server had dropped fails: before the final "."
/// (so the server cannot have taken the mail), with no answer of the server's (the connection
/// closed or reset), or with `421`, the answer a server leaves on a connection it closes (as
/// Postfix does on its idle timeout).
fn dropped_before_the_dot(err: &SendError, final_dot: &AtomicBool) -> bool {
    if final_dot.load(Ordering::SeqCst) {
        return false;
    }
    match err {
        SendError::Smtp(err) => err.status().is_none_or(|code| code.to_string() == "421"),
        _ => false,
    }
}

/// Whether a connect failed because the server's certificate did not verify: a rustls
/// certificate error somewhere in the chain (lettre wraps it in an `io::Error`, whose own
/// `source` skips the error it carries, so that one is looked into too).
fn is_certificate_error(err: &lettre::transport::smtp::Error) -> bool {
    use tokio_rustls::rustls;
    let is_certificate = |e: &(dyn std::error::Error + 'static)| {
        e.downcast_ref::<rustls::Error>().is_some_and(|e| {
            matches!(
                e,
                rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented
            )
        })
    };
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = next {
        let carried = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .map(|inner| inner as &(dyn std::error::Error + 'static));
        if is_certificate(e) || carried.is_some_and(is_certificate) {
            return true;
        }
        next = e.source();
    }
    false
}
