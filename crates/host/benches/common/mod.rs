//! What the host's benchmarks share: their knobs, the demo's automation, and a host with the
//! shipped defaults on one IMAP account.

use std::time::Duration;

use worker_testkit::{TestDb, TestVhost};

use crate::support::{Host, base_settings};

/// The number in the environment variable `name`, or `default`.
pub fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The demo's automation: a reply to every mail whose subject starts with "ping".
pub const AUTOMATION: &str = include_str!("../../../../config/automations.demo.toml");

/// A host named `installation`, with the shipped defaults but for where the services are, the
/// demo's automation and the IMAP account `account`; `extra` sections after them and `vars`
/// in its environment. Returns once the account's first poll (which starts after its
/// history) is behind it.
pub async fn launch(
    installation: &str,
    account: &str,
    extra: &str,
    vars: &[(&str, &str)],
) -> (Host, TestDb, TestVhost) {
    let db = TestDb::create().await.unwrap();
    let vhost = TestVhost::create().await.unwrap();
    let (imap_host, imap_port) = worker_testkit::imap_addr()
        .rsplit_once(':')
        .map(|(h, p)| (h.to_string(), p.to_string()))
        .unwrap();
    let host = Host::launch_with("BENCH_SHOW_LOG", vars, |dir, port| {
        let automations = dir.join("automations.toml");
        std::fs::write(&automations, AUTOMATION)?;
        let files = format!("[{:?}]", automations.display().to_string());
        let settings = base_settings(installation, &files, &db, &vhost, port);
        Ok(format!(
            "{settings}\n[[imap.accounts]]\nname = \"bench\"\nhost = {imap_host:?}\nport = {imap_port}\nusername = {account:?}\npassword = \"secret\"\n\n{extra}\n"
        ))
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    (host, db, vhost)
}
