//! The `email.received` event carries what an automation needs to leave automatic mail
//! unanswered (RFC 3834): Auto-Submitted, Precedence, List-Id and the envelope's null sender,
//! and the signs RFC 3834 does not name but mail carries: X-Auto-Response-Suppress,
//! X-Autoreply, List-Unsubscribe and List-Post.

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

#[tokio::test]
async fn the_event_carries_the_other_signs_of_automatic_and_list_mail() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user("poll-suppress");
    let notice = b"Message-ID: <notice@test>\r\nFrom: robot@example.com\r\n\
To: someone@localhost\r\nSubject: Out of office\r\nX-Auto-Response-Suppress: DR, RN,\r\n NRN\r\n\
X-Autoreply: yes\r\nList-Unsubscribe: <mailto:leave@lists.example>\r\n\
List-Post: <mailto:team@lists.example>\r\n\r\naway\r\n";
    append(&u, "INBOX", notice).await?;
    let poller = poller(&db.pool, config(vec![account("suppress", &u, "secret")]));
    assert_eq!(poll(&poller).await.accounts[0].counts.stored, 1);

    let body: Vec<u8> = sqlx::query_scalar("SELECT body FROM outbox")
        .fetch_one(&db.pool)
        .await?;
    let event: DomainEvent = serde_json::from_slice(&body)?;
    // What the automation's loop guard reads: the event's JSON.
    let field = |name: &str| {
        event
            .data
            .get(name)
            .and_then(|v| v.as_str())
            .map(str::to_string)
    };
    assert_eq!(
        field("x_auto_response_suppress").as_deref(),
        Some("DR, RN, NRN")
    );
    assert_eq!(field("x_autoreply").as_deref(), Some("yes"));
    assert_eq!(
        field("list_unsubscribe").as_deref(),
        Some("<mailto:leave@lists.example>")
    );
    assert_eq!(
        field("list_post").as_deref(),
        Some("<mailto:team@lists.example>")
    );
    Ok(())
}
