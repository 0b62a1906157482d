use super::*;

fn load(text: &str) -> Result<FleetSettings, Vec<SettingsError>> {
    load_with_env(text, &[])
}

fn load_with_env(text: &str, env: &[(&str, &str)]) -> Result<FleetSettings, Vec<SettingsError>> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fleet.toml");
    std::fs::write(&path, text).unwrap();
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect();
    FleetSettings::load(&path, &env)
}

fn keys(errors: &[SettingsError]) -> Vec<String> {
    errors.iter().map(|e| e.key.clone()).collect()
}

const GOOD: &str = r#"
listen = "127.0.0.1:9190"
refresh = "10s"
timeout = "2s"

[[installations]]
name = "acme"
url = "https://acme-admin.example.net/"
token = "acme-viewer-token-0123456789"
environment = "production"

[[installations]]
name = "acme-staging"
url = "http://10.0.0.5:9180"
token_env = "STAGING_TOKEN"
environment = "staging"
environment_colour = "amber"
allow_plaintext = true
"#;

#[test]
fn a_good_file_is_read_with_each_token_from_where_it_is_kept() {
    let settings = load_with_env(GOOD, &[("STAGING_TOKEN", "staging-viewer-token")]).unwrap();
    assert_eq!(settings.installations.len(), 2);
    let acme = &settings.installations[0];
    assert_eq!(acme.base_url(), "https://acme-admin.example.net");
    assert!(acme.environment().production);
    let staging = &settings.installations[1];
    assert_eq!(
        staging.token.as_ref().unwrap().expose(),
        "staging-viewer-token"
    );
    assert_eq!(staging.environment().colour, Colour::Amber);
}

#[test]
fn a_token_is_read_from_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "from-a-file-token\n").unwrap();
    let text = format!(
        "[[installations]]\nname = \"a\"\nurl = \"http://127.0.0.1:9180\"\ntoken_file = {:?}\nenvironment = \"staging\"\n",
        token.display().to_string()
    );
    let settings = load(&text).unwrap();
    assert_eq!(
        settings.installations[0].token.as_ref().unwrap().expose(),
        "from-a-file-token"
    );
}

#[test]
fn an_unknown_key_is_named_by_its_installation() {
    let text = GOOD.replace("environment = \"staging\"", "environmnet = \"staging\"");
    let errors = load_with_env(&text, &[("STAGING_TOKEN", "t")]).unwrap_err();
    let shown = errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(
        keys(&errors),
        vec!["installations[1].environmnet"],
        "{shown}"
    );
    assert!(shown.contains("unknown key"), "{shown}");
}

#[test]
fn a_missing_token_names_the_installation_and_its_keys() {
    let text = GOOD.replace("token_env = \"STAGING_TOKEN\"\n", "");
    let errors = load(&text).unwrap_err();
    assert_eq!(keys(&errors), vec!["installations[1].token"]);
    assert!(errors[0].problem.contains("acme-staging"), "{errors:?}");
}

#[test]
fn an_unset_token_variable_is_named() {
    let errors = load(GOOD).unwrap_err();
    assert_eq!(keys(&errors), vec!["installations[1].token_env"]);
    assert!(errors[0].problem.contains("STAGING_TOKEN"), "{errors:?}");
}

#[test]
fn a_token_of_the_wrong_shape_is_refused_without_quoting_it() {
    let text = GOOD.replace(
        "token = \"acme-viewer-token-0123456789\"",
        "token = [\"acme-viewer-token-0123456789\"]",
    );
    let errors = load_with_env(&text, &[("STAGING_TOKEN", "t")]).unwrap_err();
    let shown = errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(shown.contains("token"), "{shown}");
    assert!(!shown.contains("acme-viewer-token-0123456789"), "{shown}");
}

#[test]
fn a_bad_url_an_empty_environment_and_a_twice_listed_name_are_each_named() {
    let text = GOOD
        .replace("http://10.0.0.5:9180", "10.0.0.5:9180")
        .replace("name = \"acme-staging\"", "name = \"acme\"")
        .replace("environment = \"production\"", "environment = \"\"");
    let errors = load_with_env(&text, &[("STAGING_TOKEN", "t")]).unwrap_err();
    let mut keys = keys(&errors);
    keys.sort();
    assert_eq!(
        keys,
        vec![
            "installations[0].environment",
            "installations[1].name",
            "installations[1].url"
        ],
        "{errors:?}"
    );
}

#[test]
fn a_listen_address_off_loopback_and_a_timeout_past_the_refresh_are_refused() {
    let text = GOOD
        .replace("127.0.0.1:9190", "0.0.0.0:9190")
        .replace("timeout = \"2s\"", "timeout = \"30s\"");
    let errors = load_with_env(&text, &[("STAGING_TOKEN", "t")]).unwrap_err();
    assert_eq!(keys(&errors), vec!["listen", "timeout"], "{errors:?}");
}

#[test]
fn a_duration_that_does_not_parse_is_named() {
    let text = GOOD.replace("refresh = \"10s\"", "refresh = \"often\"");
    let errors = load_with_env(&text, &[("STAGING_TOKEN", "t")]).unwrap_err();
    assert_eq!(keys(&errors), vec!["refresh"], "{errors:?}");
}

#[test]
fn a_missing_file_says_which() {
    let errors = FleetSettings::load(Path::new("/nonexistent/fleet.toml"), &[]).unwrap_err();
    assert!(
        errors[0].to_string().contains("/nonexistent/fleet.toml"),
        "{errors:?}"
    );
}

#[test]
fn the_example_file_loads() {
    let example = include_str!("../../../config/fleet.example.toml");
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "acme-viewer-token\n").unwrap();
    let text = example.replace(
        "/run/secrets/fleet-acme-token",
        &token.display().to_string(),
    );
    let settings = load_with_env(
        &text,
        &[("FLEET_ACME_STAGING_TOKEN", "staging-viewer-token")],
    )
    .unwrap();
    assert_eq!(settings.installations.len(), 2);
    assert_eq!(settings.listen, FleetSettings::default().listen);
    assert_eq!(settings.refresh, FleetSettings::default().refresh);
    assert_eq!(settings.timeout, FleetSettings::default().timeout);
}

#[test]
fn a_token_over_plain_http_to_another_host_is_refused_unless_allowed() {
    let text = GOOD.replace("allow_plaintext = true\n", "");
    let errors = load_with_env(&text, &[("STAGING_TOKEN", "staging-viewer-token")]).unwrap_err();
    assert_eq!(keys(&errors), vec!["installations[1].url"], "{errors:?}");
    let shown = errors[0].to_string();
    assert!(
        shown.contains("10.0.0.5")
            && shown.contains("plain text")
            && shown.contains("installations[1].allow_plaintext"),
        "{shown}"
    );
    assert!(!shown.contains("staging-viewer-token"), "{shown}");
}

#[test]
fn a_token_over_plain_http_to_loopback_is_taken() {
    for url in [
        "http://127.0.0.1:9180",
        "http://localhost:9180",
        "http://[::1]:9180",
    ] {
        let text = format!(
            "[[installations]]\nname = \"a\"\nurl = \"{url}\"\ntoken = \"a-viewer-token\"\nenvironment = \"staging\"\n"
        );
        assert!(load(&text).is_ok(), "{url}");
    }
}

#[test]
fn an_allowed_host_that_is_a_url_is_refused_naming_it() {
    let text = format!(
        "allowed_hosts = [\"fleet.example.net\", \"https://fleet.example.net\"]\n{}",
        GOOD.trim_start()
            .trim_start_matches("listen = \"127.0.0.1:9190\"\n")
    );
    let errors = load_with_env(&text, &[("STAGING_TOKEN", "t")]).unwrap_err();
    assert_eq!(keys(&errors), vec!["allowed_hosts[1]"], "{errors:?}");
    assert!(errors[0].to_string().contains("not a URL"), "{errors:?}");
}
