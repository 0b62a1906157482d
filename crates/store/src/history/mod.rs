//! The history behind the console's charts: per job its units of work, failures by reason
//! and durations; per queue its depth, its retry tiers and its dead letters; the outbox's
//! backlog and oldest pending row. Kept as rollups by minute (`history_minutes`), hour
//! (`history_hours`) and day (`history_days`), swept by the retention job.
//!
//! ## Who writes what
//!
//! * **Every replica** counts the units its jobs finish in a [`Tally`], in memory: a unit on
//!   the hot path is two atomic adds (and a short lock for a failure), never a statement.
//!   Once a minute the host drains it and [`flush`]es it into the minute rows with an
//!   additive upsert, so that several replicas add up in one row. Durations are counts in
//!   fixed [`buckets`]: they add up across replicas and periods, and the percentiles are read
//!   from them.
//! * **The replica that holds the `history` lease** writes the gauges it sampled into the
//!   minute rows ([`write`]), then recomputes the open and the last hour from their minutes
//!   and the open and the last day from their hours ([`roll_up_since`]); a recomputed row
//!   replaces the previous one, so a re-run or a late flush only makes it right.
//! * **The retention job** deletes each table's rows past their age ([`sweep_batch`]).

pub mod buckets;
pub mod reason;
mod rollup;
mod store;
mod tally;

pub use buckets::{BOUNDS_MS, BUCKETS, percentile, quantiles};
pub use rollup::{Gauge, HistoryRow, Resolution, roll_up};
pub use store::{Select, flush, read, roll_up_since, sweep_batch, write};
pub use tally::{JobCounts, JobTally, Tally};
