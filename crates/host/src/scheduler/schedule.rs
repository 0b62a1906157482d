//! Timer schedules: when each timer job ticks.
//!
//! Every schedule runs as a cron expression with a seconds field, because the ticker that fires
//! it is tokio-cron-scheduler's cron job (see [`crate::scheduler`]). An `every <duration>`
//! schedule is therefore only accepted when it fits the clock's grid: a whole number of
//! seconds, minutes or hours that divides the next unit, or one day. Anything else would tick
//! at uneven intervals once turned into cron, so it is refused when the settings load rather
//! than run subtly wrong.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use croner::Cron;
use croner::parser::{CronParser, Seconds};
use serde::{Deserialize, Serialize};

/// When a timer job ticks: `every 5s` (an interval that fits the clock, see
/// [`every_as_cron`]) or a cron expression with optional seconds (`0 */5 * * * *`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Schedule {
    Every(Duration),
    Cron(String),
}

/// What an `every` interval may be, for the message that refuses one.
const ALLOWED_EVERY: &str = "1, 2, 3, 4, 5, 6, 10, 12, 15, 20 or 30 seconds (`every 5s`), \
     the same numbers of minutes (`every 10m`), 1, 2, 3, 4, 6, 8 or 12 hours (`every 6h`), or \
     `every 1d`; sub-second intervals are not supported; write a cron expression for anything \
     else";

impl Schedule {
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if let Some(interval) = text.strip_prefix("every ") {
            let every = humantime::parse_duration(interval.trim()).map_err(|e| {
                format!("`{text}`: the interval is not a duration like `5s` or `2m` ({e})")
            })?;
            every_as_cron(every).map_err(|problem| format!("`{text}`: {problem}"))?;
            return Ok(Self::Every(every));
        }
        parse_cron(text)
            .map(|_| Self::Cron(text.to_string()))
            .map_err(|e| {
                format!("`{text}` is neither `every <duration>` nor a valid cron expression: {e}")
            })
    }

    /// The six-field cron expression the ticker runs.
    pub fn cron(&self) -> Result<String, String> {
        match self {
            Self::Every(every) => every_as_cron(*every),
            Self::Cron(expression) => Ok(with_seconds(expression)),
        }
    }

    /// An interval ticks once as soon as its job starts (the outbox drain and the poller
    /// should not wait a whole period after a restart); a cron expression names its moments
    /// and waits for the first.
    pub fn ticks_at_start(&self) -> bool {
        matches!(self, Self::Every(_))
    }

    /// The first moment after `after` that the ticker fires; `None` for a schedule that never
    /// fires again (or one that failed validation).
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let cron = parse_cron(&self.cron().ok()?).ok()?;
        cron.find_next_occurrence(&after, false).ok()
    }

    /// The schedule's period: an interval's own, and for a cron expression the gap between
    /// its next two moments (a nominal figure for a schedule that is uneven, like "weekdays
    /// at 9").
    pub fn interval(&self) -> Option<Duration> {
        match self {
            Self::Every(every) => Some(*every),
            Self::Cron(_) => {
                let first = self.next_after(Utc::now())?;
                let second = self.next_after(first)?;
                (second - first).to_std().ok()
            }
        }
    }
}

/// The cron expression (with seconds) that ticks every `every`, on the clock's grid: `every 5s`
/// ticks at :00, :05, :10 … of each minute. Refuses, with the allowed intervals, an interval
/// that does not divide its next unit (it would tick unevenly at each wrap) and sub-second
/// ones (the ticker's resolution is a second).
pub fn every_as_cron(every: Duration) -> Result<String, String> {
    let refuse = |what: &str| Err(format!("{what}; an interval may be {ALLOWED_EVERY}"));
    if every.is_zero() {
        return refuse("the interval must be longer than zero");
    }
    if every.subsec_nanos() != 0 {
        return refuse("the interval must be a whole number of seconds");
    }
    let step = |n: u64| {
        if n == 1 {
            "*".to_string()
        } else {
            format!("*/{n}")
        }
    };
    let divides = |n: u64, unit: u64| n > 0 && n < unit && unit.is_multiple_of(n);
    let seconds = every.as_secs();
    if divides(seconds, 60) {
        return Ok(format!("{} * * * * *", step(seconds)));
    }
    if seconds.is_multiple_of(60) && divides(seconds / 60, 60) {
        return Ok(format!("0 {} * * * *", step(seconds / 60)));
    }
    if seconds.is_multiple_of(3600) && divides(seconds / 3600, 24) {
        return Ok(format!("0 0 {} * * *", step(seconds / 3600)));
    }
    if seconds == 86_400 {
        return Ok("0 0 0 * * *".to_string());
    }
    refuse("the interval does not fit the clock")
}

/// Parses a cron expression with five or six fields (seconds optional), read exactly as the
/// ticker reads it: seconds first, and a day-of-month and a day-of-week both given must both
/// match (tokio-cron-scheduler parses with croner's `dom_and_dow`).
pub fn parse_cron(expression: &str) -> Result<Cron, croner::errors::CronError> {
    CronParser::builder()
        .seconds(Seconds::Required)
        .dom_and_dow(true)
        .build()
        .parse(&with_seconds(expression))
}

/// A five-field expression gains a leading `0` seconds field; the ticker requires six.
fn with_seconds(expression: &str) -> String {
    let expression = expression.trim();
    if expression.split_whitespace().count() == 5 {
        format!("0 {expression}")
    } else {
        expression.to_string()
    }
}

/// How many moments of `cron` in `(after, now]` were not the one fired at `now`: the ticks a
/// late ticker passed over. Returns them and the moment fired, the `after` of the next call.
/// Bounded, so that a process suspended for days does not walk every second of them.
pub fn passed_over(cron: &Cron, after: DateTime<Utc>, now: DateTime<Utc>) -> (u64, DateTime<Utc>) {
    const MOST: u64 = 100_000;
    let mut last = after;
    let mut due = 0;
    while due < MOST {
        match cron.find_next_occurrence(&last, false) {
            Ok(next) if next <= now => {
                last = next;
                due += 1;
            }
            _ => break,
        }
    }
    (due.saturating_sub(1), last)
}

impl TryFrom<String> for Schedule {
    type Error = String;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(&value)
    }
}

impl From<Schedule> for String {
    fn from(schedule: Schedule) -> Self {
        schedule.to_string()
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Every(every) => write!(f, "every {}", humantime::format_duration(*every)),
            Self::Cron(expr) => f.write_str(expr),
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::Datelike;

    use super::*;

    #[test]
    fn five_and_six_field_expressions_parse_and_nonsense_does_not() {
        assert!(parse_cron("*/5 * * * *").is_ok());
        assert!(parse_cron("0 */5 * * * *").is_ok());
        assert!(parse_cron("every five minutes").is_err());
        assert!(parse_cron("61 * * * *").is_err());
    }

    #[test]
    fn the_next_run_is_the_next_moment_the_ticker_fires() {
        let at = |text: &str| {
            DateTime::parse_from_rfc3339(text)
                .unwrap()
                .with_timezone(&Utc)
        };
        let every = Schedule::parse("every 5m").unwrap();
        assert_eq!(
            every.next_after(at("2026-12-01T10:07:30Z")),
            Some(at("2026-12-01T10:10:00Z"))
        );
        let nightly = Schedule::parse("0 3 * * *").unwrap();
        assert_eq!(
            nightly.next_after(at("2026-12-01T10:07:30Z")),
            Some(at("2026-12-02T03:00:00Z"))
        );
    }

    #[test]
    fn a_five_field_expression_runs_at_second_zero() {
        let schedule = Schedule::parse("*/5 * * * *").unwrap();
        assert_eq!(schedule.cron().unwrap(), "0 */5 * * * *");
        assert_eq!(schedule.to_string(), "*/5 * * * *");
    }

    #[test]
    fn intervals_that_fit_the_clock_map_onto_cron() {
        let cases = [
            (1, "* * * * * *"),
            (5, "*/5 * * * * *"),
            (30, "*/30 * * * * *"),
            (60, "0 * * * * *"),
            (120, "0 */2 * * * *"),
            (600, "0 */10 * * * *"),
            (1800, "0 */30 * * * *"),
            (3600, "0 0 * * * *"),
            (6 * 3600, "0 0 */6 * * *"),
            (12 * 3600, "0 0 */12 * * *"),
            (86_400, "0 0 0 * * *"),
        ];
        for (seconds, expected) in cases {
            let cron = every_as_cron(Duration::from_secs(seconds)).unwrap();
            assert_eq!(cron, expected, "every {seconds}s");
            assert!(parse_cron(&cron).is_ok(), "{cron}");
        }
    }

    #[test]
    fn intervals_that_do_not_fit_the_clock_are_refused_with_what_is_allowed() {
        for text in [
            "every 500ms",
            "every 1500ms",
            "every 0s",
            "every 7s",
            "every 90s",
            "every 45m",
            "every 5h",
            "every 2d",
        ] {
            let problem = Schedule::parse(text).unwrap_err();
            assert!(problem.starts_with(&format!("`{text}`: ")), "{problem}");
            assert!(problem.contains("an interval may be 1, 2, 3"), "{problem}");
            assert!(problem.contains("sub-second"), "{problem}");
        }
        assert!(
            Schedule::parse("every 500ms")
                .unwrap_err()
                .contains("whole number of seconds")
        );
    }

    #[test]
    fn an_interval_displays_as_written_and_reads_back() {
        for text in [
            "every 1s",
            "every 5s",
            "every 10m",
            "every 1h",
            "every 1day",
        ] {
            let schedule = Schedule::parse(text).unwrap();
            assert_eq!(Schedule::parse(&schedule.to_string()).unwrap(), schedule);
        }
        assert_eq!(Schedule::parse("every 5s").unwrap().to_string(), "every 5s");
        assert_eq!(Schedule::parse("every 2m").unwrap().to_string(), "every 2m");
    }

    #[test]
    fn day_of_month_and_day_of_week_both_given_must_both_match() {
        // 1 June 2026 is a Monday; 1 July 2026 is a Wednesday.
        let cron = parse_cron("0 0 0 1 * MON").unwrap();
        let after = "2026-05-31T00:00:00Z".parse::<DateTime<Utc>>().unwrap();
        let next = cron.find_next_occurrence(&after, false).unwrap();
        assert_eq!(next.to_rfc3339(), "2026-06-01T00:00:00+00:00");
        // Read as "the 1st or a Monday" it would be 8 June; both must match.
        let next = cron.find_next_occurrence(&next, false).unwrap();
        assert_eq!(
            (next.day(), next.weekday()),
            (1, chrono::Weekday::Mon),
            "{next}"
        );
    }

    #[test]
    fn a_late_ticker_passes_over_the_moments_between_its_fires() {
        let cron = parse_cron("* * * * * *").unwrap();
        let at = |s: &str| s.parse::<DateTime<Utc>>().unwrap();
        // On time, even half a second late: nothing passed over.
        let (missed, fired) = passed_over(
            &cron,
            at("2026-01-01T00:00:00Z"),
            at("2026-01-01T00:00:01.4Z"),
        );
        assert_eq!((missed, fired), (0, at("2026-01-01T00:00:01Z")));
        // Starved for 30 s: 29 moments passed over, the 30th fires.
        let (missed, fired) = passed_over(&cron, fired, at("2026-01-01T00:00:31.2Z"));
        assert_eq!((missed, fired), (29, at("2026-01-01T00:00:31Z")));
        // Fired again before the next moment (the fire is attributed, not counted twice).
        assert_eq!(
            passed_over(&cron, fired, at("2026-01-01T00:00:31.9Z")),
            (0, fired)
        );
    }
}
