//! The fleet view (`worker-host fleet`) in a real browser, over installations that are real
//! hosts on databases and vhosts of their own, and the environment's band on an
//! installation's own console (`admin.environment`).
//!
//! - Three installations, one of them stopped, and a fourth address that accepts and never
//!   answers: the page lists the live two with their health, dead letters, release and
//!   schema, the stopped one as unreachable since its first failed reading, and answers at
//!   once all the same (it shows the last background reading, never waits on one).
//! - A production installation's console has a band naming it on every page, red and in
//!   words; `/status` says its environment.
//!
//! Both pages pass axe-core (no serious or critical violation) and fit a phone's width.
//!
//! Screenshots: `fleet.png` and `environment-band.png` (with
//! `WH_CONSOLE_SCREENSHOTS=docs/console`, into docs/console/).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::time::{Duration, Instant};

use fantoccini::Locator;
use support::SERIAL;
use support::browser::{element, screenshot_dir, sign_in, text_of};
use support::fleet::{FleetView, Installation, VIEWER_PASSWORD, silent_listener};
use worker_testkit::Browser;

const SHOW_LOG: &str = "CONSOLE_FLEET_SHOW_LOG";

/// The bound on one answer of the fleet view while an installation hangs: a reading waits
/// up to 3 s (the view's `timeout`) for it, so a page that waited on the readings would take
/// longer than this; the page must not wait at all, and 2 s leaves the slow machine room.
const PAGE_BOUND: Duration = Duration::from_secs(2);

fn entry(name: &str, url: &str, token: &str, environment: &str) -> String {
    format!(
        "\n[[installations]]\nname = {name:?}\nurl = {url:?}\ntoken = {token:?}\nenvironment = {environment:?}\n"
    )
}

fn row(name: &str, cell: &str) -> String {
    format!("tr[data-installation='{name}'] {cell}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_view_shows_every_installation_and_one_stopped_as_unreachable_without_waiting()
-> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let (shots, _temporary) = screenshot_dir();
    let prod = Installation::start(SHOW_LOG, "acme", "environment = \"production\"").await?;
    let staging =
        Installation::start(SHOW_LOG, "acme-staging", "environment = \"staging\"").await?;
    let mut gone = Installation::start(SHOW_LOG, "globex", "").await?;
    // An installation without admin.environment has no band.
    let page = reqwest::get(gone.host.url("/sign-in"))
        .await?
        .text()
        .await?;
    assert!(!page.contains("id=\"environment\""), "{page}");
    let stopped_at = chrono::Utc::now();
    gone.host.stop().await;
    let (silent, _silent_task) = silent_listener().await?;
    prod.dead_letters(2).await?;

    let settings = format!(
        "refresh = \"4s\"\ntimeout = \"3s\"\n{}{}{}{}",
        entry("acme", &prod.host.url(""), &prod.token, "production"),
        entry(
            "acme-staging",
            &staging.host.url(""),
            &staging.token,
            "staging"
        ),
        entry("globex", &gone.host.url(""), &gone.token, "staging"),
        entry(
            "initech",
            &format!("http://{silent}"),
            "initech-viewer-token",
            "staging"
        ),
    );
    let mut fleet = FleetView::start(&settings).await?;

    // The JSON twin: the first round is over once every installation has a state.
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let api = loop {
        let started = Instant::now();
        let api: serde_json::Value = http
            .get(fleet.url("/api/fleet"))
            .send()
            .await?
            .json()
            .await?;
        let took = started.elapsed();
        assert!(took < PAGE_BOUND, "/api/fleet took {took:?}");
        let states: Vec<&str> = api["installations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["state"].as_str().unwrap())
            .collect();
        if !states.contains(&"waiting") && api["installations"][0]["reading"]["dead_letters"] == 2 {
            break api;
        }
        assert!(
            Instant::now() < deadline,
            "the fleet view never read every installation: {api:#}\n{}",
            fleet.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let by_name = |name: &str| {
        api["installations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["name"] == name)
            .unwrap()
            .clone()
    };
    assert_eq!(by_name("acme")["state"], "healthy", "{api:#}");
    assert_eq!(by_name("acme-staging")["state"], "healthy", "{api:#}");
    let globex = by_name("globex");
    assert_eq!(globex["state"], "unreachable", "{api:#}");
    let since: chrono::DateTime<chrono::Utc> =
        globex["unreachable_since"].as_str().unwrap().parse()?;
    assert!(
        since >= stopped_at,
        "unreachable since {since}, stopped at {stopped_at}"
    );
    assert!(
        globex["last_error"]
            .as_str()
            .unwrap()
            .contains("cannot connect"),
        "{globex:#}"
    );
    assert_eq!(
        by_name("initech")["last_error"],
        "no answer within 3s",
        "{api:#}"
    );
    let schema = prod.schema_version().await?;
    assert_eq!(
        by_name("acme")["reading"]["schema_version"],
        schema,
        "{api:#}"
    );
    assert_eq!(
        by_name("acme")["reading"]["environment"],
        "production",
        "{api:#}"
    );

    // The page, in the browser.
    let browser = Browser::start().await?;
    let client = &browser.client;
    let started = Instant::now();
    client.goto(&fleet.url("/")).await?;
    let took = started.elapsed();
    assert!(
        took < PAGE_BOUND,
        "the page took {took:?} with one installation hanging"
    );
    text_of(client, &row("acme", ".health"), "healthy").await;
    text_of(client, &row("acme", ".dead-letters"), "2").await;
    text_of(client, &row("acme", ".release"), env!("CARGO_PKG_VERSION")).await;
    text_of(client, &row("acme", ".schema"), &schema.to_string()).await;
    text_of(client, &row("acme", ".environment-cell"), "production").await;
    element(client, &row("acme", ".env-label.env-red")).await;
    text_of(client, &row("acme-staging", ".health"), "healthy").await;
    text_of(client, &row("acme-staging", ".dead-letters"), "0").await;
    text_of(client, &row("acme-staging", ".environment-cell"), "staging").await;
    let health = text_of(client, &row("globex", ".health"), "unreachable").await;
    assert!(health.contains("since"), "{health}");
    text_of(
        client,
        &row("globex", ".unreachable-error"),
        "cannot connect",
    )
    .await;
    text_of(
        client,
        &row("initech", ".unreachable-error"),
        "no answer within 3s",
    )
    .await;
    // Each row links into its installation's console.
    let link = element(client, &row("acme", "th a"))
        .await
        .attr("href")
        .await?;
    assert_eq!(link.as_deref(), Some(prod.host.url("/").as_str()));
    let source = client.source().await?;
    for token in [&prod.token, &staging.token, &gone.token] {
        assert!(!source.contains(token.as_str()), "a token is on the page");
        assert!(
            !fleet.log_text().contains(token.as_str()),
            "a token is in the log"
        );
    }
    assert!(client.find_all(Locator::Css("script")).await?.is_empty());
    browser.screenshot(&shots.join("fleet.png")).await?;
    // As a person would use it: axe-core clean, and on a phone no wider than the window.
    browser.assert_accessible("the fleet view").await?;
    browser.resize(390, 844).await?;
    browser.assert_fits_width("the fleet view").await?;
    browser.assert_accessible("the fleet view, narrow").await?;
    browser.resize(1280, 900).await?;
    // Reloading itself only when asked (axe counts a timed refresh as critical).
    element(client, "#reload-auto").await.click().await?;
    element(client, "#reload-stop").await;
    let refresh = client
        .find(Locator::Css("meta[http-equiv=refresh]"))
        .await?
        .attr("content")
        .await?;
    assert_eq!(refresh.as_deref(), Some("4; url=/?reload=auto"));

    // Read again while one installation hangs: still at once.
    // Over a whole round: readings go on in the background meanwhile.
    for _ in 0..4 {
        let started = Instant::now();
        client.refresh().await?;
        element(client, &row("initech", ".health")).await;
        let took = started.elapsed();
        assert!(took < PAGE_BOUND, "a reload took {took:?}");
        tokio::time::sleep(Duration::from_millis(1000)).await;
    }
    // Its row links to the console, where the viewer signs in.
    element(client, &row("acme", "th a")).await.click().await?;
    element(client, "#environment").await;
    browser.close().await;
    assert_eq!(fleet.stop().await, Some(0), "{}", fleet.log_text());
    prod.host.stop_cleanly().await;
    staging.host.stop_cleanly().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_production_installations_console_shows_its_band_on_every_page() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let (shots, _temporary) = screenshot_dir();
    let prod = Installation::start(SHOW_LOG, "acme", "environment = \"production\"").await?;
    prod.dead_letters(1).await?;
    let browser = Browser::start().await?;
    let client = &browser.client;
    let base = prod.host.url("");

    // Before signing in, too.
    client.goto(&format!("{base}/sign-in")).await?;
    text_of(client, "#environment", "production").await;
    sign_in(client, &base, "fleet", VIEWER_PASSWORD).await;
    for path in [
        "/",
        "/dead-letters",
        "/outbox",
        "/actions",
        "/jobs/draft-expiry",
    ] {
        client.goto(&format!("{base}{path}")).await?;
        let band = text_of(client, "#environment", "Environment: production").await;
        // In words, for who cannot tell the colour.
        assert!(band.contains("real clients"), "{path}: {band}");
        element(client, "#environment.env-red").await;
    }
    client.goto(&format!("{base}/")).await?;
    text_of(client, "#dead-letters", "1 waiting").await;
    browser
        .screenshot(&shots.join("environment-band.png"))
        .await?;
    browser
        .assert_accessible("the overview with its band")
        .await?;
    browser.resize(390, 844).await?;
    browser
        .assert_fits_width("the overview with its band")
        .await?;
    browser.close().await;

    let status: serde_json::Value = reqwest::get(prod.host.url("/status")).await?.json().await?;
    assert_eq!(status["environment"]["name"], "production", "{status:#}");
    assert_eq!(status["environment"]["production"], true, "{status:#}");
    assert!(status["schema"]["version"].as_i64().is_some(), "{status:#}");
    prod.host.stop_cleanly().await;
    Ok(())
}
