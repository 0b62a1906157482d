//! The history in a real browser: the overview shows its charts, and a job's page shows a
//! week of seeded hours with the right totals in the table beside the chart (and the same
//! numbers in its JSON twin). Screenshots: `history-overview.png`, `history-job.png`
//! (into `docs/console/` with `WH_CONSOLE_SCREENSHOTS=docs/console`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use support::SERIAL;
use support::browser::{element, screenshot_dir, text_of};
use support::console::World;
use support::history::{failures, seed_week, units};
use worker_testkit::Browser;

const SHOW_LOG: &str = "CONSOLE_HISTORY_SHOW_LOG";
/// A consumer that gets no message in this test: its hours are only the seeded ones.
const JOB: &str = "automation-action";
const QUEUE: &str = "automation.action";
/// Hours seeded, back from the current one: the whole week's range even if the hour turns
/// during the test.
const HOURS: i64 = 166;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_page_shows_a_seeded_week_with_its_totals_beside_the_chart() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let (shots, _temporary) = screenshot_dir();
    let world = World::with_token(SHOW_LOG).await?;
    seed_week(&world.db.pool, JOB, QUEUE, HOURS).await?;
    let units_total: i64 = (1..=HOURS).map(units).sum();
    let (parked, gave_up) = (1..=HOURS)
        .map(failures)
        .fold((0, 0), |(p, g), (a, b)| (p + a, g + b));

    let browser = Browser::start().await?;
    let client = &browser.client;
    let base = world.host.url("");

    // The overview: its charts, each an image named in text, with its table.
    client.goto(&format!("{base}/?range=week#history")).await?;
    for chart in ["work", "queues", "outbox-age"] {
        let svg = element(client, &format!("#chart-{chart} svg[role=img]")).await;
        let name = svg.attr("aria-label").await?.unwrap_or_default();
        assert!(name.contains("last week"), "{chart}: {name}");
        element(client, &format!("#table-{chart} tfoot")).await;
    }
    // Every job's units: the seeded week, and whatever the timers ran since the start.
    let all = text_of(client, "#table-work td[data-total=units]", "total").await;
    let all: i64 = all.split_whitespace().next().unwrap().parse()?;
    assert!(all >= units_total, "{all} < {units_total}");
    text_of(
        client,
        "#table-queues td[data-total='ready, all queues']",
        "89",
    )
    .await;
    element(client, "#queues a[href='/queues/automation.action']").await;
    browser
        .screenshot(&shots.join("history-overview.png"))
        .await?;

    // The job's week: 168 hours in the table, the seeded totals at its foot.
    client
        .goto(&format!("{base}/jobs/{JOB}?range=week#history"))
        .await?;
    element(client, "#chart-work svg[role=img] title").await;
    text_of(client, "nav.ranges [aria-current=page]", "last week").await;
    let rows = client
        .find_all(fantoccini::Locator::Css("#table-work tbody tr"))
        .await?;
    assert_eq!(rows.len(), 168);
    text_of(
        client,
        "#table-work td[data-total=units]",
        &format!("{units_total} total"),
    )
    .await;
    text_of(
        client,
        "#table-work td[data-total=failures]",
        &format!("{} total", parked + gave_up),
    )
    .await;
    text_of(
        client,
        "#failures-by-reason",
        &format!("parked:transient {parked}"),
    )
    .await;
    // Most units took 20 to 50 ms; the slowest 1 % between half a second and a second.
    let p99 = text_of(client, "#table-work-durations td[data-total=p99]", "of all").await;
    let p99: f64 = p99.split_whitespace().next().unwrap().parse()?;
    assert!((500.0..=1000.0).contains(&p99), "p99 {p99}");
    browser.screenshot(&shots.join("history-job.png")).await?;

    // A day back: only the last 24 hours count.
    element(client, "nav.ranges a[href$='range=day']")
        .await
        .click()
        .await?;
    let day: i64 = (1..=23).map(units).sum();
    text_of(
        client,
        "#table-work td[data-total=units]",
        &format!("{day} total"),
    )
    .await;

    // The queue's page, linked from the overview.
    client
        .goto(&format!("{base}/queues/{QUEUE}?range=week"))
        .await?;
    text_of(client, "#table-depth thead", "retry tier 30s").await;
    text_of(client, "#table-depth td[data-total=ready]", "89 peak").await;
    browser.close().await;

    // The same numbers as JSON.
    let json: serde_json::Value = reqwest::get(format!("{base}/api/jobs/{JOB}/history?range=week"))
        .await?
        .error_for_status()?
        .json()
        .await?;
    let columns = &json["charts"][0]["columns"];
    assert_eq!(columns[0]["name"], "units");
    assert_eq!(columns[0]["total"].as_f64(), Some(units_total as f64));
    assert_eq!(json["failures"]["dead-lettered:gave-up"], gave_up);
    assert_eq!(
        json["charts"][0]["rows"].as_array().map(Vec::len),
        Some(168)
    );
    world.host.stop_cleanly().await;
    Ok(())
}
