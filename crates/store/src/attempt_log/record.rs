//! One row of the attempt log, as written and as read: [`AttemptRecord`], made from a try or a
//! tick, and the [`UnitInfo`] of the unit of work it belongs to.

use std::time::Duration;

use chrono::{DateTime, Utc};
use worker_core::{TickOutcome, TryRecord, WorkContext, truncate};

/// The longest error kept in a row, in bytes.
pub const ERROR_MAX: usize = 2048;

/// One row of the attempt log, owned, ready to write.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AttemptRecord {
    pub job: String,
    pub message_id: Option<String>,
    pub tick: Option<i64>,
    /// The attempt across parks (`x-attempt`), 1 for a tick.
    pub attempt: i32,
    /// The in-process try; 0 on a final outcome that stands for the whole delivery.
    pub try_number: i32,
    /// `succeeded`, `failed`, `cancelled` for a try; the runner's or the tick's outcome
    /// (`parked`, `dead-lettered:gave-up`, `failed`, `skipped-busy`...) for a final one.
    pub outcome: String,
    pub is_final: bool,
    pub failure_class: Option<String>,
    pub error: Option<String>,
    #[serde(rename = "duration_ms", serialize_with = "as_millis")]
    pub duration: Duration,
    pub at: DateTime<Utc>,
}

fn as_millis<S: serde::Serializer>(duration: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(duration.as_secs_f64() * 1000.0)
}

impl AttemptRecord {
    /// A try, as the retry loop reports it, of the unit described by `ctx` (message id,
    /// tick, delivery attempt), or of an unknown unit when `ctx` is `None`.
    pub fn from_try(record: &TryRecord<'_>, ctx: Option<&UnitInfo>) -> Self {
        Self {
            job: record.job.to_string(),
            message_id: ctx.and_then(|c| c.message_id.clone()),
            tick: ctx.and_then(|c| c.tick),
            attempt: ctx.map_or(1, |c| c.attempt),
            try_number: to_i32(record.try_number),
            outcome: record.outcome.as_str().to_string(),
            is_final: false,
            failure_class: record.failure.map(|f| f.class().as_str().to_string()),
            error: record
                .failure
                .map(|f| truncate(&f.to_string(), ERROR_MAX).to_string()),
            duration: record.duration,
            at: Utc::now(),
        }
    }

    /// The final outcome of a timer tick that ended at `ended`.
    pub fn from_tick(
        job: &str,
        tick: u64,
        outcome: &TickOutcome,
        duration: Duration,
        ended: DateTime<Utc>,
    ) -> Self {
        let failure = match outcome {
            TickOutcome::Failed(failure) => Some(failure),
            _ => None,
        };
        Self {
            job: job.to_string(),
            message_id: None,
            tick: Some(i64::try_from(tick).unwrap_or(i64::MAX)),
            attempt: 1,
            try_number: 1,
            outcome: outcome.as_str().to_string(),
            is_final: true,
            failure_class: failure.map(|f| f.class().as_str().to_string()),
            error: failure.map(|f| truncate(&f.to_string(), ERROR_MAX).to_string()),
            duration,
            at: ended,
        }
    }
}

/// What the attempt log needs to know about a unit of work beyond the [`TryRecord`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnitInfo {
    pub message_id: Option<String>,
    pub tick: Option<i64>,
    pub attempt: i32,
}

impl UnitInfo {
    pub fn of(ctx: &WorkContext) -> Self {
        Self {
            message_id: ctx.message_id.clone(),
            tick: ctx.tick.map(|t| i64::try_from(t).unwrap_or(i64::MAX)),
            attempt: to_i32(ctx.attempt),
        }
    }
}

pub(super) fn to_i32(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}
