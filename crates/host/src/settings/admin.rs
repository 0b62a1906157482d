//! `[admin]`: the admin endpoints, the operator's console, and how operators' passwords are
//! hashed.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::secret::Secret;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminSettings {
    pub enabled: bool,
    /// Where `/healthz`, `/readyz`, `/status`, `/metrics` and the console listen. On loopback
    /// the console's pages need no sign-in; anywhere else every page does, and the host
    /// refuses to start without an `operator_token`.
    pub listen: SocketAddr,
    /// The secret an operator signs in to the console with, to act (replay, purge, retry,
    /// pause, run now). Unset: the console is read-only and says so.
    pub operator_token: Option<Secret>,
    pub operator_token_file: Option<PathBuf>,
    /// How long a console session lasts after its last use.
    #[serde(with = "humantime_serde")]
    pub session_idle: Duration,
    /// The argon2id parameters `worker-host operators` hashes new passwords with (a stored
    /// hash keeps its own).
    pub password_hashing: PasswordHashing,
    /// The console's own database connections (besides `database.max_connections`), so
    /// that no page or bulk action can starve the jobs.
    pub console_connections: u32,
    /// The rate a bulk replay or purge offers first, in messages per second.
    pub bulk_rate: u32,
}

impl Default for AdminSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            listen: SocketAddr::from(([127, 0, 0, 1], 9180)),
            operator_token: None,
            operator_token_file: None,
            session_idle: Duration::from_secs(8 * 3600),
            password_hashing: PasswordHashing::default(),
            console_connections: 4,
            bulk_rate: 50,
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
