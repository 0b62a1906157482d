//! The operators' recorded commands (`worker-host dlq`, `outbox retry`) with the real binary
//! on a real database. A purge records who ran it: the operating-system user of the process
//! (whatever `$USER` says), the name given with `--actor` or `WORKER_HOST_ACTOR`, and the
//! database role; a purge without `--yes` is recorded as a dry run. A time too far back is a
//! usage error that names its flag. A confirmed count (`--planned`) caps what is acted on.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use support::{Installation, host_command};
use worker_testkit::TestDb;

fn dlq(config: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut command = host_command(config);
    command.args(args).env_remove("WORKER_HOST_ACTOR");
    for (key, value) in env {
        command.env(key, value);
    }
    let output = command.output().unwrap();
    (
        output.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    )
}

#[tokio::test]
async fn a_purge_records_the_os_user_the_given_actor_and_its_dry_run() -> anyhow::Result<()> {
    let Installation {
        db,
        vhost: _,
        config,
        dir: _dir,
    } = Installation::new("audit-test").await?;
    // Whoever runs this, `$USER` lies about it.
    let spoofed = [("USER", "mallory"), ("LOGNAME", "mallory")];

    let mut env = spoofed.to_vec();
    env.push(("WORKER_HOST_ACTOR", "alice"));
    let (code, out) = dlq(&config, &["dlq", "purge", "--all"], &env);
    assert_eq!(code, 64, "without --yes: {out}");
    assert!(out.contains("dry run recorded"), "{out}");
    let (code, out) = dlq(
        &config,
        &["dlq", "purge", "--all", "--yes", "--actor", "bob"],
        &env,
    );
    assert_eq!(code, 0, "{out}");

    let rows: Vec<(String, bool, String, Option<String>, String)> = sqlx::query_as(
        "SELECT action, dry_run, actor_user, actor, db_user FROM dead_letter_actions ORDER BY id",
    )
    .fetch_all(&db.pool)
    .await?;
    let os_user = whoami::username();
    assert_ne!(os_user, "mallory");
    let role: String = sqlx::query_scalar("SELECT session_user::text")
        .fetch_one(&db.pool)
        .await?;
    assert_eq!(
        rows,
        vec![
            (
                "purge".into(),
                true,
                os_user.clone(),
                Some("alice".into()),
                role.clone()
            ),
            ("purge".into(), false, os_user, Some("bob".into()), role),
        ],
        "the flag wins over the variable; the OS user over $USER"
    );
    Ok(())
}

#[tokio::test]
async fn an_age_too_far_back_is_a_usage_error_naming_the_flag() -> anyhow::Result<()> {
    let Installation {
        db: _,
        vhost: _,
        config,
        dir: _dir,
    } = Installation::new("since-test").await?;
    for args in [
        &["dlq", "show", "--since", "300000y"][..],
        &["dlq", "replay", "--dry-run", "--until", "300000y"][..],
    ] {
        let (code, out) = dlq(&config, args, &[]);
        assert_eq!(code, 64, "{args:?}: {out}");
        assert!(!out.contains("panicked"), "{args:?}: {out}");
        let flag = args[args.len() - 2];
        assert!(out.contains(flag), "{args:?} names {flag}: {out}");
        assert!(out.contains("300000y"), "{args:?}: {out}");
    }
    Ok(())
}

#[tokio::test]
async fn a_purge_with_planned_marks_at_most_that_many_and_says_how_many_more_match()
-> anyhow::Result<()> {
    use job_dead_letter_archive::{Archiver, ArchiverSettings, DeadQueue, RawMessage};
    let Installation {
        db,
        vhost: _,
        config,
        dir: _dir,
    } = Installation::new("planned-test").await?;
    let properties: Vec<worker_broker::Properties> = (0..5)
        .map(|i| worker_broker::Properties {
            message_id: Some(format!("m-{i}")),
            ..worker_broker::Properties::default()
        })
        .collect();
    let raws: Vec<RawMessage<'_>> = properties
        .iter()
        .map(|p| RawMessage {
            routing_key: "orders",
            redelivered: false,
            properties: p,
            body: b"{}",
        })
        .collect();
    Archiver::new(db.pool.clone(), ArchiverSettings::default())
        .archive_batch(&DeadQueue::new("orders.dead", "orders"), &raws)
        .await?;

    let (code, out) = dlq(
        &config,
        &["dlq", "purge", "--all", "--yes", "--planned", "3"],
        &[],
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("purged 3") && out.contains("2 more"), "{out}");
    let dead: Vec<String> =
        sqlx::query_scalar("SELECT message_id FROM dead_letters WHERE status = 'dead' ORDER BY id")
            .fetch_all(&db.pool)
            .await?;
    assert_eq!(dead, ["m-3", "m-4"], "the oldest three went");
    Ok(())
}

/// `n` outbox rows that gave up.
async fn failed_outbox_rows(db: &TestDb, from: usize, n: usize) -> anyhow::Result<()> {
    use worker_store::outbox::{self, PublishFailure};
    let messages: Vec<worker_store::OutboxMessage> = (from..from + n)
        .map(|i| worker_store::OutboxMessage::new(format!("o-{i}"), b"{}".to_vec()))
        .collect();
    let mut tx = db.pool.begin().await?;
    let ids = outbox::enqueue_many(&mut tx, "events", "k", &messages).await?;
    let failures: Vec<PublishFailure> = ids
        .iter()
        .map(|&id| PublishFailure {
            id,
            error: "unroutable".into(),
            retry_in: std::time::Duration::ZERO,
        })
        .collect();
    outbox::record_failures(&mut tx, &failures, 1).await?;
    tx.commit().await?;
    Ok(())
}

#[tokio::test]
async fn outbox_retry_all_failed_has_a_recorded_dry_run_and_keeps_to_the_planned_count()
-> anyhow::Result<()> {
    let Installation {
        db,
        vhost: _,
        config,
        dir: _dir,
    } = Installation::new("outbox-test").await?;
    failed_outbox_rows(&db, 0, 3).await?;

    let (code, out) = dlq(
        &config,
        &["outbox", "retry", "--all-failed", "--dry-run"],
        &[],
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("3 failed outbox rows would be pending again"),
        "{out}"
    );
    assert!(
        out.contains("o-0") && out.contains("o-2"),
        "lists them: {out}"
    );
    failed_outbox_rows(&db, 3, 2).await?;
    let (code, out) = dlq(
        &config,
        &["outbox", "retry", "--all-failed", "--planned", "3"],
        &[],
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("3 failed outbox rows are pending again"),
        "{out}"
    );
    assert!(out.contains("2 more"), "{out}");

    let failed: Vec<String> =
        sqlx::query_scalar("SELECT message_id FROM outbox WHERE status = 'failed' ORDER BY id")
            .fetch_all(&db.pool)
            .await?;
    assert_eq!(failed, ["o-3", "o-4"]);
    let rows: Vec<(String, bool, i64, i64, Option<i64>)> = sqlx::query_as(
        "SELECT action, dry_run, matched, succeeded, planned FROM dead_letter_actions ORDER BY id",
    )
    .fetch_all(&db.pool)
    .await?;
    assert_eq!(
        rows,
        [
            ("outbox-retry".to_string(), true, 3, 0, None),
            ("outbox-retry".to_string(), false, 3, 3, Some(3)),
        ]
    );
    Ok(())
}

/// An email.send dead letter of the reply `id`, as the archive keeps it.
async fn dead_reply(db: &TestDb, key: &str, id: uuid::Uuid) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO dead_letters (dedup_key, source, queue, message_id, reason, attempts, \
             last_error, error_fingerprint, error_normalized, died_at, body) \
         VALUES ($1, 'runner', 'email.send', $2, 'gave-up', 5, 'timeout', 'abcdef012345', \
             'timeout', now(), $3)",
    )
    .bind(key)
    .bind(id.to_string())
    .bind(format!("{{\"outbound_email_id\": \"{id}\"}}").into_bytes())
    .execute(&db.pool)
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_replays_dry_run_says_how_many_replies_would_expire() -> anyhow::Result<()> {
    let Installation {
        db,
        vhost: _vhost,
        config,
        dir: _dir,
    } = Installation::new("expiry-test").await?;
    let mut settings = std::fs::read_to_string(&config)?;
    settings.push_str("\n[jobs.email_send]\nmax_age = \"1day\"\n");
    std::fs::write(&config, settings)?;
    // Two replies that gave up: one queued two days ago, one an hour ago.
    for (key, age) in [("stale", "2 days"), ("fresh", "1 hour")] {
        let id = uuid::Uuid::new_v4();
        sqlx::query(
            "INSERT INTO outbound_emails (id, message_id, to_addresses, subject, text_body, \
                 created_at) \
             VALUES ($1, $2, ARRAY['ann@example.com'], 'Re: ping', 'pong', \
                 now() - $3::interval)",
        )
        .bind(id)
        .bind(format!("{id}@worker-host"))
        .bind(age)
        .execute(&db.pool)
        .await?;
        dead_reply(&db, key, id).await?;
    }

    let (code, out) = dlq(
        &config,
        &["dlq", "replay", "--all", "--dry-run", "--json"],
        &[],
    );
    assert_eq!(code, 0, "{out}");
    let report: serde_json::Value = serde_json::from_str(&out)?;
    assert_eq!(report["matched"], 2, "{out}");
    assert_eq!(report["would_expire"], 1, "{out}");
    let (code, out) = dlq(&config, &["dlq", "replay", "--all", "--dry-run"], &[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("1 of them are replies past their age limit"),
        "{out}"
    );
    let dead: i64 = sqlx::query_scalar("SELECT count(*) FROM dead_letters WHERE status = 'dead'")
        .fetch_one(&db.pool)
        .await?;
    assert_eq!(dead, 2, "a dry run replays nothing");
    Ok(())
}
