//! How fast credentials may be tried, on the real binary and the real services: a storm of
//! wrong sign-ins is answered `429 Retry-After` at once, never kept waiting, and the probes
//! keep answering through it; wrong scrape tokens spend a budget apart from the sign-ins of
//! their address; and replicas on one database take an account's sign-ins from one budget.
//! Clients on other loopback addresses (127.0.0.x) play the many addresses of a guesser.
//!
//! `SIGN_IN_THROTTLE_SHOW_LOG=1` prints a host's log when it stops.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use support::SERIAL;
use support::console::{Setup, TOKEN, World, hidden, set_cookie};

const SHOW_LOG: &str = "SIGN_IN_THROTTLE_SHOW_LOG";
/// Far below the 20 s a throttled sign-in used to wait for its turn, far above what an answer
/// that does not wait takes on a loaded machine.
const ANSWERED_WITHIN: Duration = Duration::from_secs(5);

/// A client from `ip` (a loopback address of its own) that follows no redirect.
fn http_from(ip: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .local_address(ip.parse::<IpAddr>().ok())
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// One sign-in through the form: the POST's status, its `Retry-After`, and how long the POST
/// took to be answered.
async fn sign_in(
    http: &reqwest::Client,
    base: &str,
    name: &str,
    password: &str,
) -> (StatusCode, Option<String>, Duration) {
    let form = http.get(format!("{base}/sign-in")).send().await.unwrap();
    let cookie = set_cookie(&form, "wh_signin").unwrap();
    let csrf = hidden(&form.text().await.unwrap(), "csrf").unwrap();
    let posted = Instant::now();
    let answer = http
        .post(format!("{base}/sign-in"))
        .header(reqwest::header::COOKIE, format!("wh_signin={cookie}"))
        .form(&[
            ("csrf", csrf.as_str()),
            ("name", name),
            ("password", password),
        ])
        .send()
        .await
        .unwrap();
    let took = posted.elapsed();
    let retry = answer
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .map(|v| v.to_str().unwrap().to_string());
    (answer.status(), retry, took)
}

fn setup(admin: &str) -> Setup {
    Setup {
        admin: format!("{}\n{admin}", Setup::signed_reading().admin),
        ..Setup::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_of_wrong_sign_ins_is_refused_at_once_and_readyz_keeps_answering()
-> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    // Few connections, so that sign-ins held open would leave none for the probe.
    let world = World::start(SHOW_LOG, setup("max_connections = 16")).await?;
    world.add_account("alice", "admin", "alice-password-long")?;
    let base = world.host.url("");

    // The probe, every 200 ms through the storm, each answer timed.
    let probing = tokio::sync::watch::channel(true);
    let probe = {
        let url = world.host.url("/readyz");
        let mut running = probing.1.clone();
        tokio::spawn(async move {
            let http = http_from("127.0.0.1");
            let mut slowest = Duration::ZERO;
            let mut answers = 0;
            while *running.borrow_and_update() {
                let started = Instant::now();
                let answer = http.get(&url).timeout(Duration::from_secs(10)).send().await;
                let ok = answer.is_ok_and(|a| a.status() == StatusCode::OK);
                assert!(ok, "/readyz did not answer 200 during the storm");
                slowest = slowest.max(started.elapsed());
                answers += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            (answers, slowest)
        })
    };

    // Forty wrong sign-ins for alice, two from each of twenty addresses, all at once.
    let storm: Vec<_> = (0..40)
        .map(|i| {
            let base = base.clone();
            let http = http_from(&format!("127.0.0.{}", 10 + i / 2));
            tokio::spawn(async move { sign_in(&http, &base, "alice", &format!("guess-{i}")).await })
        })
        .collect();
    let mut answers = Vec::new();
    for guess in storm {
        answers.push(guess.await?);
    }
    probing.0.send(false)?;
    let (probes, slowest_probe) = probe.await?;

    let refused: Vec<_> = answers
        .iter()
        .filter(|(status, ..)| *status == StatusCode::TOO_MANY_REQUESTS)
        .collect();
    let slowest = answers.iter().map(|(_, _, took)| *took).max().unwrap();
    eprintln!(
        "{} refused of {}, slowest answer {slowest:?}; {probes} probes, slowest {slowest_probe:?}",
        refused.len(),
        answers.len()
    );
    assert!(
        answers.iter().all(|(status, ..)| {
            [StatusCode::UNAUTHORIZED, StatusCode::TOO_MANY_REQUESTS].contains(status)
        }),
        "{answers:?}"
    );
    assert!(
        refused.len() >= 20,
        "an account takes five at once, then one a second: {answers:?}"
    );
    assert!(
        refused.iter().all(|(_, retry, _)| retry
            .as_deref()
            .and_then(|r| r.parse::<u64>().ok())
            .is_some_and(|r| r >= 1)),
        "each refusal says when to try again: {refused:?}"
    );
    assert!(
        slowest < ANSWERED_WITHIN,
        "no sign-in waits for its turn: the slowest was answered after {slowest:?}"
    );
    assert!(
        slowest_probe < ANSWERED_WITHIN,
        "/readyz answered within {ANSWERED_WITHIN:?} throughout, its slowest took {slowest_probe:?}"
    );
    world.host.stop_cleanly().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_scrape_tokens_do_not_throttle_a_sign_in_from_their_address() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::start(
        SHOW_LOG,
        setup("scrape_token = \"scrape-token-long-enough\""),
    )
    .await?;
    let base = world.host.url("");
    let scraper = http_from("127.0.0.5");
    let mut last = None;
    for _ in 0..15 {
        last = Some(
            scraper
                .get(world.host.url("/metrics"))
                .bearer_auth("a-stale-scrape-token")
                .send()
                .await?,
        );
    }
    let last = last.unwrap();
    assert_eq!(
        last.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "the wrong tokens ran out of their budget"
    );
    assert!(last.headers().contains_key(reqwest::header::RETRY_AFTER));
    let (status, retry, _) = sign_in(&scraper, &base, "alice", TOKEN).await;
    assert_eq!(
        status,
        StatusCode::SEE_OTHER,
        "a sign-in from the scraper's address still goes in (Retry-After {retry:?})"
    );
    world.host.stop_cleanly().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_take_an_accounts_sign_ins_from_one_budget() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let world = World::start(SHOW_LOG, Setup::signed_reading()).await?;
    let second = world.replica(SHOW_LOG, "r2").await?;
    world.add_account("alice", "admin", "alice-password-long")?;
    // Ten wrong sign-ins for alice on the first replica, from two addresses at once: its
    // burst of five and more.
    let first: Vec<_> = (0..10)
        .map(|i| {
            let base = world.host.url("");
            let http = http_from(&format!("127.0.0.{}", 40 + i % 2));
            tokio::spawn(async move { sign_in(&http, &base, "alice", "wrong-guess").await })
        })
        .collect();
    for guess in first {
        guess.await?;
    }
    // Five more on the second replica, from a third address: a budget of its own would take
    // them all (a burst of five); the shared one has none left.
    let third = http_from("127.0.0.42");
    let mut on_second = Vec::new();
    for _ in 0..5 {
        on_second.push(sign_in(&third, &second.url(""), "alice", "wrong-guess").await);
    }
    let refused = on_second
        .iter()
        .filter(|(status, ..)| *status == StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert!(
        refused >= 2,
        "the second replica refused {refused} of 5: {on_second:?}"
    );
    // Alice herself, once the budget has refilled a little.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (status, ..) = sign_in(&third, &second.url(""), "alice", "alice-password-long").await;
    assert_eq!(status, StatusCode::SEE_OTHER, "slowed, not locked");
    second.stop_cleanly().await;
    world.host.stop_cleanly().await;
    Ok(())
}
