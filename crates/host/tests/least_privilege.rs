//! Least privilege: the host logs in to RabbitMQ as a user of its own that may use its own
//! vhost and nothing else (`scripts/services.sh up` creates it), the default settings use that
//! user rather than guest, and the services script keeps its state only where no one else can
//! write and never writes through a symbolic link.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::path::Path;
use std::process::Command;

use lapin::{Connection, ConnectionProperties};
use worker_testkit::{TestVhost, rabbit_api};

const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
/// The host's own RabbitMQ user and vhost, as `scripts/services.sh` creates them.
const HOST_USER: &str = "worker_host";
const HOST_VHOST: &str = "worker_host";

fn amqp_host() -> String {
    std::env::var("WH_TEST_AMQP_HOST").unwrap_or_else(|_| "127.0.0.1:5672".into())
}

async fn connects(user: &str, password: &str, vhost: &str) -> bool {
    let url = format!("amqp://{user}:{password}@{}/{vhost}", amqp_host());
    match Connection::connect(&url, ConnectionProperties::default()).await {
        Ok(connection) => {
            let _ = connection.close(200, "done".into()).await;
            true
        }
        Err(_) => false,
    }
}

#[tokio::test]
async fn the_host_user_may_use_its_own_vhost_and_no_other() -> anyhow::Result<()> {
    let (base, admin) = rabbit_api()
        .split_once('@')
        .map(|(creds, host)| {
            let creds = creds.trim_start_matches("http://");
            (format!("http://{host}"), creds.to_string())
        })
        .unwrap();
    let (admin_user, admin_password) = admin.split_once(':').unwrap();
    let client = reqwest::Client::new();
    let get = |path: String| {
        client
            .get(format!("{base}/api/{path}"))
            .basic_auth(admin_user, Some(admin_password))
            .send()
    };
    let user: serde_json::Value = get(format!("users/{HOST_USER}"))
        .await?
        .error_for_status()
        .map_err(|e| anyhow::anyhow!("no user {HOST_USER}: run scripts/services.sh up ({e})"))?
        .json()
        .await?;
    let tags = user["tags"].to_string();
    assert!(
        !tags.contains("administrator") && !tags.contains("management"),
        "the host's user has no management tag: {user}"
    );
    let permissions: Vec<serde_json::Value> = get(format!("users/{HOST_USER}/permissions"))
        .await?
        .json()
        .await?;
    let vhosts: Vec<&str> = permissions
        .iter()
        .filter_map(|p| p["vhost"].as_str())
        .collect();
    assert_eq!(vhosts, [HOST_VHOST], "{permissions:?}");
    let own = &permissions[0];
    for right in ["configure", "write", "read"] {
        assert_eq!(own[right], ".*", "{right} on its own vhost: {own}");
    }

    assert!(connects(HOST_USER, "worker_host", HOST_VHOST).await);
    let other = TestVhost::create().await?;
    assert!(
        !connects(HOST_USER, "worker_host", &other.name).await,
        "the host's user got into another vhost"
    );
    Ok(())
}

#[test]
fn the_default_settings_log_in_as_the_host_user_not_guest() {
    let output = Command::new(env!("CARGO_BIN_EXE_worker-host"))
        .args(["config", "check"])
        .current_dir(REPO)
        .env_remove("WORKER_HOST_CONFIG")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0));
    let printed: toml::Table = toml::from_str(&String::from_utf8_lossy(&output.stdout)).unwrap();
    let broker = &printed["broker"];
    assert_eq!(broker["username"].as_str(), Some(HOST_USER));
    assert_eq!(broker["vhost"].as_str(), Some(HOST_VHOST));
}

/// `scripts/services.sh up` with its state in `dir`; its exit code and stderr.
fn services_up(dir: &Path) -> (Option<i32>, String) {
    let output = Command::new("bash")
        .arg(Path::new(REPO).join("scripts/services.sh"))
        .arg("up")
        .env("WH_SERVICES_DIR", dir)
        .output()
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn the_services_script_refuses_a_state_folder_that_is_a_link() {
    let scratch = tempfile::tempdir().unwrap();
    let elsewhere = scratch.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let link = scratch.path().join("services");
    std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
    let (code, stderr) = services_up(&link);
    assert_ne!(code, Some(0), "{stderr}");
    assert!(stderr.contains("symbolic link"), "{stderr}");
    assert_eq!(
        std::fs::read_dir(&elsewhere).unwrap().count(),
        0,
        "nothing was written where the link points"
    );
}

#[test]
fn the_services_script_refuses_a_state_folder_others_own() {
    let scratch = tempfile::tempdir().unwrap();
    let foreign = scratch.path().join("services");
    std::fs::create_dir(&foreign).unwrap();
    // As root the folder is given to nobody; as anyone else, /tmp's owner (root) owns it.
    let foreign = if nix_is_root() {
        let status = Command::new("chown")
            .args(["nobody"])
            .arg(&foreign)
            .status()
            .unwrap();
        assert!(status.success());
        foreign
    } else {
        std::env::temp_dir()
    };
    let (code, stderr) = services_up(&foreign);
    assert_ne!(code, Some(0), "{stderr}");
    assert!(stderr.contains("refusing"), "{stderr}");
}

fn nix_is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}
