//! The `email.received` event carries what an automation needs to leave automatic mail
//! unanswered (RFC 3834): Auto-Submitted, Precedence, List-Id and the envelope's null sender.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;

use common::*;
use worker_messages::{DomainEvent, EmailReceived};
use worker_testkit::TestDb;

#[tokio::test]
async fn the_event_carries_the_signs_of_automatic_mail() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user("poll-auto");
    let bounce =
        b"Return-Path: <>\r\nMessage-ID: <bounce@test>\r\nFrom: MAILER-DAEMON@example.com\r\n\
To: someone@localhost\r\nSubject: Undelivered Mail\r\nAuto-Submitted: auto-replied\r\n\
Precedence: bulk\r\nList-Id: Team list <team.example.com>\r\n\r\nsorry\r\n";
    append(&u, "INBOX", bounce).await?;
    append(
        &u,
        "INBOX",
        &raw_mail("person@test", "a@example.com", "hi", "x"),
    )
    .await?;
    let poller = poller(&db.pool, config(vec![account("auto", &u, "secret")]));
    assert_eq!(poll(&poller).await.accounts[0].counts.stored, 2);

    let bodies: Vec<Vec<u8>> = sqlx::query_scalar("SELECT body FROM outbox ORDER BY id")
        .fetch_all(&db.pool)
        .await?;
    let data: Vec<EmailReceived> = bodies
        .iter()
        .map(|b| {
            let event: DomainEvent = serde_json::from_slice(b).unwrap();
            serde_json::from_value(event.data).unwrap()
        })
        .collect();
    let bounce = &data[0];
    assert_eq!(bounce.auto_submitted.as_deref(), Some("auto-replied"));
    assert_eq!(bounce.precedence.as_deref(), Some("bulk"));
    assert_eq!(
        bounce.list_id.as_deref(),
        Some("Team list <team.example.com>")
    );
    assert_eq!(bounce.return_path.as_deref(), Some(""));
    assert!(bounce.null_sender);
    let person = &data[1];
    assert_eq!(
        (&person.auto_submitted, &person.precedence, &person.list_id),
        (&None, &None, &None)
    );
    assert!(!person.null_sender);
    Ok(())
}
