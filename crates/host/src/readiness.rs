//! Readiness: what `/readyz` and the service manager's notifications ([`crate::notify`]) both
//! report, so that both say ready on the same condition; every check must pass. Below the
//! admin server, the notifications and the connections that register their checks.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

/// How long one dependency may take to answer a readiness check.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// One dependency readiness depends on: `Ok` when reachable, else why not.
pub trait ReadinessCheck: Send + Sync {
    fn name(&self) -> &'static str;
    fn check(&self) -> futures::future::BoxFuture<'_, Result<(), String>>;
}

/// What readiness depends on: every check must pass. Shared by `/readyz` and the service
/// manager's notifications ([`crate::notify`]), so both say ready on the same condition.
#[derive(Clone)]
pub struct Readiness(Arc<Vec<Box<dyn ReadinessCheck>>>);

/// One reading of [`Readiness`]: ready or not, and each check's state (`/readyz`'s body).
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct ReadinessReport {
    pub ready: bool,
    /// Each check by name: `{"status": "up"}`, or `{"status": "down", "error": ...}`.
    pub checks: serde_json::Map<String, serde_json::Value>,
}

impl ReadinessReport {
    /// The checks that failed and why, in one line (`broker: connection refused`).
    pub fn failures(&self) -> String {
        self.checks
            .iter()
            .filter_map(|(name, value)| {
                let error = value.get("error")?.as_str()?;
                Some(format!("{name}: {error}"))
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

impl std::fmt::Debug for Readiness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<_> = self.0.iter().map(|c| c.name()).collect();
        f.debug_tuple("Readiness").field(&names).finish()
    }
}

impl Readiness {
    pub fn new(checks: Vec<Box<dyn ReadinessCheck>>) -> Self {
        Self(Arc::new(checks))
    }

    /// Runs every check, each bounded by [`CHECK_TIMEOUT`].
    pub async fn check(&self) -> ReadinessReport {
        let mut ready = true;
        let mut checks = serde_json::Map::new();
        for check in self.0.iter() {
            let result = match tokio::time::timeout(CHECK_TIMEOUT, check.check()).await {
                Ok(result) => result,
                Err(_) => Err(format!("no answer within {CHECK_TIMEOUT:?}")),
            };
            let value = match result {
                Ok(()) => json!({"status": "up"}),
                Err(why) => {
                    ready = false;
                    json!({"status": "down", "error": why})
                }
            };
            checks.insert(check.name().to_string(), value);
        }
        ReadinessReport { ready, checks }
    }
}
