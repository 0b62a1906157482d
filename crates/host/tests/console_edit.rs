//! Edit and retry of a failed mail (issue 26), on the real binary, database, broker and SMTP
//! sink, through the console's JSON API with operators' tokens: one test per ServicePulse bug
//! (#2424, the edited copy and the original both sent; ServiceControl#5122, a second edit
//! dropped silently), two edits at once, a double submit, and a malformed dead letter's body.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::time::Duration;

use support::SERIAL;
use support::console::{TOKEN, World, http};
use support::edit::{
    api_edit, delivered, failed_mail, fresh_address, operator_token, outbox_drained, wait_delivered,
};
use uuid::Uuid;

const SHOW_LOG: &str = "CONSOLE_EDIT_SHOW_LOG";

/// ServicePulse#2424: only the edited copy is delivered, even when the original's dead letter
/// is replayed after the edit and its command reaches the sender again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_edited_copy_is_delivered_even_when_the_original_is_replayed_after()
-> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::with_token(SHOW_LOG).await?;
    let failed = failed_mail(&world).await?;
    let to = fresh_address();
    let key = Uuid::new_v4().to_string();
    let (status, edited) = api_edit(&world, TOKEN, &failed.mail, &key, &to).await?;
    assert_eq!(status, 200, "{edited}");
    assert_eq!(edited["outcome"], "sent");
    assert_eq!(
        edited["dead_letters"],
        serde_json::json!([failed.dead_letter])
    );
    assert_eq!(edited["diff"]["to"]["after"], serde_json::json!([to]));
    assert_eq!(
        wait_delivered(&world, &to, 1).await,
        1,
        "the copy is delivered"
    );

    // The original's address would be accepted now: were it sent, the sink would show it.
    world.sink.accept_recipient(&world.refused)?;
    let replay = http()
        .post(world.host.url("/api/dead-letters/replay"))
        .bearer_auth(TOKEN)
        .form(&[("id", failed.dead_letter.to_string())])
        .send()
        .await?;
    assert_eq!(
        replay.status().as_u16(),
        409,
        "a replay of the edited dead letter is refused"
    );
    let why = replay.text().await?;
    assert!(why.contains("was edited"), "{why}");
    let (code, _, stderr) = world
        .host
        .cli(&["dlq", "replay", "--id", &failed.dead_letter.to_string()])
        .await?;
    assert_eq!(code, Some(64), "the command line refuses it too: {stderr}");
    assert!(
        stderr.contains("edited copy went out in its place"),
        "{stderr}"
    );
    // And a command of the original that reaches the sender anyway (a copy published by
    // hand, a late redelivery) sends nothing: the row is superseded.
    let command = serde_json::json!({ "email_message_id": failed.mail });
    let properties = lapin::BasicProperties::default()
        .with_delivery_mode(2)
        .with_message_id(format!("late-{}", failed.mail).into());
    let body = serde_json::to_vec(&command)?;
    support::publish_confirmed(
        &world.vhost,
        "commands",
        "email.send",
        &[(properties, &body)],
    )
    .await?;
    world
        .host
        .wait_for(
            "the sender to pass over the superseded original",
            || async {
                Ok(world
                    .host
                    .log_text()
                    .contains("not sent: an operator edited this mail")
                    .then_some(()))
            },
        )
        .await;
    assert_eq!(
        world.delivered_to_refused(),
        0,
        "the original is never sent"
    );
    assert_eq!(delivered(&world, &to), 1, "the copy went out once");
    let statuses: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT status, superseded_by::text FROM outbound_emails WHERE id = $1::uuid",
    )
    .bind(&failed.mail)
    .fetch_all(&world.db.pool)
    .await?;
    assert_eq!(statuses[0].0, "failed", "the original keeps what it had");
    assert_eq!(statuses[0].1.as_deref(), edited["copy"].as_str());
    world.host.stop_cleanly().await;
    Ok(())
}

/// ServiceControl#5122: a second edit of a mail already superseded is refused, naming (and
/// linking) the copy that went out, and sends nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_edit_of_a_superseded_mail_is_refused_naming_the_copy() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::with_token(SHOW_LOG).await?;
    let failed = failed_mail(&world).await?;
    let (first_to, second_to) = (fresh_address(), fresh_address());
    let key = Uuid::new_v4().to_string();
    let (status, first) = api_edit(&world, TOKEN, &failed.mail, &key, &first_to).await?;
    assert_eq!(status, 200, "{first}");
    let other_key = Uuid::new_v4().to_string();
    let (status, second) = api_edit(&world, TOKEN, &failed.mail, &other_key, &second_to).await?;
    assert_eq!(status, 409, "{second}");
    let copy = first["copy"].as_str().unwrap();
    assert_eq!(second["superseded_by"], copy);
    assert_eq!(second["link"], format!("/outbound/{copy}"));
    assert!(
        second["detail"].as_str().unwrap().contains(copy),
        "{second}"
    );
    // The page says so too, with the link.
    let page = http()
        .post(world.host.url(&format!("/outbound/{}/edited", failed.mail)))
        .bearer_auth(TOKEN)
        .form(&[
            ("edit_key", Uuid::new_v4().to_string()),
            ("to", second_to.clone()),
        ])
        .send()
        .await?;
    assert_eq!(page.status().as_u16(), 409);
    assert!(
        page.text()
            .await?
            .contains(&format!("href=\"/outbound/{copy}\""))
    );
    assert_eq!(wait_delivered(&world, &first_to, 1).await, 1);
    outbox_drained(&world).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        delivered(&world, &second_to),
        0,
        "the refused edit sent nothing"
    );
    world.host.stop_cleanly().await;
    Ok(())
}

/// Two operators post their edits of one mail at the same moment: exactly one is sent, the
/// other is refused naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_operators_editing_one_mail_at_once_send_exactly_one() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::with_token(SHOW_LOG).await?;
    let (alice, bob) = (
        operator_token(&world, "alice")?,
        operator_token(&world, "bob")?,
    );
    let failed = failed_mail(&world).await?;
    let (alice_to, bob_to) = (fresh_address(), fresh_address());
    let (alice_key, bob_key) = (Uuid::new_v4().to_string(), Uuid::new_v4().to_string());
    let (a, b) = tokio::join!(
        api_edit(&world, &alice, &failed.mail, &alice_key, &alice_to),
        api_edit(&world, &bob, &failed.mail, &bob_key, &bob_to),
    );
    let (a, b) = (a?, b?);
    let mut statuses = [a.0, b.0];
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 409], "alice: {a:?}, bob: {b:?}");
    let (winner, loser) = if a.0 == 200 {
        (&a.1, &b.1)
    } else {
        (&b.1, &a.1)
    };
    assert_eq!(loser["superseded_by"], winner["copy"]);
    let winner_to = if a.0 == 200 { &alice_to } else { &bob_to };
    let loser_to = if a.0 == 200 { &bob_to } else { &alice_to };
    assert_eq!(wait_delivered(&world, winner_to, 1).await, 1);
    outbox_drained(&world).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(delivered(&world, loser_to), 0);
    let copies: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbound_emails WHERE supersedes = $1::uuid")
            .bind(&failed.mail)
            .fetch_one(&world.db.pool)
            .await?;
    assert_eq!(copies, 1, "one copy only");
    world.host.stop_cleanly().await;
    Ok(())
}

/// The same form posted twice (a double click, a resent request) sends once; the second post
/// answers with the first's result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_form_posted_twice_sends_once() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::with_token(SHOW_LOG).await?;
    let failed = failed_mail(&world).await?;
    let to = fresh_address();
    let key = Uuid::new_v4().to_string();
    let (a, b) = tokio::join!(
        api_edit(&world, TOKEN, &failed.mail, &key, &to),
        api_edit(&world, TOKEN, &failed.mail, &key, &to),
    );
    let (a, b) = (a?, b?);
    assert_eq!((a.0, b.0), (200, 200), "{a:?} {b:?}");
    assert_eq!(a.1["copy"], b.1["copy"], "both answer with the one copy");
    let mut outcomes = [a.1["outcome"].clone(), b.1["outcome"].clone()];
    outcomes.sort_by_key(|o| o.to_string());
    assert_eq!(
        outcomes,
        [serde_json::json!("already-sent"), serde_json::json!("sent")]
    );
    // A third post, later, the same.
    let (status, c) = api_edit(&world, TOKEN, &failed.mail, &key, &to).await?;
    assert_eq!((status, &c["copy"]), (200, &a.1["copy"]));
    assert_eq!(wait_delivered(&world, &to, 1).await, 1);
    outbox_drained(&world).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(delivered(&world, &to), 1, "sent once");
    let edits: i64 =
        sqlx::query_scalar("SELECT count(*) FROM dead_letter_actions WHERE action = 'edit'")
            .fetch_one(&world.db.pool)
            .await?;
    assert_eq!(edits, 1, "one audit entry");
    world.host.stop_cleanly().await;
    Ok(())
}

/// A dead letter whose body never decoded: an edited body that does not decode as its type is
/// refused; one that does is published in its place, and the mail it names goes out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_dead_letters_body_is_published_once_it_decodes() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::with_token(SHOW_LOG).await?;
    let to = fresh_address();
    let mail = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO outbound_emails (id, message_id, to_addresses, subject, text_body) \
         VALUES ($1, $2, $3, 'hello', 'from a fixed command')",
    )
    .bind(mail)
    .bind(format!("{mail}@worker-host"))
    .bind(vec![to.clone()])
    .execute(&world.db.pool)
    .await?;
    let properties = lapin::BasicProperties::default()
        .with_delivery_mode(2)
        .with_message_id("broken-1".into());
    let broken = format!(r#"{{"email_message_id": "{mail}""#);
    support::publish_confirmed(
        &world.vhost,
        "commands",
        "email.send",
        &[(properties, broken.as_bytes())],
    )
    .await?;
    let pool = &world.db.pool;
    let id: i64 = world
        .host
        .wait_for("the malformed command in the archive", || async {
            Ok(sqlx::query_scalar(
                "SELECT id FROM dead_letters WHERE reason = 'malformed' AND status = 'dead'",
            )
            .fetch_optional(pool)
            .await?)
        })
        .await;
    let post = |body: String| {
        http()
            .post(world.host.url(&format!("/api/dead-letters/{id}/edited")))
            .bearer_auth(TOKEN)
            .form(&[("edit_key", Uuid::new_v4().to_string()), ("body", body)])
            .send()
    };
    let still_broken = post(broken.clone()).await?;
    assert_eq!(still_broken.status().as_u16(), 422);
    assert!(
        still_broken
            .text()
            .await?
            .contains("does not decode as `email.send`")
    );
    let fixed = post(format!(r#"{{"email_message_id": "{mail}"}}"#)).await?;
    assert_eq!(fixed.status().as_u16(), 200);
    let answer: serde_json::Value = fixed.json().await?;
    assert_eq!(answer["outcome"], "published", "{answer}");
    assert_eq!(
        wait_delivered(&world, &to, 1).await,
        1,
        "the fixed command sent its mail"
    );
    let status: String = sqlx::query_scalar("SELECT status FROM dead_letters WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await?;
    assert_eq!(status, "edited");
    world.host.stop_cleanly().await;
    Ok(())
}

/// An edit that is not a mail an automation could have rendered (a bad address, a header
/// injected through the subject) is refused naming the field, and leaves the mail editable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_that_is_not_a_valid_mail_is_refused_naming_the_rule() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::with_token(SHOW_LOG).await?;
    let failed = failed_mail(&world).await?;
    let key = Uuid::new_v4().to_string();
    let (status, bad) = api_edit(&world, TOKEN, &failed.mail, &key, "not an address").await?;
    assert_eq!(status, 422, "{bad}");
    assert!(
        bad["detail"].as_str().unwrap().starts_with("bad-recipient"),
        "{bad}"
    );
    let injected = http()
        .post(
            world
                .host
                .url(&format!("/api/outbound/{}/edited", failed.mail)),
        )
        .bearer_auth(TOKEN)
        .form(&[
            ("edit_key", key.as_str()),
            ("subject", "Re: ping\r\nBcc: everyone@localhost"),
        ])
        .send()
        .await?;
    assert_eq!(injected.status().as_u16(), 422);
    assert!(injected.text().await?.contains("bad-subject"));
    let superseded: Option<String> =
        sqlx::query_scalar("SELECT superseded_by::text FROM outbound_emails WHERE id = $1::uuid")
            .bind(&failed.mail)
            .fetch_one(&world.db.pool)
            .await?;
    assert_eq!(superseded, None, "a refused edit writes nothing");
    // The same form, corrected, is accepted.
    let (status, done) = api_edit(&world, TOKEN, &failed.mail, &key, &fresh_address()).await?;
    assert_eq!(
        (status, done["outcome"].as_str()),
        (200, Some("sent")),
        "{done}"
    );
    world.host.stop_cleanly().await;
    Ok(())
}

/// The one-time key is bound to the mail it edits: the key of one mail's edit, posted again on
/// another mail, edits that other mail (a copy of its own), and never answers `already-sent`
/// with the first mail's copy, which would drop the second edit silently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_reused_on_another_mail_edits_that_mail_not_the_first() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::with_token(SHOW_LOG).await?;
    world.dead_letters(2).await?;
    let mails: Vec<String> = sqlx::query_scalar(
        "SELECT id::text FROM outbound_emails WHERE status = 'failed' ORDER BY created_at LIMIT 2",
    )
    .fetch_all(&world.db.pool)
    .await?;
    assert_eq!(mails.len(), 2, "two failed mails");
    let key = Uuid::new_v4().to_string();
    let (first_to, second_to) = (fresh_address(), fresh_address());
    let (status, first) = api_edit(&world, TOKEN, &mails[0], &key, &first_to).await?;
    assert_eq!(
        (status, first["outcome"].as_str()),
        (200, Some("sent")),
        "{first}"
    );
    let (status, second) = api_edit(&world, TOKEN, &mails[1], &key, &second_to).await?;
    assert_eq!(status, 200, "{second}");
    assert_eq!(
        second["outcome"], "sent",
        "the second mail's edit is done: {second}"
    );
    assert_eq!(second["original"], mails[1].as_str(), "{second}");
    assert_ne!(second["copy"], first["copy"], "a copy of its own: {second}");
    let superseded: Option<String> =
        sqlx::query_scalar("SELECT superseded_by::text FROM outbound_emails WHERE id = $1::uuid")
            .bind(&mails[1])
            .fetch_one(&world.db.pool)
            .await?;
    assert_eq!(superseded.as_deref(), second["copy"].as_str());
    assert_eq!(
        wait_delivered(&world, &second_to, 1).await,
        1,
        "its copy is sent"
    );
    world.host.stop_cleanly().await;
    Ok(())
}

/// An edited copy is a mail to its recipients as any other: the reply limit counts it, and a
/// search by the recipient of an answer (`/mail?to=`) finds the mail it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_copy_is_counted_by_the_reply_limit_and_found_by_recipient() -> anyhow::Result<()>
{
    let _serial = SERIAL.lock().await;
    let world = World::with_token(SHOW_LOG).await?;
    let failed = failed_mail(&world).await?;
    let to = fresh_address();
    let key = Uuid::new_v4().to_string();
    let (status, edited) = api_edit(&world, TOKEN, &failed.mail, &key, &to).await?;
    assert_eq!(
        (status, edited["outcome"].as_str()),
        (200, Some("sent")),
        "{edited}"
    );
    let pool = &world.db.pool;
    let (automation, event): (Uuid, Uuid) = sqlx::query_as(
        "SELECT x.automation_id, x.event_id FROM outbound_emails e \
         JOIN action_executions x ON x.id = e.action_execution_id WHERE e.id = $1::uuid",
    )
    .bind(&failed.mail)
    .fetch_one(pool)
    .await?;
    let mut conn = pool.acquire().await?;
    let counted = job_automation_action::reply_limit::sent_within(
        &mut conn,
        automation,
        &to,
        Duration::from_secs(3600),
    )
    .await?;
    assert_eq!(counted, 1, "the reply limit counts the copy to {to}");
    let found =
        job_automation_action::story::events_answering(pool, &to.to_uppercase(), None, None, 10)
            .await?;
    assert_eq!(
        found,
        vec![event],
        "the search by recipient finds the ping the copy answers"
    );
    world.host.stop_cleanly().await;
    Ok(())
}
