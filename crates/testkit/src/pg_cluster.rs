//! A private PostgreSQL cluster for tests and fault scenarios that stop, crash or restart the
//! database, or need it configured differently (TLS):
//! `initdb` from Debian's binaries (`/usr/lib/postgresql/<newest>/bin/`), a port, a data
//! directory and a socket directory of its own under the system's temporary folder, listening
//! on 127.0.0.1 only, with the role and database the project's tests expect (`worker_host`,
//! password `worker_host`, `CREATEDB`; `max_connections` 200), as `scripts/services.sh`
//! sets up the shared one. PostgreSQL refuses to run as root: when the harness is root, every
//! PostgreSQL program runs as the `postgres` system user (through `runuser`); otherwise as the
//! harness's own user.
//!
//! The cluster is stopped (immediate mode) and its folder removed when the value is dropped,
//! also when the scenario fails; its server log is copied next to the scenario's host log
//! first. With [`PgCluster::start_with_tls`] it also serves TLS (`ssl = on`) with the given
//! certificate; plain connections are still accepted, so a test can show both. `fsync` is off: the scenarios crash the server, never the machine, so the kernel
//! keeps every write the server made (crash recovery still replays the WAL), and a cluster
//! on a shared 2-core machine starts and commits faster.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection};

use crate::tls::ServerCert;

/// The role (and its database) the host's tests and settings use.
const ROLE: &str = "worker_host";

/// How long `pg_ctl` may wait for the server to start or stop.
const PG_CTL_WAIT_SECS: &str = "60";

/// The start of a private cluster's folder name in the temporary folder.
const ROOT_PREFIX: &str = "wh-pg-";

/// How old a cluster's folder must be before a later run treats it as left over.
const LEFTOVER_AGE: Duration = Duration::from_secs(2 * 3600);

/// Times a new cluster may try another port when the one it picked was taken meanwhile.
const START_ATTEMPTS: u32 = 3;

/// A running private cluster; see the module's doc.
#[derive(Debug)]
pub struct PgCluster {
    /// The TCP port it listens on, on 127.0.0.1.
    pub port: u16,
    /// How long `initdb`, the start and the role's set-up took.
    pub startup: Duration,
    /// The folder that holds the data, socket and log directories.
    root: PathBuf,
    bin: PathBuf,
    /// `Some("postgres")` when the programs run as that user (the harness is root).
    run_as: Option<String>,
    /// Where the server log is copied when the cluster is removed.
    keep_log: Option<PathBuf>,
    /// The certificate and key it serves TLS with (copies in its folder), if any.
    tls: Option<ServerCert>,
    /// Settings its role in a replica set adds after the kit's own (`pg_replica.rs`): what a
    /// primary needs to serve standbys, a standby's `primary_conninfo`, the synchronous
    /// standbys' names. Written with the rest by every [`Self::configure`].
    pub(crate) role_settings: std::sync::Mutex<String>,
}

impl PgCluster {
    /// Creates and starts a cluster, with the `worker_host` role and database; its server log
    /// is copied to `keep_log` at the end.
    pub async fn start(keep_log: Option<PathBuf>) -> anyhow::Result<Self> {
        Self::start_with(keep_log, None).await
    }

    /// [`Self::start`], serving TLS with `cert` besides plain connections.
    pub async fn start_with_tls(cert: &ServerCert) -> anyhow::Result<Self> {
        Self::start_with(None, Some(cert)).await
    }

    async fn start_with(
        keep_log: Option<PathBuf>,
        tls: Option<&ServerCert>,
    ) -> anyhow::Result<Self> {
        Self::start_configured(keep_log, tls, String::new()).await
    }

    /// Creates and starts a cluster with `role_settings` after the kit's own settings.
    pub(crate) async fn start_configured(
        keep_log: Option<PathBuf>,
        tls: Option<&ServerCert>,
        role_settings: String,
    ) -> anyhow::Result<Self> {
        let began = Instant::now();
        let mut cluster = Self::new_folder(keep_log, role_settings)?;
        if let Some(cert) = tls {
            // PostgreSQL reads its key only if the server's user owns it and no one else may.
            cluster.tls = Some(cert.copy_to(&cluster.root.join("tls"))?);
        }
        cluster.chown_root()?;
        cluster.initdb()?;
        cluster.start_on_a_free_port().await?;
        cluster.create_role().await?;
        cluster.startup = began.elapsed();
        Ok(cluster)
    }

    /// A cluster's folder, created, with nothing in it yet: removed with the value from here
    /// on, so a failure while filling it still cleans up.
    pub(crate) fn new_folder(
        keep_log: Option<PathBuf>,
        role_settings: String,
    ) -> anyhow::Result<Self> {
        let bin = newest_bin_dir()?;
        let run_as = is_root().then(|| "postgres".to_string());
        sweep_leftovers(&bin, run_as.as_deref());
        let root = std::env::temp_dir().join(format!(
            "{ROOT_PREFIX}{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        ));
        std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
        Ok(Self {
            port: 0,
            startup: Duration::ZERO,
            root,
            bin,
            run_as,
            keep_log,
            tls: None,
            role_settings: std::sync::Mutex::new(role_settings),
        })
    }

    /// Gives the cluster's folder to the user its programs run as.
    pub(crate) fn chown_root(&self) -> anyhow::Result<()> {
        if let Some(user) = &self.run_as {
            run(Command::new("chown")
                .arg("-R")
                .arg(format!("{user}:"))
                .arg(&self.root))?;
        }
        Ok(())
    }

    /// Starts the server in its data directory on a free port (another one if the port was
    /// taken meanwhile).
    pub(crate) async fn start_on_a_free_port(&mut self) -> anyhow::Result<()> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            self.port = free_port()?;
            self.configure()?;
            let args = ["start", "-l", &self.log_file_arg()].map(str::to_string);
            match self.pg_ctl_async(args.to_vec()).await {
                Ok(()) => return Ok(()),
                Err(err) if attempt < START_ATTEMPTS => {
                    eprintln!(
                        "testkit: private PostgreSQL did not start on port {}, trying another: {err:#}",
                        self.port
                    );
                }
                Err(err) => return Err(err.context(self.log_tail())),
            }
        }
    }

    /// The admin URL of the `worker_host` role on this cluster, as
    /// [`crate::TestDb::create_on`] takes it.
    pub fn admin_url(&self) -> String {
        format!("postgres://{ROLE}:{ROLE}@127.0.0.1:{}/{ROLE}", self.port)
    }

    /// A cluster found on disk, to be stopped and removed by its drop.
    fn leftover(root: PathBuf, bin: &Path, run_as: Option<&str>) -> Self {
        Self {
            port: 0,
            startup: Duration::ZERO,
            root,
            bin: bin.to_path_buf(),
            run_as: run_as.map(str::to_string),
            keep_log: None,
            tls: None,
            role_settings: std::sync::Mutex::new(String::new()),
        }
    }

    /// `pg_ctl restart -m fast`: every session ends, the server comes back at once.
    pub async fn restart_fast(&self) -> anyhow::Result<()> {
        let args = ["restart", "-m", "fast", "-l", &self.log_file_arg()].map(str::to_string);
        self.pg_ctl_async(args.to_vec()).await
    }

    /// `pg_ctl stop -m immediate`: every server process killed at once, no checkpoint; the
    /// next start runs crash recovery.
    pub async fn stop_immediate(&self) -> anyhow::Result<()> {
        self.pg_ctl_async(vec!["stop".into(), "-m".into(), "immediate".into()])
            .await
    }

    /// Whether its server runs (`pg_ctl status`: the postmaster's pid is alive, not merely
    /// written down, as after a `kill -9`).
    pub async fn is_running(&self) -> bool {
        let mut command = self.program("pg_ctl");
        command.arg("status").arg("-D").arg(self.data_dir());
        tokio::task::spawn_blocking(move || command.output())
            .await
            .ok()
            .and_then(Result::ok)
            .is_some_and(|output| output.status.success())
    }

    /// `pg_ctl start` of a stopped cluster (after an immediate stop: crash recovery first).
    pub async fn start_again(&self) -> anyhow::Result<()> {
        self.pg_ctl_async(vec!["start".into(), "-l".into(), self.log_file_arg()])
            .await
    }

    pub(crate) fn data_dir(&self) -> PathBuf {
        self.root.join("data")
    }

    pub(crate) fn socket_dir(&self) -> PathBuf {
        self.root.join("socket")
    }

    fn log_file(&self) -> PathBuf {
        self.root.join("postgres.log")
    }

    pub(crate) fn log_file_arg(&self) -> String {
        self.log_file().display().to_string()
    }

    /// A command for one of the cluster's programs, as the user it runs as.
    pub(crate) fn program(&self, name: &str) -> Command {
        let path = self.bin.join(name);
        let mut command = match &self.run_as {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(path);
                c
            }
            None => Command::new(path),
        };
        // The postgres user may not enter the harness's working directory.
        command.current_dir(&self.root);
        command
    }

    fn initdb(&self) -> anyhow::Result<()> {
        let mut command = self.program("initdb");
        command
            .arg("-D")
            .arg(self.data_dir())
            .args(["-U", "postgres", "-A", "trust", "-N", "-E", "UTF8"])
            .args(["--locale=C", "--no-instructions"]);
        run(&mut command).context("initdb of the private PostgreSQL")
    }

    /// Writes the server's settings for the current port (an `include`d file of its own, so
    /// a retry on another port rewrites it), its role's settings last.
    pub(crate) fn configure(&self) -> anyhow::Result<()> {
        let socket = self.socket_dir();
        if !socket.exists() {
            std::fs::create_dir_all(&socket)?;
            if let Some(user) = &self.run_as {
                run(Command::new("chown").arg(format!("{user}:")).arg(&socket))?;
            }
        }
        let mut settings = format!(
            "# written by worker-testkit\n\
             listen_addresses = '127.0.0.1'\n\
             port = {port}\n\
             unix_socket_directories = '{socket}'\n\
             max_connections = 200\n\
             fsync = off\n\
             full_page_writes = off\n\
             shared_buffers = '32MB'\n\
             password_encryption = 'scram-sha-256'\n",
            port = self.port,
            socket = socket.display(),
        );
        if let Some(tls) = &self.tls {
            settings.push_str(&format!(
                "ssl = on\nssl_cert_file = '{}'\nssl_key_file = '{}'\n",
                tls.cert.display(),
                tls.key.display()
            ));
        }
        match self.role_settings.lock() {
            Ok(role) => settings.push_str(&role),
            Err(poisoned) => settings.push_str(&poisoned.into_inner()),
        }
        let conf = self.data_dir().join("postgresql.auto.conf");
        std::fs::write(&conf, settings).with_context(|| format!("writing {}", conf.display()))?;
        // TCP logins with a password (as the host and the harness log in); the socket trusts
        // local users (only the cluster's owner and root can reach it), also for replication
        // (a standby of the kit streams from its primary's socket).
        let hba = "local all all trust\nlocal replication all trust\nhost all all 127.0.0.1/32 scram-sha-256\n";
        let hba_path = self.data_dir().join("pg_hba.conf");
        std::fs::write(&hba_path, hba)
            .with_context(|| format!("writing {}", hba_path.display()))?;
        Ok(())
    }

    /// `pg_ctl -w` with `args`, off the runtime's threads (it blocks until the server
    /// answers).
    pub(crate) async fn pg_ctl_async(&self, args: Vec<String>) -> anyhow::Result<()> {
        let mut command = self.program("pg_ctl");
        command
            .arg("-D")
            .arg(self.data_dir())
            .args(["-w", "-t", PG_CTL_WAIT_SECS])
            .args(&args);
        let what = format!("pg_ctl {}", args.join(" "));
        tokio::task::spawn_blocking(move || run(&mut command))
            .await
            .context("the pg_ctl task")?
            .with_context(|| what)
    }

    /// A connection as the cluster's superuser, over its socket.
    pub async fn superuser(&self) -> anyhow::Result<sqlx::PgConnection> {
        PgConnectOptions::new()
            .socket(self.socket_dir())
            .port(self.port)
            .username("postgres")
            .database("postgres")
            .connect()
            .await
            .with_context(|| {
                format!(
                    "connecting to the private PostgreSQL on port {} as its superuser",
                    self.port
                )
            })
    }

    /// The `worker_host` role (`CREATEDB`, the password) and its database, as the superuser
    /// over the socket.
    async fn create_role(&self) -> anyhow::Result<()> {
        let mut admin = self.superuser().await?;
        for sql in [
            format!("CREATE ROLE {ROLE} LOGIN CREATEDB PASSWORD '{ROLE}'"),
            format!("CREATE DATABASE {ROLE} OWNER {ROLE}"),
        ] {
            sqlx::query(&sql)
                .execute(&mut admin)
                .await
                .with_context(|| format!("running {sql}"))?;
        }
        admin.close().await?;
        Ok(())
    }

    pub(crate) fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.log_file()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let from = lines.len().saturating_sub(20);
        format!(
            "--- last lines of {} ---\n{}",
            self.log_file().display(),
            lines[from..].join("\n")
        )
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        crate::blocking_cleanup(|| self.stop_and_remove());
    }
}

impl PgCluster {
    fn stop_and_remove(&mut self) {
        if self.data_dir().join("postmaster.pid").exists() {
            let mut command = self.program("pg_ctl");
            command.arg("-D").arg(self.data_dir()).args([
                "-w",
                "-t",
                "30",
                "-m",
                "immediate",
                "stop",
            ]);
            if let Err(err) = run(&mut command) {
                eprintln!("testkit: stopping the private PostgreSQL: {err:#}");
            }
        }
        if let Some(keep) = &self.keep_log {
            let _ = std::fs::copy(self.log_file(), keep);
        }
        if let Err(err) = std::fs::remove_dir_all(&self.root) {
            eprintln!("testkit: removing {}: {err}", self.root.display());
        }
    }
}

/// Stops and removes the clusters of harness runs that were killed before their drop ran
/// (folders `wh-pg-*` in the temporary folder older than [`LEFTOVER_AGE`]; a scenario lasts
/// minutes, so a younger one may belong to a scenario running in parallel).
fn sweep_leftovers(bin: &Path, run_as: Option<&str>) {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let is_ours = entry.file_name().to_string_lossy().starts_with(ROOT_PREFIX);
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|at| at.elapsed().ok())
            .is_some_and(|age| age > LEFTOVER_AGE);
        if !(is_ours && old) {
            continue;
        }
        let leftover = PgCluster::leftover(entry.path(), bin, run_as);
        eprintln!(
            "testkit: removing a leftover private PostgreSQL in {}",
            leftover.root.display()
        );
        drop(leftover);
    }
}

/// `/usr/lib/postgresql/<newest version>/bin`.
fn newest_bin_dir() -> anyhow::Result<PathBuf> {
    let base = Path::new("/usr/lib/postgresql");
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(base)
        .with_context(|| {
            format!(
                "reading {}: is the postgresql package installed?",
                base.display()
            )
        })?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    match versions.pop() {
        Some((_, bin)) => Ok(bin),
        None => bail!("no PostgreSQL server with initdb under {}", base.display()),
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Runs a command to its end; fails with its output when it does not exit 0.
pub(crate) fn run(command: &mut Command) -> anyhow::Result<()> {
    let Output {
        status,
        stdout,
        stderr,
    } = command
        .output()
        .with_context(|| format!("running {:?}", command.get_program()))?;
    if !status.success() {
        bail!(
            "{:?} {:?}: {status}: {}{}",
            command.get_program(),
            command.get_args().collect::<Vec<_>>(),
            String::from_utf8_lossy(&stdout),
            String::from_utf8_lossy(&stderr)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Needs the postgresql package (as the fault suite does); skipped where it is missing.
    #[tokio::test]
    async fn a_private_cluster_serves_the_test_role_and_is_removed_when_dropped() {
        if newest_bin_dir().is_err() {
            eprintln!("no PostgreSQL server binaries: skipped");
            return;
        }
        let cluster = PgCluster::start(None).await.expect("the cluster starts");
        let root = cluster.root.clone();
        let db = crate::TestDb::create_on(&cluster.admin_url())
            .await
            .expect("a migrated database on it");
        let one: i32 = sqlx::query_scalar("SELECT 1")
            .fetch_one(&db.pool)
            .await
            .expect("a query");
        assert_eq!(one, 1);
        cluster.stop_immediate().await.expect("immediate stop");
        cluster.start_again().await.expect("start after a crash");
        cluster.restart_fast().await.expect("fast restart");
        drop(db);
        drop(cluster);
        assert!(!root.exists(), "{} left behind", root.display());
    }
}
