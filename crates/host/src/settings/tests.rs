use std::path::Path;
use std::time::Duration;

use super::*;

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> SettingsSource {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    SettingsSource {
        path,
        explicit: true,
    }
}

const SECRETS: &str = "[database]\npassword = \"pw\"\n[broker]\npassword = \"guest\"\n";

fn load_text(text: &str) -> Result<Settings, Vec<SettingsError>> {
    let dir = tempfile::tempdir().unwrap();
    let source = write(&dir, "worker-host.toml", text);
    Settings::load(&source, &[])
}

fn only_error(text: &str) -> SettingsError {
    let errors = load_text(text).expect_err("the settings should be rejected");
    assert_eq!(errors.len(), 1, "expected one error, got {errors:?}");
    errors.into_iter().next().unwrap()
}

#[test]
fn minimal_file_with_secrets_loads_with_defaults() {
    let settings = load_text(SECRETS).unwrap();
    assert_eq!(settings.database.port, 5432);
    assert_eq!(
        settings.jobs.email_send.send.timeout,
        Duration::from_secs(60)
    );
    assert_eq!(
        settings.jobs.automation_trigger.runner.timeout,
        Duration::from_secs(30)
    );
    let topology = settings.topology().unwrap();
    let names: Vec<&str> = topology.queues.iter().map(|q| q.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "automation.trigger",
            "automation.action",
            "email.send",
            "audit.log"
        ]
    );
    assert_eq!(settings.database.password.as_ref().unwrap().expose(), "pw");
}

#[test]
fn an_unknown_key_is_named_with_its_file() {
    let text = "[database]\npassword = \"pw\"\nprot = 5433\n[broker]\npassword = \"guest\"\n";
    let error = only_error(text);
    assert!(error.to_string().contains("prot"), "{error}");
    assert!(error.to_string().contains("worker-host.toml"), "{error}");
    assert!(error.problem.contains("unknown key"), "{error}");
}

#[test]
fn a_wrong_type_names_the_key_and_the_expected_type() {
    let error = only_error(&format!("{SECRETS}[smtp]\nport = \"twenty-five\"\n"));
    assert_eq!(error.key, "smtp.port", "{error}");
    assert!(error.problem.contains("expected"), "{error}");
    assert!(
        error
            .source
            .as_deref()
            .unwrap()
            .contains("worker-host.toml, line "),
        "{error}"
    );
}

#[test]
fn a_claim_age_within_the_send_and_record_time_is_rejected() {
    let error = only_error(&format!(
        "{SECRETS}[jobs.email_send]\ntimeout = \"10s\"\nclaim_stale_after = \"40s\"\n"
    ));
    assert_eq!(error.key, "jobs.email_send.claim_stale_after");
    assert!(error.problem.contains("(40s)"), "{error}");
}

#[test]
fn a_claim_age_above_the_send_and_record_time_is_taken() {
    let settings = load_text(&format!(
        "{SECRETS}[jobs.email_send]\ntimeout = \"10s\"\nclaim_stale_after = \"45s\"\n"
    ))
    .expect("settings load");
    assert_eq!(
        settings.jobs.email_send.claim_stale_after,
        Some(std::time::Duration::from_secs(45))
    );
}

#[test]
fn a_zero_duration_is_rejected() {
    let error = only_error(&format!("{SECRETS}[jobs.email_send]\ntimeout = \"0s\"\n"));
    assert_eq!(error.key, "jobs.email_send.timeout");
    assert!(error.problem.contains("longer than zero"), "{error}");
}

#[test]
fn a_zero_mail_limit_is_rejected_by_its_key() {
    for key in [
        "max_mime_parts",
        "max_mime_depth",
        "max_header_fields",
        "max_header_bytes",
    ] {
        let error = only_error(&format!(
            "{SECRETS}[jobs.inbound_email_poller]\n{key} = 0\n"
        ));
        assert_eq!(error.key, format!("jobs.inbound_email_poller.{key}"));
        assert!(error.problem.contains("positive number"), "{error}");
    }
    let settings = load_text(&format!(
        "{SECRETS}[jobs.inbound_email_poller]\nmax_mime_parts = 50\nmax_header_bytes = 4096\n"
    ))
    .unwrap();
    let limits = crate::jobs::poller_config(&settings).mail_limits;
    assert_eq!((limits.max_parts, limits.max_header_bytes), (50, 4096));
    assert_eq!(limits.max_depth, 30);
}

#[test]
fn a_negative_duration_is_rejected() {
    let error = only_error(&format!("{SECRETS}[workers]\nshutdown_grace = \"-5s\"\n"));
    assert_eq!(error.key, "workers.shutdown_grace", "{error}");
}

#[test]
fn the_settle_deadline_must_end_before_the_grace() {
    let error = only_error(&format!(
        "{SECRETS}[workers]\nshutdown_grace = \"10s\"\nsettle_deadline = \"9500ms\"\n"
    ));
    assert_eq!(error.key, "workers.settle_deadline", "{error}");
    assert!(error.problem.contains("shutdown_grace"), "{error}");
    let settings = load_text(&format!("{SECRETS}[workers]\nshutdown_grace = \"6s\"\n")).unwrap();
    assert_eq!(settings.workers.settle_deadline(), Duration::from_secs(4));
}

#[test]
fn an_in_process_wait_past_the_broker_consumer_timeout_is_rejected() {
    let error = only_error(&format!(
        "{SECRETS}[jobs.automation_action]\nin_process_wait = \"1h\"\n"
    ));
    assert_eq!(
        error.key, "jobs.automation_action.in_process_wait",
        "{error}"
    );
    assert!(error.problem.contains("consumer timeout"), "{error}");
}

#[test]
fn a_bad_cron_expression_is_rejected() {
    let error = only_error(&format!(
        "{SECRETS}[jobs.draft_expiry]\nschedule = \"every tuesday-ish\"\n"
    ));
    assert_eq!(error.key, "jobs.draft_expiry.schedule", "{error}");
    let error = only_error(&format!(
        "{SECRETS}[jobs.draft_expiry]\nschedule = \"99 * * * *\"\n"
    ));
    assert!(error.problem.contains("cron"), "{error}");
}

#[test]
fn an_interval_the_cron_ticker_cannot_keep_is_refused_naming_the_key() {
    let error = only_error(&format!(
        "{SECRETS}[jobs.inbound_email_poller]\nschedule = \"every 500ms\"\n"
    ));
    assert_eq!(error.key, "jobs.inbound_email_poller.schedule", "{error}");
    assert!(
        error.problem.contains("whole number of seconds")
            && error
                .problem
                .contains("an interval may be 1, 2, 3, 4, 5, 6, 10, 12, 15, 20 or 30 seconds"),
        "{error}"
    );
    let error = only_error(&format!(
        "{SECRETS}[jobs.dead_letter_archive]\nschedule = \"every 90s\"\n"
    ));
    assert_eq!(error.key, "jobs.dead_letter_archive.schedule", "{error}");
    assert!(error.problem.contains("does not fit the clock"), "{error}");
}

#[test]
fn schedules_parse_as_intervals_or_cron() {
    let settings =
        load_text(&format!("{SECRETS}[jobs.draft_expiry]\nschedule = \"0 */5 * * * *\"\n[jobs.db_health]\nschedule = \"every 2s\"\n"))
            .unwrap();
    assert_eq!(
        settings.jobs.draft_expiry.schedule,
        Schedule::Cron("0 */5 * * * *".into())
    );
    assert_eq!(
        settings.jobs.db_health.schedule,
        Schedule::Every(Duration::from_secs(2))
    );
}

#[test]
fn a_missing_secret_names_the_key_and_the_ways_to_give_it() {
    let error = only_error("[broker]\npassword = \"guest\"\n");
    assert_eq!(error.key, "database.password");
    assert!(
        error.problem.contains("WORKER_HOST__DATABASE__PASSWORD"),
        "{error}"
    );
    assert!(error.problem.contains("password_file"), "{error}");
}

#[test]
fn an_unreadable_secret_file_is_rejected() {
    let error = only_error(
        "[database]\npassword_file = \"/nonexistent/db-password\"\n[broker]\npassword = \"guest\"\n",
    );
    assert_eq!(error.key, "database.password_file");
    assert!(
        error.problem.contains("/nonexistent/db-password"),
        "{error}"
    );
}

#[test]
fn a_secret_file_is_read() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("pw"), "from-file\n").unwrap();
    let text = format!(
        "[database]\npassword_file = \"{}\"\n[broker]\npassword = \"guest\"\n",
        dir.path().join("pw").display()
    );
    let source = write(&dir, "s.toml", &text);
    let settings = Settings::load(&source, &[]).unwrap();
    assert_eq!(settings.database.password.unwrap().expose(), "from-file");
}

#[test]
fn an_imap_account_needs_its_password() {
    let error = only_error(&format!(
        "{SECRETS}[[imap.accounts]]\nname = \"support\"\nusername = \"alice\"\n"
    ));
    assert_eq!(error.key, "imap.accounts[0].password");
}

#[test]
fn an_imap_account_backfills_only_when_it_says_so() {
    let account = "[[imap.accounts]]\nname = \"a\"\nusername = \"alice\"\npassword = \"p\"\n";
    let settings = load_text(&format!("{SECRETS}{account}")).unwrap();
    assert!(!settings.imap.accounts[0].backfill);
    let settings = load_text(&format!("{SECRETS}{account}backfill = true\n")).unwrap();
    assert!(settings.imap.accounts[0].backfill);
    let error = only_error(&format!("{SECRETS}{account}backfill = \"yes\"\n"));
    assert_eq!(error.key, "imap.accounts.0.backfill", "{error}");
}

#[test]
fn the_reply_limit_has_a_default_and_refuses_zero() {
    let settings = load_text(SECRETS).unwrap();
    let limit = &settings.jobs.automation_action.auto_replies;
    assert_eq!(limit.per_recipient, 10);
    assert_eq!(limit.window, Duration::from_secs(3600));
    assert_eq!(limit.recipients_max, 50);
    let section = "[jobs.automation_action.auto_replies]";
    let text = format!("{SECRETS}{section}\nrecipients_max = 0\n");
    assert_eq!(
        only_error(&text).key,
        "jobs.automation_action.auto_replies.recipients_max"
    );
    let text = format!("{SECRETS}{section}\nper_recipient = 0\n");
    assert_eq!(
        only_error(&text).key,
        "jobs.automation_action.auto_replies.per_recipient"
    );
    let text = format!("{SECRETS}{section}\nwindow = \"0s\"\n");
    assert_eq!(
        only_error(&text).key,
        "jobs.automation_action.auto_replies.window"
    );
}

#[test]
fn the_environment_overrides_any_key() {
    let env = vec![
        (
            "WORKER_HOST__DATABASE__PORT".to_string(),
            "6543".to_string(),
        ),
        (
            "WORKER_HOST__JOBS__OUTBOX_DRAIN__DRAIN__BATCH_SIZE".to_string(),
            "42".to_string(),
        ),
        (
            "WORKER_HOST__BROKER__PASSWORD".to_string(),
            "from-env".to_string(),
        ),
        ("WORKER_HOST_CONFIG".to_string(), "ignored-here".to_string()),
        ("UNRELATED".to_string(), "x".to_string()),
    ];
    let dir = tempfile::tempdir().unwrap();
    let source = write(&dir, "s.toml", "[database]\npassword = \"pw\"\n");
    let settings = Settings::load(&source, &env).unwrap();
    assert_eq!(settings.database.port, 6543);
    assert_eq!(settings.jobs.outbox_drain.job.drain.batch_size, 42);
    assert_eq!(settings.broker.password.unwrap().expose(), "from-env");
}

#[test]
fn a_bad_environment_value_names_the_variable() {
    let env = vec![(
        "WORKER_HOST__DATABASE__PORT".to_string(),
        "lots".to_string(),
    )];
    let dir = tempfile::tempdir().unwrap();
    let source = write(&dir, "s.toml", SECRETS);
    let errors = Settings::load(&source, &env).unwrap_err();
    assert_eq!(errors[0].key, "database.port");
    assert!(
        errors[0]
            .to_string()
            .contains("WORKER_HOST__DATABASE__PORT"),
        "{}",
        errors[0]
    );
}

#[test]
fn a_missing_explicit_file_is_an_error_and_a_missing_default_is_not() {
    let missing = SettingsSource {
        path: "/nonexistent/worker-host.toml".into(),
        explicit: true,
    };
    let errors = Settings::load(&missing, &[]).unwrap_err();
    assert!(errors[0].problem.contains("no such settings file"));
    let default = SettingsSource {
        path: "/nonexistent/worker-host.toml".into(),
        explicit: false,
    };
    let env = vec![
        (
            "WORKER_HOST__DATABASE__PASSWORD".to_string(),
            "a".to_string(),
        ),
        ("WORKER_HOST__BROKER__PASSWORD".to_string(), "b".to_string()),
    ];
    assert!(Settings::load(&default, &env).is_ok());
}

fn problem_at(text: &str, key: &str) -> String {
    let errors = load_text(text).unwrap_err();
    errors
        .iter()
        .find(|e| e.key == key)
        .map(|e| e.to_string())
        .unwrap_or_else(|| panic!("no problem at {key}: {errors:?}"))
}

#[test]
fn open_reading_is_refused_off_loopback_and_a_console_there_needs_no_token() {
    let why = problem_at(
        "[admin]\nlisten = \"0.0.0.0:9180\"\nopen_reading = true\n",
        "admin.open_reading",
    );
    assert!(
        why.contains("loopback") && why.contains("SSH tunnel"),
        "{why}"
    );
    let signed = format!("{SECRETS}[admin]\nlisten = \"0.0.0.0:9180\"\n");
    assert!(load_text(&signed).is_ok());
    let local = format!("{SECRETS}[admin]\nopen_reading = true\n");
    assert!(load_text(&local).is_ok());
}

#[test]
fn trusted_proxies_take_addresses_and_networks_and_name_a_bad_one() {
    let text =
        format!("{SECRETS}[admin]\ntrusted_proxies = [\"127.0.0.1\", \"10.0.0.0/8\", \"::1\"]\n");
    let settings = load_text(&text).unwrap();
    let shown: Vec<String> = settings
        .admin
        .trusted_proxies
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(shown, ["127.0.0.1/32", "10.0.0.0/8", "::1/128"]);
    let errors = load_text("[admin]\ntrusted_proxies = [\"proxy.local\"]\n").unwrap_err();
    let why = errors
        .iter()
        .find(|e| e.key.contains("trusted_proxies"))
        .map(ToString::to_string)
        .unwrap_or_else(|| panic!("{errors:?}"));
    assert!(why.contains("proxy.local"), "{why}");
}

#[test]
fn an_auth_proxy_needs_trusted_proxies_and_a_header_name() {
    let why = problem_at(
        "[admin.auth_proxy]\nheader = \"X-Forwarded-User\"\n",
        "admin.auth_proxy",
    );
    assert!(why.contains("trusted_proxies"), "{why}");
    let why = problem_at(
        "[admin]\ntrusted_proxies = [\"127.0.0.1\"]\n[admin.auth_proxy]\nheader = \"X User\"\n",
        "admin.auth_proxy.header",
    );
    assert!(why.contains("header name"), "{why}");
    let good = format!(
        "{SECRETS}[admin]\ntrusted_proxies = [\"127.0.0.1\"]\n[admin.auth_proxy]\nheader = \"X-Forwarded-User\"\nnew_account_role = \"viewer\"\n"
    );
    let settings = load_text(&good).unwrap();
    let proxy = settings.admin.auth_proxy.unwrap();
    assert_eq!(
        proxy.new_account_role,
        Some(worker_store::operators::Role::Viewer)
    );
}

#[test]
fn a_short_scrape_token_is_refused_without_showing_it() {
    let why = problem_at(
        "[admin]\nscrape_token = \"short-Scrape\"\n",
        "admin.scrape_token",
    );
    assert!(why.contains("at least 16"), "{why}");
    assert!(!why.contains("short-Scrape"), "{why}");
}

#[test]
fn a_short_operator_token_is_refused_without_showing_it() {
    let why = problem_at(
        "[admin]\noperator_token = \"short-Tok\"\n",
        "admin.operator_token",
    );
    assert!(why.contains("at least 16"), "{why}");
    assert!(!why.contains("short-Tok"), "{why}");
}

#[test]
fn the_operator_token_comes_from_its_file_too() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, "from-a-file-token-value\n").unwrap();
    let text = format!(
        "{SECRETS}[admin]\noperator_token_file = {:?}\n",
        file.display().to_string()
    );
    let settings = load_text(&text).unwrap();
    let token = settings.admin.operator_token.unwrap();
    assert_eq!(token.expose(), "from-a-file-token-value");
    let both = format!("{text}operator_token = \"from-the-file-itself-too\"\n");
    let why = problem_at(&both, "admin.operator_token_file");
    assert!(why.contains("not both"), "{why}");
}

#[test]
fn the_privacy_key_comes_from_its_file_and_a_short_one_is_refused_unshown() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("privacy-key");
    std::fs::write(&file, "a-privacy-key-of-its-own\n").unwrap();
    let text = format!(
        "{SECRETS}[admin]\nprivacy_key_file = {:?}\n",
        file.display().to_string()
    );
    let settings = load_text(&text).unwrap();
    assert_eq!(
        settings.admin.privacy_key.unwrap().expose(),
        "a-privacy-key-of-its-own"
    );
    let why = problem_at(
        "[admin]\nprivacy_key = \"short-Key\"\n",
        "admin.privacy_key",
    );
    assert!(why.contains("at least 16"), "{why}");
    assert!(!why.contains("short-Key"), "{why}");
}

#[test]
fn broken_toml_names_the_file() {
    let errors = load_text("[database\npassword = 1").unwrap_err();
    assert!(
        errors[0].to_string().contains("worker-host.toml"),
        "{}",
        errors[0]
    );
}

#[test]
fn redacted_output_holds_no_secret() {
    let text = "[database]\npassword = \"db-Secret-1\"\n[broker]\npassword = \"mq-Secret-2\"\n[smtp]\nusername = \"u\"\npassword = \"smtp-Secret-3\"\n[admin]\noperator_token = \"console-Secret-5-long\"\n[[imap.accounts]]\nname = \"a\"\nusername = \"alice\"\npassword = \"imap-Secret-4\"\n";
    let settings = load_text(text).unwrap();
    let printed = settings.to_redacted_toml();
    let debug = format!("{settings:?}");
    for secret in [
        "db-Secret-1",
        "mq-Secret-2",
        "smtp-Secret-3",
        "imap-Secret-4",
        "console-Secret-5-long",
    ] {
        assert!(!printed.contains(secret), "{secret} printed");
        assert!(!debug.contains(secret), "{secret} in Debug");
    }
    assert!(printed.contains(crate::secret::REDACTED));
}

/// The annotated example must hold every key, each at its default, so that it stays a true
/// reference: parsing it gives exactly the defaults.
#[test]
fn the_annotated_example_lists_every_key_at_its_default() {
    let example =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/worker-host.example.toml");
    let text = std::fs::read_to_string(&example).unwrap();
    let parsed: toml::Value = toml::from_str(&text).unwrap();
    let defaults = toml::Value::try_from(Settings::default()).unwrap();
    let mut missing = Vec::new();
    collect_missing("", &defaults, &parsed, &mut missing, false);
    assert!(
        missing.is_empty(),
        "keys missing from the example: {missing:?}"
    );

    let source = SettingsSource {
        path: example,
        explicit: true,
    };
    let env = vec![
        (
            "WORKER_HOST__DATABASE__PASSWORD".to_string(),
            "a".to_string(),
        ),
        ("WORKER_HOST__BROKER__PASSWORD".to_string(), "b".to_string()),
    ];
    let mut loaded = Settings::load(&source, &env).unwrap();
    loaded.database.password = None;
    loaded.broker.password = None;
    let loaded = toml::Value::try_from(loaded).unwrap();
    let mut differing = Vec::new();
    collect_missing("", &defaults, &loaded, &mut differing, true);
    assert!(
        differing.is_empty(),
        "keys whose example value is not the default: {differing:?}"
    );
}

fn collect_missing(
    prefix: &str,
    defaults: &toml::Value,
    example: &toml::Value,
    missing: &mut Vec<String>,
    compare: bool,
) {
    match (defaults, example) {
        (toml::Value::Table(d), toml::Value::Table(e)) => {
            for (key, value) in d {
                let path = if prefix.is_empty() {
                    key.clone()
                } else {
                    format!("{prefix}.{key}")
                };
                match e.get(key) {
                    Some(found) => collect_missing(&path, value, found, missing, compare),
                    None => missing.push(path),
                }
            }
        }
        (d, e) if compare && d != e => missing.push(format!("{prefix} (example {e}, default {d})")),
        _ => {}
    }
}

#[test]
fn a_bad_queue_setting_names_the_job_and_key() {
    let errors = load_text(&format!(
        "{SECRETS}[jobs.email_send.queue]\nretry_tiers = []\n"
    ))
    .unwrap_err();
    assert!(
        errors
            .iter()
            .any(|e| e.key.starts_with("jobs.email_send.queue")),
        "{errors:?}"
    );
}

#[test]
fn relative_automation_files_are_found_beside_the_settings_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("autos.toml"),
        "[[automations]]\nname = \"a\"\nevent_type = \"email.received\"\n\n[[automations.actions]]\ntype = \"webhook\"\nurl = \"http://127.0.0.1:1/\"\n",
    )
    .unwrap();
    let source = write(
        &dir,
        "s.toml",
        &format!("automations_files = [\"autos.toml\"]\n{SECRETS}"),
    );
    let settings = Settings::load(&source, &[]).unwrap();
    assert_eq!(
        settings.automations_files,
        vec![dir.path().join("autos.toml")]
    );
    let missing = write(
        &dir,
        "t.toml",
        &format!("automations_files = [\"nope.toml\"]\n{SECRETS}"),
    );
    let errors = Settings::load(&missing, &[]).unwrap_err();
    assert_eq!(errors[0].key, "automations_files[0]", "{errors:?}");
}

#[test]
fn an_all_digit_password_from_the_environment_is_taken_as_text() {
    let env = vec![
        (
            "WORKER_HOST__DATABASE__PASSWORD".to_string(),
            "98765432123".to_string(),
        ),
        (
            "WORKER_HOST__BROKER__PASSWORD".to_string(),
            "007".to_string(),
        ),
        (
            "WORKER_HOST__SMTP__PASSWORD".to_string(),
            "true".to_string(),
        ),
    ];
    let source = SettingsSource {
        path: PathBuf::from("/nonexistent/worker-host.toml"),
        explicit: false,
    };
    let settings = Settings::load(&source, &env).unwrap();
    assert_eq!(settings.database.password.unwrap().expose(), "98765432123");
    assert_eq!(settings.broker.password.unwrap().expose(), "007");
    assert_eq!(settings.smtp.password.unwrap().expose(), "true");
}

#[test]
fn a_number_as_a_password_in_the_file_is_taken_as_text() {
    let settings =
        load_text("[database]\npassword = 98765432123\n[broker]\npassword = 1.5\n").unwrap();
    assert_eq!(settings.database.password.unwrap().expose(), "98765432123");
    assert_eq!(settings.broker.password.unwrap().expose(), "1.5");
}

#[test]
fn a_password_of_the_wrong_shape_is_refused_without_its_value() {
    let error =
        only_error("[database]\npassword = [\"canary-5150\"]\n[broker]\npassword = \"guest\"\n");
    assert_eq!(error.key, "database.password", "{error}");
    assert!(!error.to_string().contains("canary-5150"), "{error}");
}

#[test]
fn a_toml_error_on_a_password_line_names_the_line_and_key_but_not_the_text() {
    let error = only_error(
        "installation = \"x\"\n[database]\npassword = \"wh\\q-canary-5150\"\n[broker]\npassword = \"guest\"\n",
    );
    let text = error.to_string();
    assert!(!text.contains("canary-5150"), "{text}");
    assert!(text.contains("worker-host.toml"), "{text}");
    assert!(text.contains("line 3"), "{text}");
    assert_eq!(error.key, "database.password", "{error}");
}

#[test]
fn a_toml_error_elsewhere_still_says_what_is_wrong() {
    let error = only_error(&format!("{SECRETS}[smtp]\nport = 25 25\n"));
    let text = error.to_string();
    assert!(text.contains("line 6"), "{text}");
    assert_eq!(error.key, "smtp.port", "{error}");
    assert!(text.contains("expected"), "{text}");
}

const REMOTE_PLAIN: &str = "[database]\nhost = \"db.example.com\"\npassword = \"pw\"\n\
     [broker]\nhost = \"mq.example.com\"\npassword = \"guest\"\n\
     [smtp]\nhost = \"smtp.example.com\"\nusername = \"wh\"\npassword = \"pw\"\n\
     [[imap.accounts]]\nname = \"in\"\nhost = \"imap.example.com\"\nusername = \"wh\"\npassword = \"pw\"\n";

#[test]
fn credentials_in_plain_text_to_a_remote_host_are_refused_for_each_protocol() {
    let errors = load_text(REMOTE_PLAIN).expect_err("plain text to remote hosts is refused");
    let keys: Vec<&str> = errors.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "database.ssl_mode",
            "broker.tls",
            "smtp.security",
            "imap.accounts[0].security"
        ],
        "{errors:?}"
    );
    for error in &errors {
        assert!(error.problem.contains("plain text"), "{error}");
        assert!(error.problem.contains("allow_plaintext"), "{error}");
    }
}

#[test]
fn allow_plaintext_lets_an_installation_say_so_explicitly() {
    let text = REMOTE_PLAIN
        .replace(
            "host = \"db.example.com\"\n",
            "host = \"db.example.com\"\nallow_plaintext = true\n",
        )
        .replace(
            "host = \"mq.example.com\"\n",
            "host = \"mq.example.com\"\nallow_plaintext = true\n",
        )
        .replace(
            "host = \"smtp.example.com\"\n",
            "host = \"smtp.example.com\"\nallow_plaintext = true\n",
        )
        .replace(
            "host = \"imap.example.com\"\n",
            "host = \"imap.example.com\"\nallow_plaintext = true\n",
        );
    load_text(&text).unwrap();
}

#[test]
fn verified_tls_to_remote_hosts_loads_and_loopback_may_stay_plain() {
    let text = "[database]\nhost = \"db.example.com\"\npassword = \"pw\"\nssl_mode = \"verify-full\"\n\
                [broker]\nhost = \"mq.example.com\"\npassword = \"guest\"\ntls = true\n\
                [smtp]\nhost = \"smtp.example.com\"\nusername = \"wh\"\npassword = \"pw\"\nsecurity = \"starttls\"\n\
                [[imap.accounts]]\nname = \"in\"\nhost = \"imap.example.com\"\nusername = \"wh\"\npassword = \"pw\"\nsecurity = \"tls\"\n\
                [[imap.accounts]]\nname = \"local\"\nhost = \"localhost\"\nusername = \"wh\"\npassword = \"pw\"\n\
                [[imap.accounts]]\nname = \"v6\"\nhost = \"::1\"\nusername = \"wh\"\npassword = \"pw\"\n";
    let settings = load_text(text).unwrap();
    assert_eq!(settings.database.ssl_mode, SslMode::VerifyFull);
}

#[test]
fn every_ssl_mode_is_read_and_an_unknown_one_names_the_key() {
    for (text, mode) in [
        ("disable", SslMode::Disable),
        ("prefer", SslMode::Prefer),
        ("require", SslMode::Require),
        ("verify-ca", SslMode::VerifyCa),
        ("verify-full", SslMode::VerifyFull),
    ] {
        let settings = load_text(&format!(
            "[database]\npassword = \"pw\"\nssl_mode = \"{text}\"\n[broker]\npassword = \"guest\"\n"
        ))
        .unwrap();
        assert_eq!(settings.database.ssl_mode, mode);
    }
    let error = only_error(
        "[database]\npassword = \"pw\"\nssl_mode = \"verify\"\n[broker]\npassword = \"guest\"\n",
    );
    assert_eq!(error.key, "database.ssl_mode", "{error}");
    assert!(error.problem.contains("verify-full"), "{error}");
}

#[test]
fn a_ca_file_that_is_missing_or_holds_no_certificate_is_refused_with_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate\n").unwrap();
    let missing = dir.path().join("missing.pem");
    let text = format!(
        "[database]\npassword = \"pw\"\nssl_mode = \"verify-full\"\nssl_root_cert = \"{junk}\"\n\
         [broker]\npassword = \"guest\"\ntls = true\nca_file = \"{missing}\"\n\
         [smtp]\nsecurity = \"starttls\"\nca_file = \"{junk}\"\n\
         [[imap.accounts]]\nname = \"in\"\nusername = \"wh\"\npassword = \"pw\"\nsecurity = \"tls\"\nca_file = \"{junk}\"\n",
        junk = junk.display(),
        missing = missing.display()
    );
    let errors = load_text(&text).expect_err("bad CA files are refused");
    let keys: Vec<&str> = errors.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "database.ssl_root_cert",
            "broker.ca_file",
            "smtp.ca_file",
            "imap.accounts[0].ca_file"
        ],
        "{errors:?}"
    );
}

#[test]
fn a_ca_file_without_verification_is_refused_as_misleading() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(
        &ca,
        "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let text = format!(
        "[database]\npassword = \"pw\"\nssl_mode = \"require\"\nssl_root_cert = \"{ca}\"\n\
         [broker]\npassword = \"guest\"\nca_file = \"{ca}\"\n\
         [smtp]\nca_file = \"{ca}\"\n",
        ca = ca.display()
    );
    let errors = load_text(&text).expect_err("a CA that is never used is refused");
    let keys: Vec<&str> = errors.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(
        keys,
        ["database.ssl_root_cert", "broker.ca_file", "smtp.ca_file"],
        "{errors:?}"
    );
}

#[test]
fn webhook_allow_takes_hosts_ports_and_ranges() {
    let settings = load_text(&format!(
        "{SECRETS}[jobs.automation_action]\nwebhook_allow = [\"hooks.internal:8443\", \"10.20.0.0/16\", \"[fd00::1]:80\"]\n"
    ))
    .unwrap();
    assert_eq!(
        settings.jobs.automation_action.webhook_allow,
        ["hooks.internal:8443", "10.20.0.0/16", "[fd00::1]:80"]
    );
    assert!(
        load_text(SECRETS)
            .unwrap()
            .jobs
            .automation_action
            .webhook_allow
            .is_empty()
    );
}

#[test]
fn an_unreadable_webhook_allow_entry_is_rejected_by_its_position() {
    let error = only_error(&format!(
        "{SECRETS}[jobs.automation_action]\nwebhook_allow = [\"hooks.internal\", \"10.0.0.0/33\"]\n"
    ));
    assert_eq!(
        error.key, "jobs.automation_action.webhook_allow[1]",
        "{error}"
    );
    assert!(error.problem.contains("CIDR"), "{error}");
}

#[test]
fn webhook_allow_under_another_consumer_is_rejected() {
    let error = only_error(&format!(
        "{SECRETS}[jobs.email_send]\nwebhook_allow = [\"127.0.0.1\"]\n"
    ));
    assert_eq!(error.key, "jobs.email_send.webhook_allow", "{error}");
    assert!(
        error
            .problem
            .contains("unknown key `jobs.email_send.webhook_allow`"),
        "{error}"
    );
}

#[test]
fn webhook_allow_can_come_from_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let source = write(&dir, "worker-host.toml", SECRETS);
    let env = [(
        "WORKER_HOST__JOBS__AUTOMATION_ACTION__WEBHOOK_ALLOW".to_string(),
        r#"["127.0.0.1:8080", "10.0.0.0/8"]"#.to_string(),
    )];
    let settings = Settings::load(&source, &env).unwrap();
    assert_eq!(
        settings.jobs.automation_action.webhook_allow,
        ["127.0.0.1:8080", "10.0.0.0/8"]
    );
}

#[test]
fn a_bad_value_in_a_flattened_part_is_named_by_its_key_and_file() {
    let error = only_error(&format!(
        "{SECRETS}[jobs.email_send]\nprefetch = 3\ntimeout = \"soon\"\n"
    ));
    assert_eq!(error.key, "jobs.email_send.timeout", "{error}");
    assert!(
        error
            .source
            .as_deref()
            .unwrap()
            .contains("worker-host.toml, line "),
        "{error}"
    );
    let error = only_error(&format!("{SECRETS}[jobs.reconciler]\nstuck_after = 7\n"));
    assert_eq!(error.key, "jobs.reconciler.stuck_after", "{error}");
}

#[test]
fn broker_addresses_replace_host_and_port_and_keep_their_order() {
    let settings = load_text(
        "[database]\npassword = \"pw\"\n[broker]\npassword = \"guest\"\n\
         addresses = [\"127.0.0.1:5673\", \"localhost:5674\", \"[::1]:5675\"]\n",
    )
    .unwrap();
    let connection = crate::connections::broker_connection(&settings).unwrap();
    let shown: Vec<String> = connection
        .addresses
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        shown,
        ["127.0.0.1:5673", "localhost:5674", "[::1]:5675"],
        "{connection:?}"
    );
}

#[test]
fn without_addresses_host_and_port_are_the_one_address() {
    let settings = load_text(
        "[database]\npassword = \"pw\"\n[broker]\npassword = \"guest\"\nhost = \"localhost\"\nport = 5680\n",
    )
    .unwrap();
    let connection = crate::connections::broker_connection(&settings).unwrap();
    assert_eq!(
        connection.addresses,
        [worker_broker::BrokerAddress::new("localhost", 5680)]
    );
}

#[test]
fn broker_addresses_come_from_the_environment_as_a_list() {
    let dir = tempfile::tempdir().unwrap();
    let source = write(&dir, "s.toml", SECRETS);
    let env = vec![(
        "WORKER_HOST__BROKER__ADDRESSES".to_string(),
        "[\"127.0.0.1:5673\", \"127.0.0.1:5674\"]".to_string(),
    )];
    let settings = Settings::load(&source, &env).unwrap();
    assert_eq!(
        settings.broker.addresses.as_deref(),
        Some(["127.0.0.1:5673".to_string(), "127.0.0.1:5674".to_string()].as_slice())
    );
}

#[test]
fn a_bad_broker_address_is_named_by_its_entry() {
    let error = only_error(&format!(
        "{SECRETS}addresses = [\"127.0.0.1:5673\", \"127.0.0.1\", \"127.0.0.1:5675\"]\n"
    ));
    assert_eq!(error.key, "broker.addresses[1]", "{error}");
    assert!(error.problem.contains("host:port"), "{error}");
    assert!(error.problem.contains("`127.0.0.1`"), "{error}");

    let error = only_error(&format!("{SECRETS}addresses = [\"mq:0\"]\n"));
    assert_eq!(error.key, "broker.addresses[0]", "{error}");
    assert!(error.problem.contains("port"), "{error}");
}

#[test]
fn an_empty_or_repeating_address_list_is_refused() {
    let error = only_error(&format!("{SECRETS}addresses = []\n"));
    assert_eq!(error.key, "broker.addresses", "{error}");
    assert!(error.problem.contains("at least one"), "{error}");

    let error = only_error(&format!(
        "{SECRETS}addresses = [\"127.0.0.1:5673\", \"127.0.0.1:5674\", \"127.0.0.1:5673\"]\n"
    ));
    assert_eq!(error.key, "broker.addresses[2]", "{error}");
    assert!(error.problem.contains("broker.addresses[0]"), "{error}");
}

#[test]
fn addresses_replace_a_host_and_port_the_file_sets() {
    let settings = load_text(&format!(
        "{SECRETS}host = \"mq-old.example.com\"\nport = 5673\naddresses = [\"127.0.0.1:5674\"]\n"
    ))
    .unwrap();
    let connection = crate::connections::broker_connection(&settings).unwrap();
    assert_eq!(
        connection.addresses,
        [worker_broker::BrokerAddress::new("127.0.0.1", 5674)],
        "and the plain-text rule looks at the list, not at the host it replaces"
    );
}

#[test]
fn plain_text_to_one_remote_node_is_refused_naming_that_entry() {
    let text = format!(
        "{SECRETS}addresses = [\"127.0.0.1:5672\", \"mq-2.example.com:5672\", \"localhost:5674\"]\n"
    );
    let error = only_error(&text);
    assert_eq!(error.key, "broker.addresses[1]", "{error}");
    assert!(error.problem.contains("mq-2.example.com"), "{error}");
    assert!(error.problem.contains("allow_plaintext"), "{error}");
    load_text(&format!("{text}tls = true\n")).unwrap();
    load_text(&format!("{text}allow_plaintext = true\n")).unwrap();
}

#[test]
fn quorum_placement_is_read_and_a_group_of_none_named_by_its_key() {
    let settings = load_text(&format!(
        "{SECRETS}[broker.topology]\nquorum_initial_group_size = 3\nqueue_leader_locator = \"balanced\"\n"
    ))
    .unwrap();
    let placement = settings.topology().unwrap().placement;
    assert_eq!(placement.initial_group_size, Some(3));
    assert_eq!(
        placement.leader_locator,
        Some(worker_broker::LeaderLocator::Balanced)
    );
    assert_eq!(
        load_text(SECRETS).unwrap().topology().unwrap().placement,
        worker_broker::QuorumPlacement::default(),
        "unset by default: existing queues keep working"
    );

    let error = only_error(&format!(
        "{SECRETS}[broker.topology]\nquorum_initial_group_size = 0\n"
    ));
    assert_eq!(
        error.key, "broker.topology.quorum_initial_group_size",
        "{error}"
    );
}

#[test]
fn the_retention_ages_written_in_their_old_sections_are_the_retention_jobs() {
    let settings = load_text(&format!(
        "{SECRETS}[workers]\ndedup_retention = \"3days\"\n[workers.attempt_log]\nretention = \"5days\"\n"
    ))
    .unwrap();
    let retention = &settings.jobs.retention.job;
    assert_eq!(
        retention.processed_messages,
        Duration::from_secs(3 * 24 * 3600)
    );
    assert_eq!(retention.attempt_log, Duration::from_secs(5 * 24 * 3600));
    let moved: Vec<&str> = settings
        .deprecations
        .iter()
        .map(|d| d.old.as_str())
        .collect();
    assert_eq!(
        moved,
        ["workers.dedup_retention", "workers.attempt_log.retention"]
    );
}

#[test]
fn an_environment_band_is_read_and_an_empty_name_or_a_lone_colour_is_named() {
    let text = format!("{SECRETS}[admin]\nenvironment = \"production\"\n");
    let band = load_text(&text).unwrap().admin.environment().unwrap();
    assert!(band.production);
    assert_eq!(band.colour, worker_pages::environment::Colour::Red);
    assert!(load_text(SECRETS).unwrap().admin.environment().is_none());
    let why = problem_at("[admin]\nenvironment = \" \"\n", "admin.environment");
    assert!(why.contains("environment's name"), "{why}");
    let why = problem_at(
        "[admin]\nenvironment_colour = \"amber\"\n",
        "admin.environment_colour",
    );
    assert!(why.contains("admin.environment"), "{why}");
    let errors = load_text(&format!(
        "{SECRETS}[admin]\nenvironment = \"staging\"\nenvironment_colour = \"pink\"\n"
    ))
    .unwrap_err();
    assert_eq!(errors[0].key, "admin.environment_colour", "{errors:?}");
}

/// `[database]` with the given lines after the password.
fn database(lines: &str) -> String {
    format!("[database]\npassword = \"pw\"\n{lines}[broker]\npassword = \"guest\"\n")
}

#[test]
fn database_hosts_replace_host_and_port_and_keep_their_order() {
    let settings = load_text(&database(
        "hosts = [\"127.0.0.1:5433\", \"localhost:5434\", \"[::1]:5435\"]\n",
    ))
    .unwrap();
    let options = crate::connections::pool_options(&settings.database);
    let shown: Vec<String> = options.members.iter().map(ToString::to_string).collect();
    assert_eq!(shown, ["127.0.0.1:5433", "localhost:5434", "[::1]:5435"]);
    // Every member on this machine: `prefer` talks plain, as to one local server.
    assert!(matches!(
        options.connect.get_ssl_mode(),
        sqlx::postgres::PgSslMode::Disable
    ));
}

#[test]
fn without_hosts_the_pool_has_the_one_server_of_host_and_port() {
    let settings = load_text(&database("host = \"localhost\"\nport = 5440\n")).unwrap();
    let options = crate::connections::pool_options(&settings.database);
    assert!(options.members.is_empty());
    assert_eq!(
        (options.connect.get_host(), options.connect.get_port()),
        ("localhost", 5440)
    );
}

#[test]
fn database_hosts_come_from_the_environment_as_a_list() {
    let dir = tempfile::tempdir().unwrap();
    let source = write(&dir, "s.toml", SECRETS);
    let env = vec![(
        "WORKER_HOST__DATABASE__HOSTS".to_string(),
        "[\"127.0.0.1:5433\", \"127.0.0.1:5434\"]".to_string(),
    )];
    let settings = Settings::load(&source, &env).unwrap();
    assert_eq!(settings.database.members().unwrap().len(), 2);
}

#[test]
fn a_bad_database_member_is_named_by_its_entry() {
    let error = only_error(&database(
        "hosts = [\"127.0.0.1:5433\", \"db-b\", \"127.0.0.1:5435\"]\n",
    ));
    assert_eq!(error.key, "database.hosts[1]", "{error}");
    assert!(error.problem.contains("host:port"), "{error}");
    assert!(error.problem.contains("`db-b`"), "{error}");

    let error = only_error(&database("hosts = [\"127.0.0.1:0\"]\n"));
    assert_eq!(error.key, "database.hosts[0]", "{error}");
    assert!(error.problem.contains("port"), "{error}");
}

#[test]
fn an_empty_or_repeating_database_host_list_is_refused() {
    let error = only_error(&database("hosts = []\n"));
    assert_eq!(error.key, "database.hosts", "{error}");
    assert!(error.problem.contains("at least one"), "{error}");

    let error = only_error(&database(
        "hosts = [\"127.0.0.1:5433\", \"127.0.0.1:5434\", \"127.0.0.1:5433\"]\n",
    ));
    assert_eq!(error.key, "database.hosts[2]", "{error}");
    assert!(error.problem.contains("database.hosts[0]"), "{error}");
}

#[test]
fn a_database_member_off_this_machine_needs_tls() {
    let error = only_error(&database(
        "hosts = [\"127.0.0.1:5433\", \"db-b.example.com:5432\"]\n",
    ));
    assert_eq!(error.key, "database.ssl_mode", "{error}");
    assert!(error.problem.contains("db-b.example.com"), "{error}");
}
