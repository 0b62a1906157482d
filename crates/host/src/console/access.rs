//! Who may see and who may act. Every request is made by a [`Caller`]: an operator account
//! signed in through a console session, an API token (`Authorization: Bearer`), or a trusted
//! auth proxy's header; or nobody.
//!
//! - Reading needs a signed-in account of any role, unless `admin.open_reading` is set (only
//!   on loopback, and never for a request that came through a proxy).
//! - Acting needs the `operator` role or above and, from a session, the session's CSRF token
//!   in the form and no sign that another site sent the request. A `Bearer` request needs no
//!   CSRF token: a browser never adds that header by itself.
//! - Sessions live in PostgreSQL ([`worker_store::sessions`]), so every replica knows them,
//!   and end after `admin.session_idle` without use or `admin.session_lifetime` in all. A page
//!   that reloads itself asks with [`REFRESH_MARKER`] in its query, which does not count as a
//!   use. The cookie `wh_session` is HttpOnly and SameSite=Strict, and Secure when the browser
//!   came over HTTPS through a trusted proxy.
//! - `admin.operator_token` is the credential of the `bootstrap` admin account: typed at
//!   sign-in (with the operator's own name, recorded beside the account) or sent as a token.
//!   It is kept as that account's API token ([`operators::sync_bootstrap`] at start), so that
//!   every replica checks it in the database: a token changed or removed on one replica's
//!   start stops working on all of them, and ends the sessions made with it.
//! - Credentials are tried no faster than [`Throttle`] allows.

use std::net::{IpAddr, SocketAddr};
use std::sync::OnceLock;
use std::time::Duration;

use axum::http::HeaderMap;
use cookie::{Cookie, SameSite};
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use worker_store::audit::{Actor, Via};
use worker_store::operators::{self, BOOTSTRAP, Role};
use worker_store::sessions::{self, NewSession};

use super::forwarded::{Client, TrustedProxies};
use super::throttle::{Throttle, TooMany};
use crate::credentials;
use crate::secret::Secret;
use crate::settings::{AdminSettings, AuthProxy, PasswordHashing};

/// The session cookie.
pub const SESSION_COOKIE: &str = "wh_session";
/// The sign-in form's own CSRF cookie.
pub const SIGNIN_COOKIE: &str = "wh_signin";
/// The query parameter of a page that reloads itself: that request does not keep its session
/// alive, so that a tab left open on a running action still ends at the idle limit.
pub const REFRESH_MARKER: &str = "refresh=auto";
/// The longest name an operator may give at sign-in.
pub const NAME_MAX_CHARS: usize = 80;

/// An account, signed in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed {
    pub account: String,
    pub role: Role,
    /// The name the operator gave, for the bootstrap account (which anyone with the token is).
    pub given_name: Option<String>,
}

impl Signed {
    /// How pages show who is signed in: `alice`, or `bootstrap (alice)`.
    pub fn label(&self) -> String {
        match &self.given_name {
            Some(name) => format!("{} ({name})", self.account),
            None => self.account.clone(),
        }
    }
}

/// How a request proved who it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    None,
    /// A console session, with the token its forms carry.
    Session {
        csrf: String,
    },
    /// An API token or the bootstrap token, as `Authorization: Bearer`.
    Bearer,
}

/// Who made a request.
#[derive(Debug, Clone)]
pub struct Caller {
    pub client: Client,
    /// The connection's own peer (a proxy's address, when it came through one).
    pub peer: IpAddr,
    pub signed: Option<Signed>,
    pub credential: Credential,
    /// The id of a session made for this request (by the auth proxy's header): its cookie
    /// goes out with the answer.
    pub new_session: Option<String>,
    /// It asked the JSON API (`/api/...`), which answers JSON instead of pages.
    pub api: bool,
    open_reading: bool,
}

/// Why a request may not go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("sign in first")]
    NotSignedIn,
    #[error("the form's CSRF token does not match this session: reload the page and try again")]
    BadCsrf,
    #[error("a request from another site is refused")]
    CrossSite,
    #[error("too many tries from this address or for this account: try again in {} s", .0.as_secs().max(1))]
    Throttled(Duration),
    #[error("the account name or the password is wrong")]
    WrongPassword,
    #[error("the API token is wrong, or its account is disabled")]
    WrongToken,
    #[error("the account `{account}` is a {role}: this needs an {needed}")]
    Role {
        account: String,
        role: Role,
        needed: Role,
    },
    #[error(
        "the sign-in proxy names `{0}`, which is no enabled account here: ask an admin to make it (worker-host operators add)"
    )]
    NoAccount(String),
    #[error("checking who you are failed: {0}")]
    Unavailable(String),
}

impl From<TooMany> for Refusal {
    fn from(too_many: TooMany) -> Self {
        Self::Throttled(too_many.retry_after)
    }
}

impl From<worker_core::Failure> for Refusal {
    fn from(failure: worker_core::Failure) -> Self {
        Self::Unavailable(failure.to_string())
    }
}

impl Caller {
    /// May this request read pages and the API?
    pub fn may_read(&self) -> Result<(), Refusal> {
        if self.signed.is_some() || (self.open_reading && !self.client.forwarded) {
            Ok(())
        } else {
            Err(Refusal::NotSignedIn)
        }
    }

    /// Whether this caller's role may act (the pages show action buttons to it).
    pub fn acts(&self) -> bool {
        self.signed
            .as_ref()
            .is_some_and(|s| s.role >= Role::Operator)
    }

    /// The session's CSRF token, for its forms.
    pub fn csrf(&self) -> Option<&str> {
        match &self.credential {
            Credential::Session { csrf } => Some(csrf),
            Credential::None | Credential::Bearer => None,
        }
    }

    /// Who the audit trail says acted.
    pub fn actor(&self) -> Actor {
        let via = match self.credential {
            Credential::Bearer => Via::Api,
            Credential::None | Credential::Session { .. } => Via::Console,
        };
        let from = self.client.label(self.peer);
        match &self.signed {
            Some(signed) => Actor::account(signed.account.clone(), from, via)
                .with_name(signed.given_name.clone()),
            None => Actor::new(via.as_str(), from),
        }
    }

    /// May this request act, as a role of at least `needed`? From a session it needs the
    /// session's CSRF token in `csrf` and no sign that another site sent it.
    pub fn may_act_as(
        &self,
        needed: Role,
        headers: &HeaderMap,
        csrf: &str,
    ) -> Result<Actor, Refusal> {
        let signed = self.signed.as_ref().ok_or(Refusal::NotSignedIn)?;
        match &self.credential {
            Credential::Bearer => {}
            Credential::Session { csrf: expected } => {
                refuse_cross_site(headers)?;
                if !same_secret(expected, csrf) {
                    return Err(Refusal::BadCsrf);
                }
            }
            Credential::None => return Err(Refusal::NotSignedIn),
        }
        if signed.role < needed {
            return Err(Refusal::Role {
                account: signed.account.clone(),
                role: signed.role,
                needed,
            });
        }
        Ok(self.actor())
    }

    /// [`Caller::may_act_as`] an operator.
    pub fn may_act(&self, headers: &HeaderMap, csrf: &str) -> Result<Actor, Refusal> {
        self.may_act_as(Role::Operator, headers, csrf)
    }
}

/// The console's access rules, its throttle and how it signs in.
#[derive(Debug)]
pub struct Access {
    open_reading: bool,
    idle: Duration,
    lifetime: Duration,
    proxies: TrustedProxies,
    auth_proxy: Option<AuthProxy>,
    scrape_token: Option<Secret>,
    pub throttle: Throttle,
}

/// 32 random bytes as hex: a session id or a CSRF token.
fn random_token() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Compares two secrets by their SHA-256, so that the time taken says nothing about how much
/// of a guess was right.
fn same_secret(a: &str, b: &str) -> bool {
    Sha256::digest(a.as_bytes()) == Sha256::digest(b.as_bytes())
}

fn digest(id: &str) -> Vec<u8> {
    Sha256::digest(id.as_bytes()).to_vec()
}

/// The value of cookie `name` in the request.
pub fn cookie_value(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(Cookie::split_parse)
        .filter_map(Result::ok)
        .find(|c| c.name() == name)
        .map(|c| c.value().to_string())
}

/// The request's `Authorization: Bearer` token, if it has one.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

/// A `Set-Cookie` value: HttpOnly, SameSite=Strict, path `/`, Secure when the browser came
/// over HTTPS; `None` as the value ends the cookie.
pub fn set_cookie(tls: bool, name: &str, value: Option<&str>) -> String {
    let mut cookie = Cookie::build((name.to_string(), value.unwrap_or("").to_string()))
        .http_only(true)
        .same_site(SameSite::Strict)
        .path("/")
        .secure(tls);
    if value.is_none() {
        cookie = cookie.max_age(cookie::time::Duration::ZERO);
    }
    cookie.build().to_string()
}

/// An argon2id string that matches no password, verified when no account has the name given,
/// so that a wrong name takes as long as a wrong password.
fn decoy_hash() -> &'static str {
    static DECOY: OnceLock<String> = OnceLock::new();
    DECOY.get_or_init(|| {
        credentials::hash_password(&random_token(), PasswordHashing::default()).unwrap_or_default()
    })
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
                self.throttle.address(client.ip)?;
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

    /// Signs the auth proxy's `user` in with a new session: its id and CSRF token.
    async fn proxy_sign_in(
        &self,
        pool: &PgPool,
        caller: &Caller,
        user: &str,
    ) -> Result<(Signed, String, String), Refusal> {
        let proxy_role = self.auth_proxy.as_ref().and_then(|p| p.new_account_role);
        let actor = Actor::account(user, caller.client.label(caller.peer), Via::Console)
            .with_name(Some("auth proxy".into()));
        let role = match operators::from_proxy(pool, user, proxy_role, &actor).await {
            Ok(Some(role)) => role,
            Ok(None) | Err(operators::AccountError::BadName(_)) => {
                return Err(Refusal::NoAccount(user.to_string()));
            }
            Err(e) => return Err(Refusal::Unavailable(e.to_string())),
        };
        let (id, csrf) = self
            .open_session(pool, user, None, &caller.client.label(caller.peer))
            .await?;
        tracing::info!(account = %user, from = %caller.client.ip, "an operator signed in to the console through the auth proxy");
        let signed = Signed {
            account: user.to_string(),
            role,
            given_name: None,
        };
        Ok((signed, id, csrf))
    }

    async fn open_session(
        &self,
        pool: &PgPool,
        account: &str,
        given_name: Option<&str>,
        origin: &str,
    ) -> Result<(String, String), Refusal> {
        let id = random_token();
        let csrf = random_token();
        sessions::create(
            pool,
            &NewSession {
                id_sha256: &digest(&id),
                account,
                csrf: &csrf,
                origin,
                given_name,
                lifetime: self.lifetime,
            },
        )
        .await?;
        Ok((id, csrf))
    }

    /// Signs in as account `name` with its `password`, or with the bootstrap token as
    /// `password` (then `name` is the operator's own, recorded beside the account). The
    /// sign-in form's CSRF token must match its cookie's. Returns the new session's id.
    pub async fn sign_in(
        &self,
        pool: &PgPool,
        client: &Client,
        headers: &HeaderMap,
        form_csrf: &str,
        name: &str,
        password: &str,
    ) -> Result<String, Refusal> {
        refuse_cross_site(headers)?;
        let cookie = cookie_value(headers, SIGNIN_COOKIE).ok_or(Refusal::BadCsrf)?;
        if form_csrf.is_empty() || !same_secret(&cookie, form_csrf) {
            return Err(Refusal::BadCsrf);
        }
        self.throttle.address(client.ip)?;
        self.throttle.account(name).await?;
        let from = client.ip.to_string();
        let bootstrap = operators::by_token(pool, &credentials::token_digest(password))
            .await?
            .is_some_and(|(account, _)| account == BOOTSTRAP);
        let (account, given_name) = if bootstrap {
            let given = (name != BOOTSTRAP).then_some(name);
            (BOOTSTRAP.to_string(), given)
        } else {
            let found = operators::credentials(pool, name).await?;
            let stored = found
                .as_ref()
                .map_or_else(|| decoy_hash().to_string(), |(_, hash)| hash.clone());
            let password = password.to_string();
            let matches = tokio::task::spawn_blocking(move || {
                credentials::verify_password(&password, &stored)
            })
            .await
            .unwrap_or(false);
            if found.is_none() || !matches {
                tracing::warn!(%from, account = %name, "a console sign-in with a wrong account name or password was refused");
                return Err(Refusal::WrongPassword);
            }
            (name.to_string(), None)
        };
        let (id, _) = self.open_session(pool, &account, given_name, &from).await?;
        tracing::info!(%account, given_name = ?given_name, %from, "an operator signed in to the console");
        Ok(id)
    }

    /// Ends the request's session, if it has one, on every replica.
    pub async fn sign_out(&self, pool: &PgPool, headers: &HeaderMap) -> Result<(), Refusal> {
        if let Some(id) = cookie_value(headers, SESSION_COOKIE) {
            sessions::end(pool, &digest(&id)).await?;
        }
        Ok(())
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

    /// A fresh CSRF token for a sign-in form (its cookie is set with it).
    pub fn signin_token() -> String {
        random_token()
    }
}

/// Refuses what a browser says another site sent (`Sec-Fetch-Site: cross-site`) or whose
/// `Origin` is not the host it was sent to. SameSite=Strict cookies already keep another
/// site's forms from carrying a session; this keeps them from reaching the sign-in.
fn refuse_cross_site(headers: &HeaderMap) -> Result<(), Refusal> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if header("sec-fetch-site") == Some("cross-site") {
        return Err(Refusal::CrossSite);
    }
    if let (Some(origin), Some(host)) = (header("origin"), header("host")) {
        let origin_host = origin
            .split_once("://")
            .map_or(origin, |(_, rest)| rest)
            .trim_end_matches('/');
        if origin != "null" && !origin_host.eq_ignore_ascii_case(host) {
            return Err(Refusal::CrossSite);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(role: Option<Role>, credential: Credential, open_reading: bool) -> Caller {
        Caller {
            client: Client {
                ip: "127.0.0.1".parse().unwrap(),
                proxied: false,
                tls: false,
                forwarded: false,
            },
            peer: "127.0.0.1".parse().unwrap(),
            signed: role.map(|role| Signed {
                account: "alice".into(),
                role,
                given_name: None,
            }),
            credential,
            new_session: None,
            api: false,
            open_reading,
        }
    }

    fn session(csrf: &str) -> Credential {
        Credential::Session { csrf: csrf.into() }
    }

    #[test]
    fn a_session_acts_only_with_its_own_csrf_token() {
        let alice = caller(Some(Role::Operator), session("right"), false);
        let actor = alice.may_act(&HeaderMap::new(), "right").unwrap();
        assert_eq!(actor.account.as_deref(), Some("alice"));
        assert_eq!(actor.via, Via::Console);
        assert_eq!(
            alice.may_act(&HeaderMap::new(), "forged"),
            Err(Refusal::BadCsrf)
        );
    }

    #[test]
    fn a_viewer_reads_but_never_acts() {
        let viewer = caller(Some(Role::Viewer), session("right"), false);
        assert!(viewer.may_read().is_ok());
        assert!(!viewer.acts());
        assert!(matches!(
            viewer.may_act(&HeaderMap::new(), "right"),
            Err(Refusal::Role {
                needed: Role::Operator,
                ..
            })
        ));
    }

    #[test]
    fn a_bearer_acts_without_a_csrf_token_and_is_recorded_as_the_api() {
        let script = caller(Some(Role::Operator), Credential::Bearer, false);
        let actor = script.may_act(&HeaderMap::new(), "").unwrap();
        assert_eq!(actor.via, Via::Api);
        assert_eq!(actor.label(), "alice (api from 127.0.0.1)");
    }

    #[test]
    fn nobody_signed_in_reads_only_with_open_reading_and_never_through_a_proxy() {
        assert_eq!(
            caller(None, Credential::None, false).may_read(),
            Err(Refusal::NotSignedIn)
        );
        let open = caller(None, Credential::None, true);
        assert!(open.may_read().is_ok());
        let mut forwarded = open.clone();
        forwarded.client.forwarded = true;
        assert_eq!(forwarded.may_read(), Err(Refusal::NotSignedIn));
        assert_eq!(
            open.may_act(&HeaderMap::new(), ""),
            Err(Refusal::NotSignedIn)
        );
    }

    #[test]
    fn the_bootstrap_accounts_label_carries_the_name_given() {
        let signed = Signed {
            account: BOOTSTRAP.into(),
            role: Role::Admin,
            given_name: Some("alice".into()),
        };
        assert_eq!(signed.label(), "bootstrap (alice)");
    }

    #[test]
    fn another_sites_request_is_refused() {
        let mut headers = HeaderMap::new();
        headers.insert("host", "127.0.0.1:9180".parse().unwrap());
        headers.insert("origin", "http://127.0.0.1:9180".parse().unwrap());
        assert!(refuse_cross_site(&headers).is_ok());
        headers.insert("origin", "https://evil.example".parse().unwrap());
        assert_eq!(refuse_cross_site(&headers), Err(Refusal::CrossSite));
        let mut fetch = HeaderMap::new();
        fetch.insert("sec-fetch-site", "cross-site".parse().unwrap());
        assert_eq!(refuse_cross_site(&fetch), Err(Refusal::CrossSite));
        let alice = caller(Some(Role::Operator), session("right"), false);
        assert_eq!(alice.may_act(&fetch, "right"), Err(Refusal::CrossSite));
    }

    #[test]
    fn cookies_are_http_only_strict_and_secure_over_https() {
        let set = set_cookie(false, SESSION_COOKIE, Some("abc"));
        assert!(set.contains("HttpOnly"), "{set}");
        assert!(set.contains("SameSite=Strict"), "{set}");
        assert!(!set.contains("Secure"), "{set}");
        assert!(set_cookie(true, SESSION_COOKIE, Some("abc")).contains("Secure"));
        assert!(set_cookie(true, SESSION_COOKIE, None).contains("Max-Age=0"));
    }

    #[test]
    fn a_bearer_token_is_read_from_its_header() {
        let mut headers = HeaderMap::new();
        assert_eq!(bearer(&headers), None);
        headers.insert(
            axum::http::header::AUTHORIZATION,
            "Bearer wht_abc ".parse().unwrap(),
        );
        assert_eq!(bearer(&headers), Some("wht_abc"));
    }
}
