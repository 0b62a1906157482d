//! `worker-host operators add|list|password|role|disable|enable|remove|token`: the operators'
//! named accounts, kept in the shared database so that every replica sees the same ones.
//! The command line acts with the database's authority; each change is recorded in the
//! audit trail with the operating-system user, as coming from the command line.
//!
//! A password is read from standard input or a file, never from an argument (which `ps` and
//! the shell's history would show).

use std::io::Read;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use worker_store::operators::{self, AccountError, Role};

use super::actor::{ActorArgs, actor};
use crate::connections;
use crate::exit::Fatal;
use crate::settings::Settings;
use worker_console::credentials::{self, CredentialError};

#[derive(Debug, Subcommand)]
pub enum OperatorsAction {
    /// Every account: its role, how it was made, whether it is disabled, its tokens and
    /// live sessions.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Make an account.
    Add {
        #[arg(value_name = "NAME")]
        account: String,
        /// viewer (reads), operator (also acts), admin (also manages accounts).
        #[arg(long)]
        role: Role,
        #[command(flatten)]
        password: PasswordSource,
        #[command(flatten)]
        actor: ActorArgs,
    },
    /// Set an account's password (its sessions end).
    Password {
        #[arg(value_name = "NAME")]
        account: String,
        #[command(flatten)]
        password: PasswordSource,
        #[command(flatten)]
        actor: ActorArgs,
    },
    /// Give an account another role (its sessions end).
    Role {
        #[arg(value_name = "NAME")]
        account: String,
        role: Role,
        #[command(flatten)]
        actor: ActorArgs,
    },
    /// Disable an account: its sessions end and its tokens stop working at once.
    Disable {
        #[arg(value_name = "NAME")]
        account: String,
        #[command(flatten)]
        actor: ActorArgs,
    },
    /// Enable a disabled account again.
    Enable {
        #[arg(value_name = "NAME")]
        account: String,
        #[command(flatten)]
        actor: ActorArgs,
    },
    /// Remove an account with its tokens and sessions (its audit rows stay).
    Remove {
        #[arg(value_name = "NAME")]
        account: String,
        #[command(flatten)]
        actor: ActorArgs,
    },
    /// Let a viewer reveal customers' personal data, a console page at a time, each reveal
    /// audited (`--allow`), or no longer (`--deny`). Operators and admins see it by role.
    Reveal {
        #[arg(value_name = "NAME")]
        account: String,
        #[arg(long, conflicts_with = "deny", required_unless_present = "deny")]
        allow: bool,
        #[arg(long)]
        deny: bool,
        #[command(flatten)]
        actor: ActorArgs,
    },
    /// Make an API token for an account, which acts with the account's role. It is printed
    /// once; only its digest is kept.
    Token {
        #[arg(value_name = "NAME")]
        account: String,
        /// What the token is for (`prometheus`, `replay script`).
        #[arg(long)]
        label: String,
        #[command(flatten)]
        actor: ActorArgs,
    },
}

/// Where a password comes from.
#[derive(Debug, Clone, Args)]
#[group(required = false, multiple = false)]
pub struct PasswordSource {
    /// Read the password from standard input (up to its first newline).
    #[arg(long)]
    pub password_stdin: bool,
    /// Read the password from this file (its trailing newline dropped).
    #[arg(long)]
    pub password_file: Option<PathBuf>,
}

impl PasswordSource {
    /// The password given, if any.
    fn read(&self) -> Result<Option<String>, Fatal> {
        let text = if self.password_stdin {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| Fatal::usage(format!("reading the password from stdin: {e}")))?;
            text
        } else if let Some(file) = &self.password_file {
            std::fs::read_to_string(file).map_err(|e| {
                Fatal::usage(format!("reading the password from {}: {e}", file.display()))
            })?
        } else {
            return Ok(None);
        };
        let first_line = text.split(['\n', '\r']).next().unwrap_or_default();
        Ok(Some(first_line.to_string()))
    }
}

fn account_error(e: AccountError) -> Fatal {
    match e {
        AccountError::Store(failure) => Fatal::from_failure(failure),
        other => Fatal::usage(other),
    }
}

fn hashed(password: &str, settings: &Settings) -> Result<String, Fatal> {
    credentials::hash_password(password, settings.admin.password_hashing).map_err(|e| match e {
        CredentialError::TooShort => Fatal::usage(e),
        other => Fatal::software(other),
    })
}

pub async fn run(settings: &Settings, action: OperatorsAction) -> Result<(), Fatal> {
    let pool = worker_store::connect(&connections::pool_options(&settings.database))
        .await
        .map_err(Fatal::unavailable)?;
    let result = dispatch(&pool, settings, action).await;
    pool.close().await;
    result
}

async fn dispatch(
    pool: &sqlx::PgPool,
    settings: &Settings,
    action: OperatorsAction,
) -> Result<(), Fatal> {
    match action {
        OperatorsAction::List { json } => list(pool, json).await,
        OperatorsAction::Add {
            account: name,
            role,
            password,
            actor: who,
        } => {
            let hash = match password.read()? {
                Some(password) => Some(hashed(&password, settings)?),
                None => None,
            };
            operators::add(pool, &name, role, hash.as_deref(), &actor(&who))
                .await
                .map_err(account_error)?;
            let how = if hash.is_some() {
                "signs in with its password"
            } else {
                "has no password: give it one with `operators password`, or a token"
            };
            println!("made account {name} ({role}); it {how}");
            Ok(())
        }
        OperatorsAction::Password {
            account: name,
            password,
            actor: who,
        } => {
            let password = password.read()?.ok_or_else(|| {
                Fatal::usage("give the password with --password-stdin or --password-file")
            })?;
            let hash = hashed(&password, settings)?;
            operators::set_password(pool, &name, &hash, &actor(&who))
                .await
                .map_err(account_error)?;
            println!("set the password of {name}; its sessions ended");
            Ok(())
        }
        OperatorsAction::Role {
            account: name,
            role,
            actor: who,
        } => {
            operators::set_role(pool, &name, role, &actor(&who))
                .await
                .map_err(account_error)?;
            println!("{name} is now {role}; its sessions ended");
            Ok(())
        }
        OperatorsAction::Disable {
            account: name,
            actor: who,
        } => {
            operators::disable(pool, &name, &actor(&who))
                .await
                .map_err(account_error)?;
            println!("disabled {name}: its sessions ended and its tokens stopped working");
            Ok(())
        }
        OperatorsAction::Enable {
            account: name,
            actor: who,
        } => {
            operators::enable(pool, &name, &actor(&who))
                .await
                .map_err(account_error)?;
            println!("enabled {name}");
            Ok(())
        }
        OperatorsAction::Remove {
            account: name,
            actor: who,
        } => {
            operators::remove(pool, &name, &actor(&who))
                .await
                .map_err(account_error)?;
            println!("removed {name}, its tokens and its sessions");
            Ok(())
        }
        OperatorsAction::Reveal {
            account: name,
            allow,
            deny: _,
            actor: who,
        } => {
            operators::set_reveal_right(pool, &name, allow, &actor(&who))
                .await
                .map_err(account_error)?;
            if allow {
                println!("{name} may reveal personal data, a page at a time, each reveal audited");
            } else {
                println!("{name} may no longer reveal personal data");
            }
            Ok(())
        }
        OperatorsAction::Token {
            account: name,
            label,
            actor: who,
        } => {
            let token = credentials::new_token();
            let digest = credentials::token_digest(&token);
            let id = operators::add_token(pool, &name, &label, &digest, &actor(&who))
                .await
                .map_err(account_error)?;
            eprintln!("token {id} of {name} (`{label}`); it is shown only now:");
            println!("{token}");
            Ok(())
        }
    }
}

async fn list(pool: &sqlx::PgPool, json: bool) -> Result<(), Fatal> {
    let accounts = operators::list(pool).await.map_err(Fatal::from_failure)?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&accounts).unwrap_or_default()
        );
        return Ok(());
    }
    if accounts.is_empty() {
        println!(
            "no operator account yet: `worker-host operators add NAME --role admin --password-stdin`"
        );
    }
    for a in accounts {
        let state = match a.disabled_at {
            Some(at) => format!("disabled {}", at.format("%Y-%m-%d %H:%M")),
            None => "enabled".into(),
        };
        println!(
            "{:<24} {:<8} {:<9} {:<22} password {:<3} tokens {} sessions {}{}  made by {}",
            a.name,
            a.role.0,
            a.origin,
            state,
            if a.has_password { "yes" } else { "no" },
            a.tokens,
            a.sessions,
            if a.reveals_personal_data {
                "  may reveal"
            } else {
                ""
            },
            a.created_by
        );
    }
    Ok(())
}
