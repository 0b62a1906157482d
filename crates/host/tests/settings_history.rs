//! Settings files of earlier releases, as they shipped (`tests/fixtures/settings/`, taken from
//! git: the first example, the one before each job owned its section, and 0.1.0's), checked
//! by the real binary's `config check`: each is accepted, every old key read under its new
//! name with a warning that names both and the release that will refuse it.
//!
//! A file is never edited after it is added here: it stands for what an installation has.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::path::{Path, PathBuf};
use std::process::Output;

use support::host_command;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/settings")
        .join(name)
}

/// `config check` on a fixture, with the secrets a file leaves to the environment and `env`.
fn check(name: &str, env: &[(&str, &str)]) -> Output {
    let mut command = host_command(&fixture(name));
    command
        .arg("config")
        .arg("check")
        .env("WORKER_HOST__DATABASE__PASSWORD", "a-database-password")
        .env("WORKER_HOST__BROKER__PASSWORD", "a-broker-password");
    for (var, value) in env {
        command.env(var, value);
    }
    command.output().unwrap()
}

/// The old keys the warnings name, in order.
fn renamed(output: &Output) -> Vec<String> {
    String::from_utf8_lossy(&output.stderr)
        .lines()
        .filter(|line| line.starts_with("worker-host: warning:"))
        .filter_map(|line| line.split('`').nth(1).map(str::to_string))
        .collect()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Retention deletes are sweeps now; 0.1.0's example set the outbox's interval.
const PURGE_INTERVAL: &str = "jobs.outbox_drain.drain.purge_interval";

/// The outbox backoff's own count of tries was never used: taken out with a warning.
const BACKOFF_TRIES: &str = "jobs.outbox_drain.drain.backoff.max_tries";

/// The ages of what the retention job deletes moved into its section.
const RETENTION_AGES: [&str; 2] = ["workers.dedup_retention", "workers.attempt_log.retention"];

/// The drain deletes what it published: its retention of processed rows is no longer used.
const DRAIN_RETENTION: &str = "jobs.outbox_drain.drain.retention";

const TIMEOUTS: [&str; 8] = [
    "workers.timeouts.automation",
    "workers.timeouts.webhook",
    "workers.timeouts.email_send",
    "workers.timeouts.outbox_batch",
    "workers.timeouts.health",
    "workers.timeouts.draft",
    "workers.timeouts.imap_connect",
    "workers.timeouts.imap_message",
];

#[test]
fn the_settings_of_0_1_0_are_accepted_with_a_warning_per_key_renamed_or_removed_since() {
    let output = check("0.1.0.toml", &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(
        renamed(&output),
        [
            BACKOFF_TRIES,
            PURGE_INTERVAL,
            RETENTION_AGES[0],
            RETENTION_AGES[1],
            DRAIN_RETENTION
        ]
    );
    assert!(
        stderr(&output).contains(&format!(
            "key `{DRAIN_RETENTION}` is no longer used (the outbox drain now deletes each row once the broker confirmed it, and the retention job"
        )),
        "{}",
        stderr(&output)
    );
    assert!(
        stderr(&output).contains(&format!(
            "key `{BACKOFF_TRIES}` is no longer used: it is ignored until release 0.3.0"
        )),
        "{}",
        stderr(&output)
    );
}

#[test]
fn the_settings_from_before_job_sections_are_accepted_with_a_warning_per_moved_key() {
    let output = check("before-job-sections.toml", &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let mut expected: Vec<&str> = TIMEOUTS.to_vec();
    expected.extend([
        "workers.retry.max_attempts",
        "jobs.outbox_drain.drain.backoff.max_attempts",
        "auto_replies.per_recipient",
        "auto_replies.window",
        "jobs.dead_letter_archive.maintenance_schedule",
        PURGE_INTERVAL,
    ]);
    expected.extend(RETENTION_AGES);
    expected.push(DRAIN_RETENTION);
    assert_eq!(renamed(&output), expected);
    let effective = String::from_utf8_lossy(&output.stdout);
    assert!(
        effective.contains("[jobs.automation_action.auto_replies]"),
        "{effective}"
    );
    assert!(stderr(&output).contains("until release 0.3.0"));
}

#[test]
fn the_first_settings_are_read_with_their_old_keys_and_refused_only_for_a_pool_too_small_for_todays_jobs()
 {
    // Its 20 connections were enough for the jobs it had; the jobs added since need more,
    // and a pool too small would starve them, so the host says so, naming the key and why.
    let refused = check("first-example.toml", &[]);
    assert_eq!(refused.status.code(), Some(64), "{}", stderr(&refused));
    let why = stderr(&refused);
    assert!(
        why.contains("key `database.max_connections`") && why.contains("raise it"),
        "{why}"
    );
    assert_eq!(why.matches("key `").count(), 1, "only the pool: {why}");

    let output = check(
        "first-example.toml",
        &[("WORKER_HOST__DATABASE__MAX_CONNECTIONS", "60")],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let mut expected: Vec<&str> = TIMEOUTS.to_vec();
    expected.extend([
        "jobs.outbox_drain.batch_size",
        "jobs.inbound_email_poller.batch_size",
        "jobs.automation_trigger.queue",
        "jobs.automation_action.queue",
        "jobs.email_send.queue",
        "workers.retry.max_attempts",
        RETENTION_AGES[0],
    ]);
    assert_eq!(renamed(&output), expected);
    let effective = String::from_utf8_lossy(&output.stdout);
    assert!(
        effective.contains("name = \"email.send\""),
        "the old queue string is the queue's name: {effective}"
    );
}

#[test]
fn an_old_key_in_the_environment_is_read_under_its_new_name_too() {
    let output = check(
        "0.1.0.toml",
        &[("WORKER_HOST__WORKERS__TIMEOUTS__EMAIL_SEND", "77s")],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(
        renamed(&output),
        [
            BACKOFF_TRIES,
            PURGE_INTERVAL,
            RETENTION_AGES[0],
            RETENTION_AGES[1],
            DRAIN_RETENTION,
            "workers.timeouts.email_send"
        ]
    );
    assert!(
        stderr(&output).contains("environment variable WORKER_HOST__WORKERS__TIMEOUTS__EMAIL_SEND")
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("timeout = \"1m 17s\""));
}

/// `config check` on a settings file holding `text`.
fn check_text(text: &str) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("worker-host.toml");
    std::fs::write(&file, text).unwrap();
    host_command(&file)
        .args(["config", "check"])
        .env("WORKER_HOST__DATABASE__PASSWORD", "p")
        .env("WORKER_HOST__BROKER__PASSWORD", "p")
        .output()
        .unwrap()
}

#[test]
fn an_unknown_key_is_named_as_written_with_its_file_and_line() {
    let output = check_text(
        "[workers]\nshutdown_grace = \"5s\"\n\n[workers.timeouts]\nemail_sned = \"60s\"\n",
    );
    assert_eq!(output.status.code(), Some(64));
    let why = stderr(&output);
    assert!(
        why.contains(", line 4: key `workers.timeouts`: unknown key `workers.timeouts`"),
        "{why}"
    );
    assert!(!why.contains("workers.timeouts.timeouts"), "{why}");
}

#[test]
fn a_key_set_by_its_old_and_its_new_name_is_refused_naming_both() {
    let output = check_text(
        "[workers.timeouts]\nemail_send = \"60s\"\n\n[jobs.email_send]\ntimeout = \"90s\"\n",
    );
    assert_eq!(output.status.code(), Some(64));
    let why = stderr(&output);
    assert!(
        why.contains("`workers.timeouts.email_send`")
            && why.contains("`jobs.email_send.timeout`, not both"),
        "{why}"
    );
}

#[test]
fn a_gather_window_as_long_as_the_drains_tick_is_refused_naming_it() {
    let output = check_text("[jobs.outbox_drain.drain]\ngather = \"1s\"\n");
    assert_eq!(output.status.code(), Some(64), "{}", stderr(&output));
    let why = stderr(&output);
    assert!(
        why.contains("jobs.outbox_drain.drain")
            && why.contains("`gather` must be shorter than the drain's tick interval"),
        "{why}"
    );
    let off = check_text("[jobs.outbox_drain.drain]\ngather = \"0s\"\n");
    assert!(off.status.success(), "{}", stderr(&off));
}
