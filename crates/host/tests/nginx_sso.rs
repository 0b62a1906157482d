//! The shipped nginx file (`deploy/nginx/worker-host-console.conf`) in front of the real
//! binary, with a real nginx (Debian's `nginx-light`, which `scripts/services.sh up`
//! installs): the pages and `/api/` ask for the user's basic auth and name the user to the
//! host; once the user is removed from the htpasswd file, the console session's cookie gets
//! nothing more, on the pages nor on `/api/`; an API token still acts on `/api/`, and a cookie
//! beside a token counts for nothing. The file runs as shipped but for its listen line (plain
//! HTTP on a free port, so no certificate), its htpasswd path and the host's port.
//!
//! `NGINX_SSO_SHOW_LOG=1` prints the host's log when it stops.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use reqwest::StatusCode;
use support::console::{Setup, World, set_cookie};
use support::{SERIAL, free_port};

const SHIPPED: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../deploy/nginx/worker-host-console.conf"
);

/// An nginx of the test's own, stopped when dropped.
struct Nginx {
    child: Child,
    dir: PathBuf,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn nginx_binary() -> PathBuf {
    ["/usr/sbin/nginx", "/usr/bin/nginx"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .expect("no nginx here: `scripts/services.sh up` installs Debian's nginx-light")
}

/// The shipped file with only its listen line, certificate lines, htpasswd path and the
/// host's port changed (each of them found, so that a change to the file fails here first).
fn shipped_for(listen: u16, htpasswd: &Path, host_port: u16) -> String {
    let shipped = std::fs::read_to_string(SHIPPED).unwrap();
    let mut changed = 0;
    let lines: Vec<String> = shipped
        .lines()
        .filter_map(|line| {
            let trimmed = line.trim_start();
            if trimmed.starts_with("ssl_certificate") {
                changed += 1;
                return None;
            }
            if trimmed == "listen 443 ssl;" {
                changed += 1;
                return Some(format!("    listen 127.0.0.1:{listen};"));
            }
            if trimmed.starts_with('#') {
                return Some(line.to_string());
            }
            let replaced = line
                .replace(
                    "/etc/nginx/worker-host.htpasswd",
                    &htpasswd.display().to_string(),
                )
                .replace("127.0.0.1:9180", &format!("127.0.0.1:{host_port}"));
            if replaced != line {
                changed += 1;
            }
            Some(replaced)
        })
        .collect();
    assert!(changed >= 6, "the shipped file's shape changed: {changed}");
    lines.join("\n")
}

fn start_nginx(host_port: u16, htpasswd_text: &str) -> (Nginx, u16, PathBuf) {
    let dir = std::env::temp_dir().join(format!("wh-nginx-{}", support::short_id()));
    std::fs::create_dir_all(dir.join("tmp")).unwrap();
    let htpasswd = dir.join("htpasswd");
    std::fs::write(&htpasswd, htpasswd_text).unwrap();
    let port = free_port();
    std::fs::write(
        dir.join("console.conf"),
        shipped_for(port, &htpasswd, host_port),
    )
    .unwrap();
    let d = dir.display();
    // As root, nginx's workers would otherwise run as nobody, who cannot read the test's
    // files; the directive is ignored when not root.
    let main = format!(
        "user root;\ndaemon off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\n\
         events {{}}\nhttp {{\n    access_log {d}/access.log;\n    client_body_temp_path {d}/tmp/body;\n\
         proxy_temp_path {d}/tmp/proxy;\n    fastcgi_temp_path {d}/tmp/fastcgi;\n\
         uwsgi_temp_path {d}/tmp/uwsgi;\n    scgi_temp_path {d}/tmp/scgi;\n\
         include {d}/console.conf;\n}}\n"
    );
    std::fs::write(dir.join("nginx.conf"), main).unwrap();
    let conf = dir.join("nginx.conf");
    let args = |test: bool| {
        let mut command = Command::new(nginx_binary());
        if test {
            command.arg("-t");
        }
        command
            .arg("-c")
            .arg(&conf)
            .arg("-p")
            .arg(&dir)
            .arg("-e")
            .arg(dir.join("error.log"));
        command
    };
    let checked = args(true).output().unwrap();
    assert!(
        checked.status.success(),
        "nginx -t: {}",
        String::from_utf8_lossy(&checked.stderr)
    );
    let child = args(false)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    (Nginx { child, dir }, port, htpasswd)
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_removed_from_the_proxy_gets_nothing_more_with_the_session_cookie_on_api()
-> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::start(
        "NGINX_SSO_SHOW_LOG",
        Setup {
            admin: format!(
                "{}\ntrusted_proxies = [\"127.0.0.2\"]",
                Setup::signed_reading().admin
            ),
            sections:
                "[admin.auth_proxy]\nheader = \"X-Forwarded-User\"\nnew_account_role = \"operator\"\n"
                    .into(),
            ..Setup::default()
        },
    )
    .await?;
    let host_port: u16 = world.host.url("").rsplit(':').next().unwrap().parse()?;
    let (nginx, port, htpasswd) = start_nginx(host_port, "carol:{PLAIN}carol-basic-password\n");
    let base = format!("http://127.0.0.1:{port}");
    let http = http();
    // nginx is up once it answers.
    let mut asked = None;
    for _ in 0..50 {
        if let Ok(answer) = http.get(format!("{base}/")).send().await {
            asked = Some(answer.status());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(asked, Some(StatusCode::UNAUTHORIZED), "nginx asks first");

    // Carol signs in through nginx, and reads /api/ with her cookie and her basic auth (the
    // pages' "as JSON" links).
    let page = http
        .get(format!("{base}/"))
        .basic_auth("carol", Some("carol-basic-password"))
        .send()
        .await?;
    assert_eq!(page.status(), StatusCode::OK);
    let cookie = format!(
        "wh_session={}",
        set_cookie(&page, "wh_session").expect("a session for carol")
    );
    assert!(
        page.text()
            .await?
            .contains("signed in as <strong>carol</strong>")
    );
    let api = || {
        http.get(format!("{base}/api/overview"))
            .header(reqwest::header::COOKIE, &cookie)
    };
    let read = api()
        .basic_auth("carol", Some("carol-basic-password"))
        .send()
        .await?;
    assert_eq!(read.status(), StatusCode::OK, "/api/ as the pages");
    let token = world.add_token("carol")?;

    // Carol is removed from the identity provider (the htpasswd file, which nginx reads at
    // each request): her cookie gets nothing more, on the pages nor on /api/.
    std::fs::write(&htpasswd, "dave:{PLAIN}dave-basic-password\n")?;
    let page = http
        .get(format!("{base}/"))
        .header(reqwest::header::COOKIE, &cookie)
        .basic_auth("carol", Some("carol-basic-password"))
        .send()
        .await?;
    assert_eq!(page.status(), StatusCode::UNAUTHORIZED, "the pages");
    let cookie_alone = api().send().await?;
    assert_eq!(
        cookie_alone.status(),
        StatusCode::UNAUTHORIZED,
        "/api/ with the session cookie alone: {:.200}",
        cookie_alone.text().await?
    );
    let paused = http
        .post(format!("{base}/api/jobs/draft-expiry/pause"))
        .header(reqwest::header::COOKIE, &cookie)
        .form(&[("unused", "")])
        .send()
        .await?;
    assert_ne!(paused.status(), StatusCode::OK, "no action with the cookie");

    // A script's token still acts on /api/; a cookie beside a wrong token counts for nothing.
    let with_token = http
        .get(format!("{base}/api/overview"))
        .bearer_auth(&token)
        .send()
        .await?;
    assert_eq!(with_token.status(), StatusCode::OK, "a token on /api/");
    let wrong = api().bearer_auth("wht_wrong").send().await?;
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED, "a wrong token");
    drop(nginx);
    world.host.stop_cleanly().await;
    Ok(())
}
