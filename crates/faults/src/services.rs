//! Process control of the shared local services (the disruptive scenarios): RabbitMQ through
//! `rabbitmqctl`. Run as root (or a user these commands accept), as the services were started.
//! (The PostgreSQL scenarios restart a private cluster of their own: `pg_cluster.rs`.)

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
