//! The relay's circuit (issue 39): a relay that refuses our login is the relay's failure, never
//! the mail's. The first refusal opens the `smtp-relay` circuit at once; the reply is charged
//! no try and stays `queued`; while the circuit is open no reply reaches the relay. On a
//! private SMTP sink behind a sign-in gate that answers `535 5.7.8`, and the real database.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use worker_core::ConsumerJob;
use worker_core::circuit::CircuitSettings;
use worker_store::circuits::{self, Circuits};
use worker_testkit::{SignInGate, SmtpSink, TestDb};

use common::{command, ctx, queue, row, smtp_for};

/// A sender signing in through `gate`, counting toward the circuits of `db`.
fn sender(db: &TestDb, sink: &SmtpSink, gate: &SignInGate) -> job_email_send::EmailSender {
    let smtp = job_email_send::SmtpSettings {
        port: gate.port(),
        username: Some("faults".into()),
        password: Some(worker_core::Secret::new("secret")),
        ..smtp_for(sink, 1)
    };
    let circuits = Circuits::new(db.pool.clone(), CircuitSettings::default(), "test");
    job_email_send::EmailSender::new(
        db.pool.clone(),
        &smtp,
        "Worker Host <worker-host@localhost>",
        Duration::from_secs(10),
    )
    .unwrap()
    .with_circuits(circuits)
}

#[tokio::test]
async fn a_refused_login_opens_the_relays_circuit_and_charges_the_reply_nothing()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let sink = SmtpSink::start()?;
    let gate = SignInGate::start(format!("127.0.0.1:{}", sink.port).parse()?).await?;
    gate.refuse();
    let job = sender(&db, &sink, &gate);
    let first = queue(&db.pool, "alice@localhost", "first").await;

    let failure = job.handle(&ctx(), &command(first)).await.unwrap_err();
    assert!(failure.is_unavailable(), "{failure}");
    let (status, attempts, error, _) = row(&db.pool, first).await;
    assert_eq!((status.as_str(), attempts), ("queued", 0), "{error:?}");
    let open = circuits::list(&db.pool).await?;
    assert_eq!(open.len(), 1);
    assert_eq!(open[0].dependency, "smtp-relay");
    assert!(
        open[0].reason.contains("535 5.7.8") || open[0].reason.contains("(535)"),
        "{}",
        open[0].reason
    );
    assert_eq!(gate.refused(), 1);

    let second = queue(&db.pool, "bob@localhost", "second").await;
    let failure = job.handle(&ctx(), &command(second)).await.unwrap_err();
    assert!(failure.is_unavailable(), "{failure}");
    assert_eq!(gate.refused(), 1, "an open circuit does not call the relay");
    let (status, attempts, ..) = row(&db.pool, second).await;
    assert_eq!(
        (status.as_str(), attempts),
        ("queued", 0),
        "not even claimed"
    );
    assert!(sink.delivered("alice").is_empty() && sink.delivered("bob").is_empty());
    Ok(())
}

#[tokio::test]
async fn a_recipients_refusal_stays_the_mails_and_opens_nothing() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let sink = SmtpSink::start()?;
    let gate = SignInGate::start(format!("127.0.0.1:{}", sink.port).parse()?).await?;
    let job = sender(&db, &sink, &gate);
    let id = queue(&db.pool, "fail5xx-nobody@localhost", "refused").await;

    let failure = job.handle(&ctx(), &command(id)).await.unwrap_err();
    assert!(failure.is_permanent(), "{failure}");
    assert!(circuits::list(&db.pool).await?.is_empty());
    Ok(())
}
