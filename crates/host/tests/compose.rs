//! docker-compose.yml's host service as the compose tool here reads it: `podman-compose
//! --dry-run up -d worker-host` must parse the file and print the `podman run` of the host
//! with its settings file mounted read-only and its environment.
//!
//! podman-compose 1.0.3's dry run is not free of effects: it really creates the project's
//! network and named volumes (it only prints the `run`s and `build`s). The test gives it a
//! project name of its own and removes both afterwards, passed or failed.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::process::Stdio;
use std::time::Duration;

use support::container::{repo_root, succeed, with_podman_settings};
use support::short_id;

/// Removes what the dry run of project `project` created, when dropped.
struct ComposeProjectGuard {
    project: String,
}

impl Drop for ComposeProjectGuard {
    fn drop(&mut self) {
        for (kind, name) in [
            ("network", format!("{}_default", self.project)),
            ("volume", format!("{}_mail", self.project)),
        ] {
            let mut command = with_podman_settings("podman");
            command
                .args([kind, "rm", "--force", &name])
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let _ = command.status();
        }
    }
}

#[tokio::test]
async fn the_compose_files_host_service_runs_with_its_settings_mount_and_environment()
-> anyhow::Result<()> {
    let guard = ComposeProjectGuard {
        project: format!("whcompose{}", short_id()),
    };
    let mut command = with_podman_settings("podman-compose");
    command.current_dir(repo_root()).args([
        "--project-name",
        &guard.project,
        "--dry-run",
        "-f",
        "docker-compose.yml",
        "up",
        "-d",
        "worker-host",
    ]);
    let printed = succeed(
        "podman-compose --dry-run up -d worker-host (install it with scripts/deploy-tools.sh)",
        command,
        Duration::from_secs(60),
    )
    .await?;

    let host_run = printed
        .lines()
        .find(|line| {
            line.starts_with("podman run ")
                && line.contains(&format!("--name={}_worker-host_1", guard.project))
        })
        .unwrap_or_else(|| panic!("no `podman run` of the host service:\n{printed}"));
    let repo = repo_root().canonicalize()?;
    for expected in [
        format!(
            "-v {}/config/worker-host.compose.toml:/etc/worker-host/worker-host.toml:ro",
            repo.display()
        ),
        "-e WORKER_HOST_CONFIG=/etc/worker-host/worker-host.toml".to_string(),
        "-e WORKER_HOST__DATABASE__PASSWORD=worker_host".to_string(),
        "-e WORKER_HOST__BROKER__PASSWORD=worker_host".to_string(),
        "-e WORKER_HOST__ADMIN__OPERATOR_TOKEN=compose-dev-operator-token".to_string(),
        "-p 127.0.0.1::9180".to_string(),
        "--read-only".to_string(),
    ] {
        assert!(
            host_run.contains(&expected),
            "the host's run lacks `{expected}`:\n{host_run}"
        );
    }
    assert!(
        host_run.ends_with(&format!(" {}_worker-host", guard.project)),
        "the host runs the image the compose file builds:\n{host_run}"
    );
    assert!(
        printed.lines().any(|line| line
            == format!(
                "podman build -t {}_worker-host -f ./Dockerfile .",
                guard.project
            )),
        "the host's image is built from the Dockerfile:\n{printed}"
    );
    // Its dependencies come up first (1.0.3 orders them; it does not wait for their health).
    for service in [
        "postgres",
        "rabbitmq",
        "rabbitmq-host-user",
        "dovecot",
        "smtp",
    ] {
        assert!(
            printed.contains(&format!("--name={}_{service}_1", guard.project)),
            "the dependency {service} is started:\n{printed}"
        );
    }
    Ok(())
}
