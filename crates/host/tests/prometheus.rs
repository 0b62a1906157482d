//! The shipped alert rules and dashboard (`deploy/prometheus/`, `deploy/grafana/`), proven on
//! a real Prometheus (Debian's package, installed by `scripts/deploy-tools.sh`):
//! - the rules' thresholds are the host's own `[alerts]` defaults;
//! - `promtool check rules` and `promtool test rules` (a unit test for every alert) pass;
//! - a Prometheus scraping a running host sees a refused reply (550) become a dead letter and
//!   the dead-letter alert go pending, then firing, read from its HTTP API;
//! - every panel of the dashboard runs against that Prometheus without an error and names no
//!   series that does not exist.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Deserialize;
use support::{Host, SERIAL, base_settings, free_port, mail_account_settings, short_id};
use worker_host::settings::AlertSettings;
use worker_testkit::{TestDb, TestVhost};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn rules_path() -> PathBuf {
    root().join("deploy/prometheus/worker-host.rules.yml")
}

#[derive(Debug, Deserialize)]
struct RuleFile {
    groups: Vec<Group>,
}

#[derive(Debug, Deserialize)]
struct Group {
    rules: Vec<Rule>,
}

#[derive(Debug, Deserialize)]
struct Rule {
    /// `None` for a recording rule.
    alert: Option<String>,
    expr: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

fn alerts() -> Vec<Rule> {
    let text = std::fs::read_to_string(rules_path()).unwrap();
    let file: RuleFile = serde_saphyr::from_str(&text).unwrap();
    file.groups
        .into_iter()
        .flat_map(|g| g.rules)
        .filter(|r| r.alert.is_some())
        .collect()
}

/// Each alert whose threshold the host also has in `[alerts]`, with that default.
fn shared_thresholds() -> Vec<(&'static str, String)> {
    let a = AlertSettings::default();
    vec![
        (
            "WorkerHostDeadLettersWaiting",
            a.dead_letter_depth.to_string(),
        ),
        (
            "WorkerHostDeadLettersArriving",
            a.dead_letter_inflow_per_minute.to_string(),
        ),
        (
            "WorkerHostDeadLetterOld",
            a.dead_letter_oldest_age.as_secs().to_string(),
        ),
        ("WorkerHostOutboxBacklog", a.outbox_pending.to_string()),
        (
            "WorkerHostOutboxStalled",
            a.outbox_oldest_pending.as_secs().to_string(),
        ),
        ("WorkerHostOutboxFailed", a.outbox_failed.to_string()),
        (
            "WorkerHostDatabaseUnhealthy",
            a.db_probe_failures.to_string(),
        ),
        ("WorkerHostStuckWork", a.stuck_work.to_string()),
        (
            "WorkerHostReplyLimitSkipping",
            a.reply_limit_skips.to_string(),
        ),
        ("WorkerHostJobPausedLong", a.pause_age.as_secs().to_string()),
        // The host counts silent replicas against 0 too; `replica_silent_after` is carried by
        // the gauge's state.
        ("WorkerHostReplicaSilent", "0".to_string()),
    ]
}

#[test]
fn the_rules_thresholds_are_the_hosts_alert_defaults() {
    let alerts = alerts();
    for (name, default) in shared_thresholds() {
        let rule = alerts
            .iter()
            .find(|r| r.alert.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("no alert {name} in the rules"));
        assert!(
            rule.expr.trim().ends_with(&format!("> {default}")),
            "{name}: the rule's threshold is the host's [alerts] default {default}: {}",
            rule.expr
        );
    }
}

#[test]
fn every_alert_has_a_severity_a_summary_a_description_and_a_runbook_section() {
    let runbook = std::fs::read_to_string(root().join("docs/RUNBOOK.md")).unwrap();
    let alerts = alerts();
    assert!(alerts.len() >= 15, "{} alerts", alerts.len());
    for rule in alerts {
        let name = rule.alert.as_deref().unwrap_or_default();
        assert!(
            matches!(
                rule.labels.get("severity").map(String::as_str),
                Some("critical" | "warning")
            ),
            "{name}: severity"
        );
        for key in ["summary", "description", "runbook_url"] {
            assert!(rule.annotations.contains_key(key), "{name}: {key}");
        }
        let url = &rule.annotations["runbook_url"];
        let anchor = url
            .rsplit_once("docs/RUNBOOK.md#")
            .map(|(_, a)| a)
            .unwrap_or_else(|| {
                panic!("{name}: the runbook_url points into docs/RUNBOOK.md: {url}")
            });
        assert_eq!(anchor, name.to_lowercase(), "{name}: its own section");
        assert!(
            runbook.lines().any(|l| l == format!("## {name}")),
            "docs/RUNBOOK.md has a section `## {name}`"
        );
    }
}

fn promtool(args: &[&str], dir: &Path) -> std::process::Output {
    Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "promtool cannot run ({e}): scripts/deploy-tools.sh installs Debian's prometheus"
            )
        })
}

#[test]
fn promtool_checks_the_rules_and_runs_a_unit_test_for_every_alert() {
    let dir = root().join("deploy/prometheus");
    let check = promtool(&["check", "rules", "worker-host.rules.yml"], &dir);
    assert!(
        check.status.success(),
        "promtool check rules:\n{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    let test = promtool(&["test", "rules", "worker-host.rules.test.yml"], &dir);
    assert!(
        test.status.success(),
        "promtool test rules:\n{}{}",
        String::from_utf8_lossy(&test.stdout),
        String::from_utf8_lossy(&test.stderr)
    );
    let tests = std::fs::read_to_string(dir.join("worker-host.rules.test.yml")).unwrap();
    for rule in alerts() {
        let name = rule.alert.unwrap_or_default();
        assert!(
            tests.contains(&format!("alertname: {name}")),
            "a promtool test of {name}"
        );
    }
}

/// A Prometheus of the test's own on a free loopback port, killed when dropped.
struct Prometheus {
    child: Child,
    base: String,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Scrapes `target` every second and evaluates `rules` every second.
    async fn start(target: &str, rules: &str) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("rules.yml"), rules)?;
        std::fs::write(
            dir.path().join("prometheus.yml"),
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 rule_files: [rules.yml]\n\
                 scrape_configs:\n  - job_name: worker-host\n    static_configs:\n      - targets: [\"{target}\"]\n"
            ),
        )?;
        let port = free_port();
        let child = Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("prometheus.log"))?)
            .spawn()
            .context(
                "prometheus cannot start: scripts/deploy-tools.sh installs Debian's prometheus",
            )?;
        let prometheus = Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
            _dir: dir,
        };
        let ready = format!("{}/-/ready", prometheus.base);
        support::wait_for("Prometheus ready", String::new, || async {
            Ok(reqwest::get(&ready)
                .await
                .ok()
                .filter(|r| r.status().is_success())
                .map(|_| ()))
        })
        .await;
        Ok(prometheus)
    }

    async fn api(&self, path: &str, query: &[(&str, &str)]) -> anyhow::Result<serde_json::Value> {
        let response = reqwest::Client::new()
            .get(format!("{}{path}", self.base))
            .query(query)
            .send()
            .await?;
        let body: serde_json::Value = response.json().await?;
        anyhow::ensure!(body["status"] == "success", "{path} {query:?}: {body}");
        Ok(body["data"].clone())
    }

    async fn query(&self, expr: &str) -> anyhow::Result<Vec<serde_json::Value>> {
        let data = self.api("/api/v1/query", &[("query", expr)]).await?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    /// The state of the alert `name` now: `pending`, `firing`, or `None` while inactive.
    async fn alert_state(&self, name: &str) -> anyhow::Result<Option<String>> {
        let data = self.api("/api/v1/alerts", &[]).await?;
        Ok(data["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["labels"]["alertname"] == name)
            .and_then(|a| a["state"].as_str().map(str::to_string)))
    }
}

/// The test's copy of the rules: every `for:` a few seconds, and the dead-letter depth's
/// threshold 0 (the host under test runs with `alerts.dead_letter_depth = 0`, the same
/// change made on both sides, as an installation would make it).
fn quick_rules(shipped: &str) -> String {
    let fors = regex::Regex::new(r"(?m)^(\s+for:) \S+$").unwrap();
    let quick = fors.replace_all(shipped, "$1 3s").into_owned();
    let depth = "max without (instance) (worker_dead_letter_depth) > 100";
    assert!(quick.contains(depth), "the rule the test shortens is there");
    quick.replace(
        depth,
        "max without (instance) (worker_dead_letter_depth) > 0",
    )
}

/// A refused reply (550) becomes a dead letter; the dead-letter alert goes pending, then
/// firing, on a real Prometheus scraping the host; then every dashboard panel's query runs
/// there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_reply_fires_the_dead_letter_alert_and_every_dashboard_query_runs()
-> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let db = TestDb::create().await?;
    let vhost = TestVhost::create().await?;
    let account = format!("prom-{}", short_id());
    let host = Host::launch("WH_SHOW_PROMETHEUS_LOG", |dir, port| {
        let automations = support::write_automation(dir)?;
        Ok(format!(
            "{}{}\n[alerts]\ninterval = \"1s\"\ndead_letter_depth = 0\n",
            base_settings("prometheus", &automations, &db, &vhost, port),
            mail_account_settings(&account),
        ))
    })
    .await?;
    let target = host.url("").trim_start_matches("http://").to_string();
    let shipped = std::fs::read_to_string(rules_path())?;
    let prometheus = Prometheus::start(&target, &quick_rules(&shipped)).await?;
    let began = Instant::now();
    prometheus_sees_the_host(&prometheus).await;

    // A ping the host answers, and a ping whose reply the SMTP server refuses.
    let answered = format!("prom-ok-{}@localhost", short_id());
    let refused = format!("fail5xx-{}@localhost", short_id());
    let to = format!("{account}@localhost");
    support::send_mail(&answered, &to, "ping answered", "localhost").await?;
    support::send_mail(&refused, &to, "ping refused", "localhost").await?;

    let mut timeline: Vec<(Duration, String)> = Vec::new();
    let mut state: Option<String> = None;
    let mut dead_seen = false;
    let deadline = Instant::now() + Duration::from_secs(90);
    while state.as_deref() != Some("firing") {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the alert did not fire within 90 s: {timeline:?}\n{}",
            host.log_tail()
        );
        if !dead_seen
            && host
                .metrics()
                .await?
                .sum("worker_dead_letter_depth", &[("queue", "email.send")])
                >= 1.0
        {
            dead_seen = true;
            timeline.push((began.elapsed(), "the host counts the dead letter".into()));
        }
        let now = prometheus
            .alert_state("WorkerHostDeadLettersWaiting")
            .await?;
        if now != state {
            timeline.push((
                began.elapsed(),
                format!(
                    "WorkerHostDeadLettersWaiting {}",
                    now.as_deref().unwrap_or("inactive")
                ),
            ));
            state = now;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("the live Prometheus saw, from its start:");
    for (at, what) in &timeline {
        eprintln!("  {:>6.1} s  {what}", at.as_secs_f64());
    }
    let states: Vec<&str> = timeline
        .iter()
        .filter_map(|(_, w)| w.strip_prefix("WorkerHostDeadLettersWaiting "))
        .collect();
    assert_eq!(states, ["pending", "firing"], "{timeline:?}");
    let at = |what: &str| {
        timeline
            .iter()
            .find(|(_, w)| w.ends_with(what))
            .map(|(t, _)| *t)
    };
    let (pending, firing) = (at(" pending").unwrap(), at(" firing").unwrap());
    assert!(
        firing - pending >= Duration::from_secs(2),
        "pending for its `for:` (3 s) before firing: {timeline:?}"
    );

    // The answered ping's reply went out, so deliveries and durations exist for every
    // consumer, and the failure panels have a failure to show.
    support::wait_for("the answered ping's reply", String::new, || async {
        Ok(
            (support::inbox_count(answered.split('@').next().unwrap_or_default()).await? > 0)
                .then_some(()),
        )
    })
    .await;
    // Two scrapes and two evaluations after the last delivery, for rates and recording rules.
    tokio::time::sleep(Duration::from_secs(3)).await;
    every_dashboard_query_runs(&prometheus).await?;
    host.stop_cleanly().await;
    Ok(())
}

async fn prometheus_sees_the_host(prometheus: &Prometheus) {
    support::wait_for("Prometheus scraping the host", String::new, || async {
        let up = prometheus.query(r#"up{job="worker-host"}"#).await?;
        Ok(up.first().filter(|s| s["value"][1] == "1").map(|_| ()))
    })
    .await;
}

/// Every panel's query of `deploy/grafana/worker-host.json`, as Grafana would send it for
/// the last hour over every instance.
fn dashboard_queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(root().join("deploy/grafana/worker-host.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut panels: Vec<serde_json::Value> = Vec::new();
    let mut stack: Vec<serde_json::Value> =
        dashboard["panels"].as_array().cloned().unwrap_or_default();
    while let Some(panel) = stack.pop() {
        stack.extend(panel["panels"].as_array().cloned().unwrap_or_default());
        panels.push(panel);
    }
    let mut queries = Vec::new();
    for panel in panels {
        let title = panel["title"].as_str().unwrap_or("?").to_string();
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                let expr = expr
                    .replace("$__rate_interval", "1m")
                    .replace("$__interval", "1m")
                    .replace("$__range", "1m")
                    .replace("${instance:regex}", ".*")
                    .replace("$instance", ".*");
                queries.push((title.clone(), expr));
            }
        }
    }
    queries
}

/// The series names a query reads: the identifiers of metrics (`worker_*`, `process_*`) and
/// recording rules (with a `:`), not label names in selectors or grouping clauses.
fn series_named(expr: &str) -> BTreeSet<String> {
    let selectors = regex::Regex::new(r"\{[^}]*\}").unwrap();
    let groupings =
        regex::Regex::new(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
            .unwrap();
    let bare = groupings
        .replace_all(&selectors.replace_all(expr, " "), " ")
        .into_owned();
    let names = regex::Regex::new(r"[a-zA-Z_][a-zA-Z0-9_:]*").unwrap();
    names
        .find_iter(&bare)
        .map(|m| m.as_str().to_string())
        .filter(|n| n.starts_with("worker_") || n.starts_with("process_") || n.contains(':'))
        .collect()
}

#[test]
fn label_names_are_not_taken_for_series() {
    let named = series_named(
        r#"sum by (worker_job, le) (rate(worker_tick_duration_seconds_bucket{worker_job=~".*"}[1m])) and on (job) worker_build_info"#,
    );
    assert_eq!(
        named,
        BTreeSet::from([
            "worker_tick_duration_seconds_bucket".to_string(),
            "worker_build_info".to_string()
        ])
    );
}

async fn every_dashboard_query_runs(prometheus: &Prometheus) -> anyhow::Result<()> {
    let queries = dashboard_queries();
    assert!(
        queries.len() >= 20,
        "{} queries in the dashboard",
        queries.len()
    );
    let mut problems = Vec::new();
    let mut names = BTreeSet::new();
    for (title, expr) in &queries {
        if let Err(e) = prometheus.query(expr).await {
            problems.push(format!("panel {title:?}: {e:#}"));
        }
        names.extend(series_named(expr));
    }
    for name in &names {
        let found = prometheus
            .query(&format!("count({{__name__={name:?}}})"))
            .await?;
        if found.is_empty() {
            problems.push(format!("no series {name}"));
        }
    }
    assert!(
        problems.is_empty(),
        "{} queries over {} series names; problems:\n{}",
        queries.len(),
        names.len(),
        problems.join("\n")
    );
    Ok(())
}

/// `/metrics` of a running host: every counter ends in `_total` and no gauge does, and what
/// was renamed is still there under its old name for one release (the changelog lists it):
/// `worker_broker_reconnects` beside `worker_broker_reconnects_total`, and the `job` label
/// beside `worker_job` with the same value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_follow_prometheus_conventions_and_keep_their_old_names() -> anyhow::Result<()>
{
    use worker_host::metrics::names;
    let _serial = SERIAL.lock().await;
    let db = TestDb::create().await?;
    let vhost = TestVhost::create().await?;
    let host = Host::launch("WH_SHOW_PROMETHEUS_LOG", |_, port| {
        Ok(base_settings("conventions", "[]", &db, &vhost, port))
    })
    .await?;
    let scrape = host
        .wait_for("the timers' first ticks on /metrics", || async {
            let scrape = host.metrics().await?;
            Ok((scrape.sum(names::TICKS, &[]) > 0.0).then_some(scrape))
        })
        .await;
    let types: BTreeMap<String, String> = scrape
        .0
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(name, kind)| (name.to_string(), kind.to_string()))
        .collect();
    for (name, kind) in &types {
        match kind.as_str() {
            "counter" => assert!(name.ends_with("_total"), "counter {name} ends in _total"),
            _ => assert!(
                !name.ends_with("_total"),
                "{kind} {name} does not end in _total"
            ),
        }
    }
    assert_eq!(
        types.get(names::BROKER_RECONNECTS).map(String::as_str),
        Some("counter")
    );
    assert_eq!(
        types
            .get(names::BROKER_RECONNECTS_GAUGE)
            .map(String::as_str),
        Some("gauge"),
        "the deprecated gauge is still emitted"
    );
    assert_eq!(
        scrape.sum(names::BROKER_RECONNECTS, &[]),
        scrape.sum(names::BROKER_RECONNECTS_GAUGE, &[])
    );
    let new = scrape.label_values(names::TICKS, names::JOB_LABEL);
    let old = scrape.label_values(names::TICKS, names::DEPRECATED_JOB_LABEL);
    assert!(new.contains("db-health"), "{new:?}");
    assert_eq!(new, old, "the deprecated job label has the same values");
    let build = scrape.label_values(names::BUILD_INFO, "version");
    assert_eq!(
        build,
        BTreeSet::from([env!("CARGO_PKG_VERSION").to_string()])
    );
    for deprecation in names::DEPRECATED {
        assert!(
            scrape.0.contains(deprecation.old) && scrape.0.contains(deprecation.new),
            "{deprecation:?}"
        );
    }
    host.stop_cleanly().await;
    Ok(())
}
