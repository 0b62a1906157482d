//! Customers' personal data by role, through the JSON API of the real binary on the real
//! services: a mail from a customer whose reply was refused (a dead letter, a failed outbound
//! mail) and the customer's stored inbound mail.
//!
//! - A viewer's answers hold the customer's address nowhere and no body, and say so
//!   (`x-personal-data: masked`); an operator's hold both.
//! - A viewer an operator allowed to reveal sees one page after revealing it, and the reveal
//!   is an audit entry naming the account and the page; other pages stay masked.
//! - A viewer not allowed cannot reveal, nor one whose right was taken back
//!   (`operators reveal NAME --deny`), and nothing is recorded.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use reqwest::StatusCode;
use support::SERIAL;
use support::console::{Setup, World, http};
use support::edit::failed_mail;

const SHOW_LOG: &str = "CONSOLE_PERSONAL_SHOW_LOG";
const PASSWORD: &str = "a-long-enough-password";
const BODY_TEXT: &str = "my parcel 4711 has not arrived";

struct Seen {
    status: StatusCode,
    masked: bool,
    text: String,
}

async fn get(world: &World, token: &str, path: &str) -> Seen {
    let answer = http()
        .get(world.host.url(path))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    let status = answer.status();
    let masked = answer
        .headers()
        .get("x-personal-data")
        .is_some_and(|v| v == "masked");
    let text = answer.text().await.unwrap();
    Seen {
        status,
        masked,
        text,
    }
}

async fn post(
    world: &World,
    token: &str,
    path: &str,
    form: &[(&str, &str)],
) -> (StatusCode, String) {
    let answer = http()
        .post(world.host.url(path))
        .bearer_auth(token)
        .form(form)
        .send()
        .await
        .unwrap();
    (answer.status(), answer.text().await.unwrap())
}

/// A stored inbound mail from `from`, with a body.
async fn inbound_mail(world: &World, from: &str) -> String {
    let id = uuid::Uuid::new_v4();
    sqlx::query(
        "INSERT INTO inbound_emails (id, account, mailbox, uidvalidity, uid, status, message_id, \
             from_address, from_name, to_addresses, subject, text_body, raw_size) \
         VALUES ($1, 'test', 'INBOX', 1, 1, 'stored', $2, $3, 'Fiona Customer', $4, 'where is it', $5, 10)",
    )
    .bind(id)
    .bind(format!("m-{id}@test"))
    .bind(from)
    .bind(vec!["support@localhost".to_string()])
    .bind(BODY_TEXT)
    .execute(&world.db.pool)
    .await
    .unwrap();
    id.to_string()
}

/// Every reading page of the API that can hold a customer's data.
fn readings(dead_letter: i64, mail: &str, inbound: &str) -> Vec<String> {
    vec![
        "/api/overview".into(),
        "/api/dead-letters".into(),
        "/api/dead-letters/messages".into(),
        format!("/api/dead-letters/{dead_letter}"),
        format!("/api/outbound/{mail}"),
        "/api/outbox".into(),
        "/api/actions".into(),
        "/api/mail".into(),
        format!("/api/mail/{inbound}"),
        "/api/jobs/draft-expiry".into(),
    ]
}

fn holds(text: &str, address: &str) -> bool {
    let local = address.split('@').next().unwrap();
    text.to_lowercase().contains(&local.to_lowercase())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_viewer_sees_no_address_and_no_body_and_an_operator_sees_both() {
    let _serial = SERIAL.lock().await;
    let world = World::start(SHOW_LOG, Setup::signed_reading())
        .await
        .unwrap();
    let failed = failed_mail(&world).await.unwrap();
    let customer = world.refused.clone();
    let inbound = inbound_mail(&world, &customer).await;
    world.add_account("vera", "viewer", PASSWORD).unwrap();
    world.add_account("olga", "operator", PASSWORD).unwrap();
    let viewer = world.add_token("vera").unwrap();
    let operator = world.add_token("olga").unwrap();

    for path in readings(failed.dead_letter, &failed.mail, &inbound) {
        let seen = get(&world, &viewer, &path).await;
        assert_eq!(seen.status, StatusCode::OK, "{path}: {}", seen.text);
        assert!(seen.masked, "{path} is not marked masked for a viewer");
        assert!(
            !holds(&seen.text, &customer),
            "{path} shows a viewer the customer's address {customer}:\n{}",
            seen.text
        );
        assert!(
            !seen.text.contains(BODY_TEXT) && !seen.text.contains("Fiona"),
            "{path} shows a viewer the customer's body or name:\n{}",
            seen.text
        );
    }
    let mail = get(&world, &viewer, &format!("/api/mail/{inbound}")).await;
    assert!(mail.text.contains("f***@localhost"), "{}", mail.text);

    for path in [
        format!("/api/outbound/{}", failed.mail),
        format!("/api/mail/{inbound}"),
    ] {
        let seen = get(&world, &operator, &path).await;
        assert!(!seen.masked, "{path} is marked masked for an operator");
        assert!(holds(&seen.text, &customer), "{path}: {}", seen.text);
    }
    let story = get(&world, &operator, &format!("/api/mail/{inbound}")).await;
    assert!(story.text.contains(BODY_TEXT), "{}", story.text);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_allowed_viewer_reveals_one_page_and_the_reveal_is_audited() {
    let _serial = SERIAL.lock().await;
    let world = World::start(SHOW_LOG, Setup::signed_reading())
        .await
        .unwrap();
    let failed = failed_mail(&world).await.unwrap();
    let customer = world.refused.clone();
    world.add_account("rita", "viewer", PASSWORD).unwrap();
    world.add_account("vera", "viewer", PASSWORD).unwrap();
    world.add_account("olga", "operator", PASSWORD).unwrap();
    let allowed = world.add_token("rita").unwrap();
    let other = world.add_token("vera").unwrap();
    let operator = world.add_token("olga").unwrap();
    let page = format!("/outbound/{}", failed.mail);

    let (status, text) = post(&world, &allowed, "/api/reveal", &[("page", &page)]).await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "a viewer not yet allowed: {text}"
    );

    let (status, text) = post(
        &world,
        &operator,
        "/api/accounts/rita/personal-data",
        &[("allowed", "yes")],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let before = get(&world, &allowed, &format!("/api{page}")).await;
    assert!(before.masked && !holds(&before.text, &customer));

    let (status, text) = post(&world, &allowed, "/api/reveal", &[("page", &page)]).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let after = get(&world, &allowed, &format!("/api{page}")).await;
    assert!(!after.masked, "the revealed page is still masked");
    assert!(holds(&after.text, &customer), "{}", after.text);
    let elsewhere = get(
        &world,
        &allowed,
        &format!("/api/dead-letters/{}", failed.dead_letter),
    )
    .await;
    assert!(
        elsewhere.masked && elsewhere.text.contains("[hidden: personal data]"),
        "a reveal showed another page: {}",
        elsewhere.text
    );

    let (status, _) = post(&world, &other, "/api/reveal", &[("page", &page)]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let denied = world.operators(&["reveal", "rita", "--deny"], "").unwrap();
    assert!(denied.status.success(), "{denied:?}");
    let (status, _) = post(&world, &allowed, "/api/reveal", &[("page", &page)]).await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "a right taken back still reveals"
    );
    let reveals: Vec<(Option<String>, serde_json::Value)> = sqlx::query_as(
        "SELECT account, filter FROM dead_letter_actions WHERE action = 'reveal' ORDER BY id",
    )
    .fetch_all(&world.db.pool)
    .await
    .unwrap();
    assert_eq!(
        reveals,
        vec![(
            Some("rita".to_string()),
            serde_json::json!({ "page": page })
        )],
        "exactly the allowed viewer's reveal is recorded"
    );
    let granted: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT action, note FROM dead_letter_actions WHERE action = 'operator-change'",
    )
    .fetch_all(&world.db.pool)
    .await
    .unwrap();
    assert_eq!(
        granted,
        vec![
            (
                "operator-change".to_string(),
                Some("may reveal personal data".to_string())
            ),
            (
                "operator-change".to_string(),
                Some("may no longer reveal personal data".to_string())
            ),
        ]
    );
}
