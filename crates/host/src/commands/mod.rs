//! One file a command of `worker-host`, each with its own grammar (its `…Action`); the command
//! line (`crate::cli`) names them and `crate::cli::execute` runs one.

pub mod actor;
pub mod audit_log;
pub mod automations;
pub use crate::broker_session as broker;
pub mod circuits;
pub mod config;
pub mod dlq;
pub mod fleet;
pub mod health;
pub mod jobs;
pub mod mail;
pub mod mail_auth;
pub mod migrate;
pub mod operators;
pub mod outbox;
pub mod privacy;
pub mod queues;
pub mod replicas;
pub mod status;
pub mod topology;
pub mod upgrade;
