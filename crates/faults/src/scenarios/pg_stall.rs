//! `pg-stall`: the host's PostgreSQL traffic stalled (a [`FaultProxy`] in front of the shared
//! server accepts and passes nothing) while work is in flight, for longer than the host's
//! timeouts, then healed.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use worker_testkit::FaultProxy;

use super::{Fault, Load, Scenario};
use crate::run::{Run, Setup};

/// How long the proxy stalls: longer than the pool's acquire timeout (10 s) and than the
/// health probe's timeout (5 s) plus its interval (5 s), so that the host must notice.
const STALL: Duration = Duration::from_secs(15);

/// How often `/readyz` is read during the stall.
const READYZ_POLL: Duration = Duration::from_millis(250);

pub fn scenario() -> Scenario {
    Scenario {
        name: "pg-stall",
        about: "The host reaches PostgreSQL only through a `FaultProxy` (worker-testkit) in front \
                of the shared server: its `database.port` is the proxy's; the harness's own \
                readings go to the server directly. At a random moment of each repetition the \
                proxy stalls for 15 s: open connections stop forwarding (queries in flight get \
                no answer), new ones are accepted and never answered, as a frozen server or a \
                dead link would look; 15 s is longer than the pool's 10 s acquire timeout and \
                the health probe's 5 s timeout plus its 5 s interval. Then it heals: the \
                stalled connections are closed and new ones pass. `/readyz` must leave 200 \
                during the stall (a host that stays ready while it cannot reach its database \
                fails the scenario). \"Ready again\" is from the heal.",
        fault: Some(|| Box::new(PgStall::default())),
        full: Load {
            repetitions: 5,
            per_repetition: 30,
        },
        quick: Load {
            repetitions: 1,
            per_repetition: 20,
        },
        rate_per_sec: 10.0,
        settle: Duration::from_secs(180),
        heartbeat: super::DEFAULT_HEARTBEAT,
    }
}

/// The fault: see [`scenario`]'s description. Holds the proxy (closed with the fault).
#[derive(Default)]
struct PgStall {
    proxy: Option<FaultProxy>,
}

#[async_trait::async_trait]
impl Fault for PgStall {
    async fn prepare(&mut self, _dir: &Path) -> anyhow::Result<Setup> {
        let url = reqwest::Url::parse(&worker_testkit::database_url())
            .context("parsing the test database URL")?;
        let host = url.host_str().unwrap_or("127.0.0.1").to_string();
        let port = url.port().unwrap_or(5432);
        let proxy = FaultProxy::start((host.as_str(), port))
            .await
            .context("starting the proxy in front of PostgreSQL")?;
        let setup = Setup {
            env: vec![
                ("WORKER_HOST__DATABASE__HOST".into(), "127.0.0.1".into()),
                (
                    "WORKER_HOST__DATABASE__PORT".into(),
                    proxy.port().to_string(),
                ),
            ],
            ..Setup::default()
        };
        self.proxy = Some(proxy);
        Ok(setup)
    }

    async fn apply(&mut self, run: &mut Run) -> anyhow::Result<()> {
        let proxy = self.proxy.as_ref().context("no proxy")?;
        proxy.stall();
        let stalled = Instant::now();
        let mut left_ready = false;
        while stalled.elapsed() < STALL {
            if run.readyz().await != Some(200) {
                left_ready = true;
            }
            tokio::time::sleep(READYZ_POLL).await;
        }
        proxy.heal();
        let healed = Instant::now();
        if !left_ready {
            eprintln!("faults: pg-stall: /readyz stayed 200 through the {STALL:?} stall");
            run.unnoticed_faults += 1;
        }
        run.record_ready_after(healed).await
    }

    async fn finish(&mut self, _run: &mut Run) -> anyhow::Result<()> {
        if let Some(proxy) = &self.proxy {
            proxy.heal();
        }
        Ok(())
    }
}
