//! How the host ends: the exit codes, after BSD's sysexits (what a supervisor or an operator's
//! script can act on), and [`Fatal`], the failure that carries one.

/// `worker-host health`: the host is not ready, or nothing answers (what a container's health
/// check takes as unhealthy).
pub const UNHEALTHY: i32 = 1;
/// Bad usage or bad settings.
pub const USAGE: i32 = 64;
/// A server the host needs stayed unreachable.
pub const UNAVAILABLE: i32 = 69;
/// Anything else that went wrong.
pub const SOFTWARE: i32 = 70;

/// A failure that ends the host or a command, with the exit code it ends with.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Fatal {
    pub code: i32,
    pub message: String,
}

impl Fatal {
    /// Bad usage or settings: the operator's to correct.
    pub fn usage(e: impl std::fmt::Display) -> Self {
        Self::with_code(USAGE, e)
    }

    /// A server stayed unreachable: worth retrying later.
    pub fn unavailable(e: impl std::fmt::Display) -> Self {
        Self::with_code(UNAVAILABLE, e)
    }

    pub fn software(e: impl std::fmt::Display) -> Self {
        Self::with_code(SOFTWARE, e)
    }

    /// A failure of a command's query or action: permanent ones are the operator's to correct
    /// (usage), transient ones worth retrying (unavailable).
    pub fn from_failure(e: worker_core::Failure) -> Self {
        if e.is_permanent() {
            Self::usage(e)
        } else {
            Self::unavailable(e)
        }
    }

    fn with_code(code: i32, e: impl std::fmt::Display) -> Self {
        Self {
            code,
            message: e.to_string(),
        }
    }
}
