//! The test kit's token endpoint (`scripts/oauth_endpoint.py`, on `WH_TEST_OAUTH`), standing
//! in for Microsoft's and Google's: each test registers a client of its own
//! ([`OAuthClient::register`]) with the mailboxes it may act for, its tokens' lifetime and
//! length, and reads back how many tokens it was asked for. The shared Dovecot, its submission
//! service and Postfix ask the same endpoint whether a token is good for a login.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use serde::Deserialize;
use serde_json::json;

/// The endpoint's base URL.
pub fn oauth_url() -> String {
    std::env::var("WH_TEST_OAUTH").unwrap_or_else(|_| "http://127.0.0.1:10180".into())
}

/// What a client's tokens are like.
#[derive(Debug, Clone)]
pub struct ClientSpec {
    /// The user names its app-only tokens may act for (`*`: any).
    pub mailboxes: Vec<String>,
    /// Seconds a token lives.
    pub lifetime: u64,
    /// Characters a token has (real ones run to 1.5–2.5 KB).
    pub token_length: usize,
    /// The RSA public key (PEM) that verifies a service account's assertions.
    pub public_key: Option<String>,
}

impl Default for ClientSpec {
    fn default() -> Self {
        Self {
            mailboxes: vec!["*".into()],
            lifetime: 3600,
            token_length: 2000,
            public_key: None,
        }
    }
}

/// How often the endpoint was asked, for one client.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
pub struct Stats {
    pub token_requests: u64,
    pub issued: u64,
    pub refused: u64,
    pub introspections: u64,
}

/// A client registered with the endpoint for one test.
#[derive(Debug, Clone)]
pub struct OAuthClient {
    pub client_id: String,
    pub client_secret: String,
    base: String,
    http: reqwest::Client,
}

impl OAuthClient {
    /// Registers a client whose id starts with `prefix` (unique per call).
    pub async fn register(prefix: &str, spec: &ClientSpec) -> anyhow::Result<Self> {
        Self::register_as(&unique_client_id(prefix), spec).await
    }

    /// Registers a client under `client_id` (a service account's `client_email`).
    pub async fn register_as(client_id: &str, spec: &ClientSpec) -> anyhow::Result<Self> {
        let id = &uuid::Uuid::new_v4().simple().to_string()[..10];
        let client = Self {
            client_id: client_id.to_string(),
            client_secret: format!("secret-{id}"),
            base: oauth_url(),
            http: reqwest::Client::new(),
        };
        client
            .admin(
                "clients",
                json!({
                    "client_id": client.client_id,
                    "client_secret": client.client_secret,
                    "public_key": spec.public_key,
                    "mailboxes": spec.mailboxes,
                    "lifetime": spec.lifetime,
                    "token_length": spec.token_length,
                }),
            )
            .await?;
        Ok(client)
    }

    /// The token URL, as a `[oauth.NAME]` section names it.
    pub fn token_url(&self) -> String {
        format!("{}/token", self.base)
    }

    /// A refresh token of this client acting for `user`.
    pub async fn refresh_token(&self, user: &str) -> anyhow::Result<String> {
        let token = format!("refresh-{}", uuid::Uuid::new_v4().simple());
        self.admin(
            "refresh_tokens",
            json!({ "client_id": self.client_id, "refresh_token": token, "user": user }),
        )
        .await?;
        Ok(token)
    }

    /// Revokes every token issued to this client so far.
    pub async fn revoke_all(&self) -> anyhow::Result<()> {
        self.admin("revoke", json!({ "client_id": self.client_id }))
            .await
    }

    /// The next `count` token requests of this client answer `status` (with Retry-After).
    pub async fn fail_next(
        &self,
        status: u16,
        count: u32,
        retry_after: Option<u64>,
    ) -> anyhow::Result<()> {
        self.admin(
            "fail",
            json!({ "client_id": self.client_id, "status": status, "count": count, "retry_after": retry_after }),
        )
        .await
    }

    pub async fn stats(&self) -> anyhow::Result<Stats> {
        let url = format!("{}/admin/stats?client_id={}", self.base, self.client_id);
        let response = self
            .http
            .get(&url)
            .send()
            .await
            .with_context(|| url.clone())?;
        if !response.status().is_success() {
            bail!("{url}: {}", response.status());
        }
        Ok(response.json().await?)
    }

    /// A `[oauth.NAME]` of this client, app-only (client credentials), as a test host's
    /// settings would give it.
    pub fn app_only(&self) -> worker_mail_auth::OAuthSettings {
        worker_mail_auth::OAuthSettings {
            flow: Some(worker_mail_auth::Flow::ClientCredentials),
            token_url: Some(self.token_url()),
            scope: Some("https://outlook.office365.com/.default".into()),
            client_id: Some(self.client_id.clone()),
            client_secret: Some(worker_core::Secret::new(self.client_secret.clone())),
            ..worker_mail_auth::OAuthSettings::default()
        }
    }

    /// The token sources of a mail connection that names `name`: this client, app-only.
    pub fn sources(&self, name: &str) -> anyhow::Result<worker_mail_auth::TokenSources> {
        let settings = std::collections::BTreeMap::from([(name.to_string(), self.app_only())]);
        Ok(worker_mail_auth::TokenSources::build(&settings)?)
    }

    /// A token of this client straight from the endpoint (client credentials), for tests that
    /// talk to a server by hand.
    pub async fn client_credentials_token(&self) -> anyhow::Result<String> {
        #[derive(Deserialize)]
        struct Answer {
            access_token: String,
        }
        let answer: Answer = self
            .http
            .post(self.token_url())
            .form(&[
                ("grant_type", "client_credentials"),
                ("client_id", &self.client_id),
                ("client_secret", &self.client_secret),
                ("scope", "mail"),
            ])
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        Ok(answer.access_token)
    }

    async fn admin(&self, path: &str, body: serde_json::Value) -> anyhow::Result<()> {
        let url = format!("{}/admin/{path}", self.base);
        let response = self
            .http
            .post(&url)
            .json(&body)
            .send()
            .await
            .with_context(|| format!("{url} (is the token endpoint up? scripts/services.sh up)"))?;
        if !response.status().is_success() {
            bail!(
                "{url}: {} {}",
                response.status(),
                response.text().await.unwrap_or_default()
            );
        }
        Ok(())
    }
}

/// A client id that starts with `prefix` and is unique to the call.
pub fn unique_client_id(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..10]
    )
}

/// A Google-style service account key in `dir`: `key.json` (as Google's console downloads
/// it, PKCS#8) and the public key that verifies its assertions, made with `openssl`.
pub fn service_account_key(dir: &Path, client_email: &str) -> anyhow::Result<(PathBuf, String)> {
    let private = dir.join("sa.pem");
    let run = |args: &[&str]| -> anyhow::Result<Vec<u8>> {
        let out = Command::new("openssl")
            .args(args)
            .output()
            .context("running openssl")?;
        if !out.status.success() {
            bail!("openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(out.stdout)
    };
    let private_text = private.to_string_lossy().into_owned();
    run(&[
        "genpkey",
        "-algorithm",
        "RSA",
        "-pkeyopt",
        "rsa_keygen_bits:2048",
        "-out",
        &private_text,
    ])?;
    let public = String::from_utf8(run(&["pkey", "-in", &private_text, "-pubout"])?)?;
    let key = json!({
        "type": "service_account",
        "project_id": "wh-test",
        "private_key_id": "test-key-1",
        "private_key": std::fs::read_to_string(&private)?,
        "client_email": client_email,
        "client_id": "1234567890",
        "token_uri": format!("{}/token", oauth_url()),
    });
    let path = dir.join("key.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&key)?)?;
    Ok((path, public))
}
