//! `[admin]`: the admin endpoints, the operator's console, who may sign in to it (accounts,
//! the bootstrap token, a trusted auth proxy), how operators' passwords are hashed, and the
//! admin server's limits.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use worker_store::operators::Role;

use worker_core::secret::Secret;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminSettings {
    pub enabled: bool,
    /// Where `/healthz`, `/readyz`, `/status`, `/metrics` and the console listen. Every
    /// console page needs a session unless `open_reading` is set.
    pub listen: SocketAddr,
    /// The credential of the built-in `bootstrap` admin account (the console's sign-in, or a
    /// `Bearer` token), kept for installations made before named accounts. Unset: no
    /// bootstrap account; named accounts (`worker-host operators`) sign in.
    pub operator_token: Option<Secret>,
    pub operator_token_file: Option<PathBuf>,
    /// How long a console session lasts after its last use. A page that reloads itself does
    /// not count as a use.
    #[serde(with = "humantime_serde")]
    pub session_idle: Duration,
    /// How long a console session lasts at most, however busy.
    #[serde(with = "humantime_serde")]
    pub session_lifetime: Duration,
    /// The host names the admin port answers to besides loopback (`localhost`, `127.0.0.1`,
    /// `[::1]`) and `listen`'s address, which it always answers to: `console.example.net`
    /// (any port) or `console.example.net:8443` (that port only). A request naming any other
    /// host in `Host` is refused with 421, so that a page on another site cannot reach the
    /// console by pointing its own name at this address (DNS rebinding). Behind a reverse
    /// proxy that passes the browser's `Host` on, list the proxy's public name.
    pub allowed_hosts: Vec<String>,
    /// Lets anyone read the console's pages and API without signing in. Allowed only while
    /// `listen` is a loopback address, and never for a request that came through a proxy
    /// (one with forwarded headers): those need a session all the same.
    pub open_reading: bool,
    /// The addresses (or networks, `10.0.0.0/8`) of the reverse proxies whose
    /// `X-Forwarded-For`, `X-Forwarded-Proto` and `auth_proxy` header count. Those headers
    /// from any other peer are ignored.
    #[serde(deserialize_with = "networks", serialize_with = "networks_out")]
    pub trusted_proxies: Vec<IpNet>,
    /// Single sign-on through the reverse proxy: unset, nobody signs in that way.
    pub auth_proxy: Option<AuthProxy>,
    /// The token `/metrics` and `/status` ask for (`Authorization: Bearer ...`), besides any
    /// account's API token. Unset: both are open, as Prometheus on loopback expects.
    pub scrape_token: Option<Secret>,
    pub scrape_token_file: Option<PathBuf>,
    /// The key of the keyed hash (HMAC-SHA256) that names an address in a privacy export's or
    /// erasure's audit entry and makes its pseudonym. Unset: derived from the database
    /// password, which changes with it.
    pub privacy_key: Option<Secret>,
    pub privacy_key_file: Option<PathBuf>,
    /// The argon2id parameters `worker-host operators` hashes new passwords with (a stored
    /// hash keeps its own).
    pub password_hashing: PasswordHashing,
    /// The console's own database connections (besides `database.max_connections`), so
    /// that no page or bulk action can starve the jobs.
    pub console_connections: u32,
    /// The rate a bulk replay or purge offers first, in messages per second.
    pub bulk_rate: u32,
    /// Connections the admin server serves at once; past it a new one waits to be accepted.
    pub max_connections: u32,
    /// How long a client may take to send a request's headers.
    #[serde(with = "humantime_serde")]
    pub header_timeout: Duration,
    /// How long one request may take, from its headers to the end of the answer.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// The environment this installation is (`production`, `staging`, ...): a band with its
    /// name on every page of the console, red for production, and `environment` on
    /// `/status`, which the fleet view shows. Unset: no band.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub environment: Option<String>,
    /// The band's colour instead of the default (red for production, blue for any other):
    /// `red`, `amber`, `blue`, `green` or `grey`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub environment_colour: Option<worker_pages::environment::Colour>,
}

impl AdminSettings {
    /// The environment's band, when `environment` is set.
    pub fn environment(&self) -> Option<worker_pages::environment::Environment> {
        self.environment
            .as_deref()
            .map(|name| worker_pages::environment::Environment::new(name, self.environment_colour))
    }
}

/// `[admin.auth_proxy]`: a header set by a reverse proxy that has already signed the user in
/// (oauth2-proxy's `X-Forwarded-User` or `X-Forwarded-Email`, nginx's `auth_request`), which
/// counts only from `trusted_proxies`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AuthProxy {
    /// The header that names the user.
    pub header: String,
    /// The role of an account made at a user's first sign-in through the proxy. Unset: the
    /// header signs in only the accounts that exist already (`worker-host operators add`).
    #[serde(default)]
    pub new_account_role: Option<Role>,
}

/// A list of networks, each written as `10.0.0.0/8` or as one address.
fn networks<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Vec<IpNet>, D::Error> {
    let texts = Vec::<String>::deserialize(deserializer)?;
    texts
        .iter()
        .map(|text| parse_network(text).map_err(serde::de::Error::custom))
        .collect()
}

fn networks_out<S: serde::Serializer>(nets: &[IpNet], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(nets.iter().map(ToString::to_string))
}

/// `10.0.0.0/8`, or one address as the network of just that address.
pub fn parse_network(text: &str) -> Result<IpNet, String> {
    let text = text.trim();
    text.parse::<IpNet>()
        .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| format!("expected an address or a network such as 10.0.0.0/8, found `{text}`"))
}

impl Default for AdminSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            listen: SocketAddr::from(([127, 0, 0, 1], 9180)),
            operator_token: None,
            operator_token_file: None,
            session_idle: Duration::from_secs(8 * 3600),
            session_lifetime: Duration::from_secs(24 * 3600),
            allowed_hosts: Vec::new(),
            open_reading: false,
            trusted_proxies: Vec::new(),
            auth_proxy: None,
            scrape_token: None,
            scrape_token_file: None,
            privacy_key: None,
            privacy_key_file: None,
            password_hashing: PasswordHashing::default(),
            console_connections: 4,
            bulk_rate: 50,
            max_connections: 256,
            header_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(60),
            environment: None,
            environment_colour: None,
        }
    }
}

/// `[admin.password_hashing]`: argon2id's cost. The defaults are OWASP's first choice
/// (19 MiB, 2 passes, 1 lane), about 30 ms a hash on this project's machines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct PasswordHashing {
    pub memory_kib: u32,
    pub iterations: u32,
    pub parallelism: u32,
}

impl Default for PasswordHashing {
    fn default() -> Self {
        Self {
            memory_kib: 19 * 1024,
            iterations: 2,
            parallelism: 1,
        }
    }
}
