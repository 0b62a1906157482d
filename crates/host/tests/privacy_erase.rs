//! `worker-host privacy export|erase` (issue 38) on the whole loop, against the real services:
//! for two addresses, a ping answered, a reply refused by the server (its dead letter), a
//! reply held back by the reply limit, and an operator's edit of the failed mail; and a dead
//! letter still in a dead queue. Then the first address is erased: a scan of every text, JSON
//! and byte column of every table of the database finds it nowhere (the erasure's own audit
//! entry holds only its keyed hash), the dry run before it changed nothing, and the second
//! address's data is where it was.
//!
//! `PRIVACY_SHOW_LOG=1` prints the host's log when it stops.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::collections::BTreeMap;

use serde_json::Value;
use support::{
    Host, SERIAL, SmtpFailSwitch, base_settings, mail_account_settings, send_mail, short_id,
    write_automation,
};
use worker_testkit::{TestDb, TestVhost};

const TOKEN: &str = "privacy-operator-token";

async fn start(db: &TestDb, vhost: &TestVhost, account: &str) -> anyhow::Result<Host> {
    Host::launch("PRIVACY_SHOW_LOG", |dir, port| {
        let automations = write_automation(dir)?;
        let mut settings = base_settings("privacy-test", &automations, db, vhost, port);
        settings = settings.replacen(
            "[admin]\n",
            &format!("[admin]\noperator_token = {TOKEN:?}\nopen_reading = true\n"),
            1,
        );
        settings.push_str(&mail_account_settings(account));
        settings.push_str(
            r#"
[jobs.automation_action.auto_replies]
per_recipient = 2

[jobs.email_send.queue]
retry_tiers = ["1s", "300s"]
"#,
        );
        Ok(settings)
    })
    .await
}

/// The newest mail from `from` in `state`, as `mail find` lists it.
async fn found_in_state(host: &Host, from: &str, state: &str) -> Value {
    host.wait_for(&format!("a mail from {from} {state}"), || async move {
        let (code, out, err) = host
            .cli(&["mail", "find", "--from", from, "--json"])
            .await?;
        anyhow::ensure!(code == Some(0), "mail find failed: {err}");
        let found: Vec<Value> = serde_json::from_str(&out)?;
        Ok(found.into_iter().find(|mail| mail["end"]["state"] == state))
    })
    .await
}

/// Where `needle` occurs (any case) in every text, varchar, char, JSON, text-array and bytea
/// column of every table of the database's `public` schema: rows per table and column.
async fn scan(db: &TestDb, needle: &str) -> anyhow::Result<BTreeMap<String, i64>> {
    let columns: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT table_name::text, column_name::text, data_type::text \
         FROM information_schema.columns c \
         JOIN information_schema.tables t USING (table_schema, table_name) \
         WHERE table_schema = 'public' AND t.table_type = 'BASE TABLE' \
           AND (data_type IN ('text', 'character varying', 'character', 'json', 'jsonb', 'bytea') \
                OR (data_type = 'ARRAY' AND udt_name IN ('_text', '_varchar', '_bpchar'))) \
         ORDER BY 1, 2",
    )
    .fetch_all(&db.pool)
    .await?;
    assert!(columns.len() > 40, "the schema's columns: {columns:?}");
    let mut found = BTreeMap::new();
    for (table, column, data_type) in columns {
        let text = if data_type == "bytea" {
            format!("lower(encode(\"{column}\", 'escape'))")
        } else {
            format!("lower(\"{column}\"::text)")
        };
        let n: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM \"{table}\" WHERE position(lower($1) in {text}) > 0"
        ))
        .bind(needle)
        .fetch_one(&db.pool)
        .await?;
        if n > 0 {
            found.insert(format!("{table}.{column}"), n);
        }
    }
    Ok(found)
}

/// A digest of every table's rows but the audit trail's (which a dry run adds an entry to).
async fn digest(db: &TestDb) -> anyhow::Result<BTreeMap<String, String>> {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables \
         WHERE table_schema = 'public' AND table_type = 'BASE TABLE' \
           AND table_name NOT IN ('dead_letter_actions') ORDER BY 1",
    )
    .fetch_all(&db.pool)
    .await?;
    let mut out = BTreeMap::new();
    for table in tables {
        let md5: String = sqlx::query_scalar(&format!(
            "SELECT md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) FROM \"{table}\" t"
        ))
        .fetch_one(&db.pool)
        .await?;
        out.insert(table, md5);
    }
    Ok(out)
}

/// The loop for one address: answered, refused (dead-lettered), held back by the reply limit,
/// and the refused mail edited by an operator and sent again; its failed mail's id.
async fn whole_loop(host: &Host, db: &TestDb, who: &str, to: &str) -> anyhow::Result<String> {
    send_mail(who, to, "ping one", "privacy.test").await?;
    found_in_state(host, who, "answered").await;
    let switch = SmtpFailSwitch::set(who, "550 5.1.1 no such user")?;
    send_mail(who, to, "ping two", "privacy.test").await?;
    found_in_state(host, who, "failed").await;
    send_mail(who, to, "ping three", "privacy.test").await?;
    let limited = found_in_state(host, who, "skipped").await;
    assert_eq!(limited["end"]["reason"], "reply-limit", "{limited:#}");
    drop(switch);
    let failed: String = sqlx::query_scalar(
        "SELECT id::text FROM outbound_emails WHERE status = 'failed' \
           AND array_to_string(to_addresses, ',') ILIKE '%' || $1 || '%'",
    )
    .bind(who)
    .fetch_one(&db.pool)
    .await?;
    let answer = support::console::http()
        .post(host.url(&format!("/api/outbound/{failed}/edited")))
        .bearer_auth(TOKEN)
        .form(&[
            ("edit_key", uuid::Uuid::new_v4().to_string().as_str()),
            ("to", who),
            ("subject", "Re: ping two"),
            (
                "text",
                &format!("Hello {}, here is your answer again.", who.to_uppercase()),
            ),
        ])
        .send()
        .await?;
    let status = answer.status();
    let body = answer.text().await?;
    assert_eq!(status, 200, "the edit: {body}");
    let (db_ref, failed_ref) = (db, failed.as_str());
    host.wait_for("the edited copy sent", || async move {
        let sent: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM outbound_emails WHERE supersedes = $1::uuid AND status = 'sent'",
        )
        .bind(failed_ref)
        .fetch_one(&db_ref.pool)
        .await?;
        Ok((sent == 1).then_some(()))
    })
    .await;
    Ok(failed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_erased_address_is_found_nowhere_and_another_is_untouched() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let db = TestDb::create_empty().await?;
    let vhost = TestVhost::create().await?;
    let id = short_id();
    let account = format!("privacy-{id}");
    let to = format!("{account}@localhost");
    let ann = format!("ann-{id}@localhost");
    let bob = format!("bob-{id}@localhost");
    let mut host = start(&db, &vhost, &account).await?;

    let (ann_failed, bob_failed) = tokio::try_join!(
        whole_loop(&host, &db, &ann, &to),
        whole_loop(&host, &db, &bob, &to)
    )?;
    // Every dead letter archived before the host stops.
    host.wait_for("both refused replies archived", || async {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM dead_letters")
            .fetch_one(&db.pool)
            .await?;
        Ok((n >= 2).then_some(()))
    })
    .await;
    host.stop().await;

    // A dead letter still in its dead queue, naming Ann in its body, with her display name.
    let stuck = format!("stuck-{id}");
    let properties = lapin::BasicProperties::default()
        .with_message_id(stuck.as_str().into())
        .with_content_type("application/json".into());
    let body = format!(
        r#"{{"to": "Ann <{}>", "subject": "parcel"}}"#,
        ann.to_uppercase()
    );
    worker_testkit::amqp::publish_confirmed(
        &vhost,
        "",
        "email.send.dead",
        &[(properties, body.as_bytes())],
    )
    .await?;

    // What a delivery report said of each one's refused reply (as the poller records it).
    for (who, failed) in [(&ann, &ann_failed), (&bob, &bob_failed)] {
        sqlx::query(
            "INSERT INTO outbound_bounces (inbound_email_id, outbound_email_id, recipient, \
                                           action, status, class, diagnostic) \
             SELECT i.id, $2::uuid, $1, 'failed', '5.1.1', 'permanent', \
                    '550 5.1.1 <' || $1 || '>: no such user' \
             FROM inbound_emails i WHERE i.from_address = $1 LIMIT 1",
        )
        .bind(who.as_str())
        .bind(failed.as_str())
        .execute(&db.pool)
        .await?;
    }

    // Another team's audit entry naming her: exported, counted, kept (docs/PRIVACY.md).
    sqlx::query(
        "INSERT INTO audit_log_entries (id, occurred_at, actor, action, entity_type, entity_id, data) \
         VALUES (gen_random_uuid(), now(), 'dispatch-7', 'customer.contacted', 'customer', $1, \
                 jsonb_build_object('channel', 'mail'))",
    )
    .bind(&ann)
    .execute(&db.pool)
    .await?;

    let ann_before = scan(&db, &ann).await?;
    let bob_before = scan(&db, &bob).await?;
    for place in [
        "inbound_emails.from_address",
        "outbound_emails.to_addresses",
        "outbound_email_recipients.address",
        "outbound_bounces.recipient",
        "outbound_bounces.diagnostic",
        "action_executions.event",
        "dead_letter_actions.filter",
    ] {
        assert!(ann_before.contains_key(place), "{place}: {ann_before:#?}");
        assert!(bob_before.contains_key(place), "{place}: {bob_before:#?}");
    }
    let recipients = |address: String| {
        let db = &db;
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM outbound_email_recipients WHERE address = $1",
            )
            .bind(address)
            .fetch_one(&db.pool)
            .await
        }
    };
    let ann_counted = recipients(ann.clone()).await?;
    assert_eq!(ann_counted, 3, "answered, refused, edited copy");

    // The export lists her rows, table by table.
    let (code, out, err) = host
        .cli(&[
            "privacy",
            "export",
            "--address",
            &ann.to_uppercase(),
            "--json",
        ])
        .await?;
    assert_eq!(code, Some(0), "privacy export: {err}");
    let export: Value = serde_json::from_str(&out)?;
    let rows_of = |export: &Value, table: &str| {
        export["tables"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["table"] == table)
            .map_or(0, |t| t["rows"].as_array().unwrap().len())
    };
    assert_eq!(rows_of(&export, "inbound_emails"), 3, "{export:#}");
    assert_eq!(rows_of(&export, "outbound_email_recipients"), 3);
    assert!(rows_of(&export, "dead_letters") >= 1);
    assert!(rows_of(&export, "dead_letter_actions") >= 1, "the edit");
    assert_eq!(rows_of(&export, "audit_log_entries"), 1, "{export:#}");
    assert!(!out.contains(&bob), "only her rows");

    // The dry run: counts, and nothing changed.
    let digest_before = digest(&db).await?;
    let (code, out, err) = host
        .cli(&[
            "privacy",
            "erase",
            "--address",
            &format!("Ann <{}>", ann.to_uppercase()),
            "--dry-run",
            "--json",
        ])
        .await?;
    assert_eq!(code, Some(0), "privacy erase --dry-run: {err}");
    let dry: Value = serde_json::from_str(&out)?;
    assert_eq!(dry["dry_run"], true);
    let planned: i64 = dry["tables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["rows"].as_i64().unwrap())
        .sum();
    assert!(planned >= 10, "{dry:#}");
    assert_eq!(
        digest(&db).await?,
        digest_before,
        "a dry run changes nothing"
    );
    let mut after_dry = scan(&db, &ann).await?;
    // Only the export's and the dry run's audit entries are new, and they hold no address.
    after_dry.remove("dead_letter_actions.filter");
    let mut before = ann_before.clone();
    before.remove("dead_letter_actions.filter");
    assert_eq!(after_dry, before, "a dry run changes nothing");

    // The erasure.
    let (code, out, err) = host
        .cli(&["privacy", "erase", "--address", &ann, "--json"])
        .await?;
    assert_eq!(code, Some(0), "privacy erase: {err}");
    let erasure: Value = serde_json::from_str(&out)?;
    let hash = erasure["address_hash"].as_str().unwrap().to_string();
    assert_eq!(hash.len(), 64);

    // Found nowhere but in the audit log, which the erasure keeps.
    let kept = BTreeMap::from([("audit_log_entries.entity_id".to_string(), 1)]);
    let ann_after = scan(&db, &ann).await?;
    assert_eq!(
        ann_after, kept,
        "the erased address is found nowhere else: {ann_after:#?}"
    );
    // Not even by its local part.
    let local = ann.split('@').next().unwrap();
    assert_eq!(scan(&db, local).await?, kept);
    // The dead letter that was still in its queue was archived, then erased.
    let stuck_body: Vec<u8> =
        sqlx::query_scalar("SELECT body FROM dead_letters WHERE message_id = $1")
            .bind(&stuck)
            .fetch_one(&db.pool)
            .await?;
    assert_eq!(stuck_body, b"[erased]");
    // The erasure's audit entry holds the keyed hash, not the address.
    let (action, target): (String, Value) =
        sqlx::query_as("SELECT action, filter FROM dead_letter_actions WHERE id = $1")
            .bind(erasure["action_id"].as_i64().unwrap())
            .fetch_one(&db.pool)
            .await?;
    assert_eq!(action, "privacy-erase");
    assert_eq!(target["address_hmac"], hash.as_str());
    // Her mails still count, under her pseudonym: the reply limit still adds up.
    let pseudonym: String = sqlx::query_scalar(
        "SELECT DISTINCT address FROM outbound_email_recipients WHERE address LIKE 'erased-%'",
    )
    .fetch_one(&db.pool)
    .await?;
    assert_eq!(recipients(pseudonym).await?, ann_counted);
    let statuses: Vec<String> =
        sqlx::query_scalar("SELECT status FROM outbound_emails WHERE id = $1::uuid")
            .bind(&ann_failed)
            .fetch_all(&db.pool)
            .await?;
    assert_eq!(statuses, ["failed"], "statuses stay");
    // Nothing is left to export but the kept audit entry.
    let (code, out, _) = host
        .cli(&["privacy", "export", "--address", &ann, "--json"])
        .await?;
    assert_eq!(code, Some(0));
    let left: Value = serde_json::from_str(&out)?;
    assert_eq!(
        left["tables"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["rows"].as_array().unwrap().len())
            .sum::<usize>(),
        1,
        "{out}"
    );
    assert_eq!(rows_of(&left, "audit_log_entries"), 1, "{out}");

    // Bob's data is where it was.
    assert_eq!(
        scan(&db, &bob).await?,
        bob_before,
        "another address is untouched"
    );
    let bob_status: String =
        sqlx::query_scalar("SELECT status FROM outbound_emails WHERE id = $1::uuid")
            .bind(&bob_failed)
            .fetch_one(&db.pool)
            .await?;
    assert_eq!(bob_status, "failed");
    let bob_text: Option<String> =
        sqlx::query_scalar("SELECT text_body FROM outbound_emails WHERE supersedes = $1::uuid")
            .bind(&bob_failed)
            .fetch_one(&db.pool)
            .await?;
    assert!(bob_text.unwrap().contains(&bob.to_uppercase()));
    host.stop_cleanly().await;
    Ok(())
}
