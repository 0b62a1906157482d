//! The windows an SMTP account's sends are counted in, and when the next send may go: pure,
//! given the time (the database's, so that every replica reads the same clock).
//!
//! The minute is a sliding log of its sends, exact: at most `messages_per_minute` in any 60 s.
//! The day is kept in 15-minute buckets (a log of 10,000 sends would be rewritten on every
//! send); a bucket counts until its *end* is a day old, so the day is never undercounted, at
//! the price of holding back up to a quarter of an hour's sends a little longer than needed.

use std::time::Duration;

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use serde::Serialize;

/// The sliding minute.
pub const MINUTE: Duration = Duration::from_secs(60);
/// The sliding day.
pub const DAY: Duration = Duration::from_secs(24 * 60 * 60);
/// The day's buckets.
pub const BUCKET: Duration = Duration::from_secs(15 * 60);
/// The fewest sends the minute's log keeps (more with a higher minute limit).
const MINUTE_LOG_FLOOR: usize = 1000;

/// How much one account may send; `None`: no limit of that kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Limits {
    pub messages_per_minute: Option<u32>,
    pub messages_per_day: Option<u32>,
    pub recipients_per_day: Option<u32>,
}

impl Limits {
    /// The limits in words (`30 messages a minute, 10000 recipients a day`; `no limit`).
    pub fn describe(&self) -> String {
        let parts: Vec<String> = [
            (self.messages_per_minute, "message", "a minute"),
            (self.messages_per_day, "message", "a day"),
            (self.recipients_per_day, "recipient", "a day"),
        ]
        .into_iter()
        .filter_map(|(limit, what, per)| limit.map(|n| in_words(n, what, per)))
        .collect();
        if parts.is_empty() {
            "no limit".into()
        } else {
            parts.join(", ")
        }
    }

    /// Whether any limit is set.
    pub fn any(&self) -> bool {
        self.messages_per_minute.is_some()
            || self.messages_per_day.is_some()
            || self.recipients_per_day.is_some()
    }
}

/// The day's sends of one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Bucket {
    pub start: DateTime<Utc>,
    pub messages: u32,
    pub recipients: u32,
}

/// What an account sent in its windows, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Windows {
    pub minute: Vec<DateTime<Utc>>,
    pub buckets: Vec<Bucket>,
}

/// What the windows hold now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub messages_this_minute: u32,
    pub messages_today: u32,
    pub recipients_today: u32,
}

/// Whether a mail may go now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Turn {
    Now,
    /// Not before `wait` has passed: `limit` names the limit that holds it back
    /// (`30 messages a minute`).
    After {
        wait: Duration,
        limit: String,
    },
}

fn delta(d: Duration) -> TimeDelta {
    TimeDelta::from_std(d).unwrap_or(TimeDelta::MAX)
}

fn until(at: DateTime<Utc>, now: DateTime<Utc>) -> Duration {
    (at - now).to_std().unwrap_or_default()
}

impl Windows {
    /// Drops what no longer counts at `now`.
    pub fn forget(&mut self, now: DateTime<Utc>) {
        let minute_ago = now - delta(MINUTE);
        self.minute.retain(|at| *at > minute_ago);
        let day_ago = now - delta(DAY);
        self.buckets
            .retain(|bucket| bucket.start + delta(BUCKET) > day_ago);
    }

    /// The sends that count at `now`.
    pub fn usage(&self, now: DateTime<Utc>) -> Usage {
        let mut windows = self.clone();
        windows.forget(now);
        Usage {
            messages_this_minute: count(windows.minute.len()),
            messages_today: windows.buckets.iter().map(|b| b.messages).sum(),
            recipients_today: windows.buckets.iter().map(|b| b.recipients).sum(),
        }
    }

    /// Whether a mail to `recipients` may go at `now` within `limits`, and if not, how long
    /// until it may (the longest of the limits' waits). A mail with more recipients than the
    /// day allows waits for an empty day, then goes: it could not go any sooner.
    pub fn turn(&self, limits: &Limits, recipients: u32, now: DateTime<Utc>) -> Turn {
        let mut windows = self.clone();
        windows.forget(now);
        let mut waits: Vec<(Duration, String)> = Vec::new();
        if let Some(limit) = limits.messages_per_minute {
            let sent = windows.minute.len();
            let limit_n = usize::try_from(limit).unwrap_or(usize::MAX);
            if sent >= limit_n {
                // The send whose ageing out leaves room for one more.
                let freeing = windows.minute.get(sent - limit_n).copied();
                let wait = freeing.map_or(MINUTE, |at| until(at + delta(MINUTE), now));
                waits.push((wait, in_words(limit, "message", "a minute")));
            }
        }
        if let Some(limit) = limits.messages_per_day {
            let wait = windows.day_wait(now, limit, 1, |b| b.messages);
            if let Some(wait) = wait {
                waits.push((wait, in_words(limit, "message", "a day")));
            }
        }
        if let Some(limit) = limits.recipients_per_day {
            let wanted = recipients.min(limit);
            if let Some(wait) = windows.day_wait(now, limit, wanted, |b| b.recipients) {
                waits.push((wait, in_words(limit, "recipient", "a day")));
            }
        }
        match waits.into_iter().max_by_key(|(wait, _)| *wait) {
            Some((wait, limit)) => Turn::After { wait, limit },
            None => Turn::Now,
        }
    }

    /// How long until `wanted` more fit under `limit` of what `of` counts; none: they fit now.
    fn day_wait(
        &self,
        now: DateTime<Utc>,
        limit: u32,
        wanted: u32,
        of: impl Fn(&Bucket) -> u32,
    ) -> Option<Duration> {
        let used: u32 = self.buckets.iter().map(&of).sum();
        let mut over = (used.saturating_add(wanted)).checked_sub(limit)?;
        if over == 0 {
            return None;
        }
        for bucket in &self.buckets {
            over = over.saturating_sub(of(bucket));
            if over == 0 {
                return Some(until(bucket.start + delta(BUCKET) + delta(DAY), now));
            }
        }
        Some(DAY)
    }

    /// Counts a mail to `recipients` sent at `now`.
    pub fn take(&mut self, recipients: u32, now: DateTime<Utc>, limits: &Limits) {
        self.forget(now);
        self.minute.push(now);
        // Never fewer than the limit, nor than MINUTE_LOG_FLOOR: a replica whose limit is lower
        // (settings changed one replica at a time) must not cut the others' log short.
        let keep = limits
            .messages_per_minute
            .and_then(|l| usize::try_from(l).ok())
            .unwrap_or(0)
            .max(MINUTE_LOG_FLOOR);
        if self.minute.len() > keep {
            let extra = self.minute.len() - keep;
            self.minute.drain(..extra);
        }
        let start = now.duration_trunc(delta(BUCKET)).unwrap_or(now);
        match self.buckets.last_mut() {
            Some(last) if last.start == start => {
                last.messages = last.messages.saturating_add(1);
                last.recipients = last.recipients.saturating_add(recipients);
            }
            _ => self.buckets.push(Bucket {
                start,
                messages: 1,
                recipients,
            }),
        }
    }

    /// When the window of `day` (else the minute) next lets a send out: when its oldest send
    /// ages out; none when it holds no send.
    pub fn rolls_over(&self, day: bool, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let mut windows = self.clone();
        windows.forget(now);
        if day {
            windows
                .buckets
                .first()
                .map(|b| b.start + delta(BUCKET) + delta(DAY))
        } else {
            windows.minute.first().map(|at| *at + delta(MINUTE))
        }
    }
}

/// `30 messages a minute`, `1 message a minute`.
fn in_words(n: u32, what: &str, per: &str) -> String {
    let s = if n == 1 { "" } else { "s" };
    format!("{n} {what}{s} {per}")
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap_or_default()
    }

    fn per_minute(n: u32) -> Limits {
        Limits {
            messages_per_minute: Some(n),
            ..Limits::default()
        }
    }

    #[test]
    fn thirty_a_minute_lets_thirty_go_then_waits_for_the_first_to_age_out() {
        let limits = per_minute(30);
        let mut windows = Windows::default();
        for i in 0..30 {
            assert_eq!(windows.turn(&limits, 1, at(i)), Turn::Now, "send {i}");
            windows.take(1, at(i), &limits);
        }
        match windows.turn(&limits, 1, at(30)) {
            Turn::After { wait, limit } => {
                assert_eq!(
                    wait,
                    Duration::from_secs(30),
                    "the first send ages out at 60 s"
                );
                assert_eq!(limit, "30 messages a minute");
            }
            Turn::Now => panic!("the 31st in a minute went"),
        }
        assert_eq!(windows.turn(&limits, 1, at(61)), Turn::Now);
    }

    #[test]
    fn no_sixty_seconds_hold_more_than_the_minutes_limit() {
        let limits = per_minute(5);
        let mut windows = Windows::default();
        let mut sent = Vec::new();
        for tick in 0..600 {
            let now = at(tick / 3);
            if windows.turn(&limits, 1, now) == Turn::Now {
                windows.take(1, now, &limits);
                sent.push(now);
            }
        }
        for first in &sent {
            let within = sent
                .iter()
                .filter(|t| **t >= *first && **t < *first + delta(MINUTE))
                .count();
            assert!(within <= 5, "{within} sends in the minute from {first}");
        }
    }

    #[test]
    fn the_days_recipients_wait_for_enough_of_them_to_age_out() {
        let limits = Limits {
            recipients_per_day: Some(10),
            ..Limits::default()
        };
        let mut windows = Windows::default();
        windows.take(6, at(0), &limits);
        windows.take(4, at(3600), &limits);
        assert_eq!(windows.usage(at(3601)).recipients_today, 10);
        let Turn::After { wait, limit } = windows.turn(&limits, 3, at(3601)) else {
            panic!("13 recipients in a day went");
        };
        assert_eq!(limit, "10 recipients a day");
        // The first bucket (started at or before 0, 15 minutes long) ages out a day after its end.
        let first = windows.buckets[0].start;
        assert_eq!(wait, until(first + delta(BUCKET) + delta(DAY), at(3601)));
        assert_eq!(
            windows.turn(&limits, 3, at(0) + delta(DAY + BUCKET)),
            Turn::Now
        );
    }

    #[test]
    fn the_days_messages_and_the_minute_each_hold_back_and_the_longer_wait_wins() {
        let limits = Limits {
            messages_per_minute: Some(2),
            messages_per_day: Some(2),
            recipients_per_day: None,
        };
        let mut windows = Windows::default();
        windows.take(1, at(0), &limits);
        windows.take(1, at(1), &limits);
        let Turn::After { wait, limit } = windows.turn(&limits, 1, at(2)) else {
            panic!("a third went");
        };
        assert_eq!(limit, "2 messages a day");
        assert!(wait > Duration::from_secs(23 * 3600), "{wait:?}");
        let usage = windows.usage(at(2));
        assert_eq!((usage.messages_this_minute, usage.messages_today), (2, 2));
        assert_eq!(windows.usage(at(120)).messages_this_minute, 0);
    }

    #[test]
    fn no_limit_never_waits() {
        let mut windows = Windows::default();
        for i in 0..100 {
            windows.take(50, at(i), &Limits::default());
        }
        assert_eq!(windows.turn(&Limits::default(), 50, at(100)), Turn::Now);
        assert_eq!(
            windows.rolls_over(false, at(100)),
            Some(at(41) + delta(MINUTE))
        );
    }
}
