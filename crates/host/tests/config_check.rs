//! `worker-host config check` on broken files: exit 64 and a message naming the key; on a
//! good file: the effective settings, with no secret in them.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::process::Command;

fn config_check(text: &str) -> (i32, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("worker-host.toml");
    std::fs::write(&path, text).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_worker-host"))
        .args(["config", "check", "--config"])
        .arg(&path)
        .env_remove("WORKER_HOST_CONFIG")
        .output()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

const SECRETS: &str =
    "[database]\npassword = \"db-pw-7f3a\"\n[broker]\npassword = \"mq-pw-91c2\"\n";

#[test]
fn each_broken_file_exits_64_and_names_the_key() {
    let cases: &[(&str, String, &str)] = &[
        (
            "unknown key",
            format!("{SECRETS}[admin]\nlisten_on = \"127.0.0.1:1\"\n"),
            "listen_on",
        ),
        (
            "zero duration",
            format!("{SECRETS}[jobs.db_health]\ntimeout = \"0s\"\n"),
            "jobs.db_health.timeout",
        ),
        (
            "wrong type",
            format!("{SECRETS}[smtp]\nport = \"twenty-five\"\n"),
            "smtp.port",
        ),
        (
            "negative duration",
            "[database]\npassword = \"p\"\n[broker]\npassword = \"q\"\nheartbeat = \"-10s\"\n"
                .to_string(),
            "broker.heartbeat",
        ),
        (
            "bad cron",
            format!("{SECRETS}[jobs.db_health]\nschedule = \"0 61 * * * *\"\n"),
            "jobs.db_health.schedule",
        ),
        (
            "missing secret",
            "[broker]\npassword = \"x\"\n".to_string(),
            "database.password",
        ),
        (
            "unreadable secret file",
            "[database]\npassword_file = \"/nonexistent/pw\"\n[broker]\npassword = \"x\"\n"
                .to_string(),
            "database.password_file",
        ),
        ("broken toml", "[database\n".to_string(), "worker-host.toml"),
        (
            "an allowed host that is a URL",
            format!(
                "{SECRETS}[admin]\nallowed_hosts = [\"ok.example.net\", \"https://console.example.net\"]\n"
            ),
            "admin.allowed_hosts[1]",
        ),
    ];
    for (case, text, key) in cases {
        let (code, stdout, stderr) = config_check(text);
        assert_eq!(code, 64, "{case}: exit code; stderr: {stderr}");
        assert!(
            stderr.contains(key),
            "{case}: stderr does not name `{key}`: {stderr}"
        );
        assert!(
            stderr.contains("worker-host.toml"),
            "{case}: stderr does not name the file: {stderr}"
        );
        assert!(
            stdout.is_empty(),
            "{case}: printed settings for a broken file: {stdout}"
        );
    }
}

#[test]
fn a_negative_duration_exits_64() {
    let (code, _, stderr) =
        config_check(&format!("{SECRETS}[workers]\nshutdown_grace = \"-1s\"\n"));
    assert_eq!(code, 64, "{stderr}");
    assert!(stderr.contains("workers.shutdown_grace"), "{stderr}");
}

#[test]
fn a_wrong_type_exits_64() {
    let text =
        "[database]\npassword = \"p\"\nmax_connections = \"many\"\n[broker]\npassword = \"q\"\n";
    let (code, _, stderr) = config_check(text);
    assert_eq!(code, 64, "{stderr}");
    assert!(stderr.contains("database.max_connections"), "{stderr}");
}

#[test]
fn a_good_file_prints_the_effective_settings_without_secrets() {
    let text = format!(
        "{SECRETS}[smtp]\nusername = \"mailer\"\npassword = \"smtp-pw-55e1\"\n[[imap.accounts]]\nname = \"support\"\nusername = \"support\"\npassword = \"imap-pw-0b9d\"\n"
    );
    let (code, stdout, stderr) = config_check(&text);
    assert_eq!(code, 0, "{stderr}");
    for secret in ["db-pw-7f3a", "mq-pw-91c2", "smtp-pw-55e1", "imap-pw-0b9d"] {
        assert!(
            !stdout.contains(secret) && !stderr.contains(secret),
            "{secret} was printed"
        );
    }
    assert!(stdout.contains("[redacted]"));
    assert!(
        stdout.contains("[jobs.email_send]") && stdout.contains("timeout = \"1m\""),
        "effective timeouts are printed: {stdout}"
    );
}

#[test]
fn the_default_file_checks_and_every_password_line_is_redacted() {
    let output = Command::new(env!("CARGO_BIN_EXE_worker-host"))
        .args(["config", "check"])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .env_remove("WORKER_HOST_CONFIG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let password_lines: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("password "))
        .collect();
    assert!(!password_lines.is_empty(), "{stdout}");
    for line in password_lines {
        assert_eq!(line, "password = \"[redacted]\"");
    }
}

#[test]
fn bad_usage_exits_64_and_help_exits_0() {
    let bin = env!("CARGO_BIN_EXE_worker-host");
    let bad = Command::new(bin).arg("frobnicate").output().unwrap();
    assert_eq!(bad.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("frobnicate"));
    let help = Command::new(bin).arg("--help").output().unwrap();
    assert_eq!(help.status.code(), Some(0));
    let text = String::from_utf8_lossy(&help.stdout);
    for command in ["run", "migrate", "config", "--config", "WORKER_HOST_CONFIG"] {
        assert!(
            text.contains(command),
            "--help does not explain {command}: {text}"
        );
    }
}

#[test]
fn the_config_path_comes_from_the_environment_too() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("from-env.toml");
    std::fs::write(&path, format!("installation = \"client-42\"\n{SECRETS}")).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_worker-host"))
        .args(["config", "check"])
        .env("WORKER_HOST_CONFIG", &path)
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("installation = \"client-42\""));
}

/// `config check` of the compose file's host settings, with what docker-compose.yml gives
/// through the environment (the container paths aside) and `vars` besides.
fn compose_config_check(vars: &[(&str, &str)]) -> std::process::Output {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    Command::new(env!("CARGO_BIN_EXE_worker-host"))
        .args(["config", "check", "--config"])
        .arg(format!("{root}/config/worker-host.compose.toml"))
        .env_remove("WORKER_HOST_CONFIG")
        .env(
            "WORKER_HOST__AUTOMATIONS_FILES",
            format!("[\"{root}/config/automations.demo.toml\"]"),
        )
        .env("WORKER_HOST__DATABASE__PASSWORD", "worker_host")
        .env("WORKER_HOST__BROKER__PASSWORD", "worker_host")
        .env(
            "WORKER_HOST__ADMIN__OPERATOR_TOKEN",
            "compose-dev-operator-token",
        )
        .envs(vars.iter().copied())
        .output()
        .unwrap()
}

/// docker-compose.yml's host: its settings file, with what the compose file gives through
/// the environment, passes the check (the container paths aside).
#[test]
fn the_compose_files_host_settings_pass_the_check() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let output = compose_config_check(&[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let compose = std::fs::read_to_string(format!("{root}/docker-compose.yml")).unwrap();
    for key in [
        "WORKER_HOST__DATABASE__PASSWORD",
        "WORKER_HOST__BROKER__PASSWORD",
        "WORKER_HOST__ADMIN__OPERATOR_TOKEN",
        "config/worker-host.compose.toml",
    ] {
        assert!(compose.contains(key), "docker-compose.yml gives {key}");
    }
}

/// docker-compose.yml's `cluster` profile: the same settings file, with the three nodes'
/// addresses the compose file gives (which replace the file's single `host`), passes the
/// check and connects to the nodes in that order.
#[test]
fn the_compose_files_cluster_host_settings_pass_the_check() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let addresses = r#"["rabbitmq-1:5672", "rabbitmq-2:5672", "rabbitmq-3:5672"]"#;
    let compose = std::fs::read_to_string(format!("{root}/docker-compose.yml")).unwrap();
    assert!(
        compose.contains(&format!("WORKER_HOST__BROKER__ADDRESSES: '{addresses}'")),
        "docker-compose.yml gives the cluster's addresses as this test does"
    );
    let output = compose_config_check(&[("WORKER_HOST__BROKER__ADDRESSES", addresses)]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let at = |node: &str| stdout.find(&format!("\"{node}:5672\""));
    let order = [at("rabbitmq-1"), at("rabbitmq-2"), at("rabbitmq-3")];
    assert!(
        order.iter().all(Option::is_some) && order.is_sorted(),
        "the effective settings list the nodes in order: {stdout}"
    );
}

const M365: &str = "[oauth.m365]\nprovider = \"microsoft\"\ntenant = \"contoso.onmicrosoft.com\"\nflow = \"client_credentials\"\nclient_id = \"app-1\"\nclient_secret = \"oauth-secret-5d1e\"\n";

const M365_SMTP: &str = "[smtp]\nhost = \"smtp.office365.com\"\nport = 587\nsecurity = \"starttls\"\nusername = \"support@contoso.com\"\nauth = \"xoauth2\"\noauth = \"m365\"\n";

#[test]
fn oauth_sections_and_their_references_are_checked_naming_the_key() {
    let cases: &[(&str, String, &str)] = &[
        (
            "an account naming no section",
            format!(
                "{SECRETS}{M365}[[imap.accounts]]\nname = \"a\"\nusername = \"support@contoso.com\"\nauth = \"xoauth2\"\noauth = \"nope\"\n"
            ),
            "imap.accounts[0].oauth",
        ),
        (
            "a token sign-in without a source",
            format!(
                "{SECRETS}[[imap.accounts]]\nname = \"a\"\nusername = \"u\"\nauth = \"xoauth2\"\n"
            ),
            "imap.accounts[0].oauth",
        ),
        (
            "microsoft without a tenant",
            format!(
                "{SECRETS}{}",
                M365.replace("tenant = \"contoso.onmicrosoft.com\"\n", "")
            ),
            "oauth.m365.tenant",
        ),
        (
            "a token url in plain http to another host",
            format!(
                "{SECRETS}[oauth.x]\nflow = \"client_credentials\"\ntoken_url = \"http://idp.example.com/token\"\nscope = \"s\"\nclient_id = \"c\"\nclient_secret = \"s\"\n"
            ),
            "oauth.x.token_url",
        ),
        (
            "an unknown flow",
            format!(
                "{SECRETS}{}",
                M365.replace("client_credentials", "implicit")
            ),
            "oauth.m365.flow",
        ),
        (
            "smtp naming no section",
            format!("{SECRETS}{}", M365_SMTP.replace("\"m365\"", "\"other\"")),
            "smtp.oauth",
        ),
    ];
    for (what, text, key) in cases {
        let (code, _out, err) = config_check(text);
        assert_eq!(code, 64, "{what}: {err}");
        assert!(err.contains(key), "{what}: expected `{key}` in: {err}");
    }
}

#[test]
fn a_microsoft_smtp_account_is_said_to_keep_three_connections_and_no_secret_is_printed() {
    let (code, out, err) = config_check(&format!("{SECRETS}{M365}{M365_SMTP}"));
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("smtp.pool_size = 4 is capped at 3"),
        "the note on Microsoft's limit: {out}"
    );
    assert!(!out.contains("oauth-secret-5d1e"), "{out}");
}

#[test]
fn a_microsoft_smtp_account_is_said_to_send_thirty_a_minute_across_replicas() {
    let (code, out, err) = config_check(&format!("{SECRETS}{M365}{M365_SMTP}"));
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(
            "smtp.rate: 30 messages a minute, 10000 recipients a day, all replicas together"
        ),
        "the note on Microsoft's sending rate: {out}"
    );
}
