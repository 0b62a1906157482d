//! STARTTLS to a private SMTP sink whose certificate is signed by a CA the test makes: the
//! mail goes out when that CA is the one given, and a server no given CA vouches for is
//! refused, permanently, with an error naming the server and the certificate problem.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;

use std::time::Duration;

use job_email_send::{EmailSender, SmtpSettings};
use worker_core::{ConsumerJob, FailureClass};
use worker_testkit::{SmtpSink, TestCa, TestDb};

use common::{command, ctx, queue, row, smtp_for};

fn starttls(sink: &SmtpSink, ca: &TestCa) -> SmtpSettings {
    SmtpSettings {
        // The certificate names localhost and 127.0.0.1; the name is checked too.
        host: "localhost".into(),
        security: worker_core::TlsMode::Starttls,
        ca_file: Some(ca.cert_path()),
        ..smtp_for(sink, 1)
    }
}

#[tokio::test]
async fn starttls_to_a_server_signed_by_the_given_ca_delivers_the_mail() -> anyhow::Result<()> {
    let ca = TestCa::new("wh test smtp ca")?;
    let sink = SmtpSink::start_with_starttls(&ca.issue("smtp")?)?;
    let db = TestDb::create().await?;
    let sender = EmailSender::new(
        db.pool.clone(),
        &starttls(&sink, &ca),
        "wh@localhost",
        Duration::from_secs(10),
    )?;
    let id = queue(&db.pool, "tls-ok@localhost", "over tls").await;
    sender.handle(&ctx(), &command(id)).await?;
    assert_eq!(row(&db.pool, id).await.0, "sent");
    assert_eq!(sink.delivered("tls-ok").len(), 1, "{}", sink.log());
    Ok(())
}

#[tokio::test]
async fn starttls_to_a_server_the_given_ca_does_not_vouch_for_is_refused_naming_the_server()
-> anyhow::Result<()> {
    let ca = TestCa::new("wh test smtp ca")?;
    let other = TestCa::new("wh test other ca")?;
    let sink = SmtpSink::start_with_starttls(&ca.issue("smtp")?)?;
    let db = TestDb::create().await?;
    let sender = EmailSender::new(
        db.pool.clone(),
        &starttls(&sink, &other),
        "wh@localhost",
        Duration::from_secs(10),
    )?;
    let id = queue(&db.pool, "tls-refused@localhost", "over tls").await;
    let err = sender.handle(&ctx(), &command(id)).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::Permanent, "{err}");
    assert_eq!(err.reason(), "smtp-tls", "{err}");
    let detail = err.detail();
    assert!(
        detail.contains(&format!("localhost:{}", sink.port)),
        "{detail}"
    );
    assert!(detail.contains("certificate"), "{detail}");
    assert!(detail.contains("UnknownIssuer"), "{detail}");
    assert!(sink.delivered("tls-refused").is_empty());
    Ok(())
}

#[tokio::test]
async fn a_ca_file_that_holds_no_certificate_is_refused_at_construction() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ca.pem");
    std::fs::write(&path, "not a certificate\n").unwrap();
    let config = SmtpSettings {
        security: worker_core::TlsMode::Starttls,
        ca_file: Some(path.clone()),
        ..SmtpSettings::default()
    };
    let pool = sqlx::PgPool::connect_lazy("postgres://x@127.0.0.1/x").unwrap();
    let err = EmailSender::new(pool, &config, "a@b.c", Duration::from_secs(1)).unwrap_err();
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
}
