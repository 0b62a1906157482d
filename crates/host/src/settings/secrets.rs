//! Secrets: each password from its key, the environment or its `*_file`, and a missing one
//! named by the key and the variable that would set it, never by a value.

use std::path::PathBuf;

use super::load::env_var_for;
use super::{Settings, SettingsError};
use crate::secret::Secret;

impl Settings {
    pub(super) fn resolve_secrets(&mut self, file: &str, errors: &mut Vec<SettingsError>) {
        resolve(
            file,
            "database",
            &mut self.database.password,
            &self.database.password_file,
            true,
            errors,
        );
        resolve(
            file,
            "broker",
            &mut self.broker.password,
            &self.broker.password_file,
            true,
            errors,
        );
        let smtp_needs = self.smtp.username.is_some() && !self.smtp.auth.uses_token();
        resolve(
            file,
            "smtp",
            &mut self.smtp.password,
            &self.smtp.password_file,
            smtp_needs,
            errors,
        );
        for (i, account) in self.imap.accounts.iter_mut().enumerate() {
            let section = format!("imap.accounts[{i}]");
            resolve(
                file,
                &section,
                &mut account.password,
                &account.password_file,
                !account.auth.uses_token(),
                errors,
            );
        }
        for (name, source) in &mut self.oauth {
            let section = format!("oauth.{name}");
            resolve_named(
                file,
                &format!("{section}.client_secret"),
                &mut source.client_secret,
                &source.client_secret_file,
                false,
                errors,
            );
            resolve_named(
                file,
                &format!("{section}.refresh_token"),
                &mut source.refresh_token,
                &source.refresh_token_file,
                false,
                errors,
            );
        }
        resolve_named(
            file,
            "admin.operator_token",
            &mut self.admin.operator_token,
            &self.admin.operator_token_file,
            false,
            errors,
        );
        resolve_named(
            file,
            "admin.scrape_token",
            &mut self.admin.scrape_token,
            &self.admin.scrape_token_file,
            false,
            errors,
        );
        resolve_named(
            file,
            "admin.privacy_key",
            &mut self.admin.privacy_key,
            &self.admin.privacy_key_file,
            false,
            errors,
        );
    }
}

fn resolve(
    file: &str,
    section: &str,
    password: &mut Option<Secret>,
    password_file: &Option<PathBuf>,
    required: bool,
    errors: &mut Vec<SettingsError>,
) {
    resolve_named(
        file,
        &format!("{section}.password"),
        password,
        password_file,
        required,
        errors,
    );
}

/// The secret at `secret_key` (`database.password`), or read from `<secret_key>_file`.
fn resolve_named(
    file: &str,
    secret_key: &str,
    password: &mut Option<Secret>,
    password_file: &Option<PathBuf>,
    required: bool,
    errors: &mut Vec<SettingsError>,
) {
    let key = format!("{secret_key}_file");
    match (password.as_ref(), password_file) {
        (Some(_), Some(_)) => errors.push(SettingsError {
            source: Some(file.to_string()),
            problem: format!("set either `{secret_key}` or `{key}`, not both"),
            key,
        }),
        (None, Some(path)) => match Secret::from_file(path) {
            Ok(secret) => *password = Some(secret),
            Err(e) => errors.push(SettingsError {
                source: Some(file.to_string()),
                key,
                problem: format!(
                    "expected a readable file holding the secret, but {} cannot be read: {e}",
                    path.display()
                ),
            }),
        },
        (None, None) if required => {
            let env = env_var_for(secret_key);
            errors.push(SettingsError {
                source: Some(file.to_string()),
                key: secret_key.to_string(),
                problem: format!(
                    "missing secret: expected `{secret_key}`, the environment variable {env}, or `{key}`"
                ),
            })
        }
        _ => {}
    }
}
