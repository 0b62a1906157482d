//! The checks of the host's own sections, and the calls to each job section's `validate`
//! (keys put under `jobs.<job>.`). TLS and credentials: no password in plain text to a host
//! that is not loopback unless the section allows it; a CA file that is readable and used.

use std::path::Path;
use std::time::Duration;

use worker_core::TlsMode;

use super::{Settings, SettingsError};

/// The shortest operator token the host takes.
pub const OPERATOR_TOKEN_MIN_CHARS: usize = 16;

fn durations_nonzero(fail: &mut impl FnMut(&str, String), durations: &[(&str, Duration)]) {
    for (key, duration) in durations {
        if duration.is_zero() {
            fail(
                key,
                "expected a duration longer than zero (like `30s`), found 0".into(),
            );
        }
    }
}

impl Settings {
    pub(super) fn validate(&self, file: &str, errors: &mut Vec<SettingsError>) {
        let mut fail = |key: &str, problem: String| {
            errors.push(SettingsError {
                source: Some(file.to_string()),
                key: key.to_string(),
                problem,
            })
        };
        if self.installation.trim().is_empty() {
            fail(
                "installation",
                "expected the name of this client installation, found an empty string".into(),
            );
        }
        for problem in self.circuits.problems() {
            fail("circuits", problem);
        }
        if self.replica.as_deref().is_some_and(|r| r.trim().is_empty()) {
            fail(
                "replica",
                "expected this replica's name, found an empty string (leave it unset for the host name)".into(),
            );
        }
        for (key, port) in [
            ("database.port", self.database.port),
            ("broker.port", self.broker.port),
        ] {
            if port == 0 {
                fail(
                    key,
                    "expected a port number from 1 to 65535, found 0".into(),
                );
            }
        }
        for (key, value) in [
            ("database.max_connections", self.database.max_connections),
            ("database.connect_attempts", self.database.connect_attempts),
            ("broker.connect_attempts", self.broker.connect_attempts),
        ] {
            if value == 0 {
                fail(key, "expected a positive number, found 0".into());
            }
        }
        let mut durations: Vec<(String, Duration)> = vec![
            (
                "database.acquire_timeout".into(),
                self.database.acquire_timeout,
            ),
            ("broker.heartbeat".into(), self.broker.heartbeat),
            ("broker.connect_timeout".into(), self.broker.connect_timeout),
            ("broker.reconnect_min".into(), self.broker.reconnect_min),
            ("broker.reconnect_max".into(), self.broker.reconnect_max),
            (
                "telemetry.export_timeout".into(),
                self.telemetry.export_timeout,
            ),
            (
                "telemetry.metrics_interval".into(),
                self.telemetry.metrics_interval,
            ),
            ("workers.shutdown_grace".into(), self.workers.shutdown_grace),
            (
                "workers.retry.max_delay".into(),
                self.workers.retry.max_delay,
            ),
        ];
        if let Some(settle) = self.workers.settle_deadline {
            durations.push(("workers.settle_deadline".into(), settle));
            if settle + worker_broker::consumer::CANCEL_WAIT >= self.workers.shutdown_grace {
                fail(
                    "workers.settle_deadline",
                    format!(
                        "expected a deadline more than {} shorter than workers.shutdown_grace ({}), which must leave time to cancel what is left, return it to the queue and close; found {}",
                        humantime::format_duration(worker_broker::consumer::CANCEL_WAIT),
                        humantime::format_duration(self.workers.shutdown_grace),
                        humantime::format_duration(settle)
                    ),
                );
            }
        }
        if self.broker.frame_max < worker_broker::FRAME_MAX_MIN {
            fail(
                "broker.frame_max",
                format!(
                    "expected at least {} bytes (AMQP's smallest frame), found {}",
                    worker_broker::FRAME_MAX_MIN,
                    self.broker.frame_max
                ),
            );
        }
        if self.workers.lease_timeout <= worker_store::lease::DEFAULT_CHECK_TIMEOUT {
            fail(
                "workers.lease_timeout",
                format!(
                    "expected more than {} (the time a lease holder takes to give up a silent session, so that it stops before another replica can take over), found {}",
                    humantime::format_duration(worker_store::lease::DEFAULT_CHECK_TIMEOUT),
                    humantime::format_duration(self.workers.lease_timeout)
                ),
            );
        }
        if let Err(problem) = self.workers.retry.validate() {
            fail("workers.retry", problem);
        }
        if let Err(problem) = self.workers.attempt_log.validate() {
            fail("workers.attempt_log", problem);
        }
        durations.push(("alerts.interval".into(), self.alerts.interval));
        durations.push(("alerts.pause_age".into(), self.alerts.pause_age));
        durations.push(("workers.pause_poll".into(), self.workers.pause_poll));
        durations.push((
            "alerts.outbox_oldest_pending".into(),
            self.alerts.outbox_oldest_pending,
        ));
        if let Err(e) = self.topology() {
            let key = match &e {
                worker_broker::TopologyError::Invalid { queue, key, .. } => {
                    self.jobs
                        .consumers()
                        .into_iter()
                        .find(|job| {
                            let section = job.section;
                            let name = section.queue().name.clone().unwrap_or_else(|| {
                                section.queue_defaults(&self.broker.topology).name
                            });
                            name == *queue
                        })
                        .map(|job| format!("jobs.{}.queue.{key}", job.spec.section()))
                        .unwrap_or_else(|| format!("broker.topology.{key}"))
                }
                _ => "broker.topology".to_string(),
            };
            fail(&key, e.to_string());
        }
        for problem in worker_core::Section::validate(&self.smtp) {
            fail(&format!("smtp.{}", problem.key), problem.problem);
        }
        for problem in self.jobs.validate() {
            fail(&format!("jobs.{}", problem.key), problem.problem);
        }
        for problem in job_inbound_email_poller::validate_accounts(&self.imap.accounts) {
            fail(&format!("imap.accounts{}", problem.key), problem.problem);
        }
        self.validate_oauth(&mut fail);
        if let Err(problem) = self.check_pool_budget() {
            fail("database.max_connections", problem);
        }
        let durations: Vec<(&str, Duration)> =
            durations.iter().map(|(k, d)| (k.as_str(), *d)).collect();
        durations_nonzero(&mut fail, &durations);
        for (i, file) in self.automations_files.iter().enumerate() {
            if let Err(e) = job_automation_trigger::import::load_file(file) {
                fail(
                    &format!("automations_files[{i}]"),
                    format!("expected a valid automations file: {e}"),
                );
            }
        }
        if let Some(endpoint) = &self.telemetry.otlp_endpoint
            && !(endpoint.starts_with("http://") || endpoint.starts_with("https://"))
        {
            fail(
                "telemetry.otlp_endpoint",
                format!("expected an http:// or https:// URL, found `{endpoint}`"),
            );
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.telemetry.log_level) {
            fail(
                "telemetry.log_level",
                format!("expected a level or tracing filter like `info`: {e}"),
            );
        }
        self.validate_broker_addresses(&mut fail);
        self.validate_database_hosts(&mut fail);
        self.validate_transport(&mut fail);
        self.validate_console(&mut fail);
    }

    /// `broker.addresses`: a list of at least one `host:port`, no node twice. It replaces
    /// `host` and `port`, whatever they say (a settings file can keep its single broker's
    /// `host` while the environment gives a cluster's addresses).
    fn validate_broker_addresses(&self, fail: &mut impl FnMut(&str, String)) {
        let broker = &self.broker;
        let Some(list) = &broker.addresses else {
            return;
        };
        if list.is_empty() {
            fail(
                "broker.addresses",
                "expected at least one `host:port`, found an empty list (leave the key out to use broker.host and broker.port)".into(),
            );
            return;
        }
        let mut seen: Vec<(String, worker_broker::BrokerAddress)> = Vec::new();
        for (key, entry) in broker.address_entries() {
            match entry {
                Err(problem) => fail(&key, problem.to_string()),
                Ok(address) => match seen.iter().find(|(_, earlier)| *earlier == address) {
                    Some((earlier, _)) => fail(
                        &key,
                        format!("expected each node once, but {address} is {earlier} again"),
                    ),
                    None => seen.push((key, address)),
                },
            }
        }
    }

    /// `database.hosts`: a list of at least one `host:port`, no member twice. It replaces
    /// `host` and `port`, as `broker.addresses` does the broker's.
    fn validate_database_hosts(&self, fail: &mut impl FnMut(&str, String)) {
        let Some(list) = &self.database.hosts else {
            return;
        };
        if list.is_empty() {
            fail(
                "database.hosts",
                "expected at least one `host:port`, found an empty list (leave the key out to use database.host and database.port)".into(),
            );
            return;
        }
        let mut seen: Vec<(String, worker_store::Member)> = Vec::new();
        for (key, entry) in self.database.member_entries() {
            match entry {
                Err(problem) => fail(&key, problem.to_string()),
                Ok(member) => match seen.iter().find(|(_, earlier)| *earlier == member) {
                    Some((earlier, _)) => fail(
                        &key,
                        format!("expected each member once, but {member} is {earlier} again"),
                    ),
                    None => seen.push((key, member)),
                },
            }
        }
    }

    /// The console: tokens long enough not to be guessed; open reading only on loopback; an
    /// auth proxy only behind trusted proxies, with a header name HTTP allows; sane session,
    /// bulk and server limits, and password hashing parameters argon2 accepts.
    fn validate_console(&self, fail: &mut impl FnMut(&str, String)) {
        let admin = &self.admin;
        durations_nonzero(
            fail,
            &[
                ("admin.session_idle", admin.session_idle),
                ("admin.session_lifetime", admin.session_lifetime),
                ("admin.header_timeout", admin.header_timeout),
                ("admin.request_timeout", admin.request_timeout),
            ],
        );
        for (key, value) in [
            ("admin.console_connections", admin.console_connections),
            ("admin.bulk_rate", admin.bulk_rate),
            ("admin.max_connections", admin.max_connections),
        ] {
            if value == 0 {
                fail(key, "expected a positive number, found 0".into());
            }
        }
        for (key, token) in [
            ("admin.operator_token", &admin.operator_token),
            ("admin.scrape_token", &admin.scrape_token),
            ("admin.privacy_key", &admin.privacy_key),
        ] {
            if token
                .as_ref()
                .is_some_and(|t| t.expose().chars().count() < OPERATOR_TOKEN_MIN_CHARS)
            {
                fail(
                    key,
                    format!(
                        "expected at least {OPERATOR_TOKEN_MIN_CHARS} characters (for example `openssl rand -hex 24`); the value is not shown"
                    ),
                );
            }
        }
        for (i, name) in admin.allowed_hosts.iter().enumerate() {
            if let Err(problem) = worker_pages::allowed_hosts::AllowedHost::parse(name) {
                fail(&format!("admin.allowed_hosts[{i}]"), problem);
            }
        }
        if admin.open_reading && !admin.listen.ip().is_loopback() {
            fail(
                "admin.open_reading",
                format!(
                    "{} is not a loopback address: reading without signing in is allowed only on loopback (reach it through an SSH tunnel), so set open_reading = false",
                    admin.listen
                ),
            );
        }
        if let Some(proxy) = &admin.auth_proxy {
            if admin.trusted_proxies.is_empty() {
                fail(
                    "admin.auth_proxy",
                    "no admin.trusted_proxies are set, so the header would count from nobody: list the proxy's address there".into(),
                );
            }
            if axum::http::HeaderName::from_bytes(proxy.header.as_bytes()).is_err() {
                fail(
                    "admin.auth_proxy.header",
                    format!("expected an HTTP header name, found `{}`", proxy.header),
                );
            }
        }
        if let Some(Err(problem)) = admin
            .environment
            .as_deref()
            .map(worker_pages::environment::check_name)
        {
            fail("admin.environment", problem);
        }
        if admin.environment_colour.is_some() && admin.environment.is_none() {
            fail(
                "admin.environment_colour",
                "set admin.environment too: the colour is the colour of its band".into(),
            );
        }
        let hashing = admin.password_hashing;
        if let Err(e) = argon2::Params::new(
            hashing.memory_kib,
            hashing.iterations,
            hashing.parallelism,
            None,
        ) {
            fail(
                "admin.password_hashing",
                format!("argon2 refuses these parameters: {e}"),
            );
        }
    }

    /// TLS and credentials: no password in plain text to a host that is not loopback unless
    /// the section says `allow_plaintext = true`; a CA file that is readable PEM and is used.
    /// Each `[oauth.NAME]` on its own, and every `oauth = "NAME"` naming one of them.
    fn validate_oauth(&self, fail: &mut impl FnMut(&str, String)) {
        for (name, source) in &self.oauth {
            for problem in worker_core::Section::validate(source) {
                fail(&format!("oauth.{name}.{}", problem.key), problem.problem);
            }
        }
        let known = |name: &str| self.oauth.contains_key(name);
        let missing = |name: &str| {
            let defined: Vec<&str> = self.oauth.keys().map(String::as_str).collect();
            format!(
                "no `[oauth.{name}]` section gives this token source (defined: {})",
                if defined.is_empty() {
                    "none".to_string()
                } else {
                    defined.join(", ")
                }
            )
        };
        for (i, account) in self.imap.accounts.iter().enumerate() {
            if let Some(name) = account.oauth.as_deref().filter(|n| !known(n)) {
                fail(&format!("imap.accounts[{i}].oauth"), missing(name));
            }
        }
        if let Some(name) = self.smtp.oauth.as_deref().filter(|n| !known(n)) {
            fail("smtp.oauth", missing(name));
        }
    }

    /// What `config check` says beside the settings: values the host adjusts.
    pub fn notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        let provider_limit = self
            .smtp
            .oauth
            .as_deref()
            .filter(|_| self.smtp.auth.uses_token())
            .and_then(|name| self.oauth.get(name))
            .and_then(worker_mail_auth::OAuthSettings::smtp_connection_limit);
        if let Some(limit) = provider_limit.filter(|limit| *limit < self.smtp.pool_size) {
            notes.push(format!(
                "smtp.pool_size = {} is capped at {limit}: Microsoft 365 allows {limit} SMTP connections per mailbox at once",
                self.smtp.pool_size
            ));
        }
        let preset = self
            .smtp
            .oauth
            .as_deref()
            .filter(|_| self.smtp.auth.uses_token())
            .and_then(|name| self.oauth.get(name))
            .map(worker_mail_auth::OAuthSettings::smtp_sending_limits)
            .unwrap_or_default();
        if preset != worker_mail_auth::SendingLimits::default() {
            notes.push(format!(
                "smtp.rate: {}, all replicas together (the keys left unset take the provider's limits)",
                self.smtp.rate.limits(preset).describe()
            ));
        }
        if self.admin.privacy_key.is_none() {
            notes.push(
                "admin.privacy_key is unset: privacy exports and erasures name an address by a keyed hash derived from database.password, which changes when that password is rotated; set admin.privacy_key_file to keep it".to_string(),
            );
        }
        notes
    }

    fn validate_transport(&self, fail: &mut impl FnMut(&str, String)) {
        let plain = |what: &str, host: &str, fix: &str, key: &str| {
            format!(
                "{what} would cross the network to {host} in plain text: {fix}, or set `{key}.allow_plaintext = true` if the network is trusted"
            )
        };
        let db = &self.database;
        // Each member on its own, as the broker's nodes: one off this machine is enough.
        if let Some(remote) = db.server_hosts().into_iter().find(|h| !is_loopback(h))
            && db.ssl_mode.may_be_plaintext()
            && !db.allow_plaintext
        {
            fail(
                "database.ssl_mode",
                plain(
                    "the database password",
                    &remote,
                    "set `ssl_mode = \"verify-full\"` (with `ssl_root_cert` for a private CA)",
                    "database",
                ),
            );
        }
        if let Some(path) = &db.ssl_root_cert {
            check_ca_file(
                fail,
                "database.ssl_root_cert",
                path,
                db.ssl_mode.verifies(),
                "`ssl_mode` is `verify-ca` or `verify-full`",
            );
        }
        let broker = &self.broker;
        // Each address on its own: one node of a cluster off this machine is enough for the
        // password to cross the network.
        for (key, entry) in broker.address_entries() {
            let Ok(address) = entry else { continue };
            if !broker.tls && !broker.allow_plaintext && !is_loopback(&address.host) {
                let key = if broker.addresses.is_some() {
                    key.as_str()
                } else {
                    "broker.tls"
                };
                fail(
                    key,
                    plain(
                        "the broker password",
                        &address.host,
                        "set `broker.tls = true` (with `ca_file` for a private CA)",
                        "broker",
                    ),
                );
            }
        }
        if let Some(path) = &broker.ca_file {
            check_ca_file(fail, "broker.ca_file", path, broker.tls, "`tls = true`");
        }
        let smtp = &self.smtp;
        if smtp.security == TlsMode::Plain
            && smtp.username.is_some()
            && !smtp.allow_plaintext
            && !is_loopback(&smtp.host)
        {
            fail(
                "smtp.security",
                plain(
                    "the SMTP login",
                    &smtp.host,
                    "set `security = \"starttls\"` or `\"tls\"` (with `ca_file` for a private CA)",
                    "smtp",
                ),
            );
        }
        if let Some(path) = &smtp.ca_file {
            check_ca_file(
                fail,
                "smtp.ca_file",
                path,
                smtp.security != TlsMode::Plain,
                "`security` is `starttls` or `tls`",
            );
        }
        for (i, account) in self.imap.accounts.iter().enumerate() {
            let section = format!("imap.accounts[{i}]");
            if account.security == TlsMode::Plain
                && !account.allow_plaintext
                && !is_loopback(&account.host)
            {
                fail(
                    &format!("{section}.security"),
                    plain(
                        "the IMAP login",
                        &account.host,
                        "set `security = \"tls\"` or `\"starttls\"` (with `ca_file` for a private CA)",
                        &section,
                    ),
                );
            }
            if let Some(path) = &account.ca_file {
                check_ca_file(
                    fail,
                    &format!("{section}.ca_file"),
                    path,
                    account.security != TlsMode::Plain,
                    "`security` is `starttls` or `tls`",
                );
            }
        }
    }
}

/// Whether `host` is this machine: `localhost`, a loopback address, or (for PostgreSQL) a
/// Unix socket folder. A name that merely resolves to loopback does not count.
pub(crate) fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.eq_ignore_ascii_case("localhost")
        || bare.starts_with('/')
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A CA file must be readable PEM holding at least one certificate, and be used (`used`, else
/// the installation believes a certificate is checked that is not).
fn check_ca_file(
    fail: &mut impl FnMut(&str, String),
    key: &str,
    path: &Path,
    used: bool,
    when: &str,
) {
    if !used {
        fail(
            key,
            format!("the CA file is only used when {when}; without it no certificate is checked"),
        );
        return;
    }
    match std::fs::read(path) {
        Err(e) => fail(
            key,
            format!(
                "expected a readable PEM file of CA certificates, but {} cannot be read: {e}",
                path.display()
            ),
        ),
        Ok(bytes) if !String::from_utf8_lossy(&bytes).contains("-----BEGIN CERTIFICATE-----") => {
            fail(
                key,
                format!(
                    "expected PEM CA certificates (`-----BEGIN CERTIFICATE-----`), but {} holds none",
                    path.display()
                ),
            )
        }
        Ok(_) => {}
    }
}
