//! The container image that `scripts/image.sh` builds, run as an installation runs it: a
//! read-only root file system with no tmpfs, the host network, a settings file mounted in,
//! its own database, vhost and IMAP account on the local services, the demo's automation.
//! It must become healthy through its HEALTHCHECK, answer a ping mail, run as its own user
//! and stop with exit code 0 within `workers.shutdown_grace` on SIGTERM.
//!
//! The image comes from `WH_TEST_IMAGE` (and the engine from `WH_TEST_ENGINE`), which
//! `scripts/image.sh --print-env` prints; without it these tests fail, saying so.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use anyhow::Context;
use support::container::{
    ContainerGuard, container_name, engine, engine_command, engine_ok, inspect, is_podman,
    output_within, repo_root, required_env, succeed,
};
use support::{
    SERIAL, WAIT, base_settings, free_port, inbox, mail_account_settings, send_mail, short_id,
    wait_for, write_automation,
};
use worker_testkit::{TestDb, TestVhost};

/// `workers.shutdown_grace` in [`base_settings`].
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// What `podman stop` / `docker stop` waits before SIGKILL: well past the grace, so that a
/// host that does not drain in time is seen exiting late, or killed (137), never hidden.
const STOP_TIMEOUT_SECS: &str = "20";
/// The image's user (Dockerfile: `USER 10001:10001`).
const IMAGE_UID: &str = "10001";

fn image() -> String {
    required_env("WH_TEST_IMAGE", "scripts/image.sh")
}

/// `state.Health.Status` (docker, and podman's docker-compatible field) or
/// `state.Healthcheck.Status` (podman's own).
fn health_status(container: &serde_json::Value) -> Option<String> {
    let state = &container["State"];
    state["Health"]["Status"]
        .as_str()
        .or_else(|| state["Healthcheck"]["Status"].as_str())
        .map(str::to_string)
}

/// Runs the image's HEALTHCHECK once: podman runs it on demand (without systemd nothing
/// runs it on its interval); docker runs it itself, so its state is read.
async fn healthcheck_passes(guard: &ContainerGuard) -> anyhow::Result<Option<()>> {
    if is_podman() {
        let mut command = engine_command();
        command.args(["healthcheck", "run", &guard.name]);
        let output =
            output_within("podman healthcheck run", command, Duration::from_secs(30)).await?;
        if output.status.success() {
            return Ok(Some(()));
        }
        anyhow::bail!(
            "podman healthcheck run: {} {}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let container = inspect("container", &guard.name).await?;
    Ok((health_status(&container).as_deref() == Some("healthy")).then_some(()))
}

/// The ids on one line (`Uid:` or `Gid:`) of the container's PID 1's /proc status.
fn ids_of(status: &str, field: &str) -> Vec<String> {
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .map(|ids| ids.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_runs_read_only_as_its_user_answers_a_ping_and_stops_on_sigterm_with_exit_0()
-> anyhow::Result<()> {
    let image = image();
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let db = TestDb::create_empty().await?;
    let vhost = TestVhost::create().await?;
    let id = short_id();
    let account = format!("container-{id}");
    let sender = format!("sender-container-{id}");
    let port = free_port();

    // The settings and the automation, mounted read-only at the same path; readable by the
    // image's user, who is not the one running this test.
    let dir = tempfile::tempdir()?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
    let automations = write_automation(dir.path())?;
    let mut settings = base_settings("container-test", &automations, &db, &vhost, port);
    settings.push_str(&mail_account_settings(&account));
    let config = dir.path().join("worker-host.toml");
    std::fs::write(&config, settings)?;
    for file in [&config, &dir.path().join("automations.toml")] {
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o644))?;
    }
    let mount = format!("{0}:{0}:ro", dir.path().display());
    let config_env = format!("WORKER_HOST_CONFIG={}", config.display());

    let guard = ContainerGuard::new(container_name("run"));
    let mut run = vec![
        "run",
        "--detach",
        "--name",
        &guard.name,
        "--read-only",
        "--network",
        "host",
        "--volume",
        &mount,
        "--env",
        &config_env,
    ];
    // Podman mounts tmpfs on /tmp, /var/tmp and /run under --read-only unless told not to;
    // docker mounts none. Without any, a host that wrote a file would fail here.
    if is_podman() {
        run.push("--read-only-tmpfs=false");
    }
    run.push(&image);
    engine_ok(&run, WAIT).await?;

    let readyz = format!("http://127.0.0.1:{port}/readyz");
    let readyz_ref = readyz.as_str();
    let guard_ref = &guard;
    wait_for(
        "the containerised host's /readyz to answer 200",
        || guard_ref.logs(),
        || async move {
            let container = inspect("container", &guard_ref.name).await?;
            if container["State"]["Running"] != serde_json::json!(true) {
                anyhow::bail!("the container is not running: {}", container["State"]);
            }
            let status = reqwest::Client::new()
                .get(readyz_ref)
                .timeout(Duration::from_secs(5))
                .send()
                .await?
                .status();
            Ok((status == 200).then_some(()))
        },
    )
    .await;
    eprintln!("ready {:?} after the start", started.elapsed());

    wait_for(
        "the image's HEALTHCHECK (worker-host health) to pass",
        || guard_ref.logs(),
        || healthcheck_passes(guard_ref),
    )
    .await;
    let container = inspect("container", &guard.name).await?;
    assert_eq!(
        health_status(&container).as_deref(),
        Some("healthy"),
        "the engine records the check: {}",
        container["State"]
    );
    assert_eq!(
        container["HostConfig"]["ReadonlyRootfs"],
        serde_json::json!(true),
        "run with --read-only"
    );

    // PID 1 is the host, as the image's user; the root file system takes no write, /tmp too.
    let status = engine_ok(&["exec", &guard.name, "cat", "/proc/1/status"], WAIT).await?;
    assert!(
        status.lines().any(|l| l == "Name:\tworker-host"),
        "PID 1 is the host:\n{status}"
    );
    assert_eq!(ids_of(&status, "Uid:"), vec![IMAGE_UID; 4], "{status}");
    assert_eq!(ids_of(&status, "Gid:"), vec![IMAGE_UID; 4], "{status}");
    // The broker's TLS trusts the system's CA certificates (rustls-native-certs).
    engine_ok(
        &[
            "exec",
            &guard.name,
            "test",
            "-s",
            "/etc/ssl/certs/ca-certificates.crt",
        ],
        WAIT,
    )
    .await
    .context("the image has no CA certificates (/etc/ssl/certs/ca-certificates.crt)")?;
    let mut write = engine_command();
    write.args([
        "exec",
        &guard.name,
        "sh",
        "-c",
        "echo probe > /tmp/write-probe",
    ]);
    let write = output_within("a write to /tmp in the container", write, WAIT).await?;
    assert!(
        !write.status.success(),
        "/tmp must be read-only in this run, so that the host is seen to write nothing"
    );

    // The whole loop through the container: the ping to its mailbox is answered.
    let subject = format!("ping to the container {id}");
    let message_id = send_mail(
        &format!("{sender}@localhost"),
        &format!("{account}@localhost"),
        &subject,
        "container.test",
    )
    .await?;
    let sent_at = Instant::now();
    let sender_ref = sender.as_str();
    let mails = wait_for(
        "the reply to the ping in the sender's INBOX",
        || guard_ref.logs(),
        || async move {
            let mails = inbox(sender_ref).await?;
            Ok((!mails.is_empty()).then_some(mails))
        },
    )
    .await;
    eprintln!("reply read {:?} after the ping", sent_at.elapsed());
    assert_eq!(mails.len(), 1, "one reply: {mails:?}");
    assert_eq!(
        mails[0].subject.as_deref(),
        Some(format!("Re: {subject}").as_str())
    );
    assert_eq!(mails[0].in_reply_to, vec![message_id]);

    // SIGTERM (the image's STOPSIGNAL) to PID 1: a drain within the grace, then exit 0.
    let stop_at = Instant::now();
    engine_ok(
        &["stop", "--time", STOP_TIMEOUT_SECS, &guard.name],
        Duration::from_secs(60),
    )
    .await?;
    let stopped_in = stop_at.elapsed();
    let container = inspect("container", &guard.name).await?;
    eprintln!(
        "stopped in {stopped_in:?}, exit code {}; test done in {:?}",
        container["State"]["ExitCode"],
        started.elapsed()
    );
    assert_eq!(
        container["State"]["ExitCode"],
        serde_json::json!(0),
        "SIGTERM must end the host with exit code 0: {}\n{}",
        container["State"],
        guard.logs()
    );
    assert!(
        stopped_in < SHUTDOWN_GRACE,
        "the stop took {stopped_in:?}, not within workers.shutdown_grace ({SHUTDOWN_GRACE:?})\n{}",
        guard.logs()
    );
    Ok(())
}

#[tokio::test]
async fn the_image_carries_its_version_and_commit_labels_user_stop_signal_and_healthcheck()
-> anyhow::Result<()> {
    let image = image();
    let found = inspect("image", &image).await?;
    let config = &found["Config"];
    let labels = &config["Labels"];
    let label = |key: &str| -> String {
        labels[format!("org.opencontainers.image.{key}")]
            .as_str()
            .unwrap_or_else(|| panic!("no label org.opencontainers.image.{key}: {labels}"))
            .to_string()
    };
    assert_eq!(label("version"), env!("CARGO_PKG_VERSION"));

    let revision = label("revision");
    // scripts/image.sh labels a prebuilt binary with the commit it says it was built from, and
    // marks an image built from a source tree with changes not committed. That commit is this
    // checkout's HEAD, or an ancestor of it when a commit came after the build.
    let commit = revision.trim_end_matches("-dirty");
    let mut git = std::process::Command::new("git");
    git.arg("-C")
        .arg(repo_root())
        .args(["merge-base", "--is-ancestor", commit, "HEAD"]);
    succeed("git merge-base --is-ancestor", git, WAIT)
        .await
        .with_context(|| {
            format!("the image's revision {revision} is not in this checkout's history: rebuild it with scripts/image.sh")
        })?;
    // The binary in the image says the same (its --version, from build.rs).
    let said = engine_ok(&["run", "--rm", &image, "--version"], WAIT).await?;
    assert_eq!(
        said.trim(),
        format!(
            "worker-host {} (revision {})",
            label("version"),
            revision.trim_end_matches("-dirty")
        )
    );
    chrono::DateTime::parse_from_rfc3339(&label("created")).with_context(|| {
        format!(
            "the created label is no RFC 3339 time: {}",
            label("created")
        )
    })?;
    assert_eq!(
        label("source"),
        "https://github.com/logistics-platform/worker-host"
    );
    assert_eq!(label("licenses"), "Apache-2.0");
    assert_eq!(label("title"), "worker-host");
    assert!(!label("description").is_empty());

    // Podman reports the health check beside Config, docker inside it.
    let healthcheck = if found["Healthcheck"].is_object() {
        &found["Healthcheck"]
    } else {
        &config["Healthcheck"]
    };
    assert_eq!(
        healthcheck["Test"],
        serde_json::json!(["CMD", "/usr/local/bin/worker-host", "health"]),
        "the HEALTHCHECK ({} keeps it only in the docker format): {found}",
        engine()
    );
    assert_eq!(config["User"], serde_json::json!("10001:10001"));
    assert_eq!(config["StopSignal"], serde_json::json!("SIGTERM"));
    assert_eq!(
        config["Entrypoint"],
        serde_json::json!(["/usr/local/bin/worker-host"])
    );
    assert_eq!(config["Cmd"], serde_json::json!(["run"]));
    Ok(())
}
