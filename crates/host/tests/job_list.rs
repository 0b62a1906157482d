//! The host's list of jobs is the one source: every place outside the code that names the jobs
//! (the example settings, the README's table, the fault suite's leased jobs) is held to it
//! here, so that adding a job and forgetting one of them fails this test.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::path::PathBuf;

use worker_core::JobSpec;

fn repo_file(path: &str) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    std::fs::read_to_string(root.join(path)).unwrap()
}

fn jobs() -> Vec<&'static JobSpec> {
    worker_host::jobs::all()
}

#[test]
fn the_example_settings_have_a_section_for_every_job_and_no_other() {
    let example: toml::Table = repo_file("config/worker-host.example.toml")
        .parse()
        .unwrap();
    let sections: Vec<&String> = example["jobs"].as_table().unwrap().keys().collect();
    let mut expected: Vec<String> = jobs().iter().map(|spec| spec.section()).collect();
    expected.sort();
    let mut sections: Vec<String> = sections.into_iter().cloned().collect();
    sections.sort();
    assert_eq!(sections, expected);
}

/// The README's table of jobs: a row a job, in the list's order, its kind as the list says.
#[test]
fn the_readme_lists_every_job_in_order_with_its_kind() {
    let readme = repo_file("README.md");
    let table = readme
        .split("| job | kind | does |")
        .nth(1)
        .expect("the README has a table of jobs");
    let rows: Vec<(String, String)> = table
        .lines()
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            (cells[1].trim_matches('`').to_string(), cells[2].to_string())
        })
        .collect();
    let names: Vec<&str> = rows.iter().map(|(name, _)| name.as_str()).collect();
    let expected: Vec<&str> = jobs().iter().map(|spec| spec.name).collect();
    assert_eq!(names, expected);
    for ((name, kind), spec) in rows.iter().zip(jobs()) {
        let leased = kind.contains("one replica (lease)");
        assert_eq!(leased, spec.leased(), "`{name}`'s kind: {kind}");
        assert_eq!(
            kind.starts_with("timer"),
            spec.is_timer(),
            "`{name}`: {kind}"
        );
    }
}

/// `crates/faults/src/timers.rs`: `LEASED_JOBS`, each leased job with its lease key.
#[test]
fn the_fault_suite_watches_every_leased_job_under_its_lease_key() {
    let source = repo_file("crates/faults/src/timers.rs");
    let list = source
        .split("pub const LEASED_JOBS")
        .nth(1)
        .and_then(|rest| rest.split("];").next())
        .expect("the fault suite lists LEASED_JOBS");
    let pairs: Vec<(String, String)> = list
        .lines()
        .filter_map(|line| {
            let quoted: Vec<&str> = line.split('"').collect();
            (quoted.len() >= 5).then(|| (quoted[1].to_string(), quoted[3].to_string()))
        })
        .collect();
    let expected: Vec<(String, String)> = jobs()
        .into_iter()
        .filter_map(|spec| Some((spec.name.to_string(), spec.lease_key()?.to_string())))
        .collect();
    assert_eq!(pairs, expected);
}
