//! `baseline`: the loop with no fault.

use std::time::Duration;

use super::{DEFAULT_HEARTBEAT, Load, Scenario};

pub fn scenario() -> Scenario {
    Scenario {
        name: "baseline",
        about: "No fault: a steady stream of pings through the whole loop (SMTP in, IMAP poll, \
                trigger, action, SMTP out). The issue's figure is 10,000 messages; \
                `--baseline-messages N` sets another.",
        fault: None,
        full: Load {
            repetitions: 1,
            per_repetition: 10_000,
        },
        quick: Load {
            repetitions: 1,
            per_repetition: 100,
        },
        rate_per_sec: 20.0,
        settle: Duration::from_secs(120),
        heartbeat: DEFAULT_HEARTBEAT,
    }
}
