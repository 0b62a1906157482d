//! [`Access`], the console's access rules and throttle: who made a request (a `Bearer` token,
//! the auth proxy's header, a session) and whether it may read `/metrics` and `/status`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderMap;
use sqlx::PgPool;
use worker_store::operators;
use worker_store::sessions;

use super::decoy::Decoy;
use super::request::{SESSION_COOKIE, bearer, cookie_value, digest, same_secret};
use super::rules::{Caller, Credential, Refusal, Signed};
use crate::credentials;
use crate::forwarded::{Client, TrustedProxies};
use crate::settings::{AdminSettings, AuthProxy};
use crate::throttle::Throttle;
use worker_core::secret::Secret;

/// The console's access rules, its throttle and how it signs in.
#[derive(Debug)]
pub struct Access {
    open_reading: bool,
    idle: Duration,
    pub(super) lifetime: Duration,
    proxies: TrustedProxies,
    pub(super) auth_proxy: Option<AuthProxy>,
    scrape_token: Option<Secret>,
    pub throttle: Throttle,
    /// What a wrong account name's password is checked against.
    pub(super) decoy: Arc<Decoy>,
}

impl Access {
    pub fn new(admin: &AdminSettings) -> Self {
        Self {
            open_reading: admin.open_reading && admin.listen.ip().is_loopback(),
            idle: admin.session_idle,
            lifetime: admin.session_lifetime,
            proxies: TrustedProxies::new(admin.trusted_proxies.clone()),
            auth_proxy: admin.auth_proxy.clone(),
            scrape_token: admin.scrape_token.clone(),
            throttle: Throttle::default(),
            decoy: Arc::new(Decoy::new(admin.password_hashing)),
        }
    }

    /// Reading needs no session (on loopback, for a request that no proxy forwarded).
    pub fn open_reading(&self) -> bool {
        self.open_reading
    }

    /// Where a request comes from.
    pub fn client(&self, peer: SocketAddr, headers: &HeaderMap) -> Client {
        self.proxies.client(peer, headers)
    }

    /// Who made the request with `headers` from `peer`. With `touch`, a session's use counts
    /// towards its idle limit (a page reloading itself passes `false`).
    pub async fn identify(
        &self,
        pool: &PgPool,
        peer: SocketAddr,
        headers: &HeaderMap,
        touch: bool,
    ) -> Result<Caller, Refusal> {
        let client = self.client(peer, headers);
        let mut caller = Caller {
            client,
            peer: peer.ip(),
            signed: None,
            credential: Credential::None,
            new_session: None,
            api: false,
            open_reading: self.open_reading,
        };
        if let Some(token) = bearer(headers) {
            caller.signed = Some(self.by_token(pool, &caller.client, token).await?);
            caller.credential = Credential::Bearer;
            return Ok(caller);
        }
        let session = match cookie_value(headers, SESSION_COOKIE) {
            Some(id) => sessions::live(pool, &digest(&id), self.idle, touch).await?,
            None => None,
        };
        if let Some(user) = self.proxy_user(&caller.client, headers) {
            if session.as_ref().is_some_and(|s| s.account == user) {
                tracing::trace!(%user, "the auth proxy's user has a session already");
            } else {
                let (signed, id, csrf) = self.proxy_sign_in(pool, &caller, &user).await?;
                caller.signed = Some(signed);
                caller.credential = Credential::Session { csrf };
                caller.new_session = Some(id);
                return Ok(caller);
            }
        }
        if let Some(live) = session {
            caller.signed = Some(Signed {
                account: live.account,
                role: live.role,
                given_name: live.given_name,
            });
            caller.credential = Credential::Session { csrf: live.csrf };
        }
        Ok(caller)
    }

    /// The account a `Bearer` token belongs to; a wrong one counts against the address.
    async fn by_token(
        &self,
        pool: &PgPool,
        client: &Client,
        token: &str,
    ) -> Result<Signed, Refusal> {
        match operators::by_token(pool, &credentials::token_digest(token)).await? {
            Some((account, role)) => Ok(Signed {
                account,
                role,
                given_name: None,
            }),
            None => {
                self.throttle.wrong_token(client.ip)?;
                tracing::warn!(from = %client.ip, "a request with a wrong API token was refused");
                Err(Refusal::WrongToken)
            }
        }
    }

    /// The user the auth proxy names, when the request came from a trusted proxy.
    fn proxy_user(&self, client: &Client, headers: &HeaderMap) -> Option<String> {
        let proxy = self.auth_proxy.as_ref()?;
        let value = headers.get(proxy.header.as_str())?.to_str().ok()?.trim();
        if value.is_empty() {
            return None;
        }
        if !client.proxied {
            tracing::warn!(from = %client.ip, header = %proxy.header, "an auth proxy header from an address outside admin.trusted_proxies was ignored");
            return None;
        }
        Some(value.to_string())
    }

    /// Whether a request may read `/metrics` and `/status`: always without a scrape token;
    /// with one, it or an account's token (or the bootstrap token) as `Bearer`.
    pub async fn may_scrape(
        &self,
        pool: &PgPool,
        peer: SocketAddr,
        headers: &HeaderMap,
    ) -> Result<(), Refusal> {
        let Some(scrape) = &self.scrape_token else {
            return Ok(());
        };
        let token = bearer(headers).ok_or(Refusal::NotSignedIn)?;
        if same_secret(scrape.expose(), token) {
            return Ok(());
        }
        let client = self.client(peer, headers);
        self.by_token(pool, &client, token).await.map(|_| ())
    }
}
