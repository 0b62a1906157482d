//! A headless Debian Chromium for one test, driven over WebDriver by fantoccini through a
//! ChromeDriver of the test's own: its own port, its own empty profile, and both processes
//! killed when dropped.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use fantoccini::{Client, ClientBuilder};
use hyper_util::client::legacy::connect::HttpConnector;

/// A browser session, ready to open pages.
pub struct Browser {
    pub client: Client,
    driver: Child,
    _profile: tempfile::TempDir,
}

impl std::fmt::Debug for Browser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Browser")
            .field("driver", &self.driver.id())
            .finish_non_exhaustive()
    }
}

/// Where a program is: the `WH_TEST_*` variable `scripts/services.sh env` prints, else the
/// Debian path.
fn program(variable: &str, debian: &str) -> anyhow::Result<String> {
    let path = std::env::var(variable).unwrap_or_else(|_| debian.to_string());
    if !Path::new(&path).exists() {
        bail!(
            "{path} is missing ({variable}); `scripts/services.sh up` installs chromium and chromium-driver"
        );
    }
    Ok(path)
}

/// The flags that keep Chromium quiet on a machine with no way out: without the background
/// networking ones it dials Google's hosts at every start, and as root it needs no sandbox.
const CHROMIUM_ARGS: &[&str] = &[
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,900",
];

impl Browser {
    /// Starts ChromeDriver on a free port and opens a Chromium session through it.
    pub async fn start() -> anyhow::Result<Self> {
        let chromedriver = program("WH_TEST_CHROMEDRIVER", "/usr/bin/chromedriver")?;
        let chromium = program("WH_TEST_CHROMIUM", "/usr/bin/chromium")?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let profile = tempfile::Builder::new()
            .prefix("wh-chromium-")
            .tempdir()
            .context("creating the browser's profile folder")?;
        let log = std::fs::File::create(profile.path().join("chromedriver.log"))?;
        let driver = {
            use std::os::unix::process::CommandExt;
            Command::new(&chromedriver)
                .arg(format!("--port={port}"))
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                // A group of its own, so that dropping it kills the browsers it started too.
                .process_group(0)
                .spawn()
                .with_context(|| format!("starting {chromedriver}"))?
        };
        let mut browser_args: Vec<String> = CHROMIUM_ARGS.iter().map(|a| a.to_string()).collect();
        browser_args.push(format!(
            "--user-data-dir={}",
            profile.path().join("profile").display()
        ));
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({ "binary": chromium, "args": browser_args }),
        );
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        let client = loop {
            let attempt = ClientBuilder::new(HttpConnector::new())
                .capabilities(capabilities.clone())
                .connect(&url)
                .await;
            match attempt {
                Ok(client) => break client,
                Err(e) if Instant::now() > deadline => {
                    let log = std::fs::read_to_string(profile.path().join("chromedriver.log"))
                        .unwrap_or_default();
                    bail!("no browser session through {url} within 30 s: {e}\n{log}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        Ok(Self {
            client,
            driver,
            _profile: profile,
        })
    }

    /// Saves what the window shows as a PNG at `path` (its folder created if missing).
    pub async fn screenshot(&self, path: &Path) -> anyhow::Result<()> {
        let png = self
            .client
            .screenshot()
            .await
            .context("taking a screenshot")?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, png).with_context(|| format!("writing {}", path.display()))
    }

    /// Ends the session in order (the browser quits), then the driver.
    pub async fn close(self) {
        let _ = tokio::time::timeout(Duration::from_secs(10), self.client.clone().close()).await;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let group = format!("-{}", self.driver.id());
        let _ = Command::new("kill")
            .args(["-KILL", "--", &group])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
