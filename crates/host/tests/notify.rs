//! systemd's notify protocol, against a socket the test listens on as systemd would
//! (`NOTIFY_SOCKET`, `WATCHDOG_USEC`): `READY=1` only once the host is ready, `WATCHDOG=1`
//! while its job loops are alive and none once a handler is wedged (the fault-injection
//! build's `x-fault-inject: wedge`), `STOPPING=1` at shutdown.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
mod support;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::{Host, SERIAL, base_settings, ping_from};
use worker_testkit::{FaultProxy, TestDb, TestVhost};

/// What the service manager heard, with when.
#[derive(Clone, Default)]
struct Heard(Arc<Mutex<Vec<(Instant, String)>>>);

impl Heard {
    /// Listens on a datagram socket at `path`, as systemd's notify socket does.
    fn listen(path: &Path) -> anyhow::Result<Self> {
        let socket = tokio::net::UnixDatagram::bind(path)?;
        let heard = Self::default();
        let log = heard.0.clone();
        tokio::spawn(async move {
            let mut buffer = vec![0u8; 4096];
            while let Ok(n) = socket.recv(&mut buffer).await {
                let text = String::from_utf8_lossy(&buffer[..n]).into_owned();
                for line in text.lines() {
                    log.lock().unwrap().push((Instant::now(), line.to_string()));
                }
            }
        });
        Ok(heard)
    }

    fn lines(&self) -> Vec<(Instant, String)> {
        self.0.lock().unwrap().clone()
    }

    fn first(&self, line: &str) -> Option<Instant> {
        self.lines()
            .into_iter()
            .find(|(_, l)| l == line)
            .map(|(at, _)| at)
    }

    fn pings_since(&self, since: Instant) -> Vec<Instant> {
        self.lines()
            .into_iter()
            .filter(|(at, l)| *at >= since && l == "WATCHDOG=1")
            .map(|(at, _)| at)
            .collect()
    }

    fn statuses(&self) -> Vec<String> {
        self.lines()
            .into_iter()
            .filter_map(|(_, l)| l.strip_prefix("STATUS=").map(str::to_string))
            .collect()
    }

    async fn wait_for(&self, line: &str, within: Duration) -> Option<Instant> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(at) = self.first(line) {
                return Some(at);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }
}

/// The watchdog period the test gives, as systemd's `WatchdogSec=` would: the host pings every
/// half of it.
const WATCHDOG: Duration = Duration::from_secs(2);

/// A test's own database and vhost, and the service manager's socket the host is told of.
struct Managed {
    db: TestDb,
    vhost: TestVhost,
    heard: Heard,
    /// The host's environment: `NOTIFY_SOCKET` and `WATCHDOG_USEC`.
    env: Vec<(String, String)>,
    _dir: tempfile::TempDir,
}

impl Managed {
    async fn new() -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let socket = dir.path().join("notify");
        Ok(Self {
            db: TestDb::create().await?,
            vhost: TestVhost::create().await?,
            heard: Heard::listen(&socket)?,
            env: vec![
                ("NOTIFY_SOCKET".into(), socket.display().to_string()),
                ("WATCHDOG_USEC".into(), WATCHDOG.as_micros().to_string()),
            ],
            _dir: dir,
        })
    }

    fn env(&self) -> Vec<(&str, &str)> {
        self.env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }
}

/// The host is told of a broker it cannot reach at first (the proxy refuses): it must say
/// nothing of readiness until it can work, then `READY=1` while `/readyz` is 200, feed the
/// watchdog, and say `STOPPING=1` when SIGTERM stops it, exiting 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_comes_once_the_host_can_work_then_the_watchdog_is_fed_and_stopping_ends_it()
-> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let mut managed = Managed::new().await?;
    let proxy = FaultProxy::start("127.0.0.1:5672").await?;
    proxy.refuse();
    managed
        .env
        .push(("WORKER_HOST__BROKER__PORT".into(), proxy.port().to_string()));
    let Managed {
        db, vhost, heard, ..
    } = &managed;
    let mut host = Host::spawn(
        Path::new(env!("CARGO_BIN_EXE_worker-host")),
        "WH_SHOW_NOTIFY_LOG",
        &managed.env(),
        |_, port| Ok(base_settings("notify", "[]", db, vhost, port)),
    )?;

    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        heard.first("READY=1"),
        None,
        "no READY while the broker is unreachable:\n{}",
        host.log_tail()
    );
    assert_ne!(host.readyz().await.ok(), Some(200));

    proxy.heal();
    let ready = heard
        .wait_for("READY=1", Duration::from_secs(60))
        .await
        .unwrap_or_else(|| panic!("READY=1 once the broker answers:\n{}", host.log_tail()));
    assert_eq!(
        host.readyz().await?,
        200,
        "/readyz agrees with READY=1 when it comes"
    );
    assert!(
        heard.statuses().iter().any(|s| s == "ready"),
        "{:?}",
        heard.statuses()
    );

    tokio::time::sleep(WATCHDOG * 3).await;
    let pings = heard.pings_since(ready);
    assert!(
        pings.len() >= 4,
        "the watchdog is fed every half period while healthy: {} pings in {:?}",
        pings.len(),
        WATCHDOG * 3
    );
    let gaps: Vec<Duration> = pings.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        gaps.iter().all(|gap| *gap < WATCHDOG),
        "never a gap as long as the period: {gaps:?}"
    );

    let stop = Instant::now();
    let code = host.stop().await;
    assert_eq!(code, Some(0), "{}", host.log_tail());
    let stopping = heard.first("STOPPING=1").expect("STOPPING=1 at shutdown");
    assert!(
        stopping >= stop,
        "STOPPING=1 comes with the SIGTERM, not before"
    );
    assert!(
        heard
            .statuses()
            .iter()
            .any(|s| s.starts_with("stopping: settling within")),
        "{:?}",
        heard.statuses()
    );
    Ok(())
}

/// The fault-injection build of the host (`cargo build -p worker-host --features
/// fault-injection`), which scripts/test.sh builds and names in this variable.
fn fault_injection_host() -> PathBuf {
    let Some(path) = std::env::var_os("WH_TEST_FAULT_INJECTION_HOST") else {
        panic!(
            "WH_TEST_FAULT_INJECTION_HOST is not set: it names the worker-host built with \
             `--features fault-injection` (scripts/test.sh builds it and sets it)"
        );
    };
    PathBuf::from(path)
}

/// One event whose trigger handler blocks its thread (`x-fault-inject: wedge`), out of the
/// reach of its 1 s timeout: the watchdog pings stop once the unit is overdue (its timeout
/// plus the 5 s slack), `STATUS=` says which job is wedged, and `/metrics` counts the unit in
/// `worker_overdue_units`. systemd would then restart the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wedged_handler_stops_the_watchdog_pings() -> anyhow::Result<()> {
    let binary = fault_injection_host();
    let _serial = SERIAL.lock().await;
    let managed = Managed::new().await?;
    let Managed {
        db, vhost, heard, ..
    } = &managed;
    let mut host = Host::spawn(
        &binary,
        "WH_SHOW_NOTIFY_LOG",
        &managed.env(),
        |dir, port| {
            let automations = support::write_automation(dir)?;
            Ok(format!(
                "{}\n[jobs.automation_trigger]\ntimeout = \"1s\"\n",
                base_settings("notify-wedge", &automations, db, vhost, port)
            ))
        },
    )?;
    host.wait_ready().await?;
    heard
        .wait_for("READY=1", Duration::from_secs(10))
        .await
        .expect("READY=1");
    let healthy = heard.pings_since(Instant::now() - WATCHDOG);
    assert!(!healthy.is_empty(), "pings before the wedge");

    let (properties, body) = ping_from("wedge@localhost", 0);
    let mut headers = lapin::types::FieldTable::default();
    headers.insert(
        "x-fault-inject".into(),
        lapin::types::AMQPValue::LongString("wedge".into()),
    );
    let properties = properties.with_headers(headers);
    let wedged_at = Instant::now();
    support::publish_confirmed(
        vhost,
        "events",
        "email.received",
        &[(properties, body.as_slice())],
    )
    .await?;

    // Overdue 1 s + 5 s after the handler began; then no ping for three periods.
    let overdue_by = Duration::from_secs(6) + WATCHDOG;
    tokio::time::sleep(overdue_by + WATCHDOG * 3).await;
    let after = heard.pings_since(wedged_at + overdue_by);
    assert!(
        after.is_empty(),
        "no watchdog ping once the unit is overdue, but {} came:\n{}",
        after.len(),
        host.log_tail()
    );
    let statuses = heard.statuses();
    assert!(
        statuses
            .iter()
            .any(|s| s.starts_with("wedged: a unit of job `automation-trigger`")),
        "{statuses:?}"
    );
    let scrape = host.metrics().await?;
    assert_eq!(
        scrape.sum(
            "worker_overdue_units",
            &[("worker_job", "automation-trigger")]
        ),
        1.0,
        "{}",
        scrape.0
    );
    assert!(
        host.log_text().contains("the watchdog is no longer fed"),
        "{}",
        host.log_tail()
    );
    // The wedged thread sleeps for an hour; the host still stops within its grace and the
    // runtime's bounded shutdown, as systemd's stop would find it.
    let stop = Instant::now();
    let code = host.stop().await;
    assert_eq!(code, Some(0), "{}", host.log_tail());
    assert!(
        stop.elapsed() < Duration::from_secs(20),
        "{:?}",
        stop.elapsed()
    );
    Ok(())
}
