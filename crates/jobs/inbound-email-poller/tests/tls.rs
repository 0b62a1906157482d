//! IMAP over TLS to a private Dovecot whose certificate is signed by a CA the test makes:
//! both TLS from the first byte and STARTTLS read the mail when that CA is the one given, and
//! a server no given CA vouches for is refused (`imap-tls`, permanent) with an error naming
//! the server and the certificate problem.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;

use job_inbound_email_poller::ImapAccount;
use worker_core::FailureClass;
use worker_core::TlsMode;
use worker_testkit::{Dovecot, ServerCert, TestCa, TestDb};

use common::{account, append, config, poll, poller, raw_mail, user};

fn secured(name: &str, user: &str, port: u16, security: TlsMode, ca: &TestCa) -> ImapAccount {
    ImapAccount {
        // The certificate names localhost and 127.0.0.1; the name is checked too.
        host: "localhost".into(),
        port,
        security,
        ca_file: Some(ca.cert_path()),
        ..account(name, user, "secret")
    }
}

#[tokio::test]
async fn tls_and_starttls_to_a_server_signed_by_the_given_ca_read_the_mail() -> anyhow::Result<()> {
    let ca = TestCa::new("wh test imap ca")?;
    let server = Dovecot::start_with_tls(&ca.issue("imap")?).await?;
    let imaps = server.imaps_port.expect("an IMAPS port");
    let db = TestDb::create().await?;
    let u = user("poll-tls-ok");
    append(
        &u,
        "INBOX",
        &raw_mail("tls-ok@test", "a@example.com", "over tls", "x"),
    )
    .await?;
    let poller = poller(
        &db.pool,
        config(vec![
            secured("tls", &u, imaps, TlsMode::Tls, &ca),
            secured("starttls", &u, server.port, TlsMode::Starttls, &ca),
        ]),
    );
    let report = poll(&poller).await;
    assert_eq!(report.failed().count(), 0, "{report:?}");
    assert_eq!(report.accounts[0].counts.stored, 1, "{report:?}");
    assert_eq!(report.accounts[1].counts.stored, 1, "{report:?}");
    Ok(())
}

#[tokio::test]
async fn a_server_the_given_ca_does_not_vouch_for_is_refused_naming_the_server()
-> anyhow::Result<()> {
    let ca = TestCa::new("wh test imap ca")?;
    let other = TestCa::new("wh test other ca")?;
    let server = Dovecot::start_with_tls(&ca.issue("imap")?).await?;
    let imaps = server.imaps_port.expect("an IMAPS port");
    let db = TestDb::create().await?;
    let u = user("poll-tls-refused");
    let poller = poller(
        &db.pool,
        config(vec![
            secured("tls", &u, imaps, TlsMode::Tls, &other),
            secured("starttls", &u, server.port, TlsMode::Starttls, &other),
        ]),
    );
    let report = poll(&poller).await;
    let failures: Vec<_> = report.failed().collect();
    assert_eq!(failures.len(), 2, "{report:?}");
    for ((name, failure), port) in failures.iter().zip([imaps, server.port]) {
        assert_eq!(
            failure.class(),
            FailureClass::Permanent,
            "{name}: {failure}"
        );
        assert_eq!(failure.reason(), "imap-tls", "{name}: {failure}");
        let detail = failure.detail();
        assert!(
            detail.contains(&format!("localhost:{port}")),
            "{name}: {detail}"
        );
        assert!(detail.contains("UnknownIssuer"), "{name}: {detail}");
    }
    Ok(())
}

/// What `openssl req -x509` makes: a self-signed certificate marked CA:TRUE, which rustls
/// refuses as a server's own (`CaUsedAsEndEntity`) even when it is given as the CA.
fn self_signed_ca_true(dir: &std::path::Path) -> anyhow::Result<ServerCert> {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let status = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args(["-subj", "/CN=localhost"])
        .args(["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stderr(std::process::Stdio::null())
        .status()?;
    anyhow::ensure!(status.success(), "openssl req -x509 failed");
    Ok(ServerCert { cert, key })
}

#[tokio::test]
async fn a_server_presenting_a_ca_certificate_is_refused_with_advice_to_issue_a_ca_false_one()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let cert = self_signed_ca_true(dir.path())?;
    let server = Dovecot::start_with_tls(&cert).await?;
    let imaps = server.imaps_port.expect("an IMAPS port");
    let db = TestDb::create().await?;
    let u = user("poll-tls-ca-true");
    let account = ImapAccount {
        host: "localhost".into(),
        port: imaps,
        security: TlsMode::Tls,
        ca_file: Some(cert.cert.clone()),
        ..account("tls", &u, "secret")
    };
    let report = poll(&poller(&db.pool, config(vec![account]))).await;
    let (_, failure) = report.failed().next().expect("refused");
    assert_eq!(failure.reason(), "imap-tls", "{failure}");
    let detail = failure.detail();
    assert!(detail.contains("CA:FALSE"), "{detail}");
    assert!(detail.contains("ca_file"), "{detail}");
    Ok(())
}
