//! A primary and a standby of the kit's private clusters ([`PgCluster`]), streaming, for tests
//! and fault scenarios of a database that fails over.
//!
//! [`PgReplicaSet::start`] makes the primary (`initdb`, the kit's role and database), then a
//! standby of it with `pg_basebackup -R` that streams from the primary's socket, and, for
//! [`Replication::Synchronous`], names the standby in the primary's
//! `synchronous_standby_names` (with `synchronous_commit = on`): a commit returns only once
//! the standby has flushed it. Each member keeps its port for its whole life, so a host's
//! address list ([`PgReplicaSet::hosts`]) stays valid whichever member is primary.
//!
//! What a scenario does to it:
//! - [`PgReplicaSet::kill_primary`]: an immediate stop, no checkpoint (a crash);
//! - [`PgReplicaSet::promote_standby`]: `pg_ctl promote`, waiting for the standby to accept
//!   writes (after a kill, [`PgReplicaSet::failover`] does both);
//! - [`PgReplicaSet::switchover`]: a planned change, with nothing lost: the primary stops
//!   (fast), the standby replays up to its shutdown checkpoint, is promoted, and the old
//!   primary rejoins as a standby of the new one;
//! - [`PgReplicaSet::rejoin`]: after a failover, the old primary comes back as a standby of
//!   the new one, after `pg_rewind` ([`Rejoin::Rewind`]) where it wrote WAL the new primary
//!   never received.
//!
//! Every wait is for what it proves (`pg_stat_replication` shows the standby streaming, or
//! `sync`; the standby's replay reached a position), bounded by [`WAIT`], never a sleep.
//!
//! Whichever member is primary, only it has `synchronous_standby_names`: a promoted standby
//! runs alone, asynchronous, until a standby rejoins it (as Patroni does without
//! `synchronous_mode_strict`), so that its commits do not wait for a standby that is not there.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sqlx::Connection;

use crate::pg_cluster::{PgCluster, run};
use crate::wait::eventually;

/// How long a wait of the set may take: a standby catching up, a promotion, a rejoin.
pub const WAIT: Duration = Duration::from_secs(60);

/// The members' names: each one's `application_name` as a standby (what
/// `pg_stat_replication` and `synchronous_standby_names` name it by) and its log's name.
pub const MEMBER_NAMES: [&str; 2] = ["pg-a", "pg-b"];

/// What every member runs with, primary or standby: streaming, and what `pg_rewind` needs
/// (full-page writes, which the kit's lone clusters turn off, and hint bits in the WAL). WAL
/// is kept (256 MB) so that a rejoining member can stream from where it stopped.
const REPLICATION_SETTINGS: &str = "# a member of a replica set (worker-testkit)\n\
    wal_level = replica\n\
    full_page_writes = on\n\
    wal_log_hints = on\n\
    max_wal_senders = 10\n\
    wal_keep_size = '256MB'\n\
    hot_standby = on\n";

/// Whether a commit on the primary waits for the standby.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// `synchronous_standby_names` names the standby, `synchronous_commit = on`: a commit
    /// returns once the standby has flushed its WAL, so a promotion loses no committed work.
    Synchronous,
    /// The standby streams behind the primary: the last commits before a crash may be lost.
    Asynchronous,
}

/// How a former primary becomes a standby of the new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejoin {
    /// As it is: right after a clean stop whose shutdown checkpoint the new primary replayed
    /// (a switchover), its WAL is a prefix of the new primary's.
    AsIs,
    /// `pg_rewind` from the new primary first: after a crash its WAL may hold records the new
    /// primary never received, which must be undone before it can follow (pg_rewind runs the
    /// crash recovery it needs first, in single-user mode, and does nothing when nothing
    /// diverged).
    Rewind,
}

/// A primary and a standby; see the module's doc. Both are stopped and removed when it is
/// dropped.
#[derive(Debug)]
pub struct PgReplicaSet {
    /// In start order: [`MEMBER_NAMES`]`[i]` is `members[i]`'s name; `members[0]` is the
    /// first primary.
    members: Vec<PgCluster>,
    /// Which of `members` is (or, once killed, was last) the primary.
    primary: usize,
    replication: Replication,
}

impl PgReplicaSet {
    /// Starts a primary (`pg-a`) and a standby (`pg-b`) of it, streaming, synchronous or not
    /// as asked. With `keep_logs`, each member's server log is copied into that folder as
    /// `<name>.log` when the set is dropped.
    pub async fn start(replication: Replication, keep_logs: Option<&Path>) -> anyhow::Result<Self> {
        let log = |i: usize| keep_logs.map(|dir| dir.join(format!("{}.log", MEMBER_NAMES[i])));
        let primary = PgCluster::start_configured(log(0), None, REPLICATION_SETTINGS.into())
            .await
            .context("starting the primary")?;
        let standby = standby_of(&primary, MEMBER_NAMES[1], log(1))
            .await
            .context("starting the standby")?;
        let set = Self {
            members: vec![primary, standby],
            primary: 0,
            replication,
        };
        // Synchronous only now: while the standby did not exist, the role's creation would
        // have waited for it.
        set.configure_primary().await?;
        set.wait_streaming(WAIT).await?;
        Ok(set)
    }

    /// The member that is primary (or, after [`Self::kill_primary`], was).
    pub fn primary(&self) -> &PgCluster {
        &self.members[self.primary]
    }

    /// The member that is not [`Self::primary`].
    pub fn standby(&self) -> &PgCluster {
        &self.members[self.standby_index()]
    }

    /// The members in start order (`pg-a`, `pg-b`), whichever is primary.
    pub fn members(&self) -> &[PgCluster] {
        &self.members
    }

    /// Which of [`Self::members`] is the primary.
    pub fn primary_index(&self) -> usize {
        self.primary
    }

    /// The replication the set was started with.
    pub fn replication(&self) -> Replication {
        self.replication
    }

    /// Each member's `127.0.0.1:<port>` in start order: a host's `database.hosts`.
    pub fn hosts(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|member| format!("127.0.0.1:{}", member.port))
            .collect()
    }

    /// The admin URL of the `worker_host` role on the current primary.
    pub fn admin_url(&self) -> String {
        self.primary().admin_url()
    }

    fn standby_index(&self) -> usize {
        1 - self.primary
    }

    /// Kills the primary: every server process at once, no checkpoint (`pg_ctl stop -m
    /// immediate`). Nothing is primary until [`Self::promote_standby`].
    pub async fn kill_primary(&self) -> anyhow::Result<()> {
        self.primary().stop_immediate().await
    }

    /// Promotes the standby (`pg_ctl promote`, which waits until it accepts writes); it is
    /// the primary from then on. Returns how long the promotion took.
    pub async fn promote_standby(&mut self) -> anyhow::Result<Duration> {
        let began = Instant::now();
        let standby = self.standby_index();
        self.members[standby]
            .pg_ctl_async(vec!["promote".into()])
            .await
            .with_context(|| format!("promoting {}", MEMBER_NAMES[standby]))?;
        self.primary = standby;
        // A promoted standby runs alone until a standby rejoins it (see the module's doc).
        self.configure_primary().await?;
        Ok(began.elapsed())
    }

    /// A failover: kills the primary, then promotes the standby. Returns how long the
    /// promotion took (from the kill's end).
    pub async fn failover(&mut self) -> anyhow::Result<Duration> {
        self.kill_primary().await?;
        self.promote_standby().await
    }

    /// A planned switchover, losing nothing: the primary stops (fast: its sessions end, its
    /// WAL is sent to the standby up to its shutdown checkpoint), the standby is promoted
    /// once it has replayed that checkpoint, and the old primary rejoins as its standby
    /// ([`Rejoin::AsIs`]), streaming (and `sync`, when synchronous) before this returns.
    pub async fn switchover(&mut self) -> anyhow::Result<()> {
        let old = self.primary;
        self.members[old]
            .pg_ctl_async(vec!["stop".into(), "-m".into(), "fast".into()])
            .await
            .with_context(|| format!("stopping {} (fast)", MEMBER_NAMES[old]))?;
        let checkpoint = latest_checkpoint(&self.members[old]).await?;
        let standby = self.standby();
        eventually(
            &format!(
                "{} replaying {}'s shutdown checkpoint at {checkpoint}",
                MEMBER_NAMES[self.standby_index()],
                MEMBER_NAMES[old]
            ),
            WAIT,
            || async {
                let mut admin = standby.superuser().await?;
                let past: Option<bool> =
                    sqlx::query_scalar("SELECT pg_last_wal_replay_lsn() > $1::text::pg_lsn")
                        .bind(&checkpoint)
                        .fetch_one(&mut admin)
                        .await?;
                admin.close().await?;
                Ok(past.unwrap_or(false).then_some(()))
            },
        )
        .await?;
        self.promote_standby().await?;
        self.rejoin(Rejoin::AsIs).await
    }

    /// The former primary (stopped or killed) comes back as a standby of the current
    /// primary, on its own port, after `pg_rewind` if asked; returns once it streams (and,
    /// when synchronous, is `sync` again).
    pub async fn rejoin(&mut self, how: Rejoin) -> anyhow::Result<()> {
        let old = self.standby_index();
        let (primary, member) = (&self.members[self.primary], &self.members[old]);
        if how == Rejoin::Rewind {
            // pg_rewind reads the source's timeline from its control file, which a promotion
            // updates only at its next checkpoint: without one, it finds both on the same
            // timeline and rewinds nothing.
            let mut admin = primary.superuser().await?;
            sqlx::query("CHECKPOINT").execute(&mut admin).await?;
            admin.close().await?;
            let mut rewind = member.program("pg_rewind");
            rewind
                .arg("--target-pgdata")
                .arg(member.data_dir())
                .arg("--source-server")
                .arg(superuser_conninfo(primary, None));
            tokio::task::spawn_blocking(move || run(&mut rewind))
                .await
                .context("the pg_rewind task")?
                .with_context(|| format!("pg_rewind of {}", MEMBER_NAMES[old]))?;
        }
        set_role_settings(member, standby_settings(primary, MEMBER_NAMES[old]));
        member.configure()?;
        let signal = member.data_dir().join("standby.signal");
        std::fs::write(&signal, "").with_context(|| format!("writing {}", signal.display()))?;
        member
            .start_again()
            .await
            .map_err(|e| e.context(member.log_tail()))?;
        self.configure_primary().await?;
        self.wait_streaming(WAIT).await
    }

    /// Waits until the primary's `pg_stat_replication` shows the standby streaming, having
    /// flushed everything the primary had flushed when the wait began (so it follows, not
    /// merely connects), and, when synchronous, with `sync_state = 'sync'` (its commits wait
    /// for it), within `within`.
    pub async fn wait_streaming(&self, within: Duration) -> anyhow::Result<()> {
        let name = MEMBER_NAMES[self.standby_index()];
        let want_sync = self.replication == Replication::Synchronous;
        let primary = self.primary();
        let mut admin = primary.superuser().await?;
        let flushed: String = sqlx::query_scalar("SELECT pg_current_wal_flush_lsn()::text")
            .fetch_one(&mut admin)
            .await?;
        admin.close().await?;
        let flushed = &flushed;
        eventually(
            &format!(
                "{name} streaming from {}{}",
                MEMBER_NAMES[self.primary],
                if want_sync { " as its sync standby" } else { "" }
            ),
            within,
            || async {
                let mut admin = primary.superuser().await?;
                let row: Option<(Option<String>, Option<String>, Option<bool>)> = sqlx::query_as(
                    "SELECT state, sync_state, flush_lsn >= $2::text::pg_lsn \
                     FROM pg_stat_replication WHERE application_name = $1",
                )
                .bind(name)
                .bind(flushed)
                .fetch_optional(&mut admin)
                .await?;
                admin.close().await?;
                let Some((state, sync_state, caught_up)) = row else {
                    bail!("{name} is not connected");
                };
                let streaming = state.as_deref() == Some("streaming");
                let sync_ok = !want_sync || sync_state.as_deref() == Some("sync");
                if streaming && sync_ok && caught_up == Some(true) {
                    Ok(Some(()))
                } else {
                    bail!(
                        "state {state:?}, sync_state {sync_state:?}, flushed up to {flushed}: {caught_up:?}"
                    )
                }
            },
        )
        .await
    }

    /// Waits until the standby has replayed everything the primary had written when this
    /// was called (its reads then see every earlier commit), within `within`.
    pub async fn wait_standby_caught_up(&self, within: Duration) -> anyhow::Result<()> {
        let mut admin = self.primary().superuser().await?;
        let written: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
            .fetch_one(&mut admin)
            .await?;
        admin.close().await?;
        let standby = self.standby();
        eventually(
            &format!("the standby replaying up to {written}"),
            within,
            || async {
                let mut admin = standby.superuser().await?;
                let caught_up: Option<bool> =
                    sqlx::query_scalar("SELECT pg_last_wal_replay_lsn() >= $1::text::pg_lsn")
                        .bind(&written)
                        .fetch_one(&mut admin)
                        .await?;
                admin.close().await?;
                Ok(caught_up.unwrap_or(false).then_some(()))
            },
        )
        .await
    }

    /// Writes the primary's settings (naming the standby as synchronous when the set is
    /// and the standby is there to answer) and has it reload them.
    async fn configure_primary(&self) -> anyhow::Result<()> {
        // Just promoted, the old primary is down: run alone until it rejoins.
        let standby_running = self.standby().is_running().await;
        let mut settings = REPLICATION_SETTINGS.to_string();
        if self.replication == Replication::Synchronous && standby_running {
            settings.push_str(&format!(
                "synchronous_commit = on\nsynchronous_standby_names = '\"{}\"'\n",
                MEMBER_NAMES[self.standby_index()]
            ));
        }
        let primary = self.primary();
        set_role_settings(primary, settings);
        primary.configure()?;
        primary.pg_ctl_async(vec!["reload".into()]).await
    }
}

/// A new cluster made from `primary` with `pg_basebackup -R`, streaming from its socket as
/// `name`, started on a port of its own.
async fn standby_of(
    primary: &PgCluster,
    name: &str,
    keep_log: Option<std::path::PathBuf>,
) -> anyhow::Result<PgCluster> {
    let began = Instant::now();
    let mut standby = PgCluster::new_folder(keep_log, standby_settings(primary, name))?;
    standby.chown_root()?;
    let mut basebackup = standby.program("pg_basebackup");
    basebackup
        .arg("--pgdata")
        .arg(standby.data_dir())
        .args(["--write-recovery-conf", "--wal-method=stream"])
        .args(["--checkpoint=fast", "--no-sync", "--dbname"])
        .arg(superuser_conninfo(primary, Some(name)));
    tokio::task::spawn_blocking(move || run(&mut basebackup))
        .await
        .context("the pg_basebackup task")?
        .context("pg_basebackup of the primary")?;
    // `-R` wrote `standby.signal` and a `primary_conninfo` into the copied
    // `postgresql.auto.conf`, which the start rewrites with the standby's own port and the
    // same `primary_conninfo` (its role's settings).
    standby.start_on_a_free_port().await?;
    standby.startup = began.elapsed();
    Ok(standby)
}

/// A standby's role settings: what every member runs with, and where it streams from.
fn standby_settings(primary: &PgCluster, name: &str) -> String {
    format!(
        "{REPLICATION_SETTINGS}primary_conninfo = '{}'\n",
        superuser_conninfo(primary, Some(name))
    )
}

/// A libpq connection string to `cluster`'s socket as its superuser, with
/// `application_name` when given (a standby's name).
fn superuser_conninfo(cluster: &PgCluster, application_name: Option<&str>) -> String {
    let mut conninfo = format!(
        "host={} port={} user=postgres dbname=postgres",
        cluster.socket_dir().display(),
        cluster.port
    );
    if let Some(name) = application_name {
        conninfo.push_str(&format!(" application_name={name}"));
    }
    conninfo
}

fn set_role_settings(cluster: &PgCluster, settings: String) {
    match cluster.role_settings.lock() {
        Ok(mut role) => *role = settings,
        Err(poisoned) => *poisoned.into_inner() = settings,
    }
}

/// The `Latest checkpoint location` of a stopped cluster, from `pg_controldata`.
async fn latest_checkpoint(cluster: &PgCluster) -> anyhow::Result<String> {
    control_data(cluster, "Latest checkpoint location:").await
}

/// One line's value of `pg_controldata`'s output for a stopped cluster.
async fn control_data(cluster: &PgCluster, field: &'static str) -> anyhow::Result<String> {
    let mut controldata = cluster.program("pg_controldata");
    controldata.arg(cluster.data_dir()).env("LC_ALL", "C");
    let output = tokio::task::spawn_blocking(move || program_output(&mut controldata))
        .await
        .context("the pg_controldata task")??;
    output
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .map(|value| value.trim().to_string())
        .with_context(|| format!("no `{field}` in pg_controldata's output: {output}"))
}

/// Runs a command to its end and returns its standard output; fails with its error output
/// when it does not exit 0.
fn program_output(command: &mut Command) -> anyhow::Result<String> {
    let output = command
        .output()
        .with_context(|| format!("running {:?}", command.get_program()))?;
    if !output.status.success() {
        bail!(
            "{:?} {:?}: {}: {}",
            command.get_program(),
            command.get_args().collect::<Vec<_>>(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the primary holds, read on `cluster` as the superuser.
    async fn rows(cluster: &PgCluster) -> anyhow::Result<i64> {
        let mut admin = cluster.superuser().await?;
        let n = sqlx::query_scalar("SELECT count(*) FROM kit_replication")
            .fetch_one(&mut admin)
            .await?;
        admin.close().await?;
        Ok(n)
    }

    async fn write(cluster: &PgCluster, sql: &str) -> anyhow::Result<()> {
        let mut admin = cluster.superuser().await?;
        sqlx::query(sql).execute(&mut admin).await?;
        admin.close().await?;
        Ok(())
    }

    async fn in_recovery(cluster: &PgCluster) -> anyhow::Result<bool> {
        let mut admin = cluster.superuser().await?;
        let standby = sqlx::query_scalar("SELECT pg_is_in_recovery()")
            .fetch_one(&mut admin)
            .await?;
        admin.close().await?;
        Ok(standby)
    }

    fn have_binaries() -> bool {
        let found = Path::new("/usr/lib/postgresql").exists();
        if !found {
            eprintln!("no PostgreSQL server binaries: skipped");
        }
        found
    }

    /// Needs the postgresql package (as the fault suite does); skipped where it is missing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_synchronous_standby_has_every_commit_and_fails_over_then_rejoins()
    -> anyhow::Result<()> {
        if !have_binaries() {
            return Ok(());
        }
        // A synchronous commit without its standby waits for ever: bound the whole test.
        tokio::time::timeout(Duration::from_secs(240), synchronous_failover()).await?
    }

    async fn synchronous_failover() -> anyhow::Result<()> {
        let mut set = PgReplicaSet::start(Replication::Synchronous, None).await?;
        assert!(!in_recovery(set.primary()).await?);
        assert!(in_recovery(set.standby()).await?);
        write(set.primary(), "CREATE TABLE kit_replication (n int)").await?;
        write(set.primary(), "INSERT INTO kit_replication VALUES (1)").await?;
        // Synchronous: the commit returned once the standby flushed it; the kill loses nothing.
        set.wait_standby_caught_up(WAIT).await?;
        set.failover().await?;
        assert_eq!(set.primary_index(), 1);
        assert!(!in_recovery(set.primary()).await?);
        assert_eq!(rows(set.primary()).await?, 1);
        write(set.primary(), "INSERT INTO kit_replication VALUES (2)").await?;
        set.rejoin(Rejoin::Rewind).await?;
        assert!(in_recovery(set.standby()).await?);
        write(set.primary(), "INSERT INTO kit_replication VALUES (3)").await?;
        set.wait_standby_caught_up(WAIT).await?;
        assert_eq!(rows(set.standby()).await?, 3);
        Ok(())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_switchover_swaps_the_roles_and_loses_nothing() -> anyhow::Result<()> {
        if !have_binaries() {
            return Ok(());
        }
        let mut set = PgReplicaSet::start(Replication::Asynchronous, None).await?;
        let ports: Vec<u16> = set.members().iter().map(|m| m.port).collect();
        write(set.primary(), "CREATE TABLE kit_replication (n int)").await?;
        write(set.primary(), "INSERT INTO kit_replication VALUES (1)").await?;
        set.switchover().await?;
        assert_eq!(set.primary_index(), 1);
        assert!(!in_recovery(set.primary()).await?);
        assert!(in_recovery(set.standby()).await?);
        assert_eq!(rows(set.primary()).await?, 1, "the last commit survived");
        write(set.primary(), "INSERT INTO kit_replication VALUES (2)").await?;
        set.switchover().await?;
        assert_eq!(set.primary_index(), 0, "and back");
        assert_eq!(rows(set.primary()).await?, 2);
        let after: Vec<u16> = set.members().iter().map(|m| m.port).collect();
        assert_eq!(ports, after, "each member kept its port");
        Ok(())
    }
}
