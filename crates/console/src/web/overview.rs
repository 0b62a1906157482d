//! `/` and `/api/overview`: each job with its queue or schedule, state, last run, success
//! and error, counts and skips; each queue with its retry tiers and dead queue; the dead
//! letters waiting, the oldest one's age and the inflow; the outbox; the broker link and the
//! database probe; the active alerts; the open circuits; and every replica that reports in.

use std::collections::BTreeMap;

use axum::http::Uri;
use serde::Serialize;
use worker_store::{pauses, replicas};

use super::Console;
use super::caller::Who;
use super::page::{PageResult, Problem, State, may_read_api, render, sign_in_first};
use super::personal;
use crate::open_circuits::ShownCircuit;
use crate::runtime::{QueueReading, Runtime, pause_of};

#[derive(Debug, Serialize)]
struct DeadLetters {
    /// Waiting per queue: archived, plus still in the dead queue.
    by_queue: BTreeMap<String, u64>,
    waiting: u64,
    oldest_age_secs: Option<f64>,
    inflow_per_minute: u64,
}

#[derive(Debug, Serialize)]
struct Outbox {
    pending: u64,
    failed: u64,
    oldest_pending_secs: Option<f64>,
}

#[derive(Debug, Serialize)]
struct Overview {
    /// What `/status` shows: installation, start, broker, database, jobs, alerts.
    status: serde_json::Value,
    /// `/status`'s jobs, each with its state: `paused`, `circuit-open` (a dependency it
    /// cannot work without is not called), `failing` (its last error is newer than its last
    /// success), `idle` (not run yet) or `ok`.
    jobs: Vec<serde_json::Value>,
    db_latency_ms: Option<u128>,
    /// The timer jobs an operator paused, by name.
    paused: Vec<pauses::Pause>,
    /// The dependencies whose circuits are open, from the shared table.
    circuits: Vec<ShownCircuit>,
    queues: Vec<QueueReading>,
    dead_letters: DeadLetters,
    outbox: Outbox,
    stuck_work: BTreeMap<&'static str, u64>,
    replicas: Vec<replicas::Replica>,
    /// This replica's name, to mark it in the list.
    this_replica: String,
}

async fn overview(console: &Console) -> Result<Overview, Problem> {
    let readings = console.runtime.readings();
    let paused = pauses::list(&console.pool)
        .await
        .map_err(|e| Problem::failed("Reading the paused jobs", e))?;
    let replicas = replicas::list(&console.pool)
        .await
        .map_err(|e| Problem::failed("Reading the replicas", e))?;
    let circuits = super::circuits::open(console).await?;
    let status = console.runtime.status();
    let jobs = status["jobs"]
        .as_array()
        .map(|jobs| {
            jobs.iter()
                .map(|job| with_state(&*console.runtime, job, &paused, &circuits))
                .collect()
        })
        .unwrap_or_default();
    Ok(Overview {
        status,
        jobs,
        db_latency_ms: readings.db_latency.map(|d| d.as_millis()),
        paused,
        circuits,
        queues: readings.queues,
        dead_letters: DeadLetters {
            waiting: readings.dead_letter_depth.values().sum(),
            by_queue: readings.dead_letter_depth.clone(),
            oldest_age_secs: readings.oldest_dead_letter_age.map(|d| d.as_secs_f64()),
            inflow_per_minute: readings.dead_letter_inflow_per_minute,
        },
        outbox: Outbox {
            pending: readings.outbox_pending,
            failed: readings.outbox_failed,
            oldest_pending_secs: readings.outbox_oldest_pending.map(|d| d.as_secs_f64()),
        },
        stuck_work: readings.stuck_work,
        replicas,
        this_replica: console.replica.clone(),
    })
}

fn at(value: &serde_json::Value) -> Option<chrono::DateTime<chrono::Utc>> {
    value.as_str()?.parse().ok()
}

/// `job` (a `/status` entry) with its `state`.
fn with_state(
    runtime: &dyn Runtime,
    job: &serde_json::Value,
    paused: &[pauses::Pause],
    circuits: &[ShownCircuit],
) -> serde_json::Value {
    let counts = &job["counts"];
    let name = job["name"].as_str().unwrap_or_default();
    let pause = pause_of(runtime, paused, name);
    let circuit = circuits.iter().find(|c| c.job == Some(name));
    let state = if pause.is_some() {
        "paused"
    } else if circuit.is_some() {
        "circuit-open"
    } else {
        match (at(&counts["last_error_at"]), at(&counts["last_success"])) {
            (Some(error), Some(success)) if error > success => "failing",
            (Some(_), None) => "failing",
            (None, None) if counts["last_run"].is_null() => "idle",
            _ => "ok",
        }
    };
    let mut job = job.clone();
    job["state"] = state.into();
    // Who paused it, when and why, on the overview's row.
    job["pause"] = pause.map_or(serde_json::Value::Null, |p| serde_json::json!(p));
    // The open circuit that stops it (the first, when several do), on the overview's row.
    job["circuit"] = circuit.map_or(serde_json::Value::Null, |c| serde_json::json!(c));
    job
}

pub async fn page(
    axum::extract::State(console): State,
    caller: Who,
    uri: Uri,
    axum::extract::Query(query): axum::extract::Query<super::history::RangeQuery>,
) -> PageResult {
    if let Some(redirect) = sign_in_first(&caller, "/") {
        return Ok(redirect);
    }
    let range = super::history::Range::of(&query)?;
    let overview = overview(&console).await?;
    let history = super::history::overview(&console, range).await?;
    let (o, personal) = personal::for_page(&console, &caller, &uri, &overview).await?;
    render(
        &console,
        &caller,
        "overview.html",
        minijinja::context! {
            o,
            history => history.view(), personal,
        },
    )
}

pub async fn api(axum::extract::State(console): State, caller: Who, uri: Uri) -> PageResult {
    may_read_api(&caller)?;
    let overview = overview(&console).await.map_err(Problem::json)?;
    personal::for_api(&console, &caller, &uri, &overview).await
}
