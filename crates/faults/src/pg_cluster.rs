//! The fault suite's use of a private PostgreSQL cluster ([`worker_testkit::PgCluster`]): one
//! per database scenario, its log kept in the scenario's folder, the host pointed at it.

use std::path::Path;

pub use worker_testkit::PgCluster;

use crate::run::Setup;

/// A cluster for a scenario.
pub trait ForScenario: Sized {
    /// Starts a cluster for a scenario whose folder is `dir` (its server log is kept there as
    /// `postgres.log`), says how long it took, and returns it with the host's [`Setup`]: the
    /// scenario's database on this cluster, the host pointed at its port.
    async fn for_scenario(dir: &Path) -> anyhow::Result<(Self, Setup)>;
}

impl ForScenario for PgCluster {
    async fn for_scenario(dir: &Path) -> anyhow::Result<(Self, Setup)> {
        std::fs::create_dir_all(dir)?;
        let cluster = Self::start(Some(dir.join("postgres.log"))).await?;
        eprintln!(
            "faults: private PostgreSQL on 127.0.0.1:{} ready in {:.2} s (initdb, start, role)",
            cluster.port,
            cluster.startup.as_secs_f64()
        );
        let setup = Setup {
            env: vec![(
                "WORKER_HOST__DATABASE__PORT".into(),
                cluster.port.to_string(),
            )],
            database_admin_url: Some(cluster.admin_url()),
            ..Setup::default()
        };
        Ok((cluster, setup))
    }
}
