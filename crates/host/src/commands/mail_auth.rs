//! `worker-host mail-auth test ACCOUNT|smtp`: fetches a token (when the connection signs in
//! with one), signs in and prints what each step saw, never the token or a secret. Exit 0
//! when every step passed, 69 when one failed.

use std::time::Duration;

use clap::Subcommand;
use worker_mail_auth::{AuthMethod, TokenSource, TokenSources};

use crate::exit::Fatal;
use crate::settings::Settings;

/// How long each step may take.
const STEP_LIMIT: Duration = Duration::from_secs(30);

#[derive(Debug, Subcommand)]
pub enum MailAuthAction {
    /// Sign in to an IMAP account (by its `name`) or to the SMTP server (`smtp`) as the host
    /// would, and print each step: the token (its length and lifetime), the connection, the
    /// sign-in and what the server answered.
    Test {
        /// An IMAP account's `name`, or `smtp`.
        target: String,
    },
}

pub async fn run(settings: &Settings, action: MailAuthAction) -> Result<(), Fatal> {
    let MailAuthAction::Test { target } = action;
    let sources = TokenSources::build(&settings.oauth).map_err(Fatal::usage)?;
    let (auth, oauth, what) = if target == "smtp" {
        let smtp = &settings.smtp;
        (
            smtp.auth,
            smtp.oauth.clone(),
            format!(
                "smtp ({}:{}, {})",
                smtp.host,
                smtp.port,
                smtp.security.as_str()
            ),
        )
    } else {
        let account = imap_account(settings, &target)?;
        (
            account.auth,
            account.oauth.clone(),
            format!(
                "imap account `{}` ({}:{}, {}, mailbox {})",
                account.name,
                account.host,
                account.port,
                account.security.as_str(),
                account.mailbox
            ),
        )
    };
    println!("mail-auth test {what}, auth {}", auth_word(auth));
    let mut passed = true;
    if let Some(name) = oauth.filter(|_| auth.uses_token()) {
        let source = sources
            .get(&name)
            .ok_or_else(|| Fatal::usage(format!("no [oauth.{name}] section")))?;
        passed &= token_step(&source).await;
    }
    if passed {
        let signed_in = if target == "smtp" {
            tokio::time::timeout(
                STEP_LIMIT,
                job_email_send::try_sign_in(&settings.smtp, &sources),
            )
            .await
        } else {
            let account = imap_account(settings, &target)?;
            tokio::time::timeout(
                STEP_LIMIT,
                job_inbound_email_poller::try_sign_in(account, &sources, STEP_LIMIT),
            )
            .await
        };
        passed &= step(
            "sign in",
            match signed_in {
                Err(_) => Err(format!("no answer within {}s", STEP_LIMIT.as_secs())),
                Ok(result) => result.map_err(|f| f.to_string()),
            },
        );
    } else {
        println!("  sign in  skipped: no token");
    }
    if passed {
        println!("result: ok");
        Ok(())
    } else {
        Err(Fatal::unavailable(format!(
            "mail-auth test {target}: failed (see the steps above)"
        )))
    }
}

fn imap_account<'a>(
    settings: &'a Settings,
    name: &str,
) -> Result<&'a job_inbound_email_poller::ImapAccount, Fatal> {
    settings
        .imap
        .accounts
        .iter()
        .find(|a| a.name == name)
        .ok_or_else(|| {
            let names: Vec<&str> = settings
                .imap
                .accounts
                .iter()
                .map(|a| a.name.as_str())
                .collect();
            Fatal::usage(format!(
                "no IMAP account is named `{name}` (accounts: {}; or `smtp`)",
                if names.is_empty() {
                    "none".into()
                } else {
                    names.join(", ")
                }
            ))
        })
}

async fn token_step(source: &TokenSource) -> bool {
    let asked = format!("from {} (scope {})", source.token_url(), source.scope());
    let outcome = match tokio::time::timeout(STEP_LIMIT, source.token()).await {
        Err(_) => Err(format!(
            "{asked}: no answer within {}s",
            STEP_LIMIT.as_secs()
        )),
        Ok(Err(err)) => Err(format!(
            "{err} [{}]",
            if err.is_permanent() {
                "permanent: fix the settings or the app's permissions"
            } else {
                "transient: try again later"
            }
        )),
        Ok(Ok(token)) => {
            let left = token
                .expires_at()
                .saturating_duration_since(tokio::time::Instant::now());
            Ok(format!(
                "{} characters {asked}, good for {}s",
                token.len(),
                left.as_secs()
            ))
        }
    };
    step("token", outcome)
}

fn step(name: &str, outcome: Result<String, String>) -> bool {
    match outcome {
        Ok(detail) => {
            println!("  {name:<8} ok: {detail}");
            true
        }
        Err(detail) => {
            println!("  {name:<8} FAILED: {detail}");
            false
        }
    }
}

fn auth_word(auth: AuthMethod) -> &'static str {
    match auth {
        AuthMethod::Password => "password",
        AuthMethod::Xoauth2 => "xoauth2",
        AuthMethod::Oauthbearer => "oauthbearer",
    }
}
