//! `?range=`: the span a page's charts cover, the rollup it reads and its periods.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use worker_store::history::Resolution;

use crate::page::Problem;

/// `?range=`: which span the charts cover.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RangeQuery {
    pub range: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Range {
    Hour,
    Day,
    Week,
    Month,
}

impl Range {
    pub const ALL: [Self; 4] = [Self::Hour, Self::Day, Self::Week, Self::Month];

    /// The range a query asks for; a day when it names none.
    pub fn of(query: &RangeQuery) -> Result<Self, Problem> {
        match query.range.as_deref() {
            None | Some("") | Some("day") => Ok(Self::Day),
            Some("hour") => Ok(Self::Hour),
            Some("week") => Ok(Self::Week),
            Some("month") => Ok(Self::Month),
            Some(other) => Err(Problem::bad_request(format!(
                "range `{other}`: one of hour, day, week, month"
            ))),
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Self::Hour => "hour",
            Self::Day => "day",
            Self::Week => "week",
            Self::Month => "month",
        }
    }

    /// The rollup its periods come from, and how many periods it shows.
    pub const fn periods(self) -> (Resolution, i32) {
        match self {
            Self::Hour => (Resolution::Minute, 60),
            Self::Day => (Resolution::Hour, 24),
            Self::Week => (Resolution::Hour, 168),
            Self::Month => (Resolution::Day, 30),
        }
    }

    pub fn label(self, at: DateTime<Utc>) -> String {
        let format = match self {
            Self::Hour | Self::Day => "%H:%M",
            Self::Week => "%a %H:%M",
            Self::Month => "%b %d",
        };
        at.format(format).to_string()
    }

    /// The periods' starts, oldest first, ending with the one now is in.
    pub fn starts(self, now: DateTime<Utc>) -> Vec<DateTime<Utc>> {
        let (resolution, n) = self.periods();
        let last = resolution.start_of(now);
        (0..n)
            .rev()
            .map(|back| last - resolution.span() * back)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_week_is_168_hours_ending_with_the_one_now_is_in() {
        let now: DateTime<Utc> = "2026-12-07T10:42:00Z".parse().unwrap();
        let starts = Range::Week.starts(now);
        assert_eq!(starts.len(), 168);
        assert_eq!(
            starts.last().unwrap().to_rfc3339(),
            "2026-12-07T10:00:00+00:00"
        );
        assert_eq!(starts[0].to_rfc3339(), "2026-11-30T11:00:00+00:00");
        assert_eq!(Range::Hour.starts(now).len(), 60);
        assert!(
            Range::of(&RangeQuery {
                range: Some("year".into())
            })
            .is_err()
        );
    }
}
