//! ARCHITECTURE.md's rules about the crates, checked on the workspace's own manifests
//! (`cargo metadata`): dependencies point one way, host → jobs → adapters → core, and the
//! client libraries of the services stay in the crates that adapt them.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::collections::BTreeMap;
use std::process::Command;

/// A workspace crate and what it depends on outside dev-dependencies.
struct Crate {
    name: String,
    deps: Vec<String>,
}

fn workspace() -> Vec<Crate> {
    let output = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|package| Crate {
            name: package["name"].as_str().unwrap().to_string(),
            deps: package["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|dep| dep["kind"].is_null())
                .map(|dep| dep["name"].as_str().unwrap().to_string())
                .collect(),
        })
        .collect()
}

/// Each crate's layer; a crate may depend on crates of lower layers only. The tooling (test
/// kit, fault suite) is outside the layers: nothing layered depends on it but in its tests.
fn layer(name: &str) -> Option<u8> {
    match name {
        "worker-core" | "worker-messages" => Some(0),
        "worker-broker" | "worker-store" => Some(1),
        "worker-host" => Some(3),
        job if job.starts_with("job-") => Some(2),
        _ => None,
    }
}

#[test]
fn every_dependency_points_down_the_layers() {
    let crates = workspace();
    let ours: Vec<&str> = crates.iter().map(|c| c.name.as_str()).collect();
    let mut wrong = Vec::new();
    for krate in &crates {
        let Some(own) = layer(&krate.name) else {
            continue;
        };
        for dep in krate.deps.iter().filter(|d| ours.contains(&d.as_str())) {
            match layer(dep) {
                Some(below) if below < own => {}
                _ => wrong.push(format!("{} → {dep}", krate.name)),
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "dependencies that do not point down: {wrong:?}"
    );
}

#[test]
fn the_service_clients_stay_in_their_adapters() {
    // Which crates may use each client library directly.
    let allowed: BTreeMap<&str, fn(&str) -> bool> = BTreeMap::from([
        (
            "lapin",
            (|c: &str| c == "worker-broker" || c == "worker-testkit") as fn(&str) -> bool,
        ),
        ("sqlx", |c: &str| {
            c != "worker-core" && c != "worker-messages" && c != "worker-broker"
        }),
        ("async-imap", |c: &str| {
            c == "job-inbound-email-poller" || c == "worker-faults"
        }),
        ("lettre", |c: &str| {
            c == "job-email-send" || c == "worker-faults"
        }),
        ("axum", |c: &str| c == "worker-host"),
    ]);
    let mut wrong = Vec::new();
    for krate in workspace() {
        for dep in &krate.deps {
            if let Some(may) = allowed.get(dep.as_str())
                && !may(&krate.name)
            {
                wrong.push(format!("{} uses {dep}", krate.name));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:?}");
}

#[test]
fn core_knows_no_service() {
    let crates = workspace();
    let core = crates.iter().find(|c| c.name == "worker-core").unwrap();
    let clients = [
        "lapin",
        "sqlx",
        "axum",
        "async-imap",
        "lettre",
        "reqwest",
        "hyper",
    ];
    let known: Vec<&String> = core
        .deps
        .iter()
        .filter(|d| clients.contains(&d.as_str()))
        .collect();
    assert!(known.is_empty(), "worker-core depends on {known:?}");
}
