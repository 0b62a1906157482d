//! Mail stories as the story tests read them (`mail find|show --json`), and the one reply
//! Postfix bounces for real: its `error` transport for `bounce.test` answers 5.1.1, and its
//! delivery status notification comes back to the mailbox the host polls.

use serde_json::Value;
use worker_testkit::{TestDb, TestVhost};

use super::{Host, base_settings, mail_account_settings, send_mail, short_id, write_automation};

/// `mail find --from <from> --json`, once the newest mail from `from` is in `state`; that
/// mail's row.
pub async fn found_in_state(host: &Host, from: &str, state: &str) -> Value {
    host.wait_for(&format!("the mail from {from} {state}"), || async move {
        let (code, out, err) = host
            .cli(&["mail", "find", "--from", from, "--json"])
            .await?;
        anyhow::ensure!(code == Some(0), "mail find failed: {err}");
        let found: Vec<Value> = serde_json::from_str(&out)?;
        Ok(found
            .into_iter()
            .next()
            .filter(|mail| mail["end"]["state"] == state))
    })
    .await
}

/// `mail show <id> --json`.
pub async fn show(host: &Host, id: &str) -> Value {
    let (code, out, err) = host.cli(&["mail", "show", id, "--json"]).await.unwrap();
    assert_eq!(code, Some(0), "mail show {id}: {err}");
    serde_json::from_str(&out).unwrap()
}

/// A host whose reply to a customer Postfix bounced, and what it takes to read about it.
pub struct Bounced {
    pub host: Host,
    /// The customer whose mail was answered: `ann-<id>@bounce.test`.
    pub customer: String,
    /// The customer's mail, as `mail find --json` lists it once its story ends `bounced`.
    pub mail: Value,
    pub db: TestDb,
    pub vhost: TestVhost,
}

/// Starts a host (`installation`, the console open for reading) that polls `bounced-<id>` and
/// sends through Postfix as that account, so Postfix's report on a reply comes back to the
/// mailbox the poller reads; a customer at `bounce.test` pings it, and this waits until the
/// customer's mail ends `bounced`.
pub async fn bounced_reply(installation: &str) -> anyhow::Result<Bounced> {
    let db = TestDb::create_empty().await?;
    let vhost = TestVhost::create().await?;
    let id = short_id();
    let account = format!("bounced-{id}");
    let to = format!("{account}@localhost");
    let customer = format!("ann-{id}@bounce.test");
    let postfix =
        std::env::var("WH_TEST_POSTFIX_STARTTLS").unwrap_or_else(|_| "127.0.0.1:10587".into());
    let (relay, port) = postfix.rsplit_once(':').unwrap();
    let host = Host::launch("MAIL_STORY_SHOW_LOG", |dir, admin_port| {
        let automations = write_automation(dir)?;
        let mut settings = base_settings(installation, &automations, &db, &vhost, admin_port);
        settings = settings.replacen("[admin]\n", "[admin]\nopen_reading = true\n", 1);
        settings.push_str(&mail_account_settings(&account));
        settings.push_str(&format!(
            r#"
[smtp]
host = {relay:?}
port = {port}
security = "starttls"
username = {account:?}
password = "secret"
ca_file = {ca:?}
from = {to:?}
"#,
            ca = worker_testkit::mail_ca().display().to_string(),
        ));
        Ok(settings)
    })
    .await?;

    send_mail(&customer, &to, "ping, to bounce", "story.test").await?;
    let mail = found_in_state(&host, &customer, "bounced").await;
    Ok(Bounced {
        host,
        customer,
        mail,
        db,
        vhost,
    })
}
