//! TLS to PostgreSQL and RabbitMQ as the settings describe it, on a private cluster and a
//! private node that serve a certificate signed by a CA the test makes: the host connects
//! when that CA is the one given, and a server no given CA vouches for is refused at once
//! with an error naming the server and the certificate problem.
//!
//! One RabbitMQ node for both broker cases: a node takes 5 to 13 s to boot.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::path::Path;
use std::time::{Duration, Instant};

use worker_host::connections;
use worker_host::settings::{Settings, SettingsSource};
use worker_testkit::{PgCluster, RabbitNode, TestCa};

/// The settings a TOML text describes (secrets included), loaded as the host loads them.
fn settings(text: &str) -> Settings {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("worker-host.toml");
    std::fs::write(&path, text).unwrap();
    Settings::load(
        &SettingsSource {
            path,
            explicit: true,
        },
        &[],
    )
    .unwrap_or_else(|errors| panic!("the settings load: {errors:?}"))
}

fn database_settings(port: u16, root_cert: &Path) -> Settings {
    settings(&format!(
        "[database]\nhost = \"localhost\"\nport = {port}\npassword = \"worker_host\"\n\
         connect_attempts = 5\nssl_mode = \"verify-full\"\nssl_root_cert = \"{}\"\n\
         [broker]\npassword = \"guest\"\n",
        root_cert.display()
    ))
}

#[tokio::test]
async fn postgres_with_verify_full_connects_over_tls_to_a_server_signed_by_the_given_ca()
-> anyhow::Result<()> {
    let ca = TestCa::new("wh test pg ca")?;
    let cluster = PgCluster::start_with_tls(&ca.issue("pg")?).await?;
    let settings = database_settings(cluster.port, &ca.cert_path());
    let pool = worker_store::connect(&connections::pool_options(&settings.database)).await?;
    let ssl: bool = sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(&pool)
        .await?;
    assert!(ssl, "the session is encrypted");
    Ok(())
}

#[tokio::test]
async fn postgres_signed_by_another_ca_is_refused_at_once_naming_the_server() -> anyhow::Result<()>
{
    let ca = TestCa::new("wh test pg ca")?;
    let other = TestCa::new("wh test other ca")?;
    let cluster = PgCluster::start_with_tls(&ca.issue("pg")?).await?;
    let settings = database_settings(cluster.port, &other.cert_path());
    let began = Instant::now();
    let err = worker_store::connect(&connections::pool_options(&settings.database))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(&format!("localhost:{}", cluster.port)),
        "{text}"
    );
    assert!(text.contains("certificate"), "{text}");
    assert!(text.contains("UnknownIssuer"), "{text}");
    // A certificate does not heal by waiting: no retries with backoff (5 attempts ≈ 7 s).
    assert!(
        began.elapsed() < Duration::from_secs(3),
        "{:?}",
        began.elapsed()
    );
    Ok(())
}

#[tokio::test]
async fn amqps_connects_with_the_given_ca_and_refuses_a_server_it_does_not_vouch_for()
-> anyhow::Result<()> {
    let ca = TestCa::new("wh test rabbit ca")?;
    let other = TestCa::new("wh test other ca")?;
    let node = RabbitNode::start_with_tls(&ca.issue("rabbit")?).await?;
    let port = node.amqps_port.expect("an AMQPS port");
    let broker = |ca_file: &Path| {
        settings(&format!(
            "[database]\npassword = \"x\"\n\
             [broker]\nhost = \"localhost\"\nport = {port}\n\
             username = \"guest\"\npassword = \"guest\"\nvhost = \"/\"\n\
             tls = true\nca_file = \"{}\"\nconnect_timeout = \"10s\"\n",
            ca_file.display()
        ))
    };

    let trusted = connections::broker_connection(&broker(&ca.cert_path()))?;
    let connection = trusted.connect().await?;
    assert!(connection.status().connected());
    connection.close(200, "done".into()).await?;

    let untrusted = connections::broker_connection(&broker(&other.cert_path()))?;
    let err = untrusted.connect().await.unwrap_err();
    let text = worker_core::error_chain(&err);
    assert!(text.contains(&format!("localhost:{port}")), "{text}");
    assert!(text.contains("UnknownIssuer"), "{text}");
    Ok(())
}
