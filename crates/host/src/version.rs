//! What this binary is: the workspace's version and the git revision it was built from
//! (embedded by `build.rs`).

/// The release, as the workspace's `Cargo.toml` names it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit the binary was built from, or `unknown`.
pub const REVISION: &str = env!("WORKER_HOST_REVISION");

/// What `worker-host --version` prints after the binary's name.
pub const LONG: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (revision ",
    env!("WORKER_HOST_REVISION"),
    ")"
);
