//! `imap-restart`: the IMAP server the poller reads restarted, on a private Dovecot of the
//! scenario's own that serves the shared mail folders (the shared Dovecot is never touched).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use worker_testkit::Dovecot as PrivateDovecot;

use super::{Fault, Load, Scenario};
use crate::run::{Run, Setup};

/// How long the server stays down between its stop and its new start.
const DOWN: Duration = Duration::from_secs(3);

pub fn scenario() -> Scenario {
    Scenario {
        name: "imap-restart",
        about: "The poller reads a private Dovecot that the scenario starts (`dovecot -F` with \
                the shared configuration's mail location, users and passwords, but a port, \
                `base_dir`, `state_dir`, log and `instance_name` of its own under the \
                scenario's folder; the shared Dovecot, which the SMTP sink delivers for and the \
                harness reads replies from, is never touched). At a random moment of each \
                repetition the private server is stopped with SIGTERM (every IMAP connection \
                closed), stays down 3 s (connections refused) and is started again. \"Ready \
                again\" is from the stop.",
        fault: Some(|| Box::new(ImapRestart::default())),
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
struct ImapRestart {
    server: Option<PrivateDovecot>,
}

#[async_trait::async_trait]
impl Fault for ImapRestart {
    async fn prepare(&mut self, dir: &Path) -> anyhow::Result<Setup> {
        let mut server = PrivateDovecot::configure(&dir.join("dovecot"))?;
        server.start().await?;
        let port = server.port;
        self.server = Some(server);
        Ok(Setup {
            imap_port: Some(port),
            ..Setup::default()
        })
    }

    async fn apply(&mut self, run: &mut Run) -> anyhow::Result<()> {
        let server = self
            .server
            .as_mut()
            .context("the private Dovecot was not started")?;
        let stopped = Instant::now();
        server.stop().await?;
        tokio::time::sleep(DOWN).await;
        server.start().await?;
        run.record_ready_after(stopped).await
    }
}
