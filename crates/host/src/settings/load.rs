//! Reading the settings: figment over the defaults, the TOML file and the environment; the
//! file's syntax checked first so that an error names its line; figment's errors turned into
//! [`SettingsError`]s that name the file (or the variable) and the key, never a secret.

use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Format, Serialized, Toml};

use super::Settings;
use super::job_sections::refine_flattened;
use super::renames;
pub use worker_core::settings_file::SettingsError;
use worker_core::settings_file::is_secret_key;
pub(crate) use worker_core::settings_file::{error_path, parse_table};

/// Figment's errors as [`SettingsError`]s, a key set by the environment named by its variable.
fn from_figment(
    errors: Vec<figment::Error>,
    file: &str,
    file_text: Option<&str>,
    overridden: &[String],
) -> Vec<SettingsError> {
    worker_core::settings_file::from_figment(errors, file, file_text, overridden, &env_var_for)
}

/// The settings file used when neither `--config` nor `WORKER_HOST_CONFIG` names one.
pub const DEFAULT_PATH: &str = "config/worker-host.toml";
/// The prefix of environment overrides; levels are separated by a double underscore.
pub const ENV_PREFIX: &str = "WORKER_HOST__";

/// Where the settings come from.
#[derive(Debug, Clone)]
pub struct SettingsSource {
    pub path: PathBuf,
    /// True when the path was asked for (by flag or variable): a missing file is then an
    /// error, where a missing default file only means "defaults and environment".
    pub explicit: bool,
}

impl Settings {
    /// Loads, resolves secrets and validates. `env` is the environment to read overrides
    /// from (the process's in production, a fixed list in tests).
    pub fn load(
        source: &SettingsSource,
        env: &[(String, String)],
    ) -> Result<Self, Vec<SettingsError>> {
        let path_text = source.path.display().to_string();
        let mut figment = Figment::from(Serialized::defaults(Settings::default()));
        let mut deprecations = Vec::new();
        let mut file_text = None;
        if source.path.exists() {
            // Read once: parsed here, and kept to name the line of a later error.
            let read = std::fs::read_to_string(&source.path).map_err(|e| {
                vec![SettingsError {
                    source: Some(path_text.clone()),
                    key: String::new(),
                    problem: format!("cannot be read: {e}"),
                }]
            })?;
            let mut table = parse_table(&read, &path_text).map_err(|error| vec![error])?;
            match renames::apply(&mut table, &path_text) {
                Ok(moved) => deprecations.extend(moved),
                Err(both) => return Err(set_both_ways(&path_text, both)),
            }
            let text = toml::to_string(&table).map_err(|e| {
                vec![SettingsError {
                    source: Some(path_text.clone()),
                    key: String::new(),
                    problem: format!("cannot be read again after renaming its old keys: {e}"),
                }]
            })?;
            file_text = Some(read);
            figment = figment.merge(Toml::string(&text));
        } else if source.explicit {
            return Err(vec![SettingsError {
                source: Some(path_text),
                key: String::new(),
                problem: "no such settings file".into(),
            }]);
        }
        // The environment is handed in rather than read here, so that tests need no
        // `set_var`; values are parsed as figment parses environment variables.
        let mut overridden = Vec::new();
        for (var, value) in env {
            if let Some(key) = env_key(var) {
                // A secret is text as given: parsed, `007` would become the number 7.
                let value: figment::value::Value = if is_secret_key(&key) {
                    value.clone().into()
                } else {
                    value.parse().unwrap_or_else(|_| value.clone().into())
                };
                let keys: Vec<String> = match renames::env_key(&key) {
                    Some(rename) => {
                        deprecations.push(renames::env_deprecation(rename, var));
                        rename.new.iter().map(|k| (*k).to_string()).collect()
                    }
                    None => vec![key],
                };
                for key in keys {
                    figment = figment.merge(Serialized::default(&key, value.clone()));
                    overridden.push(key);
                }
            }
        }
        let mut settings: Settings = figment.extract().map_err(|e| {
            from_figment(
                refine_flattened(&figment, e),
                &path_text,
                file_text.as_deref(),
                &overridden,
            )
        })?;
        settings.deprecations = deprecations;
        // Files named in the settings file are found beside it, wherever the host is started.
        if let Some(folder) = source.path.parent().filter(|_| source.path.exists()) {
            for file in &mut settings.automations_files {
                if file.is_relative() {
                    *file = folder.join(&*file);
                }
            }
        }
        let mut errors = Vec::new();
        settings.resolve_secrets(&path_text, &mut errors);
        settings.validate(&path_text, &mut errors);
        if errors.is_empty() {
            Ok(settings)
        } else {
            Err(errors)
        }
    }
}

/// `WORKER_HOST__JOBS__OUTBOX_DRAIN__BATCH_SIZE` → `jobs.outbox_drain.batch_size`.
fn env_key(var: &str) -> Option<String> {
    let rest = var.strip_prefix(ENV_PREFIX)?;
    (!rest.is_empty()).then(|| {
        rest.split("__")
            .map(str::to_ascii_lowercase)
            .collect::<Vec<_>>()
            .join(".")
    })
}

/// The environment variable that overrides a dotted key.
pub(super) fn env_var_for(key: &str) -> String {
    format!(
        "{ENV_PREFIX}{}",
        key.replace('.', "__").to_ascii_uppercase()
    )
}

/// The keys a file set both by an old name and by its new one.
fn set_both_ways(file: &str, both: Vec<(String, String)>) -> Vec<SettingsError> {
    both.into_iter()
        .map(|(old, new)| SettingsError {
            source: Some(file.to_string()),
            problem: format!(
                "set either `{old}` (its name before a release renamed it) or `{new}`, not both"
            ),
            key: old,
        })
        .collect()
}

/// The settings path from `--config` (or `WORKER_HOST_CONFIG`, which clap folds into the
/// flag), else the default.
pub fn source_from(flag: Option<&Path>) -> SettingsSource {
    match flag {
        Some(path) => SettingsSource {
            path: path.to_path_buf(),
            explicit: true,
        },
        None => SettingsSource {
            path: PathBuf::from(DEFAULT_PATH),
            explicit: false,
        },
    }
}
