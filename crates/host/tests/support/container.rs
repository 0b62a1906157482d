//! The deployment tests' side of a container engine (podman or docker, as `scripts/image.sh`
//! chose it): the artefacts the scripts built, named by environment variables, commands with
//! a bound, and containers removed when dropped.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};

/// The repository's root.
pub fn repo_root() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).to_path_buf()
}

/// The value of `var`, which `script --print-env` prints; a test that needs it fails when it
/// is missing, so that a run without the artefact never passes by skipping.
pub fn required_env(var: &str, script: &str) -> String {
    match std::env::var(var) {
        Ok(value) if !value.trim().is_empty() => value,
        _ => panic!(
            "{var} is not set: this test needs what {script} builds; build it first with \
             `eval \"$({script} --binary target/debug/worker-host --print-env)\"` \
             (docs/DEPLOYMENT.md, \"Testing the deployment\")"
        ),
    }
}

/// The engine `scripts/image.sh` used (`WH_TEST_ENGINE`, which it prints), podman if unset.
pub fn engine() -> String {
    std::env::var("WH_TEST_ENGINE").unwrap_or_else(|_| "podman".to_string())
}

pub fn is_podman() -> bool {
    engine() == "podman"
}

/// `program` with podman's settings as `scripts/image.sh` chooses them: the machine's own
/// (`/etc/containers/containers.conf`, or `CONTAINERS_CONF` when set), else this repository's
/// `deploy/podman/containers.conf`.
pub fn with_podman_settings(program: &str) -> Command {
    let mut command = Command::new(program);
    if std::env::var_os("CONTAINERS_CONF").is_none()
        && !Path::new("/etc/containers/containers.conf").exists()
    {
        command.env(
            "CONTAINERS_CONF",
            repo_root().join("deploy/podman/containers.conf"),
        );
    }
    command
}

/// A command of the engine.
pub fn engine_command() -> Command {
    with_podman_settings(&engine())
}

/// Runs `command` to its end, at most `limit`; fails naming `what` if it could not start or
/// took longer (it is killed then).
pub async fn output_within(
    what: &str,
    command: Command,
    limit: Duration,
) -> anyhow::Result<Output> {
    let mut command = tokio::process::Command::from(command);
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = command
        .spawn()
        .with_context(|| format!("{what}: cannot start it"))?;
    match tokio::time::timeout(limit, child.wait_with_output()).await {
        Ok(output) => output.with_context(|| format!("{what}: waiting for it")),
        Err(_) => bail!("{what}: not done within {limit:?}"),
    }
}

/// [`output_within`], then a failure naming `what`, the exit status and both outputs unless
/// it exited 0; returns the standard output.
pub async fn succeed(what: &str, command: Command, limit: Duration) -> anyhow::Result<String> {
    let output = output_within(what, command, limit).await?;
    if !output.status.success() {
        bail!(
            "{what}: {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// `engine ARGS`, which must succeed; its standard output.
pub async fn engine_ok(args: &[&str], limit: Duration) -> anyhow::Result<String> {
    let mut command = engine_command();
    command.args(args);
    succeed(&format!("{} {}", engine(), args.join(" ")), command, limit).await
}

/// The JSON of `engine inspect` for one object (an image or a container).
pub async fn inspect(kind: &str, name: &str) -> anyhow::Result<serde_json::Value> {
    let text = engine_ok(&[kind, "inspect", name], Duration::from_secs(30)).await?;
    let mut all: Vec<serde_json::Value> =
        serde_json::from_str(&text).with_context(|| format!("{kind} inspect {name}: {text}"))?;
    if all.len() != 1 {
        bail!("{kind} inspect {name}: {} objects, expected one", all.len());
    }
    Ok(all.remove(0))
}

/// A unique container name for this test run.
pub fn container_name(test: &str) -> String {
    format!("wh-test-{test}-{}", super::short_id())
}

/// A container that is removed (killed if need be) when this is dropped, so that no test
/// leaves one behind, passed or failed.
#[derive(Debug)]
pub struct ContainerGuard {
    pub name: String,
}

impl ContainerGuard {
    pub fn new(name: String) -> Self {
        Self { name }
    }

    /// What the container printed, for failure messages.
    pub fn logs(&self) -> String {
        let mut command = engine_command();
        command.args(["logs", "--tail", "80", &self.name]);
        match command.output() {
            Ok(out) => format!(
                "--- the container's last output ---\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => format!("(its logs could not be read: {e})"),
        }
    }
}

impl Drop for ContainerGuard {
    fn drop(&mut self) {
        let mut command = engine_command();
        command.args(["rm", "--force"]);
        // Podman would give a running container its stop timeout first; docker kills at once.
        if is_podman() {
            command.args(["--time", "0"]);
        }
        command
            .arg(&self.name)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let _ = command.status();
    }
}
