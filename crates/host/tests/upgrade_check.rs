//! `worker-host upgrade check --json` against a live installation, with the real binary on
//! the real database and broker: it names the old settings keys, the migrations still to
//! apply, the replicas on another release and the depth of every queue, and it reads the
//! queues without taking a message from them.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::process::Output;

use support::{Installation, host_command, publish_confirmed};
use worker_testkit::TestDb;

fn check(config: &std::path::Path) -> (Output, serde_json::Value) {
    let output = host_command(config)
        .args(["upgrade", "check", "--json"])
        .output()
        .unwrap();
    let report = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    });
    (output, report)
}

#[tokio::test]
async fn the_check_reports_old_keys_pending_migrations_other_releases_and_queue_depths()
-> anyhow::Result<()> {
    let site = Installation::new("upgrade-test").await?;
    let settings = std::fs::read_to_string(&site.config)?;
    std::fs::write(
        &site.config,
        format!("{settings}\n[workers.timeouts]\nemail_send = \"45s\"\n"),
    )?;
    site.declare_topology();
    let Installation {
        db,
        vhost,
        config,
        dir: _dir,
    } = site;
    let bodies: Vec<(lapin::BasicProperties, &[u8])> = (0..3)
        .map(|_| {
            (
                lapin::BasicProperties::default().with_delivery_mode(2),
                b"{}".as_slice(),
            )
        })
        .collect();
    publish_confirmed(&vhost, "", "email.send.dead", &bodies).await?;
    sqlx::query(
        "INSERT INTO replicas (name, installation, host, pid, version, started_at, last_seen) \
         VALUES ('old-one', 'upgrade-test', 'box-1', 42, '0.0.9', now(), now())",
    )
    .execute(&db.pool)
    .await?;
    // Migrations this release has and the database has not (as before an upgrade): the
    // newest, and one that builds an index on a growing table under a lock.
    let newest: i64 = sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations")
        .fetch_one(&db.pool)
        .await?;
    let locking: i64 = 20261202000300;
    sqlx::query("DELETE FROM _sqlx_migrations WHERE version = ANY($1)")
        .bind(vec![newest, locking])
        .execute(&db.pool)
        .await?;

    let (output, report) = check(&config);
    assert_eq!(report["release"], env!("CARGO_PKG_VERSION"));
    assert_eq!(
        report["settings"]["deprecated"][0]["old"], "workers.timeouts.email_send",
        "{report}"
    );
    assert_eq!(report["migrations"][0]["version"], locking, "{report}");
    assert_eq!(report["migrations"][0]["contract"], false, "{report}");
    let findings = report["migrations"][0]["findings"].to_string();
    assert!(
        findings.contains("dead_letters") && findings.contains("CONCURRENTLY"),
        "an index built under a lock on a growing table: {findings}"
    );
    assert_eq!(report["migrations"][1]["version"], newest, "{report}");
    assert_eq!(report["migrations"][1]["findings"], serde_json::json!([]));
    assert!(report["schema"]["version"].as_i64().is_some(), "{report}");
    assert_eq!(report["other_releases"][0]["name"], "old-one", "{report}");
    assert_eq!(report["other_releases"][0]["version"], "0.0.9", "{report}");
    assert_eq!(report["queues"]["email.send.dead"], 3, "{report}");
    assert_eq!(report["queues"]["email.send"], 0, "{report}");
    assert_eq!(report["undeclared"], serde_json::json!([]), "{report}");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    // migrate --dry-run prints what it would apply, and applies nothing.
    let dry = host_command(&config)
        .args(["migrate", "--dry-run"])
        .output()?;
    assert!(
        dry.status.success(),
        "{}",
        String::from_utf8_lossy(&dry.stderr)
    );
    let sql = String::from_utf8_lossy(&dry.stdout);
    assert!(
        sql.contains(&format!(
            "-- {locking} dead letter age index (expand step, in one transaction)"
        )),
        "{sql}"
    );
    assert!(sql.contains("CREATE INDEX"), "{sql}");
    let (_, after) = check(&config);
    assert_eq!(
        after["migrations"][0]["version"], locking,
        "nothing applied: {after}"
    );

    // Read, not taken: the messages are still there, never delivered.
    let (_, again) = check(&config);
    assert_eq!(again["queues"]["email.send.dead"], 3, "{again}");
    Ok(())
}

/// A dead letter of `message_type` archived with `headers`.
async fn dead_letter(db: &TestDb, key: &str, message_type: &str, headers: serde_json::Value) {
    sqlx::query(
        "INSERT INTO dead_letters (dedup_key, source, queue, message_type, reason, \
                                   error_fingerprint, error_normalized, died_at, headers, body) \
         VALUES ($1, 'runner', $2, $2, 'rejected', 'f', 'e', now(), $3, '\\x7b7d')",
    )
    .bind(key)
    .bind(message_type)
    .bind(headers)
    .execute(&db.pool)
    .await
    .unwrap();
}

#[tokio::test]
async fn dead_letters_of_a_schema_version_this_release_does_not_read_hold_the_upgrade()
-> anyhow::Result<()> {
    let site = Installation::new("upgrade-test").await?;
    site.declare_topology();
    let Installation {
        db,
        vhost: _,
        config,
        dir: _dir,
    } = site;
    // Two from before versions were written (none is version 1), one of today's, and one
    // that a newer release wrote.
    dead_letter(&db, "a", "email.send", serde_json::json!({})).await;
    dead_letter(&db, "b", "email.send", serde_json::json!({"trace": "x"})).await;
    dead_letter(
        &db,
        "c",
        "email.send",
        serde_json::json!({"x-schema-version": 1}),
    )
    .await;
    dead_letter(
        &db,
        "d",
        "email.send",
        serde_json::json!({"x-schema-version": 3}),
    )
    .await;

    let (output, report) = check(&config);
    assert_eq!(
        report["messages"],
        serde_json::json!([
            {"table": "dead_letters", "message_type": "email.send", "version": 1, "count": 3,
             "reads_up_to": 1, "readable": true},
            {"table": "dead_letters", "message_type": "email.send", "version": 3, "count": 1,
             "reads_up_to": 1, "readable": false},
        ]),
        "{report}"
    );
    assert_eq!(output.status.code(), Some(69));
    let why = String::from_utf8_lossy(&output.stderr);
    assert!(why.contains("schema version 3"), "{why}");
    Ok(())
}
