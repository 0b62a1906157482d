//! A template's output is bounded while it renders, not after: a loop that prints a large
//! field many times stops at the limit, and the render's memory stays near the limit.
//!
//! One test in its own binary, so that the process's peak RSS is this test's.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use job_automation_action::render::{MAX_BODY_BYTES, render_email};
use serde_json::json;
use worker_messages::SendEmailAction;

/// The process's resident set and its peak since the last reset, in KiB.
fn rss_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

#[test]
fn a_loop_over_a_large_field_stops_at_the_output_limit_while_rendering() {
    // A mail body of 10,000 characters (the poller keeps up to 100,000), printed in a loop
    // as often as the fuel allows: some hundreds of MB if rendered whole.
    let data = json!({ "from": "a@localhost", "subject": "s", "text": "t".repeat(10_000) });
    let action = SendEmailAction {
        to: vec!["{{ from }}".into()],
        cc: vec![],
        from: None,
        subject: "Re: {{ subject }}".into(),
        text: Some("{% for i in range(100000) %}{{ text }}{% endfor %}".into()),
        html: None,
        reply_headers: false,
        max_age: None,
    };
    let (before, _) = rss_kib();
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let started = std::time::Instant::now();
    let err = render_email(&action, &data).unwrap_err();
    let took = started.elapsed();
    let (_, peak) = rss_kib();
    println!("{err} in {took:?}; RSS before {before} KiB, peak {peak} KiB");

    assert_eq!(err.reason(), "too-large", "{err}");
    assert!(err.detail().contains("`text`"), "{err}");
    let grown = peak.saturating_sub(before);
    let bound = 4 * MAX_BODY_BYTES as u64 / 1024 + 16 * 1024;
    assert!(
        grown < bound,
        "the peak RSS grew by {grown} KiB while rendering, over {bound} KiB"
    );
    assert!(took < std::time::Duration::from_secs(10), "{took:?}");
}
