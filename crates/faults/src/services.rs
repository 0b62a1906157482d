//! Process control of the shared local services (the disruptive scenarios): PostgreSQL's
//! cluster found as `scripts/services.sh` finds it. Run as root (or a user these commands
//! accept), as the services were started. (The broker's process faults are applied to a
//! private node instead: `rabbit_node.rs`.)

use std::time::Duration;

use anyhow::{Context, bail};

/// How long one service command may take.
const COMMAND_WAIT: Duration = Duration::from_secs(120);

/// Runs `program args`, failing with its output when it does not exit 0.
pub async fn command(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let output = tokio::time::timeout(
        COMMAND_WAIT,
        tokio::process::Command::new(program).args(args).output(),
    )
    .await
    .with_context(|| format!("{program} {args:?} did not finish within {COMMAND_WAIT:?}"))?
    .with_context(|| format!("running {program}"))?;
    if !output.status.success() {
        bail!(
            "{program} {args:?}: {}: {}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

/// The Debian cluster (version, name) that listens on the test database's port.
pub async fn pg_cluster() -> anyhow::Result<(String, String)> {
    let url = reqwest::Url::parse(&worker_testkit::database_url())?;
    let port = url.port().unwrap_or(5432).to_string();
    let output = tokio::process::Command::new("pg_lsclusters")
        .arg("-h")
        .output()
        .await
        .context("running pg_lsclusters")?;
    cluster_on_port(&String::from_utf8_lossy(&output.stdout), &port)
        .with_context(|| format!("no PostgreSQL cluster on port {port} in pg_lsclusters"))
}

/// From `pg_lsclusters -h` output, the (version, name) of the cluster on `port`.
fn cluster_on_port(listing: &str, port: &str) -> Option<(String, String)> {
    listing.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.len() >= 3 && fields[2] == port)
            .then(|| (fields[0].to_string(), fields[1].to_string()))
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_cluster_is_found_by_its_port() {
        let listing = "14 old 5433 down postgres /x /y\n15 main 5432 online postgres /a /b\n";
        assert_eq!(
            super::cluster_on_port(listing, "5432"),
            Some(("15".into(), "main".into()))
        );
        assert_eq!(super::cluster_on_port(listing, "6000"), None);
    }
}
