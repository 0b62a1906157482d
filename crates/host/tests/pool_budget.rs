//! `worker-host config check` refuses settings whose jobs could ask the shared database pool
//! for more connections than `database.max_connections` gives it (exit 64, naming the keys
//! and the numbers), and the shipped defaults fit.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::path::Path;
use std::process::Command;

const SECRETS: &str = "[database]\npassword = \"p\"\n[broker]\npassword = \"q\"\n";

fn config_check_file(path: &Path) -> (i32, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_worker-host"))
        .args(["config", "check", "--config"])
        .arg(path)
        .env_remove("WORKER_HOST_CONFIG")
        .env("WORKER_HOST__DATABASE__PASSWORD", "p")
        .env("WORKER_HOST__BROKER__PASSWORD", "q")
        .output()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn config_check(text: &str) -> (i32, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("worker-host.toml");
    std::fs::write(&path, text).unwrap();
    config_check_file(&path)
}

#[test]
fn a_pool_of_20_for_the_default_concurrency_exits_64_naming_the_keys() {
    let text = SECRETS.replace("[database]\n", "[database]\nmax_connections = 20\n");
    let (code, stdout, stderr) = config_check(&text);
    assert_eq!(code, 64, "exit code; stderr: {stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    for named in [
        "database.max_connections = 20",
        "jobs.automation_trigger.concurrency 8",
        "jobs.automation_action.concurrency 8",
        "jobs.email_send.concurrency 8",
        "jobs.outbox_drain.drain.batches_in_flight",
        "jobs.inbound_email_poller.account_concurrency",
        "raise it or lower those",
    ] {
        assert!(
            stderr.contains(named),
            "stderr does not name `{named}`: {stderr}"
        );
    }
}

#[test]
fn a_concurrency_raised_past_the_pool_exits_64_naming_it() {
    let text = format!("{SECRETS}[jobs.email_send]\nconcurrency = 200\n");
    let (code, _, stderr) = config_check(&text);
    assert_eq!(code, 64, "{stderr}");
    assert!(
        stderr.contains("jobs.email_send.concurrency 200"),
        "{stderr}"
    );
    assert!(stderr.contains("database.max_connections"), "{stderr}");

    // Raising the pool with it is enough.
    let text = format!(
        "{}[jobs.email_send]\nconcurrency = 200\n",
        SECRETS.replace("[database]\n", "[database]\nmax_connections = 300\n")
    );
    let (code, _, stderr) = config_check(&text);
    assert_eq!(code, 0, "{stderr}");
}

#[test]
fn the_shipped_defaults_fit_their_pool() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    // The defaults alone.
    let (code, _, stderr) = config_check(SECRETS);
    assert_eq!(code, 0, "the defaults: {stderr}");
    // The annotated example and the local settings file.
    for file in ["config/worker-host.example.toml", "config/worker-host.toml"] {
        let (code, _, stderr) = config_check_file(&root.join(file));
        assert_eq!(code, 0, "{file}: {stderr}");
    }
}
