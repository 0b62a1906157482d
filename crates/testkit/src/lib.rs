//! Test support for integration tests on the real local services.
//!
//! Every test gets resources of its own, so tests never share state:
//! - [`TestDb`]: a fresh PostgreSQL database with the project's migrations applied;
//! - [`TestVhost`]: a fresh RabbitMQ virtual host, created through the management API;
//! - [`SmtpSink`]: a private SMTP sink (the project's `scripts/smtp_sink.py`) on a port and
//!   in a folder of its own, for tests that slow down or fail the server;
//! - [`FaultProxy`]: a TCP proxy on a port of its own in front of any of the services, that
//!   cuts, resets, stalls, blackholes, slows down or refuses connections on demand;
//! - [`Browser`]: a headless Debian Chromium driven through a ChromeDriver of the test's own
//!   (on a free port, with an empty profile), for the console's browser tests;
//! - private servers for tests that stop a server or need it configured otherwise: a
//!   PostgreSQL cluster ([`PgCluster`]) or a primary and a standby streaming from it
//!   ([`PgReplicaSet`]: synchronous or not, failover, switchover), a RabbitMQ node ([`RabbitNode`]) or cluster of them
//!   ([`RabbitCluster`]) and a Dovecot ([`Dovecot`]), each on ports and in a folder of its
//!   own, optionally serving TLS with a certificate from a [`TestCa`], a certificate authority
//!   of the test's own.
//!
//! - [`oauth`]: a client of the test's own at the token endpoint standing in for Microsoft's
//!   and Google's, which the mail servers ask whether a token is good.
//!
//! And the helpers tests would otherwise copy: [`wait::eventually`] (poll a condition within
//! a bound instead of sleeping) and [`amqp`] (a queue's depth, taking its messages, headers,
//! confirmed publishing).
//!
//! All of them are removed (or stopped) when dropped. Names carry their creation time, so that leftovers of a
//! test run that was killed are swept by a later run ([`TestDb::create`] and
//! [`TestVhost::create`] remove those older than two hours).
//!
//! The services are the ones `scripts/services.sh up` starts; their addresses come from the
//! `WH_TEST_*` variables that `scripts/services.sh env` prints, with the same defaults.

pub mod amqp;
pub mod axe;
mod browser;
mod dovecot;
pub mod oauth;
mod pg_cluster;
mod pg_replica;
pub mod plan;
mod proxy;
mod rabbit_cluster;
mod rabbit_node;
pub mod sign_in_gate;
mod smtp;
mod template;
mod tls;
pub mod wait;

pub use browser::Browser;
pub use dovecot::Dovecot;
pub use pg_cluster::PgCluster;
pub use pg_replica::{MEMBER_NAMES, PgReplicaSet, Rejoin, Replication};
pub use proxy::FaultProxy;
pub use rabbit_cluster::RabbitCluster;
pub use rabbit_node::RabbitNode;
pub use sign_in_gate::SignInGate;
pub use smtp::SmtpSink;
pub use tls::{ServerCert, TestCa};

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgPool};

/// How old a leftover test database or vhost must be before a later run removes it.
const LEFTOVER_AGE: Duration = Duration::from_secs(2 * 3600);

/// The admin URL of the local PostgreSQL (a role that may create databases).
pub fn database_url() -> String {
    std::env::var("WH_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://worker_host:worker_host@127.0.0.1:5432/worker_host".into())
}

/// The base URL of the RabbitMQ management API, with credentials.
pub fn rabbit_api() -> String {
    std::env::var("WH_TEST_RABBIT_API")
        .unwrap_or_else(|_| "http://guest:guest@127.0.0.1:15672".into())
}

/// `host:port` of the local IMAP server.
pub fn imap_addr() -> String {
    std::env::var("WH_TEST_IMAP").unwrap_or_else(|_| "127.0.0.1:10143".into())
}

/// `host:port` of the local SMTP server.
pub fn smtp_addr() -> String {
    std::env::var("WH_TEST_SMTP").unwrap_or_else(|_| "127.0.0.1:2525".into())
}

/// The test CA that signs the mail servers' certificate (Postfix, Dovecot's submission, the
/// second IMAP server), as a client's `ca_file`.
pub fn mail_ca() -> std::path::PathBuf {
    match std::env::var("WH_TEST_MAIL_CA") {
        Ok(path) => path.into(),
        Err(_) => services_dir().join("tls/ca.pem"),
    }
}

/// The folder the local services keep their data in (mail folders, SMTP failure switches).
pub fn services_dir() -> std::path::PathBuf {
    match std::env::var("WH_SERVICES_DIR") {
        Ok(dir) => dir.into(),
        Err(_) => std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.services"),
    }
}

fn unique_name() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let rand = uuid::Uuid::new_v4().simple().to_string();
    format!("wh_test_{now}_{}", &rand[..12])
}

/// The creation time encoded in a test resource's name, if it is one of ours.
fn created_at(name: &str) -> Option<u64> {
    name.strip_prefix("wh_test_")?
        .split('_')
        .next()?
        .parse()
        .ok()
}

fn is_leftover(name: &str) -> bool {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    created_at(name).is_some_and(|at| now.saturating_sub(at) > LEFTOVER_AGE.as_secs())
}

/// Runs `f` to completion on a runtime of its own, on a thread of its own, so that `Drop`
/// can clean up from inside an async test.
fn block_on_side<F>(f: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    blocking_cleanup(move || {
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                rt.block_on(f);
            }
        })
        .join();
    });
}

/// Runs a `Drop`'s blocking clean-up. On a multi-threaded runtime the worker first hands its
/// other tasks to another thread (`block_in_place`): a clean-up that waits on a server (`DROP
/// DATABASE … WITH (FORCE)` waits for every backend, including one still authenticating a
/// connection of another task) must not stall the tasks that server is waiting for.
pub(crate) fn blocking_cleanup<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// A PostgreSQL database of one test's own, migrated, dropped with the value.
#[derive(Debug)]
pub struct TestDb {
    pub name: String,
    pub url: String,
    pub pool: PgPool,
    admin_url: String,
}

impl TestDb {
    /// Creates a fresh database and applies the project's migrations to it.
    /// (A copy of a migrated template database, see `template.rs`: as migrating, faster.)
    pub async fn create() -> anyhow::Result<Self> {
        Self::create_from_template(&database_url()).await
    }

    /// Creates a fresh database and applies the project's migrations to it, on the server
    /// `admin_url` names (a role that may create databases, as [`database_url`] is for the
    /// shared server): for a test that brings a PostgreSQL of its own.
    pub async fn create_on(admin_url: &str) -> anyhow::Result<Self> {
        Self::create_from_template(admin_url).await
    }

    async fn create_from_template(admin_url: &str) -> anyhow::Result<Self> {
        Self::create_with(admin_url, true).await
    }

    /// Creates a fresh database without applying migrations.
    pub async fn create_empty() -> anyhow::Result<Self> {
        Self::create_empty_on(&database_url()).await
    }

    /// Creates a fresh database without applying migrations, on the server `admin_url` names.
    pub async fn create_empty_on(admin_url: &str) -> anyhow::Result<Self> {
        Self::create_with(admin_url, false).await
    }

    /// Creates a fresh database on the server `admin_url` names: a copy of the migrated
    /// template with `migrated`, else an empty one.
    async fn create_with(admin_url: &str, migrated: bool) -> anyhow::Result<Self> {
        let admin_url = admin_url.to_string();
        let admin_options: PgConnectOptions = admin_url
            .parse()
            .context("parsing the admin URL of the test PostgreSQL")?;
        let mut admin = admin_options
            .clone()
            .connect()
            .await
            .with_context(|| format!("connecting to the test PostgreSQL at {admin_url}: is it up (scripts/services.sh up)?"))?;
        sweep_leftover_databases(&mut admin).await;
        let name = unique_name();
        let template = if migrated {
            let template = template::ensure(&mut admin, &admin_options).await?;
            format!(r#" TEMPLATE "{template}""#)
        } else {
            String::new()
        };
        sqlx::query(&format!(r#"CREATE DATABASE "{name}"{template}"#))
            .execute(&mut admin)
            .await
            .with_context(|| format!("creating test database {name}"))?;
        let options = admin_options.database(&name);
        let mut url = reqwest::Url::parse(&admin_url)
            .context("parsing the admin URL of the test PostgreSQL")?;
        url.set_path(&name);
        let url = url.to_string();
        let pool = PgPoolOptions::new()
            .max_connections(20)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await
            .with_context(|| format!("connecting to test database {name}"))?;
        Ok(Self {
            name,
            url,
            pool,
            admin_url,
        })
    }

    /// A second, independent pool on the same database (as another replica would have).
    pub async fn another_pool(&self, max_connections: u32) -> anyhow::Result<PgPool> {
        Ok(PgPoolOptions::new()
            .max_connections(max_connections)
            .connect(&self.url)
            .await?)
    }
}

async fn sweep_leftover_databases(admin: &mut sqlx::PgConnection) {
    let names: Vec<String> =
        sqlx::query_scalar("SELECT datname FROM pg_database WHERE datname LIKE 'wh\\_test\\_%'")
            .fetch_all(&mut *admin)
            .await
            .unwrap_or_default();
    for name in names.into_iter().filter(|n| is_leftover(n)) {
        let _ = sqlx::query(&format!(r#"DROP DATABASE IF EXISTS "{name}" WITH (FORCE)"#))
            .execute(&mut *admin)
            .await;
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        // The pool's connections belong to the test's runtime, which is blocked in this drop:
        // they cannot be closed from here, so FORCE ends their sessions on the server.
        let admin_url = self.admin_url.clone();
        let name = self.name.clone();
        block_on_side(async move {
            if let Ok(mut admin) = sqlx::PgConnection::connect(&admin_url).await {
                let _ = sqlx::query(&format!(r#"DROP DATABASE IF EXISTS "{name}" WITH (FORCE)"#))
                    .execute(&mut admin)
                    .await;
            }
        });
    }
}

/// A RabbitMQ virtual host of one test's own, with full permissions for the test user,
/// deleted with the value (which also deletes its queues and exchanges).
#[derive(Debug)]
pub struct TestVhost {
    pub name: String,
    api: String,
    /// `host:port` of the AMQP listener, when not the shared broker's (`WH_TEST_AMQP_HOST`).
    amqp_host: Option<String>,
}

impl TestVhost {
    /// A vhost on the shared local broker (`WH_TEST_RABBIT_API`, `WH_TEST_AMQP_HOST`).
    pub async fn create() -> anyhow::Result<Self> {
        let api = rabbit_api();
        let client = reqwest::Client::new();
        sweep_leftover_vhosts(&client, &api).await;
        Self::create_with(&client, api, None).await
    }

    /// A vhost on another broker: a private node a test started itself, whose management API
    /// is `api` (`http://user:password@host:port`) and AMQP listener `amqp_host`
    /// (`host:port`). Leftovers are not swept there: such a node lives no longer than its test.
    pub async fn create_on(api: &str, amqp_host: &str) -> anyhow::Result<Self> {
        let client = reqwest::Client::new();
        Self::create_with(&client, api.to_string(), Some(amqp_host.to_string())).await
    }

    async fn create_with(
        client: &reqwest::Client,
        api: String,
        amqp_host: Option<String>,
    ) -> anyhow::Result<Self> {
        let name = unique_name();
        let (base, user, password) = split_credentials(&api)?;
        let response = client
            .put(format!("{base}/api/vhosts/{name}"))
            .basic_auth(&user, Some(&password))
            .json(&serde_json::json!({}))
            .send()
            .await
            .with_context(|| format!("creating vhost {name} through {base}: is RabbitMQ's management API up (scripts/services.sh up)?"))?;
        if !response.status().is_success() {
            bail!("creating vhost {name}: HTTP {}", response.status());
        }
        let response = client
            .put(format!("{base}/api/permissions/{name}/{user}"))
            .basic_auth(&user, Some(&password))
            .json(&serde_json::json!({"configure": ".*", "write": ".*", "read": ".*"}))
            .send()
            .await?;
        if !response.status().is_success() {
            bail!(
                "granting {user} on vhost {name}: HTTP {}",
                response.status()
            );
        }
        Ok(Self {
            name,
            api,
            amqp_host,
        })
    }

    /// The management API of the broker this vhost lives on (`http://user:password@host:port`).
    pub fn api_url(&self) -> &str {
        &self.api
    }

    /// The AMQP URL of this vhost for the management user (guest by default).
    pub fn amqp_url(&self) -> String {
        let host = self.amqp_host.clone().unwrap_or_else(|| {
            std::env::var("WH_TEST_AMQP_HOST").unwrap_or_else(|_| "127.0.0.1:5672".into())
        });
        let (user, password) = split_credentials(&self.api)
            .map(|(_, u, p)| (u, p))
            .unwrap_or_else(|_| ("guest".into(), "guest".into()));
        format!("amqp://{user}:{password}@{host}/{}", self.name)
    }

    /// Calls the management API on this vhost: `path` is appended to `/api/`, with `{vhost}`
    /// replaced by this vhost's name. Returns the JSON answer (or `null` for an empty one).
    pub async fn api(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> anyhow::Result<serde_json::Value> {
        let (base, user, password) = split_credentials(&self.api)?;
        let url = format!("{base}/api/{}", path.replace("{vhost}", &self.name));
        let mut request = reqwest::Client::new()
            .request(method, &url)
            .basic_auth(&user, Some(&password));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request
            .send()
            .await
            .with_context(|| format!("calling {url}"))?;
        let status = response.status();
        let text = response.text().await?;
        if !status.is_success() {
            bail!("{url}: HTTP {status}: {text}");
        }
        if text.is_empty() {
            return Ok(serde_json::Value::Null);
        }
        Ok(serde_json::from_str(&text)?)
    }

    /// The number of messages ready in a queue of this vhost, as the management API last saw it.
    pub async fn queue_depth(&self, queue: &str) -> anyhow::Result<u64> {
        let info = self
            .api(
                reqwest::Method::GET,
                &format!("queues/{{vhost}}/{queue}"),
                None,
            )
            .await?;
        Ok(info.get("messages").and_then(|v| v.as_u64()).unwrap_or(0))
    }
}

/// Splits `http://user:password@host:port` into the base URL without credentials, the user
/// and the password.
fn split_credentials(api: &str) -> anyhow::Result<(String, String, String)> {
    let url =
        reqwest::Url::parse(api).with_context(|| format!("parsing WH_TEST_RABBIT_API {api}"))?;
    let user = if url.username().is_empty() {
        "guest".to_string()
    } else {
        url.username().to_string()
    };
    let password = url.password().unwrap_or("guest").to_string();
    let host = url.host_str().unwrap_or("127.0.0.1");
    let port = url.port().map(|p| format!(":{p}")).unwrap_or_default();
    Ok((format!("{}://{host}{port}", url.scheme()), user, password))
}

async fn sweep_leftover_vhosts(client: &reqwest::Client, api: &str) {
    let Ok((base, user, password)) = split_credentials(api) else {
        return;
    };
    let Ok(response) = client
        .get(format!("{base}/api/vhosts"))
        .basic_auth(&user, Some(&password))
        .send()
        .await
    else {
        return;
    };
    let Ok(vhosts) = response.json::<Vec<serde_json::Value>>().await else {
        return;
    };
    for name in vhosts
        .iter()
        .filter_map(|v| v.get("name")?.as_str())
        .filter(|n| is_leftover(n))
    {
        let _ = client
            .delete(format!("{base}/api/vhosts/{name}"))
            .basic_auth(&user, Some(&password))
            .send()
            .await;
    }
}

impl Drop for TestVhost {
    fn drop(&mut self) {
        let Ok((base, user, password)) = split_credentials(&self.api) else {
            return;
        };
        let name = self.name.clone();
        block_on_side(async move {
            let _ = reqwest::Client::new()
                .delete(format!("{base}/api/vhosts/{name}"))
                .basic_auth(&user, Some(&password))
                .send()
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leftover_names_are_recognised_by_age() {
        assert!(is_leftover("wh_test_1000_abcdef"));
        let fresh = unique_name();
        assert!(!is_leftover(&fresh));
        assert!(!is_leftover("worker_host"));
        assert!(!is_leftover("wh_test_notanumber_x"));
    }

    /// The fault suite's deadlock: one scenario's `DROP DATABASE … WITH (FORCE)` waited for a
    /// backend still authenticating another scenario's connection, whose task could not run.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_blocking_cleanup_lets_the_other_tasks_of_its_runtime_run() {
        let (done, waited_for) = std::sync::mpsc::channel::<()>();
        let blocked = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let started = blocked.clone();
        let cleanup = tokio::spawn(async move {
            blocking_cleanup(|| {
                started.store(true, std::sync::atomic::Ordering::SeqCst);
                waited_for.recv_timeout(Duration::from_secs(5)).is_ok()
            })
        });
        let other = tokio::spawn(async move {
            while !blocked.load(std::sync::atomic::Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let _ = done.send(());
        });
        assert!(
            cleanup.await.unwrap(),
            "the other task never ran while the clean-up blocked"
        );
        other.await.unwrap();
    }

    #[test]
    fn credentials_are_split_from_the_api_url() {
        let (base, user, password) = split_credentials("http://u:p@127.0.0.1:15672").unwrap();
        assert_eq!(
            (base.as_str(), user.as_str(), password.as_str()),
            ("http://127.0.0.1:15672", "u", "p")
        );
    }
}
