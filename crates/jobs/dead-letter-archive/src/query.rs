//! Reading the archive: `dlq list`, `dlq show`, `dlq show ID`, and the numbers behind the
//! dead-letter metrics and alerts. The readings are the store's
//! ([`worker_store::dead_letters`], which owns the table); what is the archive's own is how an
//! operator writes a time ([`parse_time`]).

use chrono::{DateTime, NaiveDateTime, TimeDelta, Utc};

pub use worker_store::dead_letters::{
    DEFAULT_SHOW_LIMIT, DeadLetter, DeadLetterSummary, Filter, FingerprintCount, OLDEST_AGE,
    PREVIEW_CHARS, QueueDepth, QueueSummary, SEARCH_BODY_BYTES, SEARCH_MAX_CHARS, Status,
    TOP_FINGERPRINTS, depth_by_queue, inflow_since, list, list_top, oldest_age, preview, show,
    show_one,
};

/// A time as an operator gives it for `since` or `until`, from the command line or the
/// console: RFC 3339, a browser's `datetime-local` value (taken as UTC), or an age before
/// `now` (`2h`, `30m`). The error names the text, not the parameter: each door names its own
/// (`--since`, `since:`).
pub fn parse_time(text: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>, String> {
    if let Ok(at) = DateTime::parse_from_rfc3339(text) {
        return Ok(at.with_timezone(&Utc));
    }
    for format in ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S"] {
        if let Ok(at) = NaiveDateTime::parse_from_str(text, format) {
            return Ok(at.and_utc());
        }
    }
    let age = humantime::parse_duration(text).map_err(|_| {
        format!("`{text}` is neither a time (2026-12-01T10:00:00Z) nor an age like `2h`")
    })?;
    // An age is anything humantime reads, up to hundreds of millennia: past chrono's range,
    // plain subtraction panics.
    TimeDelta::from_std(age)
        .ok()
        .and_then(|age| now.checked_sub_signed(age))
        .ok_or_else(|| format!("`{text}` reaches back further than any time that can be kept"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_come_as_rfc3339_browser_local_or_an_age() {
        let now = Utc::now();
        let rfc = parse_time("2026-12-01T10:00:00Z", now).unwrap();
        assert_eq!(parse_time("2026-12-01T10:00", now).unwrap(), rfc);
        assert_eq!(parse_time("2026-12-01T10:00:00", now).unwrap(), rfc);
        assert_eq!(
            parse_time("2h", now).unwrap(),
            now - TimeDelta::try_hours(2).unwrap()
        );
        let bad = parse_time("yesterday-ish", now).unwrap_err();
        assert!(bad.contains("`yesterday-ish`"), "{bad}");
    }

    #[test]
    fn an_age_past_the_range_of_time_is_an_error() {
        for age in ["300000y", "265000years", "100000000000000d"] {
            let bad = parse_time(age, Utc::now()).unwrap_err();
            assert!(bad.contains(age), "{bad}");
        }
        // The edge: the earliest time chrono keeps is still an answer.
        let now = DateTime::<Utc>::MIN_UTC + TimeDelta::try_hours(2).unwrap();
        assert_eq!(parse_time("2h", now).unwrap(), DateTime::<Utc>::MIN_UTC);
    }
}
