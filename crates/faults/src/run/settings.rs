//! The settings file of a scenario's hosts, and the ports they listen on.

use std::path::Path;

use worker_testkit::{TestDb, TestVhost};

use crate::mail::Mailboxes;

/// The demo automation: a reply to the sender of any mail whose subject contains `ping`.
pub(super) const AUTOMATION: &str = r#"
[[automations]]
name = "reply-to-ping"
event_type = "email.received"
conditions = [{ path = "subject", op = "contains", value = "ping" }]

[[automations.actions]]
type = "send_email"
to = ["{{ from }}"]
subject = "Re: {{ subject }}"
text = "pong: the worker host got your mail \"{{ subject }}\"."
"#;

/// The host's settings for one scenario.
pub(super) fn settings(
    db: &TestDb,
    vhost: &TestVhost,
    boxes: &Mailboxes,
    port: u16,
    automation: &Path,
    imap_port: Option<u16>,
) -> String {
    let imap_port = imap_port
        .map(|port| format!("port = {port}\n"))
        .unwrap_or_default();
    let tiers = r#"retry_tiers = ["2s", "5s", "10s"]"#;
    format!(
        r#"
installation = "faults"
automations_files = [{automation:?}]

[database]
name = {db:?}
password = "worker_host"

[broker]
vhost = {vhost:?}
username = "guest"
password = "guest"

[admin]
listen = "127.0.0.1:{port}"

[workers]
shutdown_grace = "10s"


[[imap.accounts]]
name = "faults"
username = {account:?}
password = "secret"
{imap_port}
[jobs.inbound_email_poller]
schedule = "every 1s"

[jobs.dead_letter_archive]
schedule = "every 2s"

[jobs.automation_trigger]
max_attempts = 30
[jobs.automation_trigger.queue]
{tiers}

[jobs.automation_action]
max_attempts = 30
[jobs.automation_action.queue]
{tiers}
# Every ping comes from one sender: the reply limit must not count it as a mail cannon.
[jobs.automation_action.auto_replies]
per_recipient = 1000000

[jobs.email_send]
max_attempts = 30
# One send (the runner's limit adds the record budget); a stale claim is taken over at 45 s.
timeout = "10s"
claim_stale_after = "45s"
[jobs.email_send.queue]
{tiers}
"#,
        automation = automation.display().to_string(),
        db = db.name,
        vhost = vhost.name,
        account = boxes.account,
    )
}

pub(super) fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}
