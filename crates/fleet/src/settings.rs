//! The fleet view's settings file (`worker-host fleet --config fleet.toml`): where it listens,
//! how often and how patiently it reads the installations, and the installations, each with
//! its name, admin address, environment and a `viewer` account's API token. Read as the
//! host's settings are (figment, unknown keys refused, every error naming the file, the line
//! and the key, a token never quoted), but a file of its own: the fleet view reaches no
//! database or broker.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::Figment;
use figment::providers::{Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

use worker_core::secret::Secret;
use worker_core::settings_file::SettingsError;
use worker_pages::environment::{Colour, Environment};

/// The file `worker-host fleet` reads when neither `--config` nor `WORKER_HOST_CONFIG` names
/// one.
pub const DEFAULT_PATH: &str = "config/fleet.toml";

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct FleetSettings {
    /// Where the fleet view's page and `/api/fleet` listen: a loopback address, since the
    /// view has no sign-in of its own (reach it through an SSH tunnel or an authenticating
    /// proxy on the same machine).
    pub listen: SocketAddr,
    /// How often every installation is read, all at once, in the background.
    #[serde(with = "humantime_serde")]
    pub refresh: Duration,
    /// How long one installation may take to answer before it counts as unreachable.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// The host names the view answers to besides loopback and `listen`'s address (as
    /// `admin.allowed_hosts`): the name an authenticating proxy on this machine passes on.
    /// Any other `Host` is refused with 421 (DNS rebinding).
    pub allowed_hosts: Vec<String>,
    pub installations: Vec<InstallationSettings>,
}

impl Default for FleetSettings {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 9190)),
            refresh: Duration::from_secs(10),
            timeout: Duration::from_secs(3),
            allowed_hosts: Vec::new(),
            installations: Vec::new(),
        }
    }
}

/// `[[installations]]`: one installation the view reads.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct InstallationSettings {
    /// The name shown for it (its `installation` setting, usually).
    pub name: String,
    /// Its admin address, as an operator's browser reaches its console
    /// (`https://acme-admin.example.net`): the view reads `<url>/api/overview` and links there.
    pub url: String,
    /// The API token of a `viewer` account on it (`worker-host operators token <account>`).
    /// Exactly one of `token`, `token_file` and `token_env` is set.
    #[serde(default)]
    pub token: Option<Secret>,
    /// A file holding the token (a mounted secret).
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// The environment variable holding the token.
    #[serde(default)]
    pub token_env: Option<String>,
    /// `production`, `staging`, ...: production is marked red and in words.
    pub environment: String,
    /// The label's colour instead of the default (red for production, blue for any other).
    #[serde(default)]
    pub environment_colour: Option<Colour>,
    /// Lets the token go over plain `http://` to a host that is not loopback, as
    /// `database.allow_plaintext` and `broker.allow_plaintext` do: only for a network that
    /// is trusted. Unset: such a `url` is refused, since anyone on the path reads the token.
    #[serde(default)]
    pub allow_plaintext: bool,
}

impl InstallationSettings {
    pub fn environment(&self) -> Environment {
        Environment::new(&self.environment, self.environment_colour)
    }

    /// Its admin address without a trailing slash, to put paths after.
    pub fn base_url(&self) -> &str {
        self.url.trim().trim_end_matches('/')
    }
}

impl FleetSettings {
    /// Reads `path`, takes each token from where it is kept, and validates; `env` is the
    /// environment `token_env` reads from.
    pub fn load(path: &Path, env: &[(String, String)]) -> Result<Self, Vec<SettingsError>> {
        let file = path.display().to_string();
        let one = |key: &str, problem: String| {
            vec![SettingsError {
                source: Some(file.clone()),
                key: key.to_string(),
                problem,
            }]
        };
        let text = std::fs::read_to_string(path).map_err(|e| {
            one(
                "",
                format!("cannot be read: {e} (the fleet view's settings file; see config/fleet.example.toml)"),
            )
        })?;
        let table = worker_core::settings_file::parse_table(&text, &file).map_err(|e| vec![e])?;
        let toml_text =
            toml::to_string(&table).map_err(|e| one("", format!("cannot be read again: {e}")))?;
        let mut settings: Self = Figment::from(Serialized::defaults(Self::default()))
            .merge(Toml::string(&toml_text))
            .extract()
            .map_err(|e| {
                worker_core::settings_file::from_figment(
                    e.into_iter().collect(),
                    &file,
                    Some(&text),
                    &[],
                    &|key| key.to_string(),
                )
                .into_iter()
                .map(indexed)
                .collect::<Vec<_>>()
            })?;
        let mut errors = Vec::new();
        let mut fail = |key: String, problem: String| {
            errors.push(SettingsError {
                source: Some(file.clone()),
                key,
                problem,
            });
        };
        for (i, installation) in settings.installations.iter_mut().enumerate() {
            resolve_token(i, installation, env, &mut fail);
        }
        settings.validate(&mut fail);
        if errors.is_empty() {
            Ok(settings)
        } else {
            Err(errors)
        }
    }

    fn validate(&self, fail: &mut impl FnMut(String, String)) {
        if !self.listen.ip().is_loopback() {
            fail(
                "listen".into(),
                format!(
                    "{} is not a loopback address: the fleet view has no sign-in of its own and shows every installation's state, so it listens on loopback only (reach it through an SSH tunnel or an authenticating proxy on this machine)",
                    self.listen
                ),
            );
        }
        for (key, duration) in [("refresh", self.refresh), ("timeout", self.timeout)] {
            if duration.is_zero() {
                fail(
                    key.into(),
                    "expected a duration longer than zero (like `3s`), found 0".into(),
                );
            }
        }
        if self.timeout >= self.refresh {
            fail(
                "timeout".into(),
                format!(
                    "expected less than `refresh` ({}), found {}: a reading must end before the next begins",
                    humantime::format_duration(self.refresh),
                    humantime::format_duration(self.timeout)
                ),
            );
        }
        for (i, name) in self.allowed_hosts.iter().enumerate() {
            if let Err(problem) = worker_pages::allowed_hosts::AllowedHost::parse(name) {
                fail(format!("allowed_hosts[{i}]"), problem);
            }
        }
        if self.installations.is_empty() {
            fail(
                "installations".into(),
                "expected at least one [[installations]] entry (name, url, token, environment)"
                    .into(),
            );
        }
        let mut seen = std::collections::HashSet::new();
        for (i, installation) in self.installations.iter().enumerate() {
            let key = |field: &str| format!("installations[{i}].{field}");
            let name = installation.name.trim();
            if name.is_empty() {
                fail(
                    key("name"),
                    "expected the installation's name, found an empty string".into(),
                );
            } else if !seen.insert(name.to_string()) {
                fail(
                    key("name"),
                    format!("`{name}` is listed twice: each installation once"),
                );
            }
            match reqwest::Url::parse(installation.base_url()) {
                Ok(url) if matches!(url.scheme(), "http" | "https") && url.host().is_some() => {
                    if url.query().is_some()
                        || url.fragment().is_some()
                        || !url.username().is_empty()
                        || url.password().is_some()
                    {
                        fail(key("url"), "expected the admin address alone (`https://host:port`), without credentials, query or fragment".into());
                    }
                    let host = url.host_str().unwrap_or_default();
                    if url.scheme() == "http" && !installation.allow_plaintext && !is_loopback(host)
                    {
                        fail(
                            key("url"),
                            format!(
                                "the viewer token would cross the network to {host} in plain text: use https:// (the admin port behind a TLS proxy), or set `installations[{i}].allow_plaintext = true` if the network is trusted"
                            ),
                        );
                    }
                }
                _ => fail(
                    key("url"),
                    format!(
                        "expected the installation's admin address as http:// or https:// (`https://acme-admin.example.net`), found `{}`",
                        installation.url
                    ),
                ),
            }
            if let Err(problem) = worker_pages::environment::check_name(&installation.environment) {
                fail(key("environment"), problem);
            }
        }
    }
}

/// figment's `installations.1.url` written as the file's readers and this file's own checks
/// write it, `installations[1].url`.
fn indexed(mut error: SettingsError) -> SettingsError {
    let Some(rest) = error.key.strip_prefix("installations.") else {
        return error;
    };
    let (index, field) = rest.split_once('.').unwrap_or((rest, ""));
    if index.chars().all(|c| c.is_ascii_digit()) {
        let key = if field.is_empty() {
            format!("installations[{index}]")
        } else {
            format!("installations[{index}].{field}")
        };
        error.problem = error.problem.replace(&error.key, &key);
        error.key = key;
    }
    error
}

/// The token of installation `i`, from `token`, `token_file` or `token_env` (exactly one).
fn resolve_token(
    i: usize,
    installation: &mut InstallationSettings,
    env: &[(String, String)],
    fail: &mut impl FnMut(String, String),
) {
    let key = |field: &str| format!("installations[{i}].{field}");
    let set = [
        installation.token.is_some(),
        installation.token_file.is_some(),
        installation.token_env.is_some(),
    ]
    .iter()
    .filter(|s| **s)
    .count();
    if set != 1 {
        fail(
            key("token"),
            format!(
                "expected exactly one of `token`, `token_file` and `token_env` (the API token of a viewer account on {}), found {set}",
                installation.name
            ),
        );
        return;
    }
    if let Some(path) = &installation.token_file {
        match Secret::from_file(path) {
            Ok(token) => installation.token = Some(token),
            Err(e) => fail(
                key("token_file"),
                format!(
                    "expected a readable file holding the token, but {} cannot be read: {e}",
                    path.display()
                ),
            ),
        }
    }
    if let Some(var) = &installation.token_env {
        match env.iter().find(|(name, _)| name == var) {
            Some((_, value)) => installation.token = Some(Secret::new(value.clone())),
            None => fail(
                key("token_env"),
                format!("the environment variable {var} is not set"),
            ),
        }
    }
    if installation
        .token
        .as_ref()
        .is_some_and(|t| t.expose().trim().is_empty())
    {
        fail(
            key("token"),
            "expected the token, found an empty value".into(),
        );
    }
}

/// `localhost` or a loopback address: a token sent there in plain text stays on this machine.
fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
#[path = "settings_tests.rs"]
mod tests;
