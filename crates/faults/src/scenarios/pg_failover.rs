//! `pg-failover-sync`, `pg-failover-async` and `pg-switchover`: the host's database is a
//! primary and a standby of the kit's private clusters ([`PgReplicaSet`]), and the host is
//! given both as `database.hosts`. At a random moment of each repetition the primary is lost
//! (killed and the standby promoted) or handed over (a planned switchover); the host must
//! find the new primary by itself. The harness's own connections (the oracle's counts, the
//! direct commands) go through a proxy that is moved to the new primary, as a DNS name or a
//! virtual IP would be; the host never uses it.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use worker_testkit::{FaultProxy, PgReplicaSet, Rejoin, Replication};

use super::{Fault, Load, Scenario};
use crate::host::metric_sum_with;
use crate::oracle::Check;
use crate::run::{HostId, Run, Setup};

/// How long the standby receives nothing before the primary is killed, with asynchronous
/// replication: the commits of that window are lost with the primary.
const LAG_WINDOW: Duration = Duration::from_secs(2);

/// What happens to the primary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    /// Killed (an immediate stop), then the standby promoted; the old primary rejoins as the
    /// new one's standby (after `pg_rewind`) before the next repetition.
    Failover,
    /// Stopped cleanly once its standby has everything, which is then promoted; the old
    /// primary rejoins as its standby.
    Switchover,
}

pub fn sync() -> Scenario {
    Scenario {
        name: "pg-failover-sync",
        about: "The scenario starts two PostgreSQL clusters of its own from Debian's binaries, \
                a primary and a standby made with `pg_basebackup -R`, streaming; the host's \
                `database.hosts` lists both, and it must find the one that accepts writes by \
                itself (the harness's own connections go through a proxy moved to the new \
                primary). Synchronous replication (`synchronous_standby_names` names the standby, \
                `synchronous_commit = on`: a commit returns once the standby has flushed it). \
                At a random moment of each repetition the primary is killed (`pg_ctl stop -m \
                immediate`) and the standby promoted (`pg_ctl promote`); the old primary \
                rejoins as the new one's standby after `pg_rewind`. Nothing committed is lost, \
                so the target is 0 lost and 0 duplicate effects. \"Ready again\" is from the \
                promotion's end.",
        fault: Some(|| Box::new(PgFailover::new(Replication::Synchronous, Change::Failover))),
        full: Load {
            repetitions: 3,
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

pub fn asynchronous() -> Scenario {
    Scenario {
        name: "pg-failover-async",
        about: "Asynchronous replication: a commit returns before the standby has it. On \
                loopback a standby keeps up within a millisecond, so the scenario opens the \
                window a loaded or distant standby has: the standby's WAL receiver is \
                stopped (SIGSTOP) 2 s before the primary is killed, under load, and let go \
                only for the promotion. What the primary committed in those 2 s never \
                reaches the new primary. As `pg-failover-sync` otherwise; the scenario \
                reports the WAL the standby lacked and what the oracle finds lost or \
                duplicated.",
        fault: Some(|| Box::new(PgFailover::new(Replication::Asynchronous, Change::Failover))),
        // Load enough that the lag window, which begins at a random moment, is under it.
        full: Load {
            repetitions: 3,
            per_repetition: 60,
        },
        quick: Load {
            repetitions: 1,
            per_repetition: 60,
        },
        ..sync()
    }
}

pub fn switchover() -> Scenario {
    Scenario {
        name: "pg-switchover",
        about: "Synchronous replication. At a random moment of each repetition a planned \
                switchover: the primary stops in fast mode (its sessions end, its WAL up to \
                the shutdown checkpoint is sent), the standby replays it and is promoted, and \
                the old primary rejoins as its standby. Two members as in `pg-failover-sync`. \
                0 lost, 0 duplicates.",
        fault: Some(|| {
            Box::new(PgFailover::new(
                Replication::Synchronous,
                Change::Switchover,
            ))
        }),
        full: Load {
            repetitions: 5,
            per_repetition: 30,
        },
        ..sync()
    }
}

/// The fault: see the scenarios' descriptions.
struct PgFailover {
    replication: Replication,
    change: Change,
    set: Option<PgReplicaSet>,
    /// The harness's way to the primary.
    proxy: Option<FaultProxy>,
    /// Per repetition: bytes of WAL the standby had not replayed when the primary was lost.
    lag_at_loss: Vec<u64>,
    /// Per repetition: how long the promotion (or the switchover) took.
    changes: Vec<Duration>,
    /// Per repetition: replies sent from the moment the standby stopped receiving to the
    /// kill, whose records the new primary may lack.
    forgotten: Vec<u64>,
}

impl PgFailover {
    fn new(replication: Replication, change: Change) -> Self {
        Self {
            replication,
            change,
            set: None,
            proxy: None,
            lag_at_loss: Vec::new(),
            changes: Vec::new(),
            forgotten: Vec::new(),
        }
    }
}

/// Bytes of WAL the primary wrote that the standby has not received yet: what a crash now
/// would lose with asynchronous replication (at most; some of it may not be committed).
async fn replay_lag(set: &PgReplicaSet) -> anyhow::Result<u64> {
    let mut standby = set.standby().superuser().await?;
    let received: String =
        sqlx::query_scalar("SELECT coalesce(pg_last_wal_receive_lsn(), '0/0')::text")
            .fetch_one(&mut standby)
            .await?;
    let mut primary = set.primary().superuser().await?;
    let lag: i64 = sqlx::query_scalar(
        "SELECT greatest(pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn), 0)::bigint",
    )
    .bind(received)
    .fetch_one(&mut primary)
    .await?;
    Ok(lag.unsigned_abs())
}

/// The replies the host has sent and recorded so far, as its `/metrics` counts them.
async fn sends(run: &Run) -> anyhow::Result<u64> {
    let host = run.process(HostId::First).context("no host is running")?;
    let scrape = host.metrics().await?;
    Ok(metric_sum_with(
        &scrape,
        "worker_messages_total",
        &[("worker_job", "email-send"), ("outcome", "succeeded")],
    ) as u64)
}

/// Stops the standby's WAL receiver (SIGSTOP) for [`LAG_WINDOW`] while the primary goes on
/// committing; returns its pid, to be let go (SIGCONT) before the promotion, which ends it.
async fn stop_receiving(set: &PgReplicaSet) -> anyhow::Result<i32> {
    let mut standby = set.standby().superuser().await?;
    let pid: i32 = sqlx::query_scalar("SELECT pid FROM pg_stat_wal_receiver")
        .fetch_one(&mut standby)
        .await
        .context("the standby's WAL receiver")?;
    signal(pid, "STOP")?;
    tokio::time::sleep(LAG_WINDOW).await;
    Ok(pid)
}

fn signal(pid: i32, name: &str) -> anyhow::Result<()> {
    let status = std::process::Command::new("kill")
        .args([format!("-{name}"), pid.to_string()])
        .status()
        .with_context(|| format!("kill -{name} {pid}"))?;
    anyhow::ensure!(status.success(), "kill -{name} {pid}: {status}");
    Ok(())
}

fn addr_of(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

#[async_trait::async_trait]
impl Fault for PgFailover {
    async fn prepare(&mut self, dir: &Path) -> anyhow::Result<Setup> {
        std::fs::create_dir_all(dir)?;
        let set = PgReplicaSet::start(self.replication, Some(dir)).await?;
        let proxy = FaultProxy::start(addr_of(set.primary().port)).await?;
        let hosts = set
            .hosts()
            .iter()
            .map(|h| format!("{h:?}"))
            .collect::<Vec<_>>()
            .join(", ");
        eprintln!(
            "faults: private primary and standby ({:?}) at {hosts}; the harness through 127.0.0.1:{}",
            self.replication,
            proxy.port()
        );
        let admin_url = set.admin_url().replace(
            &format!(":{}/", set.primary().port),
            &format!(":{}/", proxy.port()),
        );
        let setup = Setup {
            env: vec![("WORKER_HOST__DATABASE__HOSTS".into(), format!("[{hosts}]"))],
            database_admin_url: Some(admin_url),
            ..Setup::default()
        };
        self.set = Some(set);
        self.proxy = Some(proxy);
        Ok(setup)
    }

    async fn apply(&mut self, run: &mut Run) -> anyhow::Result<()> {
        let set = self.set.as_mut().context("no replica set")?;
        let proxy = self.proxy.as_ref().context("no proxy")?;
        let changed = match self.change {
            Change::Failover => {
                let sends_before = sends(run).await?;
                let receiver = match self.replication {
                    Replication::Asynchronous => Some(stop_receiving(set).await?),
                    Replication::Synchronous => None,
                };
                self.lag_at_loss.push(replay_lag(set).await?);
                set.kill_primary().await?;
                let window = sends(run).await?.saturating_sub(sends_before);
                // With synchronous replication every send's record is on the standby.
                if self.replication == Replication::Asynchronous {
                    run.count_forgotten_sends(window);
                    self.forgotten.push(window);
                }
                if let Some(pid) = receiver {
                    signal(pid, "CONT")?;
                }
                set.promote_standby().await?
            }
            Change::Switchover => {
                let began = Instant::now();
                set.switchover().await?;
                began.elapsed()
            }
        };
        let promoted = Instant::now();
        self.changes.push(changed);
        proxy.retarget(addr_of(set.primary().port));
        run.record_ready_after(promoted).await?;
        if self.change == Change::Failover {
            // A standby again before the next repetition (and the set's end state whole).
            set.rejoin(Rejoin::Rewind).await?;
        }
        Ok(())
    }

    async fn verify(&mut self, _run: &mut Run) -> anyhow::Result<Vec<Check>> {
        let lags: Vec<String> = self.lag_at_loss.iter().map(u64::to_string).collect();
        let changes: Vec<String> = self
            .changes
            .iter()
            .map(|d| format!("{:.2} s", d.as_secs_f64()))
            .collect();
        let mut checks = vec![Check::new(
            format!(
                "primary changes: {} (each took {})",
                self.changes.len(),
                changes.join(", ")
            ),
            !self.changes.is_empty(),
        )];
        if self.change == Change::Failover {
            let forgotten = if self.forgotten.is_empty() {
                "none (synchronous: every record is on the standby)".to_string()
            } else {
                let counts: Vec<String> = self.forgotten.iter().map(u64::to_string).collect();
                counts.join(", ")
            };
            checks.push(Check::new(
                format!(
                    "WAL the standby lacked when the primary was killed: {} bytes; replies \
                     sent while it lacked them (their records may be lost, so each may go \
                     again): {}",
                    lags.join(", "),
                    forgotten
                ),
                true,
            ));
        }
        Ok(checks)
    }
}
