//! The console's pages: minijinja templates compiled into the binary (`templates/`), every
//! value HTML-escaped, and the few filters they use to show times, ages and sizes.

use chrono::{DateTime, Utc};
use minijinja::{AutoEscape, Environment, Value};

/// Every page, by name: a template each, on `base.html`.
const TEMPLATES: &[(&str, &str)] = &[
    ("base.html", include_str!("templates/base.html")),
    ("macros.html", include_str!("templates/macros.html")),
    ("overview.html", include_str!("templates/overview.html")),
    ("groups.html", include_str!("templates/groups.html")),
    ("messages.html", include_str!("templates/messages.html")),
    (
        "dead_letter.html",
        include_str!("templates/dead_letter.html"),
    ),
    ("confirm.html", include_str!("templates/confirm.html")),
    ("action.html", include_str!("templates/action.html")),
    ("actions.html", include_str!("templates/actions.html")),
    ("job.html", include_str!("templates/job.html")),
    ("outbox.html", include_str!("templates/outbox.html")),
    ("sign_in.html", include_str!("templates/sign_in.html")),
    ("accounts.html", include_str!("templates/accounts.html")),
    ("privacy.html", include_str!("templates/privacy.html")),
    (
        "outbox_confirm.html",
        include_str!("templates/outbox_confirm.html"),
    ),
    ("problem.html", include_str!("templates/problem.html")),
    ("mails.html", include_str!("templates/mails.html")),
    ("audit_log.html", include_str!("templates/audit_log.html")),
    ("mail.html", include_str!("templates/mail.html")),
    ("history.html", include_str!("templates/history.html")),
    ("queue.html", include_str!("templates/queue.html")),
    (
        "send_now_confirm.html",
        include_str!("templates/send_now_confirm.html"),
    ),
    (
        "outbound_mail.html",
        include_str!("templates/outbound_mail.html"),
    ),
    ("mail_edit.html", include_str!("templates/mail_edit.html")),
    (
        "mail_refused.html",
        include_str!("templates/mail_refused.html"),
    ),
    (
        "dead_letter_edit.html",
        include_str!("templates/dead_letter_edit.html"),
    ),
    ("fleet.html", include_str!("templates/fleet.html")),
];

/// The console's stylesheet, served as `/console.css` (the pages have no inline style).
pub const STYLESHEET: &str = include_str!("templates/console.css");

/// The compiled templates.
#[derive(Debug)]
pub struct Views {
    env: Environment<'static>,
}

impl Views {
    /// Compiles every template; a template that does not compile is a bug caught by the
    /// console's tests, reported here with its name and line.
    pub fn new() -> Result<Self, minijinja::Error> {
        let mut env = Environment::new();
        env.set_auto_escape_callback(|_| AutoEscape::Html);
        env.set_undefined_behavior(minijinja::UndefinedBehavior::Chainable);
        for (name, source) in TEMPLATES {
            env.add_template(name, source)?;
        }
        env.add_filter("ago", ago);
        env.add_filter("when", when);
        env.add_filter("seconds", seconds);
        env.add_filter("bytes", bytes);
        env.add_filter("cut", cut);
        Ok(Self { env })
    }

    /// Adds a filter the pages of one program need (the console's `shown_kind`, which reads
    /// the store's words): this crate knows no store.
    pub fn with_filter<N, F, Rv, Args>(mut self, name: N, f: F) -> Self
    where
        N: Into<std::borrow::Cow<'static, str>>,
        F: minijinja::functions::Function<Rv, Args>,
        Rv: minijinja::value::FunctionResult,
        Args: for<'a> minijinja::value::FunctionArgs<'a>,
    {
        self.env.add_filter(name, f);
        self
    }

    /// Renders page `name` with `context`.
    pub fn render(&self, name: &str, context: Value) -> Result<String, minijinja::Error> {
        self.env.get_template(name)?.render(context)
    }
}

fn parse(at: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(at)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// How long ago (or how soon) an RFC 3339 time is, in the largest unit that fits: `12 s
/// ago`, `3 min ago`, `in 40 s`. Anything else shows as it is; nothing shows as `-`.
fn ago(at: Option<String>) -> String {
    let Some(text) = at else {
        return "-".into();
    };
    let Some(at) = parse(&text) else {
        return text;
    };
    let secs = (Utc::now() - at).num_seconds();
    let span = human_span(secs.unsigned_abs());
    if secs >= 0 {
        format!("{span} ago")
    } else {
        format!("in {span}")
    }
}

fn human_span(secs: u64) -> String {
    match secs {
        0..=89 => format!("{secs} s"),
        90..=5399 => format!("{} min", (secs + 30) / 60),
        5400..=172_799 => format!("{} h", (secs + 1800) / 3600),
        _ => format!("{} days", (secs + 43_200) / 86_400),
    }
}

/// An RFC 3339 time as `2026-12-01 10:07:30 UTC`; nothing as `-`.
fn when(at: Option<String>) -> String {
    match at.as_deref().map(|t| (t, parse(t))) {
        Some((_, Some(at))) => at.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
        Some((text, None)) => text.to_string(),
        None => "-".into(),
    }
}

/// A number of seconds as `1h 2m 3s`; nothing as `-`.
fn seconds(secs: Option<f64>) -> String {
    match secs {
        Some(s) if s.is_finite() && s >= 0.0 => span(s.round() as u64),
        _ => "-".into(),
    }
}

/// A span in whole days and the rest (`90 days`, `1 day 12h`), since humantime counts in
/// months of 30.44 days, which no setting is written in (`90d` read back as
/// `2months 29days 2h 52m 48s`).
fn span(secs: u64) -> String {
    const DAY: u64 = 86_400;
    let (days, rest) = (secs / DAY, secs % DAY);
    let rest = humantime::format_duration(std::time::Duration::from_secs(rest)).to_string();
    match days {
        0 => rest,
        1 if secs.is_multiple_of(DAY) => "1 day".into(),
        1 => format!("1 day {rest}"),
        _ if secs.is_multiple_of(DAY) => format!("{days} days"),
        _ => format!("{days} days {rest}"),
    }
}

/// `text` cut to `chars` characters, with `…` when cut; nothing as empty.
fn cut(text: Option<String>, chars: usize) -> String {
    let Some(text) = text else {
        return String::new();
    };
    if text.chars().count() <= chars {
        return text;
    }
    let mut out: String = text.chars().take(chars).collect();
    out.push('…');
    out
}

/// A size in bytes as `512 B`, `3.2 KiB`, `1.5 MiB`.
fn bytes(n: Option<f64>) -> String {
    let Some(n) = n else {
        return "-".into();
    };
    if n < 1024.0 {
        format!("{n} B")
    } else if n < 1024.0 * 1024.0 {
        format!("{:.1} KiB", n / 1024.0)
    } else {
        format!("{:.1} MiB", n / (1024.0 * 1024.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_template_compiles() {
        Views::new().unwrap();
    }

    #[test]
    fn ages_read_in_the_largest_unit_that_fits() {
        assert_eq!(human_span(5), "5 s");
        assert_eq!(human_span(600), "10 min");
        assert_eq!(human_span(7200), "2 h");
        assert_eq!(human_span(3 * 86_400), "3 days");
        let soon = (Utc::now() + chrono::Duration::seconds(30)).to_rfc3339();
        assert!(ago(Some(soon)).starts_with("in "));
        assert_eq!(ago(None), "-");
    }

    #[test]
    fn values_in_a_page_are_escaped() {
        let views = Views::new().unwrap();
        let page = views
            .render(
                "problem.html",
                minijinja::context! { title => "x", problem => "<script>alert(1)</script>" },
            )
            .unwrap();
        assert!(!page.contains("<script>alert(1)"), "{page}");
        assert!(page.contains("&lt;script&gt;"), "{page}");
    }

    #[test]
    fn long_text_is_cut_with_an_ellipsis() {
        assert_eq!(cut(Some("abcdef".into()), 3), "abc…");
        assert_eq!(cut(Some("abc".into()), 3), "abc");
        assert_eq!(cut(None, 3), "");
    }

    #[test]
    fn sizes_and_durations_are_short() {
        assert_eq!(bytes(Some(512.0)), "512 B");
        assert_eq!(bytes(Some(2048.0)), "2.0 KiB");
        assert_eq!(seconds(Some(75.0)), "1m 15s");
        assert_eq!(when(None), "-");
    }

    #[test]
    fn a_span_of_days_reads_in_days_not_months() {
        assert_eq!(seconds(Some(90.0 * 86_400.0)), "90 days");
        assert_eq!(seconds(Some(86_400.0)), "1 day");
        assert_eq!(seconds(Some(129_600.0)), "1 day 12h");
        assert_eq!(seconds(Some(3.0 * 86_400.0 + 60.0)), "3 days 1m");
    }
}
