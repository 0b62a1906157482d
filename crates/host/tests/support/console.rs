//! The console as its tests reach it: a host with an operator token and a private SMTP sink
//! that refuses one address (so that its pings' replies become one group of dead letters),
//! and an operator's HTTP session (cookies and CSRF tokens handled by hand, redirects not
//! followed, so that a test sees each answer).

use std::time::Duration;

use anyhow::{Context, bail};
use worker_testkit::{SmtpSink, TestDb, TestVhost};

use super::{Host, base_settings, publish_pings, short_id, wait_for, write_automation};

/// The operator token of every console test host.
pub const TOKEN: &str = "console-test-operator-token";

/// How a test's host is set up beside the defaults.
#[derive(Debug, Default)]
pub struct Setup {
    /// Lines of `[admin]` besides `listen`.
    pub admin: String,
    /// Sections of its own (`[jobs.draft_expiry]`, say).
    pub sections: String,
    /// Listen on every address (`0.0.0.0`) instead of loopback.
    pub everywhere: bool,
}

impl Setup {
    /// The console takes [`TOKEN`] as the bootstrap account's, and lets anyone on loopback
    /// read (as the console did before accounts).
    pub fn with_token() -> Self {
        Self {
            admin: format!("operator_token = {TOKEN:?}\nopen_reading = true"),
            ..Self::default()
        }
    }

    /// The console takes [`TOKEN`]; reading needs a session (the default).
    pub fn signed_reading() -> Self {
        Self {
            admin: format!("operator_token = {TOKEN:?}"),
            ..Self::default()
        }
    }
}

/// Starts replica `replica` of a console host set up as `setup` says, on `db`, `vhost` and
/// `sink`.
async fn launch_replica(
    show_log_var: &'static str,
    setup: &Setup,
    replica: &str,
    db: &TestDb,
    vhost: &TestVhost,
    sink: &SmtpSink,
) -> anyhow::Result<Host> {
    Host::launch(show_log_var, |dir, port| {
        let automations = write_automation(dir)?;
        let settings = base_settings("console-test", &automations, db, vhost, port);
        let mut settings = settings
            .replacen(
                "installation = ",
                &format!("replica = {replica:?}\ninstallation = "),
                1,
            )
            .replacen("[admin]\n", &format!("[admin]\n{}\n", setup.admin), 1);
        if setup.everywhere {
            settings = settings.replacen("listen = \"127.0.0.1:", "listen = \"0.0.0.0:", 1);
        }
        // Cheap hashing: the tests sign in, they do not measure argon2.
        settings.push_str(
            "\n[admin.password_hashing]\nmemory_kib = 1024\niterations = 1\nparallelism = 1\n",
        );
        let smtp_port = sink
            .addr()
            .rsplit_once(':')
            .map_or("2525", |(_, p)| p)
            .to_string();
        Ok(format!(
            "{settings}\n[smtp]\nport = {smtp_port}\n\n[alerts]\ninterval = \"500ms\"\n{}\n",
            setup.sections
        ))
    })
    .await
}

/// A host with a console, its database, vhost and SMTP sink, and the address whose mail the
/// sink refuses.
pub struct World {
    pub host: Host,
    pub setup: Setup,
    pub db: TestDb,
    pub vhost: TestVhost,
    pub sink: SmtpSink,
    /// `fail-<id>@localhost`: answered `550 5.1.1 no such user` until accepted again.
    pub refused: String,
}

impl World {
    /// Starts a host set up as `setup` says, whose mail goes to a private sink that refuses
    /// [`World::refused`].
    pub async fn start(show_log_var: &'static str, setup: Setup) -> anyhow::Result<Self> {
        let db = TestDb::create().await?;
        let vhost = TestVhost::create().await?;
        let sink = SmtpSink::start()?;
        let refused = format!("fail-{}@localhost", short_id());
        sink.fail_recipient(&refused, "550 5.1.1 no such user")?;
        let host = launch_replica(show_log_var, &setup, "r1", &db, &vhost, &sink).await?;
        Ok(Self {
            host,
            setup,
            db,
            vhost,
            sink,
            refused,
        })
    }

    /// A second replica beside [`World::host`]: the same settings, database, vhost and sink.
    pub async fn replica(&self, show_log_var: &'static str, name: &str) -> anyhow::Result<Host> {
        launch_replica(
            show_log_var,
            &self.setup,
            name,
            &self.db,
            &self.vhost,
            &self.sink,
        )
        .await
    }

    /// A host whose console takes [`TOKEN`].
    pub async fn with_token(show_log_var: &'static str) -> anyhow::Result<Self> {
        Self::start(show_log_var, Setup::with_token()).await
    }

    /// `count` pings from the refused address; waits until their replies are archived dead
    /// letters (one group); returns their ids.
    pub async fn dead_letters(&self, count: usize) -> anyhow::Result<Vec<i64>> {
        publish_pings(&self.vhost, &self.refused, count).await?;
        let pool = &self.db.pool;
        let ids: Vec<i64> = wait_for("the refused replies in the archive", || self.host.log_tail(), || async {
            let ids: Vec<i64> = sqlx::query_scalar(
                "SELECT id FROM dead_letters WHERE status = 'dead' AND queue = 'email.send' ORDER BY id",
            )
            .fetch_all(pool)
            .await?;
            Ok((ids.len() >= count).then_some(ids))
        })
        .await;
        Ok(ids)
    }

    /// The mails the sink delivered to the refused address.
    pub fn delivered_to_refused(&self) -> usize {
        let local = self.refused.split('@').next().unwrap_or_default();
        self.sink.delivered(local).len()
    }

    /// Makes account `name` with `role` and `password`, through `worker-host operators add`.
    pub fn add_account(&self, name: &str, role: &str, password: &str) -> anyhow::Result<()> {
        let output =
            self.operators(&["add", name, "--role", role, "--password-stdin"], password)?;
        if !output.status.success() {
            bail!(
                "operators add {name} failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(())
    }

    /// A new API token of account `name`, through `worker-host operators token`.
    pub fn add_token(&self, name: &str) -> anyhow::Result<String> {
        let output = self.operators(&["token", name, "--label", "test"], "")?;
        if !output.status.success() {
            bail!(
                "operators token {name} failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
    }

    /// Runs `worker-host operators <args>` with the host's settings and `stdin`.
    pub fn operators(&self, args: &[&str], stdin: &str) -> anyhow::Result<std::process::Output> {
        use std::io::Write;
        let mut child = super::host_command(self.host.config_path())
            .arg("operators")
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        if let Some(mut input) = child.stdin.take() {
            input.write_all(stdin.as_bytes())?;
        }
        Ok(child.wait_with_output()?)
    }

    /// The audit trail's rows: (action, actor, dry run, planned, succeeded), oldest first.
    pub async fn trail(
        &self,
    ) -> anyhow::Result<Vec<(String, Option<String>, bool, Option<i64>, i64)>> {
        Ok(sqlx::query_as(
            "SELECT action, actor, dry_run, planned, succeeded FROM dead_letter_actions ORDER BY id",
        )
        .fetch_all(&self.db.pool)
        .await?)
    }
}

/// A client that follows no redirect.
pub fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .expect("an HTTP client")
}

/// The `value` of the hidden input named `name` in `html`.
pub fn hidden(html: &str, name: &str) -> Option<String> {
    let marker = format!("name=\"{name}\" value=\"");
    let start = html.find(&marker)? + marker.len();
    let end = html[start..].find('"')?;
    Some(html[start..start + end].to_string())
}

/// The value of cookie `name` among a response's `Set-Cookie` headers.
pub fn set_cookie(response: &reqwest::Response, name: &str) -> Option<String> {
    response
        .headers()
        .get_all(reqwest::header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| {
            let (pair, _) = v.split_once(';').unwrap_or((v, ""));
            let (key, value) = pair.split_once('=')?;
            (key.trim() == name).then(|| value.trim().to_string())
        })
}

/// A signed-in operator.
pub struct Operator {
    pub http: reqwest::Client,
    base: String,
    /// `wh_session=<id>`.
    pub cookie: String,
    pub csrf: String,
}

impl Operator {
    /// Signs in to the console at `base` as account `name` with `password` (or as the
    /// bootstrap account, with its token as `password` and `name` the operator's own).
    pub async fn sign_in(base: &str, password: &str, name: &str) -> anyhow::Result<Self> {
        Self::sign_in_with(http(), base, password, name).await
    }

    /// [`Operator::sign_in`] with a client of the caller's (one bound to an address, say).
    pub async fn sign_in_with(
        http: reqwest::Client,
        base: &str,
        password: &str,
        name: &str,
    ) -> anyhow::Result<Self> {
        let form = http.get(format!("{base}/sign-in")).send().await?;
        let pre = set_cookie(&form, "wh_signin").context("the sign-in form sets its cookie")?;
        let html = form.text().await?;
        let csrf = hidden(&html, "csrf").context("the sign-in form carries a CSRF token")?;
        let answer = http
            .post(format!("{base}/sign-in"))
            .header(reqwest::header::COOKIE, format!("wh_signin={pre}"))
            .form(&[
                ("csrf", csrf.as_str()),
                ("password", password),
                ("name", name),
                ("next", "/"),
            ])
            .send()
            .await?;
        if answer.status() != reqwest::StatusCode::SEE_OTHER {
            bail!(
                "sign-in answered {}: {}",
                answer.status(),
                answer.text().await?
            );
        }
        let session = set_cookie(&answer, "wh_session").context("a session cookie")?;
        let cookie = format!("wh_session={session}");
        let page = http
            .get(format!("{base}/"))
            .header(reqwest::header::COOKIE, &cookie)
            .send()
            .await?
            .text()
            .await?;
        let csrf =
            hidden(&page, "csrf").context("a signed-in page carries the session's CSRF token")?;
        Ok(Self {
            http,
            base: base.to_string(),
            cookie,
            csrf,
        })
    }

    pub async fn get(&self, path: &str) -> anyhow::Result<reqwest::Response> {
        Ok(self
            .http
            .get(format!("{}{path}", self.base))
            .header(reqwest::header::COOKIE, &self.cookie)
            .send()
            .await?)
    }

    /// Posts `fields` and the session's CSRF token to `path`.
    pub async fn post(
        &self,
        path: &str,
        fields: &[(&str, &str)],
    ) -> anyhow::Result<reqwest::Response> {
        let mut form: Vec<(&str, &str)> = vec![("csrf", self.csrf.as_str())];
        form.extend_from_slice(fields);
        Ok(self
            .http
            .post(format!("{}{path}", self.base))
            .header(reqwest::header::COOKIE, &self.cookie)
            .form(&form)
            .send()
            .await?)
    }

    /// Waits until the action page at `progress` says the action finished; returns the page.
    pub async fn finished(&self, host: &Host, progress: &str) -> String {
        wait_for(
            "the action to finish",
            || host.log_tail(),
            || async {
                let page = self.get(progress).await?.text().await?;
                Ok(page
                    .contains("id=\"action-state\">finished")
                    .then_some(page))
            },
        )
        .await
    }

    /// Posts and expects a redirect: where it sends the browser.
    pub async fn post_redirected(
        &self,
        path: &str,
        fields: &[(&str, &str)],
    ) -> anyhow::Result<String> {
        let answer = self.post(path, fields).await?;
        if answer.status() != reqwest::StatusCode::SEE_OTHER {
            bail!(
                "{path} answered {}: {}",
                answer.status(),
                answer.text().await?
            );
        }
        Ok(answer
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|l| l.to_str().ok())
            .unwrap_or_default()
            .to_string())
    }
}
