//! What every job's settings section shares: the problem type its validation returns, the
//! traits the host composes sections through, and the one TLS mode of mail connections.
//!
//! A job crate owns its section (serde, `Default`, [`Section::validate`]); the host lists the
//! sections, calls each `validate` and puts the section's path in front of every key, as
//! linkerd2-proxy's app config holds `inbound::Config`. Keys here are relative to the section
//! (`timeout`, `drain.batch_size`), so a section does not know where the host puts it.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// One problem with a section's value: the key (relative to the section) and what was wrong
/// and expected. Never the value of a secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingError {
    pub key: String,
    pub problem: String,
}

impl SettingError {
    pub fn new(key: impl Into<String>, problem: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            problem: problem.into(),
        }
    }

    /// The same problem seen from the section that holds this one (`prefix.key`).
    pub fn under(self, prefix: &str) -> Self {
        let key = match (prefix.is_empty(), self.key.is_empty()) {
            (true, _) => self.key,
            (false, true) => prefix.to_string(),
            (false, false) if self.key.starts_with('[') => format!("{prefix}{}", self.key),
            (false, false) => format!("{prefix}.{}", self.key),
        };
        Self { key, ..self }
    }
}

impl std::fmt::Display for SettingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.key.is_empty() {
            f.write_str(&self.problem)
        } else {
            write!(f, "`{}`: {}", self.key, self.problem)
        }
    }
}

/// Collects a section's problems, with the checks every section repeats worded once.
#[derive(Debug, Default)]
pub struct Problems(Vec<SettingError>);

impl Problems {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add(&mut self, key: impl Into<String>, problem: impl Into<String>) {
        self.0.push(SettingError::new(key, problem));
    }

    /// A count or size that must not be 0.
    pub fn positive(&mut self, key: &str, value: u64) {
        if value == 0 {
            self.add(key, "expected a positive number, found 0");
        }
    }

    /// A timeout, interval or age that must not be 0.
    pub fn nonzero(&mut self, key: &str, value: Duration) {
        if value.is_zero() {
            self.add(
                key,
                "expected a duration longer than zero (like `30s`), found 0",
            );
        }
    }

    /// The problems of a section inside this one, under its key.
    pub fn nested(&mut self, prefix: &str, problems: impl IntoIterator<Item = SettingError>) {
        self.0
            .extend(problems.into_iter().map(|problem| problem.under(prefix)));
    }

    pub fn into_vec(self) -> Vec<SettingError> {
        self.0
    }
}

/// A job's settings section.
pub trait Section {
    /// Every problem of the section, each named by its key relative to the section.
    fn validate(&self) -> Vec<SettingError>;
}

/// The section of a timer job: the host adds the schedule around it and bounds each tick
/// with [`TimerSection::timeout`].
pub trait TimerSection: Section {
    /// How often the job ticks when the settings do not say.
    const EVERY: Duration;

    /// The limit of one tick (`run_unit`).
    fn timeout(&self) -> Duration;

    /// What a tick may hold of the shared database pool at once, besides its lease:
    /// connections, and the keys behind them as the host's budget names them. One, for the
    /// tick's work, unless the job says otherwise.
    fn pool_need(&self) -> PoolNeed {
        PoolNeed::new(1, "1 for the tick's work")
    }
}

/// Connections a job may hold of the shared pool at once, and why: either keys of its section
/// (`account_concurrency 4 + 1 for its idle lease`, which the host puts under the section's
/// path) or words alone (`1 for the tick's work`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolNeed {
    pub connections: u32,
    pub why: String,
    /// Whether `why` begins with a key of the section.
    pub keyed: bool,
}

impl PoolNeed {
    pub fn new(connections: u32, why: impl Into<String>) -> Self {
        Self {
            connections,
            why: why.into(),
            keyed: false,
        }
    }

    /// A need that `why`'s leading key of the section sets.
    pub fn keyed(connections: u32, why: impl Into<String>) -> Self {
        Self {
            keyed: true,
            ..Self::new(connections, why)
        }
    }
}

/// How a mail connection (SMTP, IMAP) is secured; `security = "…"` in a section.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TlsMode {
    /// No encryption: for a server on loopback only.
    #[default]
    Plain,
    /// Plain connect, then STARTTLS, which is required (no fallback to plain).
    Starttls,
    /// TLS from the first byte (SMTP's 465, IMAP's 993, usually).
    Tls,
}

impl TlsMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Plain => "plain",
            Self::Starttls => "starttls",
            Self::Tls => "tls",
        }
    }
}

/// What to do about a certificate a TLS client refused, when the refusal (its error chain,
/// as text) is one an operator meets with servers set up by hand.
pub fn certificate_advice(refusal: &str) -> Option<&'static str> {
    if refusal.contains("CaUsedAsEndEntity") {
        // `openssl req -x509` makes a CA certificate; rustls takes none as a server's.
        return Some(
            "the server presents a CA certificate (CA:TRUE, as `openssl req -x509` makes by default) as its own: issue the server a certificate with basicConstraints CA:FALSE signed by that CA, and give the CA as `ca_file`",
        );
    }
    if refusal.contains("UnknownIssuer") {
        return Some(
            "no trusted CA signed the server's certificate: for a private CA, give its certificate as `ca_file`",
        );
    }
    if refusal.contains("NotValidForName") {
        return Some("the certificate does not name this host: connect by a name it holds");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_certificate_used_by_a_server_gets_advice_naming_ca_false() {
        let refusal = "invalid peer certificate: Other(OtherError(CaUsedAsEndEntity))";
        let advice = certificate_advice(refusal).unwrap_or_default();
        assert!(advice.contains("CA:FALSE"), "{advice}");
        assert!(advice.contains("ca_file"), "{advice}");
        assert_eq!(certificate_advice("connection refused"), None);
    }

    #[test]
    fn a_problem_is_named_from_the_section_that_holds_it() {
        let e = SettingError::new("timeout", "x").under("jobs.email_send");
        assert_eq!(e.key, "jobs.email_send.timeout");
        let e = SettingError::new("[2].name", "x").under("imap.accounts");
        assert_eq!(e.key, "imap.accounts[2].name");
        assert_eq!(SettingError::new("", "x").under("jobs.a").key, "jobs.a");
    }

    #[test]
    fn tls_modes_read_as_lowercase_words() {
        for mode in [TlsMode::Plain, TlsMode::Starttls, TlsMode::Tls] {
            let text = serde_json::to_string(&mode).unwrap_or_default();
            assert_eq!(text, format!("\"{}\"", mode.as_str()));
        }
    }
}
