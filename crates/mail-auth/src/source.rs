//! [`TokenSource`]: one `[oauth.NAME]` at run time. It keeps one token, renews it a margin
//! before it expires with one request in flight at a time, and after a failure answers the
//! same failure without asking again for a while, so that many connections failing at once
//! make one request, not a storm.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use worker_core::Secret;

use crate::grant::{Endpoint, Grant};
use crate::jwt::ServiceKey;
use crate::{Flow, OAuthSettings, TokenError};

/// After a refusal of the settings, the source asks again only after this (an operator may
/// have granted consent meanwhile, which changes no setting).
pub const PERMANENT_PAUSE: Duration = Duration::from_secs(5 * 60);
/// After a transient failure without Retry-After, the source asks again only after this.
pub const TRANSIENT_PAUSE: Duration = Duration::from_secs(5);
/// The longest Retry-After honoured.
const RETRY_AFTER_MAX: Duration = Duration::from_secs(5 * 60);
/// Assumed when the endpoint gives no `expires_in` (both providers issue hour-long tokens).
const DEFAULT_LIFETIME: Duration = Duration::from_secs(3600);

/// An access token and when it expires; its text is never printed.
#[derive(Clone)]
pub struct AccessToken {
    secret: Secret,
    expires_at: Instant,
    renew_at: Instant,
    /// Which issue of the source it is: a login refused with it drops only this one.
    serial: u64,
}

impl std::fmt::Debug for AccessToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessToken")
            .field("expires_at", &self.expires_at)
            .field("serial", &self.serial)
            .finish_non_exhaustive()
    }
}

impl AccessToken {
    /// The token, for the one place that puts it on the wire.
    pub fn expose(&self) -> &str {
        self.secret.expose()
    }

    pub fn expires_at(&self) -> Instant {
        self.expires_at
    }

    /// When the source replaces it: a session that must not outlive it signs in again then,
    /// and gets the new one without a request of its own.
    pub fn renew_at(&self) -> Instant {
        self.renew_at
    }

    /// How many characters it has (what a log may say of it).
    pub fn len(&self) -> usize {
        self.secret.expose().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

struct Cached {
    token: AccessToken,
    renew_at: Instant,
}

#[derive(Default)]
struct State {
    token: Option<Cached>,
    failed: Option<(TokenError, Instant)>,
}

/// One `[oauth.NAME]`; see the module's doc.
pub struct TokenSource {
    name: String,
    token_url: String,
    scope: String,
    grant: Grant,
    smtp_limit: Option<u32>,
    sending_limits: crate::SendingLimits,
    http: reqwest::Client,
    margin: Duration,
    state: Mutex<State>,
    /// Held while a request is in flight: one at a time.
    refresh: tokio::sync::Mutex<()>,
    requests: AtomicU64,
    serial: AtomicU64,
}

impl std::fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSource")
            .field("name", &self.name)
            .field("token_url", &self.token_url)
            .finish_non_exhaustive()
    }
}

impl TokenSource {
    /// Builds a source from checked settings (the host has resolved `*_file` secrets); reads
    /// a service account's key now, so that a bad file stops the start.
    pub fn new(name: &str, settings: &OAuthSettings) -> Result<Self, TokenError> {
        let setup = |detail: String| TokenError::Setup {
            source_name: name.to_string(),
            detail,
        };
        let token_url = settings
            .resolved_token_url()
            .ok_or_else(|| setup("no token_url and no provider".into()))?;
        crate::settings::check_token_url(&token_url).map_err(setup)?;
        let scope = settings
            .resolved_scope()
            .ok_or_else(|| setup("no scope and no provider".into()))?;
        let client_id = || {
            settings
                .client_id
                .clone()
                .ok_or_else(|| setup("client_id is missing".into()))
        };
        let grant = match settings.flow {
            None => return Err(setup("flow is missing".into())),
            Some(Flow::ClientCredentials) => Grant::ClientCredentials {
                client_id: client_id()?,
                secret: settings
                    .client_secret
                    .clone()
                    .ok_or_else(|| setup("client_secret is missing".into()))?,
            },
            Some(Flow::RefreshToken) => Grant::RefreshToken {
                client_id: client_id()?,
                secret: settings.client_secret.clone(),
                refresh_token: settings
                    .refresh_token
                    .clone()
                    .ok_or_else(|| setup("the refresh token is missing".into()))?,
            },
            Some(Flow::ServiceAccount) => {
                let path = settings
                    .key_file
                    .as_deref()
                    .ok_or_else(|| setup("key_file is missing".into()))?;
                Grant::ServiceAccount {
                    key: Box::new(ServiceKey::read(path).map_err(setup)?),
                    subject: settings
                        .subject
                        .clone()
                        .ok_or_else(|| setup("subject is missing".into()))?,
                }
            }
        };
        let http = reqwest::Client::builder()
            .timeout(settings.timeout)
            .connect_timeout(settings.timeout)
            .user_agent(concat!("worker-host/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| setup(format!("the HTTP client: {}", worker_core::error_chain(&e))))?;
        Ok(Self {
            name: name.to_string(),
            token_url,
            scope,
            grant,
            smtp_limit: settings.smtp_connection_limit(),
            sending_limits: settings.smtp_sending_limits(),
            http,
            margin: settings.refresh_margin,
            state: Mutex::new(State::default()),
            refresh: tokio::sync::Mutex::new(()),
            requests: AtomicU64::new(0),
            serial: AtomicU64::new(0),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn token_url(&self) -> &str {
        &self.token_url
    }

    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// The most SMTP connections the provider allows one mailbox (Microsoft: 3).
    pub fn smtp_connection_limit(&self) -> Option<u32> {
        self.smtp_limit
    }

    /// How much one mailbox may send, as the provider limits it (see [`crate::SendingLimits`]).
    pub fn smtp_sending_limits(&self) -> crate::SendingLimits {
        self.sending_limits
    }

    /// Token requests made so far (for metrics and tests).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// A token good for at least the margin: the cached one, or a new one. Callers waiting
    /// while a request is in flight get its answer, without a request of their own.
    ///
    /// Boxed, so that the HTTP client's futures stay out of the callers' types (a job's tick
    /// must be `Send`).
    pub fn token(
        &self,
    ) -> Pin<Box<dyn Future<Output = Result<AccessToken, TokenError>> + Send + '_>> {
        Box::pin(self.fetch())
    }

    async fn fetch(&self) -> Result<AccessToken, TokenError> {
        if let Some(ready) = self.ready() {
            return ready;
        }
        let _one_at_a_time = self.refresh.lock().await;
        if let Some(ready) = self.ready() {
            return ready;
        }
        self.requests.fetch_add(1, Ordering::Relaxed);
        let endpoint = Endpoint {
            source: &self.name,
            token_url: &self.token_url,
            scope: &self.scope,
            http: &self.http,
        };
        let answer = endpoint.request(&self.grant).await;
        let now = Instant::now();
        let mut state = self.lock();
        match answer {
            Ok(issued) => {
                let lifetime = issued.lifetime.unwrap_or(DEFAULT_LIFETIME);
                let renew_at = now + lifetime.saturating_sub(self.margin.min(lifetime / 3));
                let token = AccessToken {
                    secret: issued.token,
                    expires_at: now + lifetime,
                    renew_at,
                    serial: self.serial.fetch_add(1, Ordering::Relaxed) + 1,
                };
                state.token = Some(Cached {
                    token: token.clone(),
                    renew_at,
                });
                state.failed = None;
                tracing::debug!(source = %self.name, lifetime = ?lifetime, chars = token.len(), "oauth: new token");
                Ok(token)
            }
            Err(err) => {
                let pause = if err.is_permanent() {
                    PERMANENT_PAUSE
                } else {
                    err.retry_after()
                        .map_or(TRANSIENT_PAUSE, |d| d.min(RETRY_AFTER_MAX))
                };
                tracing::warn!(source = %self.name, error = %err, ask_again_in = ?pause, "oauth: no token");
                state.failed = Some((err.clone(), now + pause));
                Err(err)
            }
        }
    }

    /// Drops `token` if it is still the cached one: a server refused a login with it
    /// (revoked, or its permissions changed), and the next [`Self::token`] asks anew.
    pub fn invalidate(&self, token: &AccessToken) {
        let mut state = self.lock();
        if state
            .token
            .as_ref()
            .is_some_and(|c| c.token.serial == token.serial)
        {
            state.token = None;
        }
    }

    /// Whether the last token request failed (and no token is cached since).
    pub fn failing(&self) -> bool {
        self.lock().failed.is_some()
    }

    fn ready(&self) -> Option<Result<AccessToken, TokenError>> {
        let now = Instant::now();
        let state = self.lock();
        if let Some(cached) = &state.token
            && now < cached.renew_at
        {
            return Some(Ok(cached.token.clone()));
        }
        match &state.failed {
            Some((err, until)) if now < *until => Some(Err(err.clone())),
            _ => None,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding it leaves plain data behind: go on with it.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Every `[oauth.NAME]` by name, shared by the mail connections that name it.
#[derive(Debug, Clone, Default)]
pub struct TokenSources(Arc<BTreeMap<String, Arc<TokenSource>>>);

impl TokenSources {
    /// Builds each source; the first that cannot be set up is the error.
    pub fn build(settings: &BTreeMap<String, OAuthSettings>) -> Result<Self, TokenError> {
        let mut sources = BTreeMap::new();
        for (name, section) in settings {
            sources.insert(name.clone(), Arc::new(TokenSource::new(name, section)?));
        }
        Ok(Self(Arc::new(sources)))
    }

    pub fn get(&self, name: &str) -> Option<Arc<TokenSource>> {
        self.0.get(name).cloned()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &Arc<TokenSource>)> {
        self.0.iter()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}
