//! Who may reach the console, on the real binary and the real services: reading needs a
//! session by default; forwarded headers and the auth proxy's header count only from
//! `admin.trusted_proxies`; bad sign-ins from one address do not stop another; a page that
//! reloads itself does not keep its session alive; API tokens act as their account; the scrape
//! token guards `/metrics` and `/status`; the admin server drops a slow client and caps its
//! connections. Clients on other loopback addresses (127.0.0.2, ...) play proxies and
//! strangers.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use support::console::{Operator, Setup, TOKEN, World, hidden, http, set_cookie};
use support::{SERIAL, host_command};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A client from `ip` (a loopback address of its own) that follows no redirect.
fn http_from(ip: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .local_address(ip.parse::<IpAddr>().ok())
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// `Setup::signed_reading()` with more `[admin]` lines and sections.
fn setup(admin: &str, sections: &str) -> Setup {
    Setup {
        admin: format!("{}\n{admin}", Setup::signed_reading().admin),
        sections: sections.to_string(),
        ..Setup::default()
    }
}

/// One sign-in through the form by `http`, with `headers` on the POST: the POST's answer.
async fn sign_in_answer(
    http: &reqwest::Client,
    base: &str,
    name: &str,
    password: &str,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let form = http.get(format!("{base}/sign-in")).send().await.unwrap();
    let cookie = set_cookie(&form, "wh_signin").unwrap();
    let csrf = hidden(&form.text().await.unwrap(), "csrf").unwrap();
    let mut post = http
        .post(format!("{base}/sign-in"))
        .header(reqwest::header::COOKIE, format!("wh_signin={cookie}"))
        .form(&[
            ("csrf", csrf.as_str()),
            ("name", name),
            ("password", password),
        ]);
    for (name, value) in headers {
        post = post.header(*name, *value);
    }
    post.send().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reading_needs_a_session_by_default_and_probes_and_metrics_stay_open() -> anyhow::Result<()>
{
    let _serial = SERIAL.lock().await;
    let world = World::start("CONSOLE_ACCESS_SHOW_LOG", Setup::signed_reading()).await?;
    let http = http();
    let page = http.get(world.host.url("/outbox")).send().await?;
    assert_eq!(page.status(), StatusCode::SEE_OTHER);
    assert_eq!(page.headers()["location"], "/sign-in?next=%2Foutbox");
    let api = http.get(world.host.url("/api/dead-letters")).send().await?;
    assert_eq!(api.status(), StatusCode::UNAUTHORIZED);
    for open in ["/healthz", "/readyz", "/metrics", "/status", "/sign-in"] {
        let answer = http.get(world.host.url(open)).send().await?;
        assert_eq!(answer.status(), StatusCode::OK, "{open}");
    }
    world.host.stop_cleanly().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_reading_ends_where_a_proxy_forwarded_the_request() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::with_token("CONSOLE_ACCESS_SHOW_LOG").await?;
    let http = http();
    let direct = http.get(world.host.url("/outbox")).send().await?;
    assert_eq!(direct.status(), StatusCode::OK, "open reading on loopback");
    for header in ["x-forwarded-for", "forwarded", "x-real-ip"] {
        let proxied = http
            .get(world.host.url("/outbox"))
            .header(header, "203.0.113.9")
            .send()
            .await?;
        assert_eq!(proxied.status(), StatusCode::SEE_OTHER, "{header}");
    }
    world.host.stop_cleanly().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_user_signs_in_only_from_a_trusted_proxy() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::start(
        "CONSOLE_ACCESS_SHOW_LOG",
        setup(
            "trusted_proxies = [\"127.0.0.2\"]",
            "[admin.auth_proxy]\nheader = \"X-Forwarded-User\"\nnew_account_role = \"viewer\"\n",
        ),
    )
    .await?;
    let accounts = || async {
        sqlx::query_as::<_, (String, String, String)>(
            "SELECT name, role, origin FROM operator_accounts WHERE name <> 'bootstrap' ORDER BY name",
        )
        .fetch_all(&world.db.pool)
        .await
        .unwrap()
    };

    // A stranger sets the header itself: ignored.
    let stranger = http_from("127.0.0.1")
        .get(world.host.url("/outbox"))
        .header("x-forwarded-user", "carol")
        .send()
        .await?;
    assert_eq!(stranger.status(), StatusCode::SEE_OTHER);
    assert!(accounts().await.is_empty(), "no account was made");

    // The proxy says who it signed in: an account with the default role, and a session.
    let proxy = http_from("127.0.0.2");
    let answer = proxy
        .get(world.host.url("/outbox"))
        .header("x-forwarded-user", "carol")
        .header("x-forwarded-for", "203.0.113.9")
        .send()
        .await?;
    assert_eq!(answer.status(), StatusCode::OK);
    let session = set_cookie(&answer, "wh_session").expect("a session for carol");
    let page = answer.text().await?;
    assert!(
        page.contains("signed in as <strong>carol</strong>"),
        "{page}"
    );
    assert_eq!(
        accounts().await,
        [("carol".into(), "viewer".into(), "proxy".into())]
    );
    let origin: String =
        sqlx::query_scalar("SELECT origin FROM operator_sessions WHERE account = 'carol'")
            .fetch_one(&world.db.pool)
            .await?;
    assert_eq!(
        origin, "203.0.113.9 via 127.0.0.2",
        "the client the proxy named"
    );

    // Its next request keeps the session instead of making another.
    let again = proxy
        .get(world.host.url("/"))
        .header("x-forwarded-user", "carol")
        .header(reqwest::header::COOKIE, format!("wh_session={session}"))
        .send()
        .await?;
    assert_eq!(again.status(), StatusCode::OK);
    assert!(set_cookie(&again, "wh_session").is_none());

    // A disabled account stays out, whatever the proxy says.
    world.add_account("dora", "operator", "dora-password-long")?;
    assert!(world.operators(&["disable", "dora"], "")?.status.success());
    let disabled = proxy
        .get(world.host.url("/"))
        .header("x-forwarded-user", "dora")
        .send()
        .await?;
    assert_eq!(disabled.status(), StatusCode::FORBIDDEN);
    assert!(disabled.text().await?.contains("dora"));
    world.host.stop_cleanly().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_bad_sign_ins_from_one_address_do_not_stop_another_address() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::start("CONSOLE_ACCESS_SHOW_LOG", Setup::signed_reading()).await?;
    world.add_account("alice", "operator", "alice-password-long")?;
    let base = world.host.url("");
    let guesser = http_from("127.0.0.3");
    let mut statuses = std::collections::BTreeMap::new();
    for i in 0..50 {
        let answer = sign_in_answer(&guesser, &base, "alice", &format!("guess-{i}"), &[]).await;
        *statuses.entry(answer.status().as_u16()).or_insert(0) += 1;
    }
    assert_eq!(
        statuses.values().sum::<i32>(),
        50,
        "each refused or answered: {statuses:?}"
    );
    assert!(
        statuses.get(&429).copied().unwrap_or(0) >= 40 && statuses.contains_key(&401),
        "ten tries a minute from one address (fewer for alice's own budget), then 429: {statuses:?}"
    );
    // Alice, from her own address: at most told to come back once her account's budget
    // (spent by the guesses) has a try again; never locked out.
    let started = Instant::now();
    let alice = loop {
        let answer = sign_in_answer(
            &http_from("127.0.0.4"),
            &base,
            "alice",
            "alice-password-long",
            &[],
        )
        .await;
        if answer.status() == StatusCode::SEE_OTHER {
            break answer;
        }
        assert_eq!(answer.status(), StatusCode::TOO_MANY_REQUESTS);
        let wait: u64 = answer.headers()["retry-after"].to_str()?.parse()?;
        assert!(started.elapsed() < Duration::from_secs(10), "locked out");
        tokio::time::sleep(Duration::from_secs(wait)).await;
    };
    let session = set_cookie(&alice, "wh_session").expect("a session");
    let alice = http_from("127.0.0.4");
    let page = alice
        .get(world.host.url("/"))
        .header(reqwest::header::COOKIE, format!("wh_session={session}"))
        .send()
        .await?
        .text()
        .await?;
    assert!(
        page.contains("signed in as <strong>alice</strong>"),
        "{page}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "slowed at most, never locked out: {:?}",
        started.elapsed()
    );
    world.host.stop_cleanly().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_that_reloads_itself_does_not_keep_its_session_alive() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::start(
        "CONSOLE_ACCESS_SHOW_LOG",
        setup("session_idle = \"60s\"", ""),
    )
    .await?;
    let operator = Operator::sign_in(&world.host.url(""), TOKEN, "alice").await?;
    let age = || async {
        sqlx::query_scalar::<_, f64>(
            "SELECT extract(epoch FROM now() - last_seen_at)::float8 FROM operator_sessions",
        )
        .fetch_one(&world.db.pool)
        .await
        .unwrap()
    };
    let back = |seconds: i32| {
        sqlx::query("UPDATE operator_sessions SET last_seen_at = now() - make_interval(secs => $1)")
            .bind(f64::from(seconds))
            .execute(&world.db.pool)
    };
    back(30).await?;
    let refreshed = operator.get("/actions?refresh=auto").await?;
    assert_eq!(refreshed.status(), StatusCode::OK);
    assert!(age().await >= 29.0, "the marker did not touch the session");
    assert_eq!(operator.get("/actions").await?.status(), StatusCode::OK);
    assert!(age().await < 5.0, "a page the operator opened did");
    back(61).await?;
    let ended = operator.get("/actions?refresh=auto").await?;
    assert_eq!(ended.status(), StatusCode::SEE_OTHER, "idle past the limit");
    world.host.stop_cleanly().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_token_acts_as_its_account_and_a_viewers_is_refused() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::start("CONSOLE_ACCESS_SHOW_LOG", Setup::signed_reading()).await?;
    world.add_account("otto", "operator", "otto-password-long")?;
    world.add_account("vera", "viewer", "vera-password-long")?;
    let otto = world.add_token("otto")?;
    let vera = world.add_token("vera")?;
    let http = http();
    let post = |token: &str, path: &str| {
        http.post(world.host.url(path))
            .bearer_auth(token)
            .form(&[("unused", "")])
            .send()
    };
    let paused = post(&otto, "/api/jobs/draft-expiry/pause").await?;
    assert_eq!(paused.status(), StatusCode::OK);
    let body: serde_json::Value = paused.json().await?;
    assert_eq!(body["location"], "/jobs/draft-expiry");
    let refused = post(&vera, "/api/jobs/draft-expiry/resume").await?;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    let body: serde_json::Value = refused.json().await?;
    assert!(
        body["detail"].as_str().unwrap().contains("viewer"),
        "{body}"
    );
    let unknown = post(&otto, "/api/jobs/no-such-job/pause").await?;
    assert_eq!(unknown.status(), StatusCode::NOT_FOUND);
    let body: serde_json::Value = unknown.json().await?;
    assert!(
        body["detail"].as_str().unwrap().contains("no-such-job"),
        "{body}"
    );
    let wrong = post("wht_0000", "/api/jobs/draft-expiry/resume").await?;
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    let read = http
        .get(world.host.url("/api/jobs/draft-expiry"))
        .bearer_auth(&vera)
        .send()
        .await?;
    assert_eq!(read.status(), StatusCode::OK, "a viewer's token reads");

    let rows: Vec<(String, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT action, account, via FROM dead_letter_actions WHERE action = 'pause'",
    )
    .fetch_all(&world.db.pool)
    .await?;
    assert_eq!(
        rows,
        [("pause".into(), Some("otto".into()), Some("api".into()))]
    );
    world.host.stop_cleanly().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scrape_token_guards_metrics_and_status_and_the_status_command_sends_it()
-> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let scrape = "scrape-token-long-enough";
    let world = World::start(
        "CONSOLE_ACCESS_SHOW_LOG",
        setup(&format!("scrape_token = {scrape:?}"), ""),
    )
    .await?;
    world.add_account("vera", "viewer", "vera-password-long")?;
    let vera = world.add_token("vera")?;
    let http = http();
    for path in ["/metrics", "/status"] {
        let bare = http.get(world.host.url(path)).send().await?;
        assert_eq!(bare.status(), StatusCode::UNAUTHORIZED, "{path}");
        assert_eq!(bare.headers()["www-authenticate"], "Bearer");
        for token in [scrape, vera.as_str()] {
            let answer = http
                .get(world.host.url(path))
                .bearer_auth(token)
                .send()
                .await?;
            assert_eq!(answer.status(), StatusCode::OK, "{path}");
        }
    }
    let ready = http.get(world.host.url("/readyz")).send().await?;
    assert_eq!(ready.status(), StatusCode::OK, "probes stay open");
    let status = host_command(world.host.config_path())
        .arg("status")
        .output()?;
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    world.host.stop_cleanly().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cookie_is_secure_only_when_a_trusted_proxy_says_https() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::start(
        "CONSOLE_ACCESS_SHOW_LOG",
        setup("trusted_proxies = [\"127.0.0.2\"]", ""),
    )
    .await?;
    let base = world.host.url("");
    let https = [("x-forwarded-proto", "https")];
    let set_cookie_of = |answer: &reqwest::Response| {
        answer
            .headers()
            .get_all(reqwest::header::SET_COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find(|v| v.starts_with("wh_session="))
            .unwrap()
            .to_string()
    };
    let trusted = sign_in_answer(&http_from("127.0.0.2"), &base, "alice", TOKEN, &https).await;
    assert_eq!(trusted.status(), StatusCode::SEE_OTHER);
    assert!(set_cookie_of(&trusted).contains("Secure"));
    let stranger = sign_in_answer(&http_from("127.0.0.1"), &base, "alice", TOKEN, &https).await;
    assert_eq!(stranger.status(), StatusCode::SEE_OTHER);
    assert!(!set_cookie_of(&stranger).contains("Secure"));
    world.host.stop_cleanly().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disabling_an_account_ends_its_console_session_at_once() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::start("CONSOLE_ACCESS_SHOW_LOG", Setup::signed_reading()).await?;
    world.add_account("otto", "operator", "otto-password-long")?;
    let otto = Operator::sign_in(&world.host.url(""), "otto-password-long", "otto").await?;
    assert_eq!(otto.get("/").await?.status(), StatusCode::OK);
    assert!(world.operators(&["disable", "otto"], "")?.status.success());
    assert_eq!(otto.get("/").await?.status(), StatusCode::SEE_OTHER);
    world.host.stop_cleanly().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_server_drops_a_slow_client_and_caps_its_connections() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::start(
        "CONSOLE_ACCESS_SHOW_LOG",
        setup("header_timeout = \"2s\"\nmax_connections = 2", ""),
    )
    .await?;
    let address = world.host.url("").trim_start_matches("http://").to_string();
    let slow = || async {
        let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        stream
    };
    let mut first = slow().await;
    let _second = slow().await;
    let opened = Instant::now();
    let capped = http_from("127.0.0.1")
        .get(world.host.url("/healthz"))
        .timeout(Duration::from_millis(800))
        .send()
        .await;
    assert!(
        capped.is_err(),
        "a third connection waits while two are open"
    );

    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), first.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "the slow client's connection was closed");
    let waited = opened.elapsed();
    assert!(
        waited < Duration::from_secs(6),
        "closed after the header timeout, not later: {waited:?}"
    );
    let served = http_from("127.0.0.1")
        .get(world.host.url("/healthz"))
        .send()
        .await?;
    assert_eq!(served.status(), StatusCode::OK, "served once they are gone");
    world.host.stop_cleanly().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_manages_accounts_from_the_console_and_an_operator_may_not() -> anyhow::Result<()>
{
    let _serial = SERIAL.lock().await;
    let world = World::start("CONSOLE_ACCESS_SHOW_LOG", Setup::signed_reading()).await?;
    let base = world.host.url("");
    let admin = Operator::sign_in(&base, TOKEN, "alice").await?;
    let location = admin
        .post_redirected(
            "/accounts/add",
            &[
                ("name", "otto"),
                ("role", "operator"),
                ("password", "otto-password-long"),
            ],
        )
        .await?;
    assert_eq!(location, "/accounts");
    let otto = Operator::sign_in(&base, "otto-password-long", "otto").await?;
    let page = otto.get("/accounts").await?.text().await?;
    assert!(page.contains("id=\"account-otto\""), "{page}");
    assert!(
        !page.contains("id=\"add\""),
        "no admin form for an operator"
    );
    let refused = otto
        .post("/accounts/add", &[("name", "eve"), ("role", "admin")])
        .await?;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);

    let made = admin
        .post("/accounts/otto/token", &[("label", "nightly replay")])
        .await?;
    assert_eq!(made.status(), StatusCode::OK);
    let page = made.text().await?;
    let token = page
        .split("<code id=\"token\">")
        .nth(1)
        .and_then(|rest| rest.split('<').next())
        .expect("the token, shown once")
        .to_string();
    let read = http()
        .get(world.host.url("/api/accounts"))
        .bearer_auth(&token)
        .send()
        .await?;
    assert_eq!(read.status(), StatusCode::OK);

    admin.post_redirected("/accounts/otto/disable", &[]).await?;
    assert_eq!(
        otto.get("/").await?.status(),
        StatusCode::SEE_OTHER,
        "signed out at once"
    );
    let own = admin.post("/accounts/bootstrap/disable", &[]).await?;
    assert_eq!(own.status(), StatusCode::CONFLICT);

    let rows: Vec<(String, Option<String>, Option<String>)> =
        sqlx::query_as("SELECT action, account, via FROM dead_letter_actions ORDER BY id")
            .fetch_all(&world.db.pool)
            .await?;
    let bootstrap = || (Some("bootstrap".to_string()), Some("console".to_string()));
    let expected: Vec<(String, Option<String>, Option<String>)> =
        ["operator-add", "operator-token", "operator-disable"]
            .into_iter()
            .map(|action| (action.to_string(), bootstrap().0, bootstrap().1))
            .collect();
    assert_eq!(rows, expected);
    world.host.stop_cleanly().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_auth_proxy_cannot_sign_anyone_in_as_bootstrap() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::start(
        "CONSOLE_ACCESS_SHOW_LOG",
        setup(
            "trusted_proxies = [\"127.0.0.2\"]",
            "[admin.auth_proxy]\nheader = \"X-Forwarded-User\"\nnew_account_role = \"viewer\"\n",
        ),
    )
    .await?;
    let proxy = http_from("127.0.0.2");
    for name in ["bootstrap", "Bootstrap"] {
        for path in ["/", "/api/accounts"] {
            let answer = proxy
                .get(world.host.url(path))
                .header("x-forwarded-user", name)
                .send()
                .await?;
            assert!(
                set_cookie(&answer, "wh_session").is_none(),
                "no session for `{name}` on {path}"
            );
            assert_eq!(answer.status(), StatusCode::FORBIDDEN, "{name} on {path}");
            let text = answer.text().await?;
            assert!(text.contains("bootstrap"), "{text}");
        }
    }
    let sessions: i64 = sqlx::query_scalar("SELECT count(*) FROM operator_sessions")
        .fetch_one(&world.db.pool)
        .await?;
    assert_eq!(sessions, 0, "no session was made");
    let made: i64 =
        sqlx::query_scalar("SELECT count(*) FROM operator_accounts WHERE origin = 'proxy'")
            .fetch_one(&world.db.pool)
            .await?;
    assert_eq!(made, 0, "no look-alike account was made");
    assert!(
        world
            .host
            .log_text()
            .contains("the auth proxy named the bootstrap account"),
        "the refusal is logged"
    );
    world.host.stop_cleanly().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cookieless_proxied_requests_keep_at_most_one_unused_session() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::start(
        "CONSOLE_ACCESS_SHOW_LOG",
        setup(
            "trusted_proxies = [\"127.0.0.2\"]",
            "[admin.auth_proxy]\nheader = \"X-Forwarded-User\"\nnew_account_role = \"viewer\"\n",
        ),
    )
    .await?;
    let sessions = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM operator_sessions WHERE account = 'carol'",
        )
        .fetch_one(&world.db.pool)
        .await
        .unwrap()
    };
    let proxy = http_from("127.0.0.2");
    // Another site's <img> in a signed-in browser: the cookie (SameSite=Strict) stays home,
    // the proxy still names the user, twenty times.
    let cookieless = || {
        proxy
            .get(world.host.url("/"))
            .header("x-forwarded-user", "carol")
            .send()
    };
    let mut last = None;
    for _ in 0..20 {
        let answer = cookieless().await?;
        assert_eq!(answer.status(), StatusCode::OK);
        last = set_cookie(&answer, "wh_session");
    }
    assert_eq!(sessions().await, 1, "twenty cookieless requests, one row");

    // The browser that keeps its cookie keeps its session through more cookieless requests.
    let cookie = format!("wh_session={}", last.unwrap());
    let kept = || {
        proxy
            .get(world.host.url("/"))
            .header("x-forwarded-user", "carol")
            .header(reqwest::header::COOKIE, &cookie)
            .send()
    };
    let answer = kept().await?;
    assert_eq!(answer.status(), StatusCode::OK);
    assert!(set_cookie(&answer, "wh_session").is_none(), "its session");
    for _ in 0..5 {
        cookieless().await?;
    }
    assert_eq!(sessions().await, 2, "the one in use and one unused");
    let answer = kept().await?;
    assert!(
        set_cookie(&answer, "wh_session").is_none(),
        "the session in use was kept"
    );
    world.host.stop_cleanly().await;
    Ok(())
}
