//! The admin port answers only requests that name it (`admin.allowed_hosts`, against DNS
//! rebinding), on the real binary: a page whose name is pointed at 127.0.0.1 has the browser
//! send its own name in `Host`, and is refused on every path (console, API, `/status`,
//! `/metrics`, the probes) with 421 and a plain sentence; loopback, the listen address and a
//! listed name are answered.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use support::SERIAL;
use support::console::{Setup, TOKEN, World};

const SHOW_LOG: &str = "ALLOWED_HOSTS_SHOW_LOG";

/// Every path kind the admin port serves.
const PATHS: [&str; 7] = [
    "/",
    "/api/overview",
    "/api/dead-letters",
    "/status",
    "/metrics",
    "/healthz",
    "/readyz",
];

/// `GET path` on `world`'s admin port with `Host: host`; the status and the body.
async fn get_as(world: &World, path: &str, host: &str) -> (u16, String) {
    let answer = reqwest::Client::new()
        .get(world.host.url(path))
        .header(reqwest::header::HOST, host)
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    (answer.status().as_u16(), answer.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_naming_another_host_is_refused_on_every_path_and_ours_are_answered()
-> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let setup = Setup::with_token();
    let world = World::start(
        SHOW_LOG,
        Setup {
            admin: format!(
                "{}\nallowed_hosts = [\"console.example.net\", \"other.example.net:8443\"]",
                setup.admin
            ),
            ..setup
        },
    )
    .await?;
    let base = world.host.url("");
    let port = base.rsplit_once(':').unwrap().1;
    for path in PATHS {
        for evil in [
            "evil.example",
            &format!("evil.example:{port}"),
            "other.example.net",
        ] {
            let (status, body) = get_as(&world, path, evil).await;
            assert_eq!(status, 421, "{path} with Host {evil}: {body}");
            assert!(
                body.contains(evil.split(':').next().unwrap())
                    && body.contains("admin.allowed_hosts"),
                "{path}: {body}"
            );
        }
        for ours in [
            format!("127.0.0.1:{port}"),
            format!("localhost:{port}"),
            "console.example.net".to_string(),
            "console.example.net:443".to_string(),
            "other.example.net:8443".to_string(),
        ] {
            let (status, body) = get_as(&world, path, &ours).await;
            assert_ne!(status, 421, "{path} with Host {ours}: {body}");
            assert!(status < 400, "{path} with Host {ours}: {status} {body}");
        }
    }
    world.host.stop_cleanly().await;
    Ok(())
}
