//! Signing in and out: a session opened for an account's password, the bootstrap token or
//! the auth proxy's user, kept in PostgreSQL so that every replica knows it, and ended.

use axum::http::HeaderMap;
use sqlx::PgPool;
use worker_store::audit::{Actor, Via};
use worker_store::operators::{self, BOOTSTRAP};
use worker_store::sessions::{self, NewSession};

use super::identify::Access;
use super::request::{
    SESSION_COOKIE, SIGNIN_COOKIE, cookie_value, digest, random_token, same_secret,
};
use super::rules::{Caller, Refusal, Signed, refuse_cross_site};
use crate::credentials;
use crate::forwarded::Client;

impl Access {
    /// Signs the auth proxy's `user` in with a new session: its id and CSRF token.
    pub(super) async fn proxy_sign_in(
        &self,
        pool: &PgPool,
        caller: &Caller,
        user: &str,
    ) -> Result<(Signed, String, String), Refusal> {
        let proxy_role = self.auth_proxy.as_ref().and_then(|p| p.new_account_role);
        let actor = Actor::account(user, caller.client.label(caller.peer), Via::Console)
            .with_name(Some("auth proxy".into()));
        let role = match operators::from_proxy(pool, user, proxy_role, &actor).await {
            Ok(Some(role)) => role,
            Ok(None) | Err(operators::AccountError::BadName(_)) => {
                return Err(Refusal::NoAccount(user.to_string()));
            }
            Err(operators::AccountError::Bootstrap) => {
                tracing::warn!(from = %caller.client.ip, proxy = %caller.peer, named = %user, "the auth proxy named the bootstrap account, which only admin.operator_token signs in as: refused");
                return Err(Refusal::ProxyBootstrap);
            }
            Err(e) => return Err(Refusal::Unavailable(e.to_string())),
        };
        let (id, csrf) = self
            .open_session(pool, user, None, &caller.client.label(caller.peer), true)
            .await?;
        tracing::info!(account = %user, from = %caller.client.ip, "an operator signed in to the console through the auth proxy");
        let signed = Signed {
            account: user.to_string(),
            role,
            given_name: None,
        };
        Ok((signed, id, csrf))
    }

    /// A new session: its id and CSRF token. One made `by_proxy` is unclaimed until its
    /// cookie comes back, and replaces the account's other unclaimed one.
    async fn open_session(
        &self,
        pool: &PgPool,
        account: &str,
        given_name: Option<&str>,
        origin: &str,
        by_proxy: bool,
    ) -> Result<(String, String), Refusal> {
        let id = random_token();
        let csrf = random_token();
        let session = NewSession {
            id_sha256: &digest(&id),
            account,
            csrf: &csrf,
            origin,
            given_name,
            lifetime: self.lifetime,
        };
        if by_proxy {
            sessions::create_unclaimed(pool, &session).await?;
        } else {
            sessions::create(pool, &session).await?;
        }
        Ok((id, csrf))
    }

    /// Signs in as account `name` with its `password`, or with the bootstrap token as
    /// `password` (then `name` is the operator's own, recorded beside the account). The
    /// sign-in form's CSRF token must match its cookie's. Returns the new session's id.
    pub async fn sign_in(
        &self,
        pool: &PgPool,
        client: &Client,
        headers: &HeaderMap,
        form_csrf: &str,
        name: &str,
        password: &str,
    ) -> Result<String, Refusal> {
        refuse_cross_site(headers)?;
        let cookie = cookie_value(headers, SIGNIN_COOKIE).ok_or(Refusal::BadCsrf)?;
        if form_csrf.is_empty() || !same_secret(&cookie, form_csrf) {
            return Err(Refusal::BadCsrf);
        }
        self.throttle.sign_in(client.ip)?;
        let from = client.ip.to_string();
        // The bootstrap token first: it is too long to guess, so it needs no account budget,
        // and an admin who holds it gets in while guesses keep an account's budget empty.
        let bootstrap = operators::by_token(pool, &credentials::token_digest(password))
            .await?
            .is_some_and(|(account, _)| account == BOOTSTRAP);
        let (account, given_name) = if bootstrap {
            let given = (name != BOOTSTRAP).then_some(name);
            (BOOTSTRAP.to_string(), given)
        } else {
            self.throttle.account(pool, name).await?;
            let found = operators::credentials(pool, name).await?;
            let stored = found.as_ref().map(|(_, hash)| hash.clone());
            let decoy = self.decoy.clone();
            let password = password.to_string();
            let matches = tokio::task::spawn_blocking(move || match stored {
                Some(stored) => credentials::verify_password(&password, &stored),
                None => {
                    // A wrong name takes as long as a wrong password.
                    credentials::verify_password(&password, decoy.hash());
                    false
                }
            })
            .await
            .unwrap_or(false);
            if found.is_none() || !matches {
                tracing::warn!(%from, account = %name, "a console sign-in with a wrong account name or password was refused");
                return Err(Refusal::WrongPassword);
            }
            (name.to_string(), None)
        };
        let (id, _) = self
            .open_session(pool, &account, given_name, &from, false)
            .await?;
        tracing::info!(%account, given_name = ?given_name, %from, "an operator signed in to the console");
        Ok(id)
    }

    /// Ends the request's session, if it has one, on every replica.
    pub async fn sign_out(&self, pool: &PgPool, headers: &HeaderMap) -> Result<(), Refusal> {
        if let Some(id) = cookie_value(headers, SESSION_COOKIE) {
            sessions::end(pool, &digest(&id)).await?;
        }
        Ok(())
    }

    /// A fresh CSRF token for a sign-in form (its cookie is set with it).
    pub fn signin_token() -> String {
        random_token()
    }
}
