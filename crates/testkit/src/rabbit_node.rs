//! A private RabbitMQ node for the fault suite's broker scenarios, so that their process
//! faults (kill -9, SIGSTOP, `stop_app`, a memory alarm) never touch the shared broker, and for
//! tests that need a broker configured otherwise (a TLS listener: [`RabbitNode::start_with_tls`]).
//! Three of them with one cookie make a [`RabbitCluster`](crate::RabbitCluster).
//!
//! The node has a name of its own (`wh-<id>@localhost`), its own AMQP, distribution and
//! management ports (free ones), its data (`mnesia/`), logs (`log/`), settings and Erlang
//! cookie (`home/.erlang.cookie`, shared with the `rabbitmqctl` calls through `HOME`) under
//! the scenario's folder, the management plugin enabled, and guest allowed from loopback (the
//! broker's default). It runs in the foreground as a child process in a process group of its
//! own (`rabbitmq-server`, the unwrapped script, which runs `beam.smp` under a shell; a
//! watchdog shell around it ends the group when the harness dies without its Drop, killed or
//! interrupted), so the harness knows the node's OS process (the pid file the node writes) and can kill, stop and
//! continue it, and start it again on the same data. Dropping the value kills the whole
//! process group and removes the data (the logs stay, for reading after a failure).

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::tls::ServerCert;

/// How long the node may take to answer on AMQP and on its management API after a start (on
/// a busy two-core machine a boot has taken 13 s; recovering after a kill -9 can take longer).
const START_WAIT: Duration = Duration::from_secs(120);

/// How long one `rabbitmqctl` call may take.
const CTL_WAIT: Duration = Duration::from_secs(60);

/// `sh -c` script: runs `$2` (`rabbitmq-server`) in the background and, once the process
/// `$1` (the harness) or the node's script is gone, SIGKILLs its own process group (the node
/// with it, and itself: a node that fails to boot shows as this shell's exit).
const WATCHDOG: &str = r#"harness=$1; "$2" & node=$!; while kill -0 "$harness" 2>/dev/null && kill -0 "$node" 2>/dev/null; do sleep 1; done; kill -KILL 0"#;

/// Where RabbitMQ's own scripts are (Debian's package): the unwrapped ones, which run as the
/// calling user with its `HOME` (the `/usr/sbin` wrappers switch to the `rabbitmq` user and
/// its cookie). `WH_RABBITMQ_BIN` names another folder.
fn scripts_dir() -> PathBuf {
    std::env::var_os("WH_RABBITMQ_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/lib/rabbitmq/bin"))
}

/// A private RabbitMQ node; see the module docs.
#[derive(Debug)]
pub struct RabbitNode {
    /// The Erlang node name, for `rabbitmqctl -n`.
    pub name: String,
    pub amqp_port: u16,
    pub management_port: u16,
    pub dist_port: u16,
    /// The AMQPS listener's port, when the node was started with TLS.
    pub amqps_port: Option<u16>,
    dir: PathBuf,
    /// The folder a test's node lives in, removed with the node.
    _temp: Option<tempfile::TempDir>,
    /// The watchdog shell around `rabbitmq-server`, leader of the node's process group;
    /// `None` once killed.
    child: Option<Child>,
}

impl RabbitNode {
    /// Prepares the node's folder under `dir` (`dir/rabbit`) and starts it; returns once it
    /// answers on AMQP and on its management API.
    pub async fn start(dir: &Path) -> anyhow::Result<Self> {
        let mut node = Self::launch(dir, "rabbit", None, None, None)?;
        node.wait_ready().await?;
        Ok(node)
    }

    /// A node in a temporary folder of its own (removed with it) with, besides its plain
    /// listener, an AMQPS listener on [`Self::amqps_port`] that serves `cert` (no client
    /// certificates asked).
    pub async fn start_with_tls(cert: &ServerCert) -> anyhow::Result<Self> {
        let temp = tempfile::Builder::new()
            .prefix("wh-rabbit-")
            .tempdir()
            .context("creating the node's folder")?;
        let dir = temp.path().to_path_buf();
        let mut node = Self::launch(&dir, "rabbit", None, Some(cert), Some(temp))?;
        node.wait_ready().await?;
        Ok(node)
    }

    /// Prepares the node's folder (`dir/folder`) and starts its process, without waiting for
    /// it to answer ([`Self::wait_ready`]), so that a cluster's nodes boot side by side.
    /// `cookie` is the Erlang cookie it shares with other nodes; unset, one of its own.
    pub(crate) fn launch(
        dir: &Path,
        folder: &str,
        cookie: Option<&str>,
        tls: Option<&ServerCert>,
        temp: Option<tempfile::TempDir>,
    ) -> anyhow::Result<Self> {
        let dir = dir.join(folder);
        for sub in ["home", "mnesia", "log"] {
            std::fs::create_dir_all(dir.join(sub))
                .with_context(|| format!("creating {}", dir.join(sub).display()))?;
        }
        let id = uuid::Uuid::new_v4().simple().to_string();
        let name = format!("wh-{}@localhost", &id[..12]);
        let [amqp_port, management_port, dist_port, amqps] = free_ports()?;
        write_private(&dir.join("home/.erlang.cookie"), cookie.unwrap_or(&id))?;
        let mut conf = format!(
            "# written by worker-testkit for a private node\n\
             listeners.tcp.default = 127.0.0.1:{amqp_port}\n\
             management.tcp.ip = 127.0.0.1\n\
             management.tcp.port = {management_port}\n\
             loopback_users.guest = true\n"
        );
        let amqps_port = match tls {
            Some(cert) => {
                let copy = cert.copy_to(&dir.join("tls"))?;
                conf.push_str(&format!(
                    "listeners.ssl.default = 127.0.0.1:{amqps}\n\
                     ssl_options.certfile = {}\n\
                     ssl_options.keyfile = {}\n\
                     ssl_options.verify = verify_none\n\
                     ssl_options.fail_if_no_peer_cert = false\n",
                    copy.cert.display(),
                    copy.key.display()
                ));
                Some(amqps)
            }
            None => None,
        };
        std::fs::write(dir.join("rabbitmq.conf"), conf)?;
        std::fs::write(dir.join("enabled_plugins"), "[rabbitmq_management].\n")?;
        let mut node = Self {
            name,
            amqp_port,
            management_port,
            dist_port,
            amqps_port,
            dir,
            _temp: temp,
            child: None,
        };
        node.spawn()?;
        Ok(node)
    }

    /// The management API's base URL with guest's credentials (as `WH_TEST_RABBIT_API`).
    pub fn api_url(&self) -> String {
        format!("http://guest:guest@127.0.0.1:{}", self.management_port)
    }

    /// `host:port` of the node's AMQP listener.
    pub fn amqp_addr(&self) -> String {
        format!("127.0.0.1:{}", self.amqp_port)
    }

    /// The node's OS process (`beam.smp`), from the pid file it writes when it boots.
    pub fn os_pid(&self) -> anyhow::Result<u32> {
        let path = self.pid_file();
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading the node's pid file {}", path.display()))?;
        text.trim()
            .parse()
            .with_context(|| format!("the pid file {} holds {text:?}", path.display()))
    }

    fn pid_file(&self) -> PathBuf {
        self.dir.join("mnesia/node.pid")
    }

    /// Starts the node's process (on the data already there, if any).
    fn spawn(&mut self) -> anyhow::Result<()> {
        // A pid file left by a killed process must not be read as the new one's.
        let _ = std::fs::remove_file(self.pid_file());
        let log_path = self.dir.join("log/startup.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("opening {}", log_path.display()))?;
        let script = scripts_dir().join("rabbitmq-server");
        // The node runs under a small watchdog shell that kills the whole group once the
        // harness is gone, so that a harness killed with SIGKILL or SIGINT (no Drop) does not
        // leave the node behind.
        let child = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG)
            .arg("sh")
            .arg(std::process::id().to_string())
            .arg(&script)
            .envs(self.environment())
            .env("RABBITMQ_NODENAME", &self.name)
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("RABBITMQ_MNESIA_BASE", self.dir.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", self.dir.join("log"))
            .env("RABBITMQ_PID_FILE", self.pid_file())
            .env("RABBITMQ_CONFIG_FILE", self.dir.join("rabbitmq.conf"))
            .env(
                "RABBITMQ_ENABLED_PLUGINS_FILE",
                self.dir.join("enabled_plugins"),
            )
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // A group of its own: the Drop guard kills the shell, beam.smp and its helpers
            // at once, and no signal meant for the harness reaches the node.
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {}", script.display()))?;
        self.child = Some(child);
        Ok(())
    }

    /// The environment every process of the node's own shares: `HOME` holds the cookie;
    /// the caller's `RABBITMQ_*` settings are not passed on.
    fn environment(&self) -> Vec<(String, String)> {
        vec![(
            "HOME".into(),
            self.dir.join("home").to_string_lossy().into_owned(),
        )]
    }

    /// Waits until the node answers on AMQP and on its management API and has written its
    /// pid file; fails if its process exits first or [`START_WAIT`] passes.
    pub async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_WAIT;
        let client = reqwest::Client::new();
        let overview = format!("http://127.0.0.1:{}/api/overview", self.management_port);
        loop {
            let mut amqp = tokio::net::TcpStream::connect(("127.0.0.1", self.amqp_port))
                .await
                .is_ok();
            if let Some(port) = self.amqps_port {
                amqp = amqp
                    && tokio::net::TcpStream::connect(("127.0.0.1", port))
                        .await
                        .is_ok();
            }
            let api = amqp
                && client
                    .get(&overview)
                    .basic_auth("guest", Some("guest"))
                    .timeout(Duration::from_secs(2))
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success());
            if api && self.os_pid().is_ok() {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                bail!(
                    "the private RabbitMQ node {} exited with {status} while starting; see {}",
                    self.name,
                    self.dir.join("log").display()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "the private RabbitMQ node {} did not answer within {START_WAIT:?}; see {}",
                    self.name,
                    self.dir.join("log").display()
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// `rabbitmqctl -n <node> args`; fails with its output when it does not exit 0.
    pub async fn ctl(&self, args: &[&str]) -> anyhow::Result<String> {
        let script = scripts_dir().join("rabbitmqctl");
        let output = tokio::time::timeout(
            CTL_WAIT,
            tokio::process::Command::new(&script)
                .envs(self.environment())
                .arg("-n")
                .arg(&self.name)
                .args(args)
                .stdin(Stdio::null())
                .output(),
        )
        .await
        .with_context(|| format!("rabbitmqctl {args:?} did not finish within {CTL_WAIT:?}"))?
        .with_context(|| format!("running {}", script.display()))?;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        if !output.status.success() {
            bail!(
                "rabbitmqctl -n {} {args:?}: {}: {stdout}{}",
                self.name,
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(stdout)
    }

    /// Sends `signal` (a `kill` name: `STOP`, `CONT`, `KILL`) to the node's OS process.
    pub async fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let pid = self.os_pid()?;
        let status = tokio::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .await
            .context("running kill")?;
        anyhow::ensure!(status.success(), "kill -{signal} {pid}: {status}");
        Ok(())
    }

    /// kill -9 of the node's OS process (`beam.smp`); then the rest of its process group (the
    /// shell that started it) is killed and reaped, so that [`Self::restart`] starts clean.
    pub async fn kill9(&mut self) -> anyhow::Result<()> {
        self.signal("KILL").await?;
        self.kill_group();
        Ok(())
    }

    /// Stops the whole node gracefully (`rabbitmqctl stop`): its client connections are closed
    /// (a `connection.close` with CONNECTION_FORCED, or a reset, as 3.10.8 does either), the
    /// quorum queues it led elect leaders among their other members, and its OS process exits;
    /// returns once it has. [`Self::restart`] starts it again on the same data.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        let pid_file = self.pid_file();
        let pid_file = pid_file.to_string_lossy().into_owned();
        // Given the pid file, `stop` waits for the OS process to end.
        self.ctl(&["stop", &pid_file]).await?;
        self.kill_group();
        Ok(())
    }

    /// Starts the node again on the same data (after [`Self::kill9`] or [`Self::stop`]);
    /// returns once it answers.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.kill_group();
        self.spawn()?;
        self.wait_ready().await
    }

    /// SIGKILL to the node's whole process group, then reaps the watchdog.
    fn kill_group(&mut self) {
        if let Some(mut child) = self.child.take() {
            // The group's id is the watchdog's pid (`process_group(0)`).
            let _ = Command::new("kill")
                .arg("-KILL")
                .arg("--")
                .arg(format!("-{}", child.id()))
                .stderr(Stdio::null())
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RabbitNode {
    fn drop(&mut self) {
        crate::blocking_cleanup(|| {
            // A stopped (SIGSTOP) node dies to SIGKILL all the same.
            self.kill_group();
            let _ = std::fs::remove_dir_all(self.dir.join("mnesia"));
        });
    }
}

/// Writes `text` to a file only its owner may read (Erlang refuses a cookie others can read).
fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    // A read-only one left by an earlier run cannot be opened for writing.
    let _ = std::fs::remove_file(path);
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    file.write_all(text.as_bytes())?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o400))?;
    Ok(())
}

/// Four distinct free ports on loopback, held together while they are picked so that they
/// differ (another process may still take one before the node binds it: the start then
/// fails with the port named in the node's log).
fn free_ports() -> anyhow::Result<[u16; 4]> {
    let listeners = [
        std::net::TcpListener::bind("127.0.0.1:0")?,
        std::net::TcpListener::bind("127.0.0.1:0")?,
        std::net::TcpListener::bind("127.0.0.1:0")?,
        std::net::TcpListener::bind("127.0.0.1:0")?,
    ];
    Ok([
        listeners[0].local_addr()?.port(),
        listeners[1].local_addr()?.port(),
        listeners[2].local_addr()?.port(),
        listeners[3].local_addr()?.port(),
    ])
}
