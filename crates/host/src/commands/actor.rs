//! Who runs a command that acts: recorded with the action in the audit trail.

use clap::Args;
use worker_store::audit::Actor;

/// Who is acting, beside the operating-system user the host reads itself.
#[derive(Debug, Clone, Args)]
pub struct ActorArgs {
    /// Your name (or a ticket), recorded with the operating-system user in the audit trail.
    #[arg(long = "actor", env = "WORKER_HOST_ACTOR")]
    pub name: Option<String>,
}

/// The operating-system user of the process's user id (not `$USER`, which anyone can set),
/// the host name, and the name given with `--actor`.
pub fn actor(given: &ActorArgs) -> Actor {
    let user = whoami::fallible::username().unwrap_or_else(|_| "unknown".into());
    let host = whoami::fallible::hostname().unwrap_or_else(|_| "unknown".into());
    Actor::new(user, host).with_name(given.name.clone())
}
