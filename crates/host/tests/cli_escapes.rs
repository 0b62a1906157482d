//! Terminal escapes in stored mail never reach an operator's terminal: a subject, a sender, an
//! error or a body carrying `ESC ] 0;...BEL` (sets the window's title; OSC 52 writes the
//! clipboard on some terminals), `ESC [2J` (clears the screen), a C1 CSI or a bidi override is
//! printed by the real binary's `mail find|show` and `dlq list|show`, as a table and as JSON,
//! with each of those characters shown, never sent.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use support::{Host, SERIAL, base_settings, write_automation};
use uuid::Uuid;
use worker_testkit::{TestDb, TestVhost};

const SHOW_LOG: &str = "CLI_ESCAPES_SHOW_LOG";

/// What an attacker puts in a header: a title, a screen clear, a C1 CSI, DEL and a
/// right-to-left override.
const HOSTILE: &str = "hi \u{1b}]0;pwned\u{7} there \u{1b}[2J \u{9b}31m \u{7f} \u{202e}txt.exe";

/// Every character a terminal acts on, found in `output`.
fn acted_on(output: &str) -> Vec<char> {
    output
        .chars()
        .filter(|c| {
            (c.is_control() && !matches!(c, '\n'))
                || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_subjects_senders_and_errors_are_printed_without_terminal_escapes()
-> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let db = TestDb::create().await?;
    let vhost = TestVhost::create().await?;
    let host = Host::launch(SHOW_LOG, |dir, port| {
        let automations = write_automation(dir)?;
        Ok(base_settings(
            "cli-escapes",
            &automations,
            &db,
            &vhost,
            port,
        ))
    })
    .await?;
    let mail = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO inbound_emails (id, account, mailbox, uidvalidity, uid, status, message_id, \
             from_address, to_addresses, subject, raw_size) \
         VALUES ($1, 'test', 'INBOX', 1, 1, 'stored', $2, $3, $4, $5, 10)",
    )
    .bind(mail)
    .bind(format!("m-{mail}@test"))
    .bind(format!("evil\u{1b}[31m{HOSTILE}@example.com"))
    .bind(vec![format!("host{HOSTILE}@localhost")])
    .bind(format!("subject {HOSTILE}"))
    .execute(&db.pool)
    .await?;
    sqlx::query(
        "INSERT INTO dead_letters (dedup_key, source, queue, reason, attempts, last_error, \
             error_fingerprint, error_normalized, died_at, body) \
         VALUES ('hostile', 'runner', $1, 'rejected', 1, $2, 'abcdef012345', $2, now(), $3)",
    )
    .bind(format!("email.send{HOSTILE}"))
    .bind(format!("550 {HOSTILE}"))
    .bind(format!("{{\"subject\": \"{HOSTILE}\"}}").into_bytes())
    .execute(&db.pool)
    .await?;
    let dead: i64 = sqlx::query_scalar("SELECT id FROM dead_letters WHERE dedup_key = 'hostile'")
        .fetch_one(&db.pool)
        .await?;
    let id = mail.to_string();
    let dead = dead.to_string();
    for args in [
        vec!["mail", "find", "--subject", "subject"],
        vec!["mail", "find", "--subject", "subject", "--json"],
        vec!["mail", "show", &id],
        vec!["mail", "show", &id, "--json"],
        vec!["dlq", "list"],
        vec!["dlq", "list", "--json"],
        vec!["dlq", "show"],
        vec!["dlq", "show", "--json"],
        vec!["dlq", "show", &dead],
    ] {
        let (code, out, err) = host.cli(&args).await?;
        assert_eq!(code, Some(0), "{args:?}: {err}");
        assert!(out.contains("pwned"), "{args:?} shows the value:\n{out}");
        assert_eq!(
            acted_on(&out),
            Vec::<char>::new(),
            "{args:?} prints characters a terminal acts on:\n{}",
            out.escape_debug()
        );
    }
    host.stop_cleanly().await;
    Ok(())
}
