//! `worker-host operators`: named accounts in the shared database, with the real binary on a
//! real database. A password comes from stdin or a file and is kept as an argon2id hash; a
//! token is printed once and kept as its digest; disabling an account ends its sessions;
//! every change is in the audit trail as the command line's, with the operating-system user.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::io::Write;
use std::process::Stdio;

use sha2::{Digest, Sha256};
use support::{base_settings, free_port, host_command};
use worker_testkit::{TestDb, TestVhost};

/// Runs `worker-host operators <args>` with `stdin`; its exit code, stdout and stderr.
fn operators(config: &std::path::Path, args: &[&str], stdin: &str) -> (i32, String, String) {
    let mut child = host_command(config)
        .arg("operators")
        .args(args)
        .env_remove("WORKER_HOST_ACTOR")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

async fn settings(db: &TestDb) -> (tempfile::TempDir, std::path::PathBuf) {
    let vhost = TestVhost::create().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("worker-host.toml");
    let text = base_settings("operators-test", "[]", db, &vhost, free_port());
    // Cheap hashing: the test checks the format and the parameters, not the cost.
    let text = format!(
        "{text}\n[admin.password_hashing]\nmemory_kib = 1024\niterations = 1\nparallelism = 1\n"
    );
    std::fs::write(&config, text).unwrap();
    (dir, config)
}

#[tokio::test]
async fn an_account_is_made_with_a_hashed_password_from_stdin_and_recorded() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let (_dir, config) = settings(&db).await;
    let (code, out, err) = operators(
        &config,
        &["add", "alice", "--role", "operator", "--password-stdin"],
        "a long enough password\n",
    );
    assert_eq!(code, 0, "{out}{err}");
    let (role, hash, origin): (String, String, String) = sqlx::query_as(
        "SELECT role, password_hash, origin FROM operator_accounts WHERE name = 'alice'",
    )
    .fetch_one(&db.pool)
    .await?;
    assert_eq!((role.as_str(), origin.as_str()), ("operator", "local"));
    assert!(hash.starts_with("$argon2id$v=19$m=1024,t=1,p=1$"), "{hash}");
    assert!(!hash.contains("a long enough password"));

    let (code, out, _) = operators(&config, &["list"], "");
    assert_eq!(code, 0);
    assert!(
        out.contains("alice") && out.contains("operator") && out.contains("password yes"),
        "{out}"
    );

    let audit: (String, Option<String>, Option<String>, String) = sqlx::query_as(
        "SELECT action, via, account, actor_user FROM dead_letter_actions ORDER BY id LIMIT 1",
    )
    .fetch_one(&db.pool)
    .await?;
    assert_eq!(
        audit,
        (
            "operator-add".into(),
            Some("cli".into()),
            None,
            whoami::username()
        ),
        "the command line acts as the OS user, not as an account"
    );
    Ok(())
}

#[tokio::test]
async fn a_password_is_never_taken_from_an_argument_and_a_short_one_is_refused()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let (dir, config) = settings(&db).await;
    let (code, _, err) = operators(
        &config,
        &[
            "add",
            "bob",
            "--role",
            "viewer",
            "--password",
            "secret-secret",
        ],
        "",
    );
    assert_eq!(code, 64, "{err}");
    assert!(
        err.contains("unexpected argument '--password'"),
        "no flag takes a password itself: {err}"
    );
    let (code, _, err) = operators(
        &config,
        &["add", "bob", "--role", "viewer", "--password-stdin"],
        "short\n",
    );
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("at least 12 characters"), "{err}");
    let file = dir.path().join("password");
    std::fs::write(&file, "from a file, long enough\n")?;
    let (code, out, err) = operators(
        &config,
        &[
            "add",
            "bob",
            "--role",
            "viewer",
            "--password-file",
            file.to_str().unwrap(),
        ],
        "",
    );
    assert_eq!(code, 0, "{out}{err}");
    let (code, _, err) = operators(&config, &["add", "bob", "--role", "viewer"], "");
    assert_eq!(code, 64);
    assert!(err.contains("exists already"), "{err}");
    Ok(())
}

#[tokio::test]
async fn a_token_is_shown_once_and_kept_as_its_digest() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let (_dir, config) = settings(&db).await;
    assert_eq!(
        operators(&config, &["add", "prom", "--role", "viewer"], "").0,
        0
    );
    let (code, out, err) = operators(&config, &["token", "prom", "--label", "prometheus"], "");
    assert_eq!(code, 0, "{err}");
    let token = out.trim();
    assert!(token.starts_with("wht_") && token.len() == 68, "{out}");
    assert!(err.contains("shown only now"), "{err}");
    let kept: Vec<u8> = sqlx::query_scalar("SELECT token_sha256 FROM operator_tokens")
        .fetch_one(&db.pool)
        .await?;
    assert_eq!(kept, Sha256::digest(token.as_bytes()).to_vec());
    let found = worker_store::operators::by_token(&db.pool, &kept).await?;
    assert_eq!(
        found,
        Some(("prom".into(), worker_store::operators::Role::Viewer))
    );
    let (code, _, err) = operators(&config, &["token", "nobody", "--label", "x"], "");
    assert_eq!(code, 64);
    assert!(err.contains("no account is called `nobody`"), "{err}");
    Ok(())
}

#[tokio::test]
async fn disabling_an_account_ends_its_sessions_and_its_tokens_at_once() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let (_dir, config) = settings(&db).await;
    assert_eq!(
        operators(&config, &["add", "carol", "--role", "admin"], "").0,
        0
    );
    let (_, out, _) = operators(&config, &["token", "carol", "--label", "script"], "");
    let digest = Sha256::digest(out.trim().as_bytes()).to_vec();
    let session = Sha256::digest(b"a session id").to_vec();
    let idle = std::time::Duration::from_secs(600);
    worker_store::sessions::create(
        &db.pool,
        &worker_store::sessions::NewSession {
            id_sha256: &session,
            account: "carol",
            csrf: "csrf",
            origin: "127.0.0.1",
            given_name: None,
            lifetime: std::time::Duration::from_secs(3600),
        },
    )
    .await?;
    assert!(
        worker_store::sessions::live(&db.pool, &session, idle, true)
            .await?
            .is_some()
    );

    assert_eq!(operators(&config, &["disable", "carol"], "").0, 0);
    assert_eq!(
        worker_store::sessions::live(&db.pool, &session, idle, true).await?,
        None
    );
    assert_eq!(
        worker_store::operators::by_token(&db.pool, &digest).await?,
        None
    );
    assert_eq!(operators(&config, &["enable", "carol"], "").0, 0);
    assert!(
        worker_store::operators::by_token(&db.pool, &digest)
            .await?
            .is_some()
    );
    let (code, _, err) = operators(&config, &["remove", "bootstrap"], "");
    assert_eq!(code, 64);
    assert!(err.contains("admin.operator_token"), "{err}");
    assert_eq!(operators(&config, &["remove", "carol"], "").0, 0);
    let actions: Vec<String> =
        sqlx::query_scalar("SELECT action FROM dead_letter_actions ORDER BY id")
            .fetch_all(&db.pool)
            .await?;
    assert_eq!(
        actions,
        [
            "operator-add",
            "operator-token",
            "operator-disable",
            "operator-change",
            "operator-remove"
        ]
    );
    Ok(())
}

#[tokio::test]
async fn the_bootstrap_token_is_its_accounts_token_and_changing_it_ends_the_old_ones_sessions()
-> anyhow::Result<()> {
    use worker_store::operators::{BootstrapSync, by_token, sync_bootstrap};
    let db = TestDb::create().await?;
    let (_dir, _config) = settings(&db).await;
    let old = Sha256::digest(b"the-first-operator-token").to_vec();
    let new = Sha256::digest(b"the-second-operator-token").to_vec();
    assert_eq!(
        sync_bootstrap(&db.pool, Some(&old)).await?,
        BootstrapSync::Enabled
    );
    assert_eq!(
        sync_bootstrap(&db.pool, Some(&old)).await?,
        BootstrapSync::Unchanged
    );
    assert_eq!(
        by_token(&db.pool, &old).await?.map(|(account, _)| account),
        Some("bootstrap".to_string())
    );
    let session = Sha256::digest(b"a bootstrap session").to_vec();
    worker_store::sessions::create(
        &db.pool,
        &worker_store::sessions::NewSession {
            id_sha256: &session,
            account: "bootstrap",
            csrf: "csrf",
            origin: "127.0.0.1",
            given_name: Some("alice"),
            lifetime: std::time::Duration::from_secs(3600),
        },
    )
    .await?;
    let idle = std::time::Duration::from_secs(600);

    // Another replica starts with a new token: the old one and its sessions end everywhere.
    assert_eq!(
        sync_bootstrap(&db.pool, Some(&new)).await?,
        BootstrapSync::Rotated
    );
    assert_eq!(by_token(&db.pool, &old).await?, None);
    assert!(by_token(&db.pool, &new).await?.is_some());
    assert_eq!(
        worker_store::sessions::live(&db.pool, &session, idle, true).await?,
        None
    );

    // Without the setting, the account is disabled and its token stops.
    assert_eq!(
        sync_bootstrap(&db.pool, None).await?,
        BootstrapSync::Disabled
    );
    assert_eq!(by_token(&db.pool, &new).await?, None);
    assert_eq!(
        sync_bootstrap(&db.pool, None).await?,
        BootstrapSync::Unchanged
    );
    Ok(())
}
