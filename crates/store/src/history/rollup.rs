//! A row of the rollups and how rows add up: a replica's minute into what other replicas
//! wrote, minutes into an hour, hours into a day. Pure; the statements are in `store.rs`.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration as Span, DurationRound, Utc};
use serde::{Deserialize, Serialize};

use super::buckets;

/// The three rollups, finest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Resolution {
    Minute,
    Hour,
    Day,
}

impl Resolution {
    pub const ALL: [Self; 3] = [Self::Minute, Self::Hour, Self::Day];

    pub const fn table(self) -> &'static str {
        match self {
            Self::Minute => "history_minutes",
            Self::Hour => "history_hours",
            Self::Day => "history_days",
        }
    }

    /// The length of one period.
    pub fn span(self) -> Span {
        match self {
            Self::Minute => Span::minutes(1),
            Self::Hour => Span::hours(1),
            Self::Day => Span::days(1),
        }
    }

    /// The start of the period `at` falls in (UTC).
    pub fn start_of(self, at: DateTime<Utc>) -> DateTime<Utc> {
        at.duration_trunc(self.span()).unwrap_or(at)
    }

    /// The finer rollup this one is made from.
    pub const fn finer(self) -> Option<Self> {
        match self {
            Self::Minute => None,
            Self::Hour => Some(Self::Minute),
            Self::Day => Some(Self::Hour),
        }
    }
}

/// One gauge over a period: the sum of its readings (the mean is `sum / samples`) and the
/// highest one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Gauge {
    pub sum: i64,
    pub max: i64,
}

/// One row of a rollup: a job's units, failures and durations, or a queue's or the outbox's
/// gauges, over the period starting `at`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct HistoryRow {
    /// `job`, `queue` or `outbox`.
    pub series: String,
    pub name: String,
    pub at: DateTime<Utc>,
    pub units: i64,
    pub failures: BTreeMap<String, i64>,
    /// Counts per bucket of [`buckets::BOUNDS_MS`].
    pub durations: Vec<i64>,
    /// Gauge readings taken in the period.
    pub samples: i32,
    pub gauges: BTreeMap<String, Gauge>,
}

impl HistoryRow {
    /// Adds `other` (the same series and name) into this row.
    pub fn absorb(&mut self, other: &HistoryRow) {
        self.units += other.units;
        for (reason, count) in &other.failures {
            *self.failures.entry(reason.clone()).or_default() += count;
        }
        buckets::merge(&mut self.durations, &other.durations);
        self.samples += other.samples;
        for (name, gauge) in &other.gauges {
            let into = self.gauges.entry(name.clone()).or_default();
            into.sum += gauge.sum;
            into.max = into.max.max(gauge.max);
        }
    }

    /// Failures over every reason.
    pub fn failed(&self) -> i64 {
        self.failures.values().sum()
    }

    /// The mean of gauge `name` over the period's readings.
    pub fn mean(&self, name: &str) -> Option<f64> {
        let gauge = self.gauges.get(name)?;
        (self.samples > 0).then(|| gauge.sum as f64 / f64::from(self.samples))
    }
}

/// The rows of `resolution` made from `finer` rows: each series and name summed over each
/// period of `resolution`, at the period's start.
pub fn roll_up(finer: &[HistoryRow], resolution: Resolution) -> Vec<HistoryRow> {
    let mut out: BTreeMap<(String, String, DateTime<Utc>), HistoryRow> = BTreeMap::new();
    for row in finer {
        let at = resolution.start_of(row.at);
        out.entry((row.series.clone(), row.name.clone(), at))
            .or_insert_with(|| HistoryRow {
                series: row.series.clone(),
                name: row.name.clone(),
                at,
                ..HistoryRow::default()
            })
            .absorb(row);
    }
    out.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn minute(h: u32, m: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 7, h, m, 0).unwrap()
    }

    fn job(at: DateTime<Utc>, units: i64, parked: i64, fast: i64) -> HistoryRow {
        let mut durations = vec![0; buckets::BUCKETS];
        durations[0] = fast;
        durations[9] = units - fast;
        HistoryRow {
            series: "job".into(),
            name: "email-send".into(),
            at,
            units,
            failures: BTreeMap::from([("parked:transient".to_string(), parked)]),
            durations,
            ..HistoryRow::default()
        }
    }

    fn queue(at: DateTime<Utc>, depth: i64) -> HistoryRow {
        HistoryRow {
            series: "queue".into(),
            name: "email.send".into(),
            at,
            samples: 1,
            gauges: BTreeMap::from([(
                "depth".to_string(),
                Gauge {
                    sum: depth,
                    max: depth,
                },
            )]),
            ..HistoryRow::default()
        }
    }

    #[test]
    fn minutes_roll_up_into_their_hour() {
        let rows = vec![
            job(minute(10, 0), 10, 1, 10),
            job(minute(10, 59), 5, 2, 0),
            job(minute(11, 0), 7, 0, 7),
        ];
        let hours = roll_up(&rows, Resolution::Hour);
        assert_eq!(hours.len(), 2);
        assert_eq!(hours[0].at, minute(10, 0));
        assert_eq!(hours[0].units, 15);
        assert_eq!(hours[0].failures["parked:transient"], 3);
        assert_eq!(hours[0].durations[0], 10);
        assert_eq!(hours[0].durations[9], 5);
        assert_eq!(hours[1].at, minute(11, 0));
        assert_eq!(hours[1].units, 7);
    }

    #[test]
    fn hours_roll_up_into_their_day_and_keep_the_totals_of_the_minutes() {
        let minutes: Vec<HistoryRow> = (0..24)
            .flat_map(|h| [job(minute(h, 0), 3, 1, 2), job(minute(h, 30), 1, 0, 1)])
            .collect();
        let hours = roll_up(&minutes, Resolution::Hour);
        assert_eq!(hours.len(), 24);
        let days = roll_up(&hours, Resolution::Day);
        let direct = roll_up(&minutes, Resolution::Day);
        assert_eq!(days, direct, "the way through hours changes nothing");
        assert_eq!(days.len(), 1);
        assert_eq!(days[0].units, 96);
        assert_eq!(days[0].failed(), 24);
        assert_eq!(days[0].durations.iter().sum::<i64>(), 96);
        assert_eq!(days[0].at, minute(0, 0));
    }

    #[test]
    fn gauges_roll_up_as_mean_and_peak() {
        let rows = vec![
            queue(minute(9, 1), 4),
            queue(minute(9, 2), 10),
            queue(minute(9, 3), 1),
        ];
        let hour = &roll_up(&rows, Resolution::Hour)[0];
        assert_eq!(hour.samples, 3);
        assert_eq!(hour.gauges["depth"], Gauge { sum: 15, max: 10 });
        assert_eq!(hour.mean("depth"), Some(5.0));
        let day = &roll_up(std::slice::from_ref(hour), Resolution::Day)[0];
        assert_eq!(day.mean("depth"), Some(5.0));
        assert_eq!(day.gauges["depth"].max, 10);
    }

    #[test]
    fn series_and_names_are_kept_apart() {
        let mut other = job(minute(10, 5), 1, 0, 1);
        other.name = "outbox-drain".into();
        let rows = vec![job(minute(10, 0), 2, 0, 2), other, queue(minute(10, 0), 3)];
        assert_eq!(roll_up(&rows, Resolution::Hour).len(), 3);
    }
}
