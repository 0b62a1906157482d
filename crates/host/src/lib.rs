//! The worker host: the one binary deployed per client installation.
//!
//! Only this crate knows the settings file, signals, the telemetry exporters, the admin
//! endpoints and the list of jobs. It loads and validates [`settings::Settings`], sets up
//! [`telemetry`], reaches the database and the broker ([`connections`]), serves the admin
//! endpoints and the operator's console ([`admin`], [`console`]) and runs until SIGTERM or SIGINT ([`lifecycle`]). Each command of the
//! binary is a file of [`commands`]; [`exit`] holds the exit codes.

pub mod admin;
pub mod alerts;
pub mod broker_session;
pub mod circuits;
pub mod cli;
pub mod commands;
pub mod connections;
pub mod console;
pub mod exit;
pub mod history;
pub mod jobs;
pub mod lifecycle;
pub mod metrics;
pub mod notify;
pub mod observe;
pub use worker_console::open_circuits;
pub use worker_console::parked;
pub mod privacy;
pub mod readiness;
pub mod sampler;
pub mod scheduler;
pub mod schema;
pub use worker_core::secret;
pub mod settings;
pub mod status;
pub mod telemetry;
pub mod topology;
pub mod version;

// The schedules live with the scheduler; `crate::schedule` is the path settings and
// dependants name them by.
pub use scheduler::schedule;
