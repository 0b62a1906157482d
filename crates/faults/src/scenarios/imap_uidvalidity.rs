//! `imap-uidvalidity`: the polled mailbox's UIDVALIDITY changes while mail arrives.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::{Fault, Load, Scenario};
use crate::run::Run;

pub fn scenario() -> Scenario {
    Scenario {
        name: "imap-uidvalidity",
        about: "At a random moment of each repetition, while pings arrive, the UIDVALIDITY of \
                the scenario's own polled mailbox is changed to a new value (the current one \
                + 1000 + the repetition): `doveadm -c <the shared Dovecot's configuration> \
                mailbox update --uid-validity <n> -u <account> INBOX`, which rewrites that \
                mailbox's index and uidlist only (the shared Dovecot is not reconfigured), \
                then read back over IMAP. The host must start the mailbox over and answer every \
                ping exactly once: no ping lost around the change, no mail handled before it \
                handled again (inbound dedup by Message-ID). \"Ready again\" is from the \
                change.",
        fault: Some(|| Box::new(ImapUidvalidity::default())),
        full: Load {
            repetitions: 10,
            per_repetition: 20,
        },
        quick: Load {
            repetitions: 1,
            per_repetition: 20,
        },
        rate_per_sec: 2.0,
        settle: Duration::from_secs(180),
        heartbeat: super::DEFAULT_HEARTBEAT,
    }
}

/// The fault: see [`scenario`]'s description.
#[derive(Default)]
struct ImapUidvalidity {
    changes: u32,
}

#[async_trait::async_trait]
impl Fault for ImapUidvalidity {
    async fn apply(&mut self, run: &mut Run) -> anyhow::Result<()> {
        let account = run.boxes.account.clone();
        let before = uidvalidity(&account).await?;
        self.changes += 1;
        let wanted = before.wrapping_add(1000 + self.changes).max(1);
        let config = worker_testkit::services_dir().join("dovecot/dovecot.conf");
        let at = Instant::now();
        crate::command::run(
            "doveadm",
            &[
                "-c",
                &config.display().to_string(),
                "mailbox",
                "update",
                "--uid-validity",
                &wanted.to_string(),
                "-u",
                &account,
                "INBOX",
            ],
        )
        .await
        .context("changing the mailbox's UIDVALIDITY")?;
        let after = uidvalidity(&account).await?;
        if after != wanted {
            bail!("the UIDVALIDITY of {account}'s INBOX is {after} after the change, not {wanted}");
        }
        eprintln!("faults: imap-uidvalidity: {account}'s INBOX UIDVALIDITY {before} → {after}");
        run.record_ready_after(at).await
    }
}

/// The UIDVALIDITY of `user`'s INBOX, read over IMAP (EXAMINE, read-only).
async fn uidvalidity(user: &str) -> anyhow::Result<u32> {
    tokio::time::timeout(Duration::from_secs(30), async {
        let stream = tokio::net::TcpStream::connect(worker_testkit::imap_addr()).await?;
        let mut client = async_imap::Client::new(stream);
        let _greeting = client.read_response().await?;
        let mut session = client.login(user, "secret").await.map_err(|(err, _)| err)?;
        let mailbox = session.examine("INBOX").await?;
        session.logout().await?;
        mailbox
            .uid_validity
            .with_context(|| format!("{user}'s INBOX has no UIDVALIDITY"))
    })
    .await
    .with_context(|| format!("reading {user}'s UIDVALIDITY timed out"))?
}
