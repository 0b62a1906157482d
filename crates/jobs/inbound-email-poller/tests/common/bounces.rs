//! Real bounces for the real poller: a fixture of `tests/fixtures/bounces/` with the
//! original's Message-ID replaced by one of a mail "the host sent" (an `outbound_emails` row
//! the test writes), and what the poller recorded of it.

use sqlx::PgPool;
use uuid::Uuid;

/// The fixture `name`, its every occurrence of `original` replaced by `replacement`, in
/// CRLF lines (as SMTP and IMAP carry mail).
pub fn fixture_about(name: &str, original: &str, replacement: &str) -> Vec<u8> {
    let path = format!(
        "{}/tests/fixtures/bounces/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = String::from_utf8(std::fs::read(&path).unwrap()).unwrap();
    assert!(
        original.is_empty() || text.contains(original),
        "{name} names {original}"
    );
    let text = if original.is_empty() {
        text
    } else {
        text.replace(original, replacement)
    };
    text.replace("\r\n", "\n")
        .replace('\n', "\r\n")
        .into_bytes()
}

/// A mail the host sent (`sent`), with a Message-ID of its own; returns its id and
/// Message-ID.
pub async fn sent_mail(pool: &PgPool, to: &str) -> anyhow::Result<(Uuid, String)> {
    let id = Uuid::new_v4();
    let message_id = format!("{}@worker-host", id.simple());
    sqlx::query(
        "INSERT INTO outbound_emails (id, message_id, to_addresses, subject, text_body, status, \
                                      attempts, smtp_response, sent_at) \
         VALUES ($1, $2, ARRAY[$3], 'Re: your order', 'thanks', 'sent', 1, '250 2.0.0 Ok', now())",
    )
    .bind(id)
    .bind(&message_id)
    .bind(to)
    .execute(pool)
    .await?;
    Ok((id, message_id))
}

pub async fn status_of(pool: &PgPool, id: Uuid) -> anyhow::Result<String> {
    Ok(
        sqlx::query_scalar("SELECT status FROM outbound_emails WHERE id = $1")
            .bind(id)
            .fetch_one(pool)
            .await?,
    )
}

/// A row of `outbound_bounces`, as the tests compare it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Bounce {
    pub outbound_email_id: Option<Uuid>,
    pub recipient: String,
    pub action: String,
    pub status: Option<String>,
    pub class: String,
    pub diagnostic: Option<String>,
}

pub async fn bounces(pool: &PgPool) -> anyhow::Result<Vec<Bounce>> {
    Ok(sqlx::query_as(
        "SELECT outbound_email_id, recipient, action, status, class, diagnostic \
         FROM outbound_bounces ORDER BY id",
    )
    .fetch_all(pool)
    .await?)
}
