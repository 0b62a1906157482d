//! The host on the real services: it comes up until `/readyz` answers 200, SIGTERM stops it
//! with exit 0; an unreachable server ends the start with a message naming it.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use worker_testkit::{TestDb, TestVhost};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The host, configured for this test's own database and vhost, on a free admin port.
fn host(db: &TestDb, vhost: &TestVhost, admin_port: u16, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_worker-host"));
    command
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .env_remove("WORKER_HOST_CONFIG")
        .env("WORKER_HOST__DATABASE__NAME", &db.name)
        .env("WORKER_HOST__BROKER__VHOST", &vhost.name)
        // The test's vhost grants guest, who created it; the default file's user is the host's.
        .env("WORKER_HOST__BROKER__USERNAME", "guest")
        .env("WORKER_HOST__BROKER__PASSWORD", "guest")
        .env(
            "WORKER_HOST__ADMIN__LISTEN",
            format!("127.0.0.1:{admin_port}"),
        )
        .env("WORKER_HOST__WORKERS__SHUTDOWN_GRACE", "5s")
        .env("RUST_LOG", "info");
    command
}

async fn get(url: &str) -> Option<(u16, String)> {
    let response = reqwest::get(url).await.ok()?;
    let status = response.status().as_u16();
    Some((status, response.text().await.unwrap_or_default()))
}

fn terminate(child: &Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
}

fn wait_exit(child: &mut Child, limit: Duration) -> Option<i32> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return status.code();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    None
}

#[tokio::test]
async fn the_host_becomes_ready_and_stops_cleanly_on_sigterm() -> anyhow::Result<()> {
    let db = TestDb::create_empty().await?;
    let vhost = TestVhost::create().await?;
    let port = free_port();
    let mut child = host(&db, &vhost, port, &["run"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;

    let healthz = format!("http://127.0.0.1:{port}/healthz");
    let readyz = format!("http://127.0.0.1:{port}/readyz");
    let deadline = Instant::now() + Duration::from_secs(60);
    let body = loop {
        if let Some((200, body)) = get(&readyz).await {
            break body;
        }
        if let Ok(Some(status)) = child.try_wait() {
            let mut stderr = String::new();
            use std::io::Read;
            child
                .stderr
                .take()
                .map(|mut s| s.read_to_string(&mut stderr));
            panic!("the host exited with {status} before it was ready: {stderr}");
        }
        assert!(Instant::now() < deadline, "/readyz never answered 200");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let body: serde_json::Value = serde_json::from_str(&body)?;
    assert_eq!(body["checks"]["database"]["status"], "up");
    assert_eq!(body["checks"]["broker"]["status"], "up");
    assert_eq!(get(&healthz).await.map(|(s, _)| s), Some(200));
    let (_, status) = get(&format!("http://127.0.0.1:{port}/status"))
        .await
        .expect("/status answers");
    let status: serde_json::Value = serde_json::from_str(&status)?;
    assert_eq!(status["release"], env!("CARGO_PKG_VERSION"), "{status}");
    assert!(status["revision"].is_string(), "{status}");
    // What a container's HEALTHCHECK runs: the binary asks its own /readyz.
    let health = host(&db, &vhost, port, &["health"]).output()?;
    assert_eq!(
        health.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&health.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&health.stdout).trim(), "ready");

    // `run` declared the topology: every consumer queue with its dead letters.
    for queue in [
        "automation.trigger",
        "automation.action",
        "email.send",
        "email.send.dead",
    ] {
        let info = vhost
            .api(
                reqwest::Method::GET,
                &format!("queues/{{vhost}}/{queue}"),
                None,
            )
            .await?;
        assert_eq!(info["name"], queue);
    }
    let info = vhost
        .api(reqwest::Method::GET, "queues/{vhost}/email.send", None)
        .await?;
    assert_eq!(info["arguments"]["x-queue-type"], "quorum");
    assert_eq!(info["arguments"]["x-delivery-limit"], 5);

    // `run` applied the migrations to the empty database.
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations")
        .fetch_one(&db.pool)
        .await?;
    assert!(applied >= 1);

    terminate(&child);
    let code =
        tokio::task::spawn_blocking(move || wait_exit(&mut child, Duration::from_secs(15))).await?;
    assert_eq!(
        code,
        Some(0),
        "SIGTERM must stop the host cleanly with exit 0"
    );
    Ok(())
}

#[tokio::test]
async fn an_unreachable_database_ends_the_start_naming_the_server() -> anyhow::Result<()> {
    let port = free_port();
    let output = Command::new(env!("CARGO_BIN_EXE_worker-host"))
        .arg("run")
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .env_remove("WORKER_HOST_CONFIG")
        .env("WORKER_HOST__DATABASE__PORT", free_port().to_string())
        .env("WORKER_HOST__DATABASE__CONNECT_ATTEMPTS", "2")
        .env("WORKER_HOST__ADMIN__LISTEN", format!("127.0.0.1:{port}"))
        .output()?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(69), "{stderr}");
    assert!(stderr.contains("PostgreSQL at 127.0.0.1:"), "{stderr}");
    assert!(stderr.contains("after 2 attempts"), "{stderr}");
    Ok(())
}

#[tokio::test]
async fn an_unreachable_broker_ends_the_start_naming_the_server() -> anyhow::Result<()> {
    let db = TestDb::create_empty().await?;
    let broker_port = free_port();
    let output = Command::new(env!("CARGO_BIN_EXE_worker-host"))
        .arg("run")
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .env_remove("WORKER_HOST_CONFIG")
        .env("WORKER_HOST__DATABASE__NAME", &db.name)
        .env("WORKER_HOST__BROKER__PORT", broker_port.to_string())
        .env("WORKER_HOST__BROKER__CONNECT_ATTEMPTS", "2")
        .env(
            "WORKER_HOST__ADMIN__LISTEN",
            format!("127.0.0.1:{}", free_port()),
        )
        .output()?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(69), "{stderr}");
    assert!(
        stderr.contains(&format!("RabbitMQ at 127.0.0.1:{broker_port}")),
        "{stderr}"
    );
    Ok(())
}

/// `worker-host health` with no host answering: exit 1 (what a health check takes as
/// unhealthy), naming the address it asked.
#[tokio::test]
async fn health_without_a_host_is_unhealthy_and_says_where_it_asked() -> anyhow::Result<()> {
    let db = TestDb::create_empty().await?;
    let vhost = TestVhost::create().await?;
    let port = free_port();
    let output = host(&db, &vhost, port, &["health"]).output()?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "no host answers at http://127.0.0.1:{port}/readyz"
        )),
        "{stderr}"
    );
    Ok(())
}

/// `worker-host --version`: the workspace's version and the git commit it was built from (a
/// commit of this repository's history: HEAD when built, an ancestor of it if a commit came
/// since).
#[test]
fn the_version_names_the_release_and_the_revision() {
    let output = Command::new(env!("CARGO_BIN_EXE_worker-host"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(output.status.success());
    let stdout = String::from_utf8_lossy(&output.stdout).trim().to_string();
    let prefix = format!("worker-host {} (revision ", env!("CARGO_PKG_VERSION"));
    let revision = stdout
        .strip_prefix(&prefix)
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or_else(|| panic!("`{stdout}` is `{prefix}<commit>)`"));
    assert!(
        revision.len() == 40 && revision.chars().all(|c| c.is_ascii_hexdigit()),
        "a whole commit id: {revision}"
    );
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .unwrap()
            .success()
    };
    assert!(
        git(&["merge-base", "--is-ancestor", revision, "HEAD"]),
        "{revision} is HEAD or one of its ancestors"
    );
}
