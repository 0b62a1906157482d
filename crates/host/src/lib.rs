//! The worker host: the one binary deployed per client installation.
//!
//! Only this crate knows the settings file, signals, the telemetry exporters, the admin
//! endpoints and the list of jobs. It loads and validates [`settings::Settings`], sets up
//! [`telemetry`], reaches the database and the broker ([`connections`]), serves the admin
//! endpoints ([`admin`]) and runs until SIGTERM or SIGINT ([`run`]).

pub mod admin;
pub mod alerts;
pub mod cli;
pub mod connections;
pub mod dlq;
pub mod jobs;
pub mod metrics;
pub mod observe;
pub mod run;
pub mod sampler;
pub mod schedule;
pub mod scheduler;
pub mod secret;
pub mod settings;
pub mod status;
pub mod telemetry;

/// Exit codes, after BSD's sysexits: what a supervisor or an operator's script can act on.
pub mod exit {
    /// Bad usage or bad settings.
    pub const USAGE: i32 = 64;
    /// A server the host needs stayed unreachable.
    pub const UNAVAILABLE: i32 = 69;
    /// Anything else that went wrong.
    pub const SOFTWARE: i32 = 70;
}
