//! ARCHITECTURE.md's rules about the crates, checked on the workspace's own manifests
//! (`cargo metadata`) and sources: dependencies point one way, host → jobs → adapters → core;
//! the client libraries of the services stay in the crates that adapt them; every table's
//! statements are written by its owners; and no two files of a crate import each other round
//! a circle.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::collections::BTreeMap;
use std::path::PathBuf;
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
        // The pages' frame knows no service: the console and the fleet view share it.
        "worker-broker" | "worker-store" | "worker-mail-auth" | "worker-pages" => Some(1),
        // The fleet view is a program of its own, over the pages' frame only.
        "worker-fleet" => Some(2),
        // The console: the store, core, the pages' frame and the job crates (each for what it
        // owns), below the host that serves it.
        "worker-console" => Some(3),
        "worker-host" => Some(4),
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

/// Every workspace crate `name` depends on, directly or through others.
fn reaches(crates: &[Crate], name: &str) -> Vec<String> {
    let mut found: Vec<String> = Vec::new();
    let mut stack = vec![name.to_string()];
    while let Some(next) = stack.pop() {
        let Some(krate) = crates.iter().find(|c| c.name == next) else {
            continue;
        };
        for dep in &krate.deps {
            if crates.iter().any(|c| c.name == *dep) && !found.contains(dep) {
                found.push(dep.clone());
                stack.push(dep.clone());
            }
        }
    }
    found
}

#[test]
fn the_console_does_not_depend_on_the_host() {
    let crates = workspace();
    assert!(crates.iter().any(|c| c.name == "worker-console"));
    assert!(
        !reaches(&crates, "worker-console").contains(&"worker-host".to_string()),
        "worker-console depends on worker-host"
    );
    let named: Vec<PathBuf> = sources()
        .into_iter()
        .filter(|(krate, _, code)| krate == "worker-console" && code.contains("worker_host::"))
        .map(|(_, path, _)| path)
        .collect();
    assert!(named.is_empty(), "{named:?}");
}

#[test]
fn the_fleet_view_depends_on_neither_the_host_nor_the_console() {
    let crates = workspace();
    assert!(crates.iter().any(|c| c.name == "worker-fleet"));
    let reached = reaches(&crates, "worker-fleet");
    let wrong: Vec<&String> = reached
        .iter()
        .filter(|d| ["worker-host", "worker-console"].contains(&d.as_str()))
        .collect();
    assert!(wrong.is_empty(), "worker-fleet depends on {wrong:?}");
    // Nor does it name them in its sources (a path dependency would show above; this catches
    // a `use` through a re-export).
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let named: Vec<String> = sources()
        .into_iter()
        .filter(|(krate, _, code)| {
            krate == "worker-fleet"
                && (code.contains("worker_host::") || code.contains("worker_console::"))
        })
        .map(|(_, path, _)| {
            path.strip_prefix(&root)
                .unwrap_or(&path)
                .display()
                .to_string()
        })
        .collect();
    assert!(named.is_empty(), "{named:?}");
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
        ("axum", |c: &str| {
            [
                "worker-host",
                "worker-console",
                "worker-pages",
                "worker-fleet",
            ]
            .contains(&c)
        }),
        ("oauth2", |c: &str| c == "worker-mail-auth"),
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

/// The tables of `migrations/`, by name.
fn tables() -> Vec<String> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../migrations");
    let mut tables = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let sql = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for part in sql.split("CREATE TABLE ").skip(1) {
            let name = part.trim_start_matches("IF NOT EXISTS ");
            let name: String = name
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            tables.push(name);
        }
    }
    tables
}

/// ARCHITECTURE.md's "Who owns each table": each table with the crates that may write
/// statements on it.
fn owners(tables: &[String]) -> BTreeMap<String, Vec<String>> {
    let doc = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../ARCHITECTURE.md"),
    )
    .unwrap();
    let list = doc
        .split("**Who owns each table**")
        .nth(1)
        .and_then(|rest| rest.split("\n\n").next())
        .expect("ARCHITECTURE.md lists who owns each table");
    let mut owners: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for item in list.split("\n- ").skip(1) {
        let names: Vec<&str> = item.split('`').skip(1).step_by(2).collect();
        let owner = names[0];
        for table in names[1..].iter().filter(|n| tables.iter().any(|t| t == *n)) {
            owners
                .entry(table.to_string())
                .or_default()
                .push(owner.to_string());
        }
    }
    owners
}

/// Every source file of a layered crate, its tests cut off, with the crate's name.
fn sources() -> Vec<(String, PathBuf, String)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut found = Vec::new();
    for krate in workspace().into_iter().filter(|c| layer(&c.name).is_some()) {
        let dir = crate_dir(&root, &krate.name).join("src");
        let mut stack = vec![dir];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") && !path.ends_with("tests.rs")
                {
                    let text = std::fs::read_to_string(&path).unwrap();
                    let code = text.split("\n#[cfg(test)]").next().unwrap().to_string();
                    found.push((krate.name.clone(), path, code));
                }
            }
        }
    }
    found
}

fn crate_dir(root: &std::path::Path, name: &str) -> PathBuf {
    match name.strip_prefix("job-") {
        Some(job) => root.join("crates/jobs").join(job),
        None => root.join("crates").join(name.trim_start_matches("worker-")),
    }
}

#[test]
fn every_table_has_an_owner_and_only_its_owners_write_statements_on_it() {
    let tables = tables();
    let owners = owners(&tables);
    let unowned: Vec<&String> = tables.iter().filter(|t| !owners.contains_key(*t)).collect();
    assert!(
        unowned.is_empty(),
        "tables without an owner in ARCHITECTURE.md: {unowned:?}"
    );
    let mut wrong = Vec::new();
    for (krate, path, code) in sources() {
        let words: Vec<&str> = code
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .filter(|w| !w.is_empty())
            .collect();
        for pair in words.windows(2) {
            let [keyword, table] = pair else { continue };
            let keyword = keyword.to_ascii_uppercase();
            if !["FROM", "INTO", "UPDATE", "JOIN"].contains(&keyword.as_str())
                || !tables.iter().any(|t| t == table)
            {
                continue;
            }
            if !owners[*table].contains(&krate) {
                wrong.push(format!("{} ({krate}): {table}", path.display()));
            }
        }
    }
    wrong.dedup();
    assert!(
        wrong.is_empty(),
        "statements outside the table's owners: {wrong:#?}"
    );
}

/// The module a `use` path names, as a file of the crate: the longest prefix of the path that
/// is a module file (`a/b.rs` or `a/b/mod.rs`).
fn module_file(src: &std::path::Path, segments: &[&str]) -> Option<PathBuf> {
    (1..=segments.len()).rev().find_map(|n| {
        let rel: PathBuf = segments[..n].iter().collect();
        [
            src.join(&rel).with_extension("rs"),
            src.join(&rel).join("mod.rs"),
        ]
        .into_iter()
        .find(|p| p.is_file())
    })
}

/// A file's module path from its crate's `src`: `a/b.rs` and `a/b/mod.rs` are `[a, b]`.
fn module_path(src: &std::path::Path, file: &std::path::Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut path: Vec<String> = rel
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    if path
        .last()
        .is_some_and(|l| l == "mod" || l == "lib" || l == "main")
    {
        path.pop();
    }
    path
}

/// The files of a crate that `file` takes names from through `use crate::…` or `use super::…`.
fn imports(src: &std::path::Path, file: &std::path::Path, code: &str) -> Vec<PathBuf> {
    let here = module_path(src, file);
    let mut found = Vec::new();
    for statement in code.split(';') {
        let Some(rest) = statement.trim().strip_prefix("use ").or_else(|| {
            statement
                .trim()
                .strip_prefix("pub use ")
                .or_else(|| statement.trim().strip_prefix("pub(crate) use "))
        }) else {
            continue;
        };
        let head: Vec<&str> = rest
            .split("::")
            .map(str::trim)
            .take_while(|s| !s.starts_with('{'))
            .collect();
        let segments: Vec<String> = match head.first() {
            Some(&"crate") => head[1..].iter().map(|s| s.to_string()).collect(),
            Some(&"super") => {
                // `a/b.rs` and `a/b/mod.rs` are both module `a::b`, whose `super` is `a`.
                let mut base = here.clone();
                let ups = head.iter().take_while(|s| **s == "super").count();
                for _ in 0..ups {
                    base.pop();
                }
                base.extend(head[ups..].iter().map(|s| s.to_string()));
                base
            }
            _ => continue,
        };
        let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
        if let Some(target) = module_file(src, &segments)
            && target != file
            && !target.ends_with("lib.rs")
            && !target.ends_with("main.rs")
        {
            found.push(target);
        }
    }
    found
}

#[test]
fn no_two_files_of_a_crate_import_each_other_round_a_circle() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut circles = Vec::new();
    for krate in workspace().into_iter().filter(|c| layer(&c.name).is_some()) {
        let src = crate_dir(&root, &krate.name).join("src");
        let files: Vec<(PathBuf, String)> = sources()
            .into_iter()
            .filter(|(name, _, _)| *name == krate.name)
            .map(|(_, path, code)| (path, code))
            .collect();
        let edges: BTreeMap<PathBuf, Vec<PathBuf>> = files
            .iter()
            .map(|(path, code)| (path.clone(), imports(&src, path, code)))
            .collect();
        // A circle: a file reached again from itself.
        for start in edges.keys() {
            let mut seen = vec![start.clone()];
            let mut stack = edges[start].clone();
            while let Some(next) = stack.pop() {
                if next == *start {
                    circles.push(format!("{} ({})", start.display(), krate.name));
                    break;
                }
                if !seen.contains(&next) {
                    seen.push(next.clone());
                    stack.extend(edges.get(&next).cloned().unwrap_or_default());
                }
            }
        }
    }
    assert!(
        circles.is_empty(),
        "files on an import circle: {circles:#?}"
    );
}

/// The host's modules, bottom to top (issue 40): a file of the host may name (`use` or a
/// path in its code) its own module or a lower one, never a higher one, so that no import
/// circle can form between modules. By a module's path; a submodule may sit above its parent
/// (`metrics::jobs`, the gauges over the running jobs, reads the status board).
fn host_layer(module: &[String]) -> Option<u8> {
    let path = module.join("::");
    let first = module.first().map(String::as_str).unwrap_or("");
    Some(match (first, path.as_str()) {
        (_, p) if p.starts_with("metrics::jobs") => 6,
        // What everything may use: exit codes, the release, the pure pieces.
        (
            "exit" | "version" | "watchdog" | "alerts" | "open_circuits" | "parked" | "circuits"
            | "readiness",
            _,
        ) => 0,
        // The settings and the schema's contract.
        ("settings" | "schema", _) => 1,
        // What the jobs report, and the readings over it.
        ("metrics", _) => 2,
        ("observe", _) => 3,
        ("scheduler", _) => 4,
        ("status", _) => 5,
        ("sampler" | "history" | "telemetry", _) => 6,
        // The running jobs, the connections, the admin server and the console it serves.
        ("jobs", _) => 7,
        ("connections" | "topology" | "notify" | "broker_session" | "privacy", _) => 8,
        ("console", _) => 9,
        ("admin", _) => 10,
        // The lifecycle of `run`, the commands and their grammar.
        ("lifecycle", _) => 11,
        ("commands", _) => 12,
        ("cli", _) => 13,
        _ => return None,
    })
}

/// Upward names the host holds today, each `from → to` by top-level module, with what would
/// remove it; the list only shrinks.
const KNOWN_UPWARD: &[&str] = &[];

/// The host's modules a file names: its `use crate::…`/`use super::…` imports, and the
/// `crate::…` paths in its code (comments aside), as module paths.
fn host_names(src: &std::path::Path, file: &std::path::Path, code: &str) -> Vec<Vec<String>> {
    let mut found: Vec<Vec<String>> = imports(src, file, code)
        .iter()
        .map(|target| module_path(src, target))
        .collect();
    for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
        for (at, _) in line.match_indices("crate::") {
            let before = line[..at].chars().last();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue; // `worker_crate::`, not ours
            }
            let segments: Vec<&str> = line[at + "crate::".len()..]
                .split("::")
                .map(|s| {
                    s.split(|c: char| !(c.is_alphanumeric() || c == '_'))
                        .next()
                        .unwrap_or("")
                })
                .take_while(|s| {
                    !s.is_empty()
                        && s.chars()
                            .all(|c| c.is_lowercase() || c == '_' || c.is_ascii_digit())
                })
                .collect();
            if let Some(target) = module_file(src, &segments) {
                found.push(module_path(src, &target));
            }
        }
    }
    found
}

#[test]
fn the_hosts_files_name_only_their_own_module_or_lower_ones() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let src = root.join("crates/host/src");
    let mut unplaced = Vec::new();
    let mut upward = std::collections::BTreeSet::new();
    for (krate, path, code) in sources() {
        if krate != "worker-host" {
            continue;
        }
        let here = module_path(&src, &path);
        if here.is_empty() {
            continue; // lib.rs and main.rs wire everything up
        }
        let Some(own) = host_layer(&here) else {
            unplaced.push(here.join("::"));
            continue;
        };
        for target in host_names(&src, &path, &code) {
            if target.is_empty() || target[0] == here[0] {
                continue;
            }
            match host_layer(&target) {
                Some(below) if below <= own => {}
                _ => {
                    upward.insert(format!("{} → {}", here[0], target[0]));
                }
            }
        }
    }
    assert!(
        unplaced.is_empty(),
        "host modules without a layer in host_layer: {unplaced:?}"
    );
    let new: Vec<&String> = upward
        .iter()
        .filter(|u| !KNOWN_UPWARD.contains(&u.as_str()))
        .collect();
    assert!(new.is_empty(), "upward names in the host: {new:#?}");
    let gone: Vec<&&str> = KNOWN_UPWARD
        .iter()
        .filter(|k| !upward.contains(**k))
        .collect();
    assert!(
        gone.is_empty(),
        "KNOWN_UPWARD lists names the host no longer has: take them off: {gone:?}"
    );
}
