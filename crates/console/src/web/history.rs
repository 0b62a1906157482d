//! The history's charts and their numbers: on the overview (every job's units and failures;
//! the queues and the outbox), on a job's page (its units and failures, its durations) and on
//! a queue's page (`/queues/{name}`: its depth, retry tiers and dead letters). The range is a
//! link (`?range=hour|day|week|month`, `range.rs`). Each chart's numbers (`table.rs`) are
//! drawn as an SVG ([`crate::chart`]), shown as a table beside it, and served again as JSON
//! (`/api/history`, `/api/jobs/{name}/history`, `/api/queues/{name}`).

use crate::history::{range, table};

use std::collections::BTreeMap;

use axum::extract::{Path, Query};
use axum::response::{IntoResponse, Json};
use chrono::{DateTime, Utc};
use minijinja::Value;
use serde::Serialize;
use worker_store::history::{self, HistoryRow, Select};

use super::Console;
use super::caller::Who;
use super::page::{PageResult, Problem, State, may_read_api, render, sign_in_first};

pub use range::{Range, RangeQuery};
pub use table::History;
use table::{Chart, Total};

async fn rows(
    console: &Console,
    range: Range,
    starts: &[DateTime<Utc>],
    select: Select<'_>,
) -> Result<Vec<HistoryRow>, Problem> {
    let resolution = range.periods().0;
    let from = starts.first().copied().unwrap_or_else(Utc::now);
    let to = starts.last().copied().unwrap_or_else(Utc::now) + resolution.span();
    history::read(&console.pool, resolution, from, to, select)
        .await
        .map_err(|e| Problem::failed("Reading the history", e))
}

/// Rows of one series added up per period.
fn by_period<'a>(
    rows: impl Iterator<Item = &'a HistoryRow>,
) -> BTreeMap<DateTime<Utc>, HistoryRow> {
    let mut out: BTreeMap<DateTime<Utc>, HistoryRow> = BTreeMap::new();
    for row in rows {
        out.entry(row.at).or_default().absorb(row);
    }
    out
}

fn count(n: i64) -> f64 {
    n as f64
}

/// Units and failures per period, and the durations' percentiles: a job's (or every job's).
fn work_charts(
    id: &str,
    title: &str,
    range: Range,
    starts: &[DateTime<Utc>],
    rows: &[&HistoryRow],
    durations: bool,
) -> Vec<Chart> {
    let per = by_period(rows.iter().copied());
    let units = Chart::new(id, title, "units per period", range, starts)
        .column("units", Total::Sum, |at| {
            Some(count(per.get(&at).map_or(0, |r| r.units)))
        })
        .column("failures", Total::Sum, |at| {
            Some(count(per.get(&at).map_or(0, HistoryRow::failed)))
        });
    if !durations {
        return vec![units];
    }
    let mut all = Vec::new();
    for row in per.values() {
        history::buckets::merge(&mut all, &row.durations);
    }
    let overall = history::quantiles(&all);
    let quantile = |i: usize| {
        let per = &per;
        move |at: DateTime<Utc>| {
            per.get(&at)
                .and_then(|r| history::quantiles(&r.durations)[i])
        }
    };
    let durations = Chart::new(
        &format!("{id}-durations"),
        "Durations",
        "milliseconds",
        range,
        starts,
    )
    .column("p50", Total::Overall, quantile(0))
    .with_total(overall[0])
    .column("p95", Total::Overall, quantile(1))
    .with_total(overall[1])
    .column("p99", Total::Overall, quantile(2))
    .with_total(overall[2]);
    vec![units, durations]
}

fn peak(row: Option<&HistoryRow>, gauge: &str) -> Option<f64> {
    row?.gauges.get(gauge).map(|g| count(g.max))
}

/// The overview's history: every job's work; the queues' depths and the outbox.
pub async fn overview(console: &Console, range: Range) -> Result<History, Problem> {
    let starts = range.starts(Utc::now());
    let rows = rows(console, range, &starts, Select::default()).await?;
    let jobs: Vec<&HistoryRow> = rows.iter().filter(|r| r.series == "job").collect();
    let mut charts = work_charts(
        "work",
        "Units of work, every job",
        range,
        &starts,
        &jobs,
        false,
    );
    // Every queue's peaks added up per period (exact by minute; by hour or day, the sum of
    // each queue's own peak), the retry tiers as one.
    let mut queues: BTreeMap<DateTime<Utc>, BTreeMap<&str, i64>> = BTreeMap::new();
    for row in rows.iter().filter(|r| r.series == "queue") {
        let period = queues.entry(row.at).or_default();
        for (gauge, reading) in &row.gauges {
            let key = if gauge.starts_with("retry:") {
                "parked"
            } else {
                gauge.as_str()
            };
            *period.entry(key).or_default() += reading.max;
        }
    }
    let summed = |gauge: &'static str| {
        let queues = &queues;
        move |at: DateTime<Utc>| {
            queues
                .get(&at)
                .and_then(|g| g.get(gauge))
                .map(|n| count(*n))
        }
    };
    let outbox = by_period(rows.iter().filter(|r| r.series == "outbox"));
    charts.push(
        Chart::new(
            "queues",
            "Queues and outbox",
            "messages (peak)",
            range,
            &starts,
        )
        .column("ready, all queues", Total::Peak, summed("ready"))
        .column("parked in retry tiers", Total::Peak, summed("parked"))
        .column("dead letters", Total::Peak, summed("dead_letters"))
        .column("outbox backlog", Total::Peak, |at| {
            peak(outbox.get(&at), "backlog")
        }),
    );
    charts.push(
        Chart::new(
            "outbox-age",
            "Oldest pending outbox row",
            "seconds (peak)",
            range,
            &starts,
        )
        .column("oldest pending row", Total::Peak, |at| {
            peak(outbox.get(&at), "oldest_secs")
        }),
    );
    Ok(History {
        range,
        ranges: Range::ALL,
        charts,
        failures: None,
    })
}

/// A job's history: its units, failures (by reason, over the range) and durations.
pub async fn job(console: &Console, name: &str, range: Range) -> Result<History, Problem> {
    let starts = range.starts(Utc::now());
    let select = Select {
        series: Some("job"),
        name: Some(name),
    };
    let rows = rows(console, range, &starts, select).await?;
    let refs: Vec<&HistoryRow> = rows.iter().collect();
    let charts = work_charts("work", "Units of work", range, &starts, &refs, true);
    let mut failures = BTreeMap::new();
    for row in &rows {
        for (reason, n) in &row.failures {
            *failures.entry(reason.clone()).or_default() += n;
        }
    }
    Ok(History {
        range,
        ranges: Range::ALL,
        charts,
        failures: Some(failures),
    })
}

/// A queue's history: its ready messages, each retry tier and its dead letters.
pub async fn queue(console: &Console, name: &str, range: Range) -> Result<History, Problem> {
    let starts = range.starts(Utc::now());
    let select = Select {
        series: Some("queue"),
        name: Some(name),
    };
    let rows = rows(console, range, &starts, select).await?;
    let per = by_period(rows.iter());
    let mut tiers: Vec<&String> = rows
        .iter()
        .flat_map(|r| r.gauges.keys())
        .filter(|k| k.starts_with("retry:"))
        .collect();
    tiers.sort();
    tiers.dedup();
    let mut chart = Chart::new("depth", "Depth", "messages (peak)", range, &starts).column(
        "ready",
        Total::Peak,
        |at| peak(per.get(&at), "ready"),
    );
    for tier in tiers {
        let label = tier.replace("retry:", "retry tier ");
        chart = chart.column(&label, Total::Peak, |at| peak(per.get(&at), tier));
    }
    chart = chart.column("dead letters", Total::Peak, |at| {
        peak(per.get(&at), "dead_letters")
    });
    Ok(History {
        range,
        ranges: Range::ALL,
        charts: vec![chart],
        failures: None,
    })
}

/// `/api/history?range=`: the overview's charts as JSON.
pub async fn overview_api(
    axum::extract::State(console): State,
    caller: Who,
    Query(query): Query<RangeQuery>,
) -> PageResult {
    may_read_api(&caller)?;
    let range = Range::of(&query).map_err(Problem::json)?;
    let history = overview(&console, range).await.map_err(Problem::json)?;
    Ok(Json(history).into_response())
}

/// `/api/jobs/{name}/history?range=`: a job's charts as JSON.
pub async fn job_api(
    axum::extract::State(console): State,
    caller: Who,
    Path(name): Path<String>,
    Query(query): Query<RangeQuery>,
) -> PageResult {
    may_read_api(&caller)?;
    if !super::jobs::runs(&console, &name) {
        return Err(Problem::not_found(format!("this host runs no job called `{name}`")).json());
    }
    let range = Range::of(&query).map_err(Problem::json)?;
    let history = job(&console, &name, range).await.map_err(Problem::json)?;
    Ok(Json(history).into_response())
}

#[derive(Debug, Serialize)]
struct QueuePage {
    name: String,
    /// The sampler's latest reading of the queue, its tiers and its dead queue.
    reading: crate::runtime::QueueReading,
    dead_letters: u64,
    history: History,
}

async fn queue_page(console: &Console, name: &str, range: Range) -> Result<QueuePage, Problem> {
    let readings = console.runtime.readings();
    let reading = readings
        .queues
        .iter()
        .find(|q| q.queue == name)
        .cloned()
        .ok_or_else(|| Problem::not_found(format!("no consumer queue called `{name}`")))?;
    Ok(QueuePage {
        name: name.to_string(),
        dead_letters: readings
            .dead_letter_depth
            .get(name)
            .copied()
            .unwrap_or_default(),
        reading,
        history: queue(console, name, range).await?,
    })
}

/// `/queues/{name}?range=`: a queue's reading now and its history.
pub async fn queue_html(
    axum::extract::State(console): State,
    caller: Who,
    Path(name): Path<String>,
    Query(query): Query<RangeQuery>,
) -> PageResult {
    if let Some(redirect) = sign_in_first(&caller, &format!("/queues/{name}")) {
        return Ok(redirect);
    }
    let range = Range::of(&query)?;
    let page = queue_page(&console, &name, range).await?;
    render(
        &console,
        &caller,
        "queue.html",
        minijinja::context! { q => Value::from_serialize(&page), history => page.history.view() },
    )
}

/// `/api/queues/{name}?range=`: the same as JSON.
pub async fn queue_api(
    axum::extract::State(console): State,
    caller: Who,
    Path(name): Path<String>,
    Query(query): Query<RangeQuery>,
) -> PageResult {
    may_read_api(&caller)?;
    let range = Range::of(&query).map_err(Problem::json)?;
    let page = queue_page(&console, &name, range)
        .await
        .map_err(Problem::json)?;
    Ok(Json(page).into_response())
}
