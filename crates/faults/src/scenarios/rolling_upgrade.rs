//! `rolling-upgrade`: the previous release's host (the commit `docs/previous-release` names,
//! built by [`crate::previous_release`]) beside this tree's, on one database and broker under
//! the mail loop's load: the new binary migrates while the old host runs, a new host starts
//! beside it, the old one stops, a second new one starts; and a dead letter the old release
//! made is replayed by the new one.

use std::time::{Duration, Instant};

use anyhow::Context;

use super::sink_switch::SinkSwitch;
use super::{Fault, Load, Scenario};
use crate::host::metric_sum;
use crate::mail::{self, Pinger};
use crate::oracle::Check;
use crate::previous_release::{self, PreviousRelease};
use crate::run::{HostId, Run, Setup};

/// The steps of the upgrade, one a repetition (the rest at the end when a run has fewer).
const STEPS: usize = 3;

/// How long the old release may take to dead-letter the refused reply (a poll, the trigger,
/// the action, one send; the 550 is permanent, so no retry tier).
const DEAD_LETTER_WAIT: Duration = Duration::from_secs(90);

/// How long `migrate` and `dlq replay` may take.
const TOOL_WAIT: Duration = Duration::from_secs(120);

/// How long the replayed mail may take to arrive after the loop settled.
const REPLAYED_WAIT: Duration = Duration::from_secs(30);

/// The sink's answer to the dead letter's recipient while the old release sends to it.
const REFUSAL: &str = "550 5.1.1 no such user";

pub fn scenario() -> Scenario {
    Scenario {
        name: "rolling-upgrade",
        about: "A rolling upgrade from the previous release (the commit `docs/previous-release` \
                names, built with `cargo build -p worker-host` in a git worktree of that commit \
                under `target/faults/previous-release/<commit>/`, its output in `build.log` \
                there, reused while its binary is there; full run only, a cold build takes \
                minutes) to this tree's binary, on one database and vhost under the pings and \
                direct commands. The old host starts first on an empty database and migrates \
                it to its own schema. Before the load, it makes a dead letter: a ping from an \
                address of the scenario's own whose reply the sink refuses \
                (`smtp-fail/<address>`, `550 5.1.1 no such user`), dead-lettered `rejected` and \
                archived by the old release; then the switch is removed. One step at a random \
                moment of each of 3 repetitions: (1) `worker-host migrate` with the new binary \
                while the old host runs (an expand step: the old host must stay ready, checked \
                for 3 s after); (2) a new host starts beside the old one (both consume the \
                queues: each must have settled deliveries by the next step); (3) the old host \
                gets SIGTERM (exit 0 expected) and a second new host starts. At the end the new binary replays the old release's dead letter \
                (`worker-host dlq replay --id N`): its mail must arrive exactly once. Each \
                binary's `--version` (the old one must name the previous release's revision) \
                and each host's time to ready are in the result column; \"max s to ready\" is the new \
                hosts' from their start.",
        fault: Some(|| Box::new(RollingUpgrade::default())),
        full: Load {
            repetitions: STEPS as u32,
            per_repetition: 100,
        },
        quick: Load {
            repetitions: STEPS as u32,
            per_repetition: 30,
        },
        rate_per_sec: 5.0,
        settle: Duration::from_secs(180),
        heartbeat: super::DEFAULT_HEARTBEAT,
    }
}

/// The upgrade: see [`scenario`]'s description.
#[derive(Default)]
struct RollingUpgrade {
    previous: Option<PreviousRelease>,
    /// The steps done so far.
    done: usize,
    /// Seconds to ready: the old host's, then each new host's, with its name.
    ready: Vec<(String, f64)>,
    /// Deliveries each host of the pair had settled when the old one was stopped.
    settled: Vec<(&'static str, u64)>,
    /// Whether the old host left `/readyz` 200 in the 3 s after the migration.
    old_left_ready: Option<bool>,
    /// The old release's dead letter: its id and the ping whose reply it is.
    dead_letter: Option<(i64, String)>,
    /// Where the dead letter's mail goes once replayed.
    dead_letter_box: String,
}

impl RollingUpgrade {
    fn previous(&self) -> anyhow::Result<&PreviousRelease> {
        self.previous
            .as_ref()
            .context("the previous release was not prepared")
    }

    /// The old release's dead letter: a ping whose reply the sink refuses with a 5xx.
    async fn make_dead_letter(&mut self, run: &mut Run) -> anyhow::Result<()> {
        let mut boxes = run.boxes.clone();
        boxes.sender = format!("dlq-{}", run.boxes.sender);
        let switch = SinkSwitch::fail(&boxes.sender, REFUSAL)?;
        let pinger = Pinger::new(&boxes, "rolling-upgrade dead letter")?;
        let ping = pinger.ping(0).await?;
        let deadline = Instant::now() + DEAD_LETTER_WAIT;
        let id = loop {
            let id: Option<i64> = sqlx::query_scalar(
                "SELECT id FROM dead_letters WHERE queue = 'email.send' AND status = 'dead' \
                 AND reason = 'rejected' ORDER BY id LIMIT 1",
            )
            .fetch_optional(&run.db.pool)
            .await
            .context("reading the dead letters")?;
            if let Some(id) = id {
                break id;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "the previous release made no dead letter within {DEAD_LETTER_WAIT:?} of a ping \
                 whose reply the sink refuses"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        drop(switch);
        eprintln!("faults: rolling-upgrade: the previous release dead-lettered #{id}");
        self.dead_letter = Some((id, ping));
        self.dead_letter_box = boxes.sender;
        run.expected_dead_letters = Some(1);
        Ok(())
    }

    /// The next step of the upgrade.
    async fn step(&mut self, run: &mut Run) -> anyhow::Result<()> {
        match self.done {
            0 => {
                let binary = run.binary.clone();
                run.host_tool(&binary, &["migrate"], "migrate.log", TOOL_WAIT)
                    .await
                    .context("migrating with the new release while the old one runs")?;
                self.old_left_ready = Some(run.left_ready_within(Duration::from_secs(3)).await?);
            }
            1 => {
                let secs = run.start_replica_timed().await?;
                run.ready.push(secs);
                self.ready.push(("new".into(), secs));
            }
            2 => {
                // What each settled while both ran (the old one's since its start): the
                // broker shares the queues between the releases.
                for (which, name) in [(HostId::First, "old"), (HostId::REPLICA, "new")] {
                    let scrape = match run.process(which) {
                        Some(host) => host.metrics().await.unwrap_or_default(),
                        None => String::new(),
                    };
                    let settled = metric_sum(&scrape, "worker_messages_total") as u64;
                    self.settled.push((name, settled));
                }
                run.stop(HostId::First).await?;
                let secs = run.start_replica_timed().await?;
                run.ready.push(secs);
                self.ready.push(("second new".into(), secs));
            }
            _ => return Ok(()),
        }
        self.done += 1;
        eprintln!(
            "faults: rolling-upgrade: step {}/{STEPS} done",
            self.done.min(STEPS)
        );
        Ok(())
    }
}

#[async_trait::async_trait]
impl Fault for RollingUpgrade {
    async fn prepare(&mut self, _dir: &std::path::Path) -> anyhow::Result<Setup> {
        let previous = previous_release::ensure().await?;
        match previous.build_secs {
            Some(secs) => eprintln!(
                "faults: rolling-upgrade: built {} in {secs:.0} s (log {})",
                previous.commit,
                previous_release::shown(&previous.build_log)
            ),
            None => eprintln!(
                "faults: rolling-upgrade: reusing the build of {} (log {})",
                previous.commit,
                previous_release::shown(&previous.build_log)
            ),
        }
        let setup = Setup {
            first_binary: Some(previous.binary.clone()),
            // The old release migrates it to its own schema at its start
            // (`migrate_on_start`, the default): it would refuse a database that has this
            // tree's newer migrations at its start (sqlx's VersionMissing).
            empty_database: true,
            ..Setup::default()
        };
        self.previous = Some(previous);
        Ok(setup)
    }

    async fn begin(&mut self, run: &mut Run) -> anyhow::Result<()> {
        self.ready.push(("old".into(), run.first_ready_secs));
        self.make_dead_letter(run).await
    }

    async fn apply(&mut self, run: &mut Run) -> anyhow::Result<()> {
        self.step(run).await
    }

    async fn finish(&mut self, run: &mut Run) -> anyhow::Result<()> {
        while self.done < STEPS {
            self.step(run).await?;
        }
        let (id, _) = self
            .dead_letter
            .as_ref()
            .context("no dead letter was made")?;
        let binary = run.binary.clone();
        run.host_tool(
            &binary,
            &["dlq", "replay", "--id", &id.to_string()],
            "dlq-replay.log",
            TOOL_WAIT,
        )
        .await
        .context("replaying the previous release's dead letter with the new release")
    }

    async fn verify(&mut self, run: &mut Run) -> anyhow::Result<Vec<Check>> {
        let previous = self.previous()?;
        let short = &previous.commit[..previous.commit.len().min(7)];
        // Which binaries ran: each names the revision it was built from, so an old host
        // that was in fact this tree's (a wrong path, a stale copy) shows here.
        let (old, new) = (
            previous_release::version_of(&previous.binary),
            previous_release::version_of(&run.binary),
        );
        let mut checks = vec![Check::new(
            format!("old host `{old}`, new hosts `{new}` (must differ)"),
            old != new && old.contains(short),
        )];
        checks.push(Check::new(
            match previous.build_secs {
                Some(secs) => format!(
                    "previous release {short} built in {secs:.0} s (log {})",
                    previous_release::shown(&previous.build_log)
                ),
                None => format!(
                    "previous release {short} reused (build log {})",
                    previous_release::shown(&previous.build_log)
                ),
            },
            true,
        ));
        let ready: Vec<String> = self
            .ready
            .iter()
            .map(|(which, secs)| format!("{which} {secs:.1} s"))
            .collect();
        checks.push(Check::new(
            format!("s to ready from start: {}", ready.join(", ")),
            self.ready.len() == STEPS,
        ));
        let settled: Vec<String> = self
            .settled
            .iter()
            .map(|(which, n)| format!("{which} {n}"))
            .collect();
        checks.push(Check::new(
            format!(
                "deliveries settled when the old host stopped: {} (each must be > 0)",
                settled.join(", ")
            ),
            self.settled.len() == 2 && self.settled.iter().all(|(_, n)| *n > 0),
        ));
        let left = self.old_left_ready.unwrap_or(true);
        checks.push(Check::new(
            format!(
                "old host left ready after the migration: {} (must be no)",
                if left { "yes" } else { "no" }
            ),
            !left,
        ));
        let releases = run
            .query_scalar("SELECT count(*) FROM schema_releases")
            .await
            .unwrap_or(0);
        checks.push(Check::new(
            format!("schema_releases rows after migrate: {releases} (must be > 0)"),
            releases > 0,
        ));
        let (id, ping) = self
            .dead_letter
            .clone()
            .context("no dead letter was made")?;
        let deadline = Instant::now() + REPLAYED_WAIT;
        let mut replies = mail::replies(&self.dead_letter_box).await?;
        while replies.is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_secs(1)).await;
            replies = mail::replies(&self.dead_letter_box).await?;
        }
        let matching = replies.iter().filter(|ids| ids.contains(&ping)).count();
        let status: String = sqlx::query_scalar("SELECT status FROM dead_letters WHERE id = $1")
            .bind(id)
            .fetch_one(&run.db.pool)
            .await
            .context("reading the replayed dead letter")?;
        checks.push(Check::new(
            format!(
                "old release's dead letter #{id} replayed by the new one: {status}, its mail \
                 arrived {matching} time(s) of {} in its mailbox (must be replayed, 1 of 1)",
                replies.len()
            ),
            status == "replayed" && matching == 1 && replies.len() == 1,
        ));
        Ok(checks)
    }
}
