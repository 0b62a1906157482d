//! The settings reference is `config/worker-host.example.toml` ("every key, at its default,
//! with a line on what it does"), and it is held to the settings types here: every key the
//! types take must be in it, so that no key goes undocumented.
//!
//! The keys are read from the types themselves, not from a list: the keys of
//! `Settings::default()` serialized, and, since a key whose default is unset is not
//! serialized, the keys each section's type names when it refuses an unknown one (every
//! section is `deny_unknown_fields`). A key counts as documented when the example sets it, or
//! shows it commented out (`# key = ...`) in its section (a commented `# [section]` or
//! `# [[section]]` heading opens one). That every key set there is at its default is the unit
//! test `the_annotated_example_lists_every_key_at_its_default` (`src/settings/tests.rs`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::collections::BTreeSet;
use std::path::PathBuf;

use worker_host::settings::Settings;
use worker_host::settings::renames::RENAMES;

const PROBE: &str = "__probe__";

/// One step of a key's path: a key, every entry of an array of tables (`[[imap.accounts]]`),
/// or any entry of a table of named tables (`[oauth.NAME]`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    Key(String),
    Each,
    Any,
}

fn dotted(path: &[Step]) -> String {
    let mut out = String::new();
    for step in path {
        match step {
            Step::Key(key) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Step::Each => out.push_str("[]"),
            Step::Any => out.push_str(".*"),
        }
    }
    out
}

/// A settings document with `leaf` at `path` and nothing else.
fn document(path: &[Step], leaf: toml::Value) -> toml::Value {
    path.iter().rev().fold(leaf, |value, step| match step {
        Step::Key(key) => toml::Value::Table(toml::Table::from_iter([(key.clone(), value)])),
        Step::Each => toml::Value::Array(vec![value]),
        Step::Any => toml::Value::Table(toml::Table::from_iter([("x".to_string(), value)])),
    })
}

/// What the type at `path` is, asked by giving it a table with an unknown key.
enum Shape {
    /// A section that names its keys when it refuses one.
    Section(Vec<String>),
    /// A section that refuses the key without naming its own (one with a flattened part):
    /// its keys are known from the serialized defaults only.
    Unnamed,
    /// Not a section.
    Value,
}

fn shape(path: &[Step]) -> Shape {
    let probe = toml::Value::Table(toml::Table::from_iter([(
        PROBE.to_string(),
        toml::Value::Integer(1),
    )]));
    let Err(error) = document(path, probe).try_into::<Settings>() else {
        return Shape::Value;
    };
    let message = error.to_string();
    let Some(at) = message.find(&format!("unknown field `{PROBE}`")) else {
        return Shape::Value;
    };
    let rest = &message[at + PROBE.len() + "unknown field ``".len()..];
    let rest = rest.lines().next().unwrap_or("");
    if !rest.starts_with(", expected") {
        return if rest.starts_with(", there are no fields") {
            Shape::Section(Vec::new())
        } else {
            Shape::Unnamed
        };
    }
    let names = rest
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect();
    Shape::Section(names)
}

/// The table of the serialized defaults at `path`, if there is one.
fn default_table<'a>(defaults: &'a toml::Value, path: &[Step]) -> Option<&'a toml::Table> {
    let mut value = defaults;
    for step in path {
        value = match step {
            Step::Key(key) => value.as_table()?.get(key)?,
            Step::Each => value.as_array()?.first()?,
            Step::Any => value.as_table()?.values().next()?,
        };
    }
    value.as_table()
}

/// Every key the settings types take, as paths.
fn keys_of_the_types() -> Vec<Vec<Step>> {
    let defaults = toml::Value::try_from(Settings::default()).unwrap();
    let mut keys = Vec::new();
    walk(&defaults, Vec::new(), &mut keys);
    keys
}

fn walk(defaults: &toml::Value, path: Vec<Step>, keys: &mut Vec<Vec<Step>>) {
    let mut names: BTreeSet<String> = default_table(defaults, &path)
        .map(|table| table.keys().cloned().collect())
        .unwrap_or_default();
    if let Shape::Section(named) = shape(&path) {
        names.extend(named);
    }
    for name in names {
        let mut key = path.clone();
        key.push(Step::Key(name));
        let nested = [None, Some(Step::Each), Some(Step::Any)]
            .into_iter()
            .map(|step| {
                let mut nested = key.clone();
                nested.extend(step);
                nested
            })
            .find(|nested| !matches!(shape(nested), Shape::Value));
        match nested {
            Some(nested) => walk(defaults, nested, keys),
            None => keys.push(key),
        }
    }
}

/// The example file: its keys as set, and the `(section, key)` of every key shown commented
/// out.
struct Example {
    parsed: toml::Value,
    commented: Vec<(String, String)>,
}

impl Example {
    fn read() -> Self {
        let path =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../config/worker-host.example.toml");
        let text = std::fs::read_to_string(path).unwrap();
        Self {
            parsed: text.parse::<toml::Table>().map(toml::Value::Table).unwrap(),
            commented: commented_keys(&text),
        }
    }

    fn documents(&self, key: &[Step]) -> bool {
        self.sets(&self.parsed, key) || self.shows(key)
    }

    fn sets(&self, value: &toml::Value, path: &[Step]) -> bool {
        let Some((step, rest)) = path.split_first() else {
            return true;
        };
        match step {
            Step::Key(key) => value
                .as_table()
                .and_then(|table| table.get(key))
                .is_some_and(|value| self.sets(value, rest)),
            Step::Each => value
                .as_array()
                .is_some_and(|items| items.iter().any(|item| self.sets(item, rest))),
            Step::Any => value
                .as_table()
                .is_some_and(|table| table.values().any(|item| self.sets(item, rest))),
        }
    }

    fn shows(&self, key: &[Step]) -> bool {
        let Some((Step::Key(name), section)) = key.split_last() else {
            return false;
        };
        self.commented
            .iter()
            .any(|(at, shown)| shown == name && section_matches(section, at))
    }
}

/// Whether the section heading `at` (`oauth.m365`, `imap.accounts`) is the section `path`
/// (`oauth.*`, `imap.accounts[]`).
fn section_matches(path: &[Step], at: &str) -> bool {
    let parts: Vec<&str> = if at.is_empty() {
        Vec::new()
    } else {
        at.split('.').collect()
    };
    let steps: Vec<&Step> = path.iter().filter(|step| **step != Step::Each).collect();
    steps.len() == parts.len()
        && steps.iter().zip(&parts).all(|(step, part)| match step {
            Step::Key(key) => key == part,
            _ => true,
        })
}

/// A section heading, `[a.b]` or `[[a.b]]`, with nothing after it.
fn heading(text: &str) -> Option<String> {
    let text = text.trim();
    let inner = text.strip_prefix('[')?.strip_suffix(']')?;
    let inner = inner.trim_start_matches('[').trim_end_matches(']').trim();
    let valid = !inner.is_empty()
        && inner
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-');
    valid.then(|| inner.to_string())
}

/// `(section, key)` for every `key =` in a comment line, in the section (set or commented)
/// the line is in; a key inside an inline table (`# bindings = [{ exchange = "events" }]`)
/// is in the section of the key the table is the value of (`….bindings`).
fn commented_keys(text: &str) -> Vec<(String, String)> {
    let mut section = String::new();
    let mut keys = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim();
        let Some(comment) = trimmed.strip_prefix('#') else {
            if let Some(name) = heading(trimmed) {
                section = name;
            }
            continue;
        };
        let comment = comment.trim_start_matches('#').trim();
        if let Some(name) = heading(comment) {
            section = name;
            continue;
        }
        // The keys whose inline tables the scan is inside, and the last key seen.
        let mut within: Vec<String> = Vec::new();
        let mut last = String::new();
        for (at, c) in comment.char_indices() {
            match c {
                '{' => within.push(last.clone()),
                '}' => {
                    within.pop();
                }
                '=' if !comment[at + 1..].starts_with('=') && !comment[..at].ends_with('=') => {
                    let before = comment[..at].trim_end();
                    let name: String = before
                        .chars()
                        .rev()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect::<Vec<_>>()
                        .into_iter()
                        .rev()
                        .collect();
                    if !name.is_empty() {
                        let at = std::iter::once(section.as_str())
                            .chain(within.iter().map(String::as_str))
                            .filter(|part| !part.is_empty())
                            .collect::<Vec<_>>()
                            .join(".");
                        keys.push((at, name.clone()));
                        last = name;
                    }
                }
                _ => {}
            }
        }
    }
    keys
}

#[test]
fn every_key_the_settings_take_is_in_the_example_settings() {
    let keys = keys_of_the_types();
    assert!(
        keys.len() > 100,
        "only {} keys found in the settings types",
        keys.len()
    );
    let example = Example::read();
    // An old name a key is still read under (a serde alias) is in docs/UPGRADING.md, not here.
    let renamed: Vec<&str> = RENAMES.iter().map(|rename| rename.old).collect();
    let undocumented: Vec<String> = keys
        .iter()
        .map(|key| (key, dotted(key)))
        .filter(|(key, name)| !example.documents(key) && !renamed.contains(&name.as_str()))
        .map(|(_, name)| name)
        .collect();
    assert!(
        undocumented.is_empty(),
        "keys the settings take that config/worker-host.example.toml neither sets nor shows \
         commented out (`# key = ...` in its section):\n{}",
        undocumented.join("\n")
    );
}

/// The keys whose default is unset are found too: they are the ones the serialized defaults
/// leave out, and the reason this test exists beside the unit test.
#[test]
fn keys_unset_by_default_are_read_from_the_types() {
    let keys: Vec<String> = keys_of_the_types().iter().map(|key| dotted(key)).collect();
    for key in [
        "replica",
        "database.ssl_root_cert",
        "smtp.rate.messages_per_minute",
        "imap.accounts[].name",
        "admin.auth_proxy.header",
    ] {
        assert!(keys.iter().any(|found| found == key), "{key} not found");
    }
}

#[test]
fn a_commented_key_belongs_to_the_section_it_is_shown_in() {
    let keys = commented_keys(
        "[smtp]\n# username = \"...\"\n# [oauth.NAME] named by `oauth`\n# oauth = \"m365\"\n\
         # [[imap.accounts]]\n# name = \"support\"   # x == y\n[telemetry]\n# or key_file = \"f\"\n\
         [jobs.a.queue]\n# bindings = [{ exchange = \"events\", routing_keys = [\"#\"] }]\n",
    );
    let pairs: Vec<(&str, &str)> = keys
        .iter()
        .map(|(section, key)| (section.as_str(), key.as_str()))
        .collect();
    assert_eq!(
        pairs,
        vec![
            ("smtp", "username"),
            ("smtp", "oauth"),
            ("imap.accounts", "name"),
            ("telemetry", "key_file"),
            ("jobs.a.queue", "bindings"),
            ("jobs.a.queue.bindings", "exchange"),
            ("jobs.a.queue.bindings", "routing_keys"),
        ]
    );
    assert!(section_matches(
        &[Step::Key("oauth".into()), Step::Any],
        "oauth.m365"
    ));
    assert!(section_matches(
        &[
            Step::Key("imap".into()),
            Step::Key("accounts".into()),
            Step::Each
        ],
        "imap.accounts"
    ));
    assert!(!section_matches(&[Step::Key("imap".into())], "smtp"));
}
