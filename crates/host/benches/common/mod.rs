//! What the host's benchmarks share: their knobs, the demo's automation, and a host with the
//! shipped defaults on one IMAP account.

use std::path::Path;
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

/// [`launch`] with another build of the host (`binary`; `None`: this one's), for a benchmark
/// that compares two builds side by side.
pub async fn launch_binary(
    binary: Option<&Path>,
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
    let settings = |dir: &Path, port: u16| {
        let automations = dir.join("automations.toml");
        std::fs::write(&automations, AUTOMATION)?;
        let files = format!("[{:?}]", automations.display().to_string());
        let settings = base_settings(installation, &files, &db, &vhost, port);
        Ok(format!(
            "{settings}\n[[imap.accounts]]\nname = \"bench\"\nhost = {imap_host:?}\nport = {imap_port}\nusername = {account:?}\npassword = \"secret\"\n\n{extra}\n"
        ))
    };
    let host = match binary {
        Some(binary) => {
            let mut host = Host::spawn(binary, "BENCH_SHOW_LOG", vars, settings).unwrap();
            host.wait_ready().await.unwrap();
            host
        }
        None => Host::launch_with("BENCH_SHOW_LOG", vars, settings)
            .await
            .unwrap(),
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    (host, db, vhost)
}
