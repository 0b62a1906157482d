//! What an account is: its name's rules, its [`Role`], what [`list`](super::list) shows of it,
//! and why a change is refused ([`AccountError`]).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use worker_core::Failure;

/// What an account may do. Each role may do everything the one before it may.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads every page and API.
    #[default]
    Viewer,
    /// Also replays, purges, retries, pauses, resumes, runs now and cancels.
    Operator,
    /// Also manages accounts from the console.
    Admin,
}

impl Role {
    pub const ALL: [Self; 3] = [Self::Viewer, Self::Operator, Self::Admin];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Viewer => "viewer",
            Self::Operator => "operator",
            Self::Admin => "admin",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Role {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|role| role.as_str().eq_ignore_ascii_case(text.trim()))
            .ok_or_else(|| format!("expected viewer, operator or admin, found `{text}`"))
    }
}

/// The name kept for the account that `admin.operator_token` will sign in as: no command
/// makes, changes or removes it.
pub const BOOTSTRAP: &str = "bootstrap";

/// The longest account name.
pub const NAME_MAX_CHARS: usize = 80;

/// Why an account cannot be changed as asked.
#[derive(Debug, thiserror::Error)]
pub enum AccountError {
    #[error(
        "`{0}` is not an account name: 1 to 80 letters, digits and `._@+-`, starting with a letter or digit"
    )]
    BadName(String),
    #[error("an account called `{0}` exists already")]
    Exists(String),
    #[error("no account is called `{0}`")]
    NotFound(String),
    #[error("`{BOOTSTRAP}` comes from admin.operator_token: change or remove that setting instead")]
    Bootstrap,
    #[error(transparent)]
    Store(#[from] Failure),
}

/// Whether `name` may name an account (the database's CHECK, said before it is asked).
pub fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && name.chars().count() <= NAME_MAX_CHARS
        && chars.all(|c| c.is_ascii_alphanumeric() || "._@+-".contains(c))
}

/// One account as `operators list` and the console show it: never a hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct Account {
    pub name: String,
    #[sqlx(try_from = "String")]
    pub role: RoleText,
    pub origin: String,
    pub created_at: DateTime<Utc>,
    pub created_by: String,
    pub disabled_at: Option<DateTime<Utc>>,
    /// It can sign in with a password.
    pub has_password: bool,
    /// Its API tokens.
    pub tokens: i64,
    /// Its live sessions.
    pub sessions: i64,
    /// As a viewer, it may reveal customers' personal data, a page at a time.
    pub reveals_personal_data: bool,
}

/// A role as a column holds it, read back into [`Role`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct RoleText(pub Role);

impl TryFrom<String> for RoleText {
    type Error = String;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        text.parse().map(Self)
    }
}

pub(super) fn target(name: &str) -> serde_json::Value {
    serde_json::json!({ "account": name })
}

pub(super) fn check_name(name: &str) -> Result<(), AccountError> {
    if valid_name(name) {
        Ok(())
    } else {
        Err(AccountError::BadName(name.to_string()))
    }
}

pub(super) fn refuse_bootstrap(name: &str) -> Result<(), AccountError> {
    if name == BOOTSTRAP {
        Err(AccountError::Bootstrap)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_read_back_as_written_and_rank_in_order() {
        for role in Role::ALL {
            assert_eq!(role.as_str().parse::<Role>(), Ok(role));
        }
        assert!(Role::Viewer < Role::Operator && Role::Operator < Role::Admin);
        assert!("root".parse::<Role>().unwrap_err().contains("viewer"));
    }

    #[test]
    fn account_names_are_what_the_database_allows() {
        assert!(valid_name("alice"));
        assert!(valid_name("alice@example.com"));
        assert!(!valid_name(""));
        assert!(!valid_name("-alice"));
        assert!(!valid_name("alice smith"));
        assert!(!valid_name(&"a".repeat(NAME_MAX_CHARS + 1)));
    }
}
