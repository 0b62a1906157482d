//! The host on a database with a standby (`database.hosts`, the kit's private replica set):
//! `config check` says which member is primary; `run` writes to the primary though the
//! standby is listed first; when the primary is killed `/readyz` says "no primary", and once
//! the standby is promoted the host is ready again on it. `upgrade check` and `migrate` on a
//! standby (one `database.host`) say it is one, and change nothing.
//!
//! Needs Debian's PostgreSQL server binaries (as the kit's clusters do); skipped without.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use worker_testkit::wait::eventually;
use worker_testkit::{PgReplicaSet, Replication, TestVhost};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The host on `hosts` (the `worker_host` role and database of the set) and the test's
/// vhost, on a free admin port.
fn host(hosts: &[String], vhost: &TestVhost, admin_port: u16, args: &[&str]) -> Command {
    let list = hosts
        .iter()
        .map(|h| format!("\"{h}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let mut command = host_on(vhost, admin_port, args);
    command.env("WORKER_HOST__DATABASE__HOSTS", format!("[{list}]"));
    command
}

/// The host on the test's vhost, on a free admin port, its database to be given.
fn host_on(vhost: &TestVhost, admin_port: u16, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_worker-host"));
    command
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .env_remove("WORKER_HOST_CONFIG")
        .env("WORKER_HOST__DATABASE__NAME", "worker_host")
        .env("WORKER_HOST__DATABASE__USERNAME", "worker_host")
        .env("WORKER_HOST__DATABASE__PASSWORD", "worker_host")
        .env("WORKER_HOST__DATABASE__CONNECT_ATTEMPTS", "3")
        .env("WORKER_HOST__JOBS__DB_HEALTH__SCHEDULE", "every 1s")
        .env("WORKER_HOST__BROKER__VHOST", &vhost.name)
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

async fn get_json(url: &str) -> anyhow::Result<(u16, serde_json::Value)> {
    let response = reqwest::get(url).await?;
    let status = response.status().as_u16();
    Ok((status, response.json().await?))
}

/// Stops the host when the test ends, passed or not.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_writes_to_the_primary_says_no_primary_and_follows_a_promotion()
-> anyhow::Result<()> {
    if !std::path::Path::new("/usr/lib/postgresql").exists() {
        eprintln!("no PostgreSQL server binaries: skipped");
        return Ok(());
    }
    let mut set = PgReplicaSet::start(Replication::Asynchronous, None).await?;
    let vhost = TestVhost::create().await?;
    let members = set.hosts();
    // The standby (pg-b) first: the host must pass it by.
    let listed = [members[1].clone(), members[0].clone()];

    let check = host(&listed, &vhost, free_port(), &["config", "check"]).output()?;
    let shown = String::from_utf8_lossy(&check.stdout);
    assert_eq!(check.status.code(), Some(0), "{shown}");
    assert!(
        shown.contains(&format!("#   {}: a standby (read-only)", listed[0])),
        "{shown}"
    );
    assert!(
        shown.contains(&format!("#   {}: the primary", listed[1])),
        "{shown}"
    );

    let port = free_port();
    let _host = Running(
        host(&listed, &vhost, port, &["run"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
    );
    let readyz = format!("http://127.0.0.1:{port}/readyz");
    let status_url = format!("http://127.0.0.1:{port}/status");
    let ready = |want: bool| {
        let readyz = readyz.clone();
        move || {
            let readyz = readyz.clone();
            async move {
                let (code, body) = get_json(&readyz).await?;
                Ok(((code == 200) == want).then_some(body))
            }
        }
    };
    eventually("/readyz 200", Duration::from_secs(60), ready(true)).await?;
    let (_, status) = get_json(&status_url).await?;
    assert_eq!(
        status["database"]["primary"],
        listed[1].as_str(),
        "{status}"
    );
    assert_eq!(
        status["database"]["members"],
        serde_json::json!(listed),
        "{status}"
    );
    assert_eq!(
        status["database"]["member_answers"][0]["role"], "standby",
        "{status}"
    );

    set.kill_primary().await?;
    // At once the probe fails (connection refused); within the follower's check, readiness
    // says why: no member takes writes.
    let body = eventually(
        "/readyz 503 saying no primary",
        Duration::from_secs(30),
        || {
            let readyz = readyz.clone();
            async move {
                let (code, body) = get_json(&readyz).await?;
                let why = body["checks"]["database"]["error"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                Ok((code == 503 && why.contains("no primary")).then_some(body))
            }
        },
    )
    .await?;
    let why = body["checks"]["database"]["error"].to_string();
    assert!(why.contains(&listed[0]), "each member's answer: {why}");

    set.promote_standby().await?;
    let promoted = Instant::now();
    eventually(
        "/readyz 200 on the promoted member",
        Duration::from_secs(30),
        ready(true),
    )
    .await?;
    eprintln!("ready again {:?} after the promotion", promoted.elapsed());
    let (_, status) = get_json(&status_url).await?;
    assert_eq!(
        status["database"]["primary"],
        listed[0].as_str(),
        "{status}"
    );
    assert_eq!(status["database"]["primary_switches"], 1, "{status}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_check_and_migrate_on_a_standby_say_so_and_change_nothing() -> anyhow::Result<()> {
    if !std::path::Path::new("/usr/lib/postgresql").exists() {
        eprintln!("no PostgreSQL server binaries: skipped");
        return Ok(());
    }
    let set = PgReplicaSet::start(Replication::Asynchronous, None).await?;
    let vhost = TestVhost::create().await?;
    for args in [&["upgrade", "check"][..], &["migrate"][..]] {
        let output = host_on(&vhost, free_port(), args)
            .env("WORKER_HOST__DATABASE__HOST", "127.0.0.1")
            .env(
                "WORKER_HOST__DATABASE__PORT",
                set.standby().port.to_string(),
            )
            .output()?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(69), "{args:?}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "127.0.0.1:{} is a standby (read-only, in recovery)",
                set.standby().port
            )),
            "{args:?}: {stderr}"
        );
        assert!(
            !stderr.contains("read-only transaction"),
            "{args:?}: {stderr}"
        );
    }
    // Nothing was migrated: the primary has no migrations table yet.
    let mut primary = <sqlx::PgConnection as sqlx::Connection>::connect(&set.admin_url()).await?;
    let migrated: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(&mut primary)
        .await?;
    assert!(!migrated);
    Ok(())
}
