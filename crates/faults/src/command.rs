//! A service's command-line tool run to its end (`doveadm`, say), bounded in time and failing
//! with its output.

use std::time::Duration;

use anyhow::{Context, bail};

/// How long one command may take.
const COMMAND_WAIT: Duration = Duration::from_secs(120);

/// Runs `program args`, failing with its output when it does not exit 0.
pub async fn run(program: &str, args: &[&str]) -> anyhow::Result<()> {
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
