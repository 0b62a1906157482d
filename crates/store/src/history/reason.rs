//! The names failures are counted under: the runner's settled outcome, with the failure's
//! class where the outcome does not already say why. Fixed `&'static str`s, so that counting
//! one allocates nothing.

use worker_core::FailureClass;

/// A consumer's delivery parked in a retry tier after a failure of `class`.
pub const fn parked(class: FailureClass) -> &'static str {
    match class {
        FailureClass::Transient => "parked:transient",
        FailureClass::Permanent => "parked:permanent",
        FailureClass::Throttled => "parked:throttled",
        FailureClass::Malformed => "parked:malformed",
        FailureClass::Unavailable => "parked:unavailable",
    }
}

/// A timer's tick that failed with `class`.
pub const fn failed(class: FailureClass) -> &'static str {
    match class {
        FailureClass::Transient => "failed:transient",
        FailureClass::Permanent => "failed:permanent",
        FailureClass::Throttled => "failed:throttled",
        FailureClass::Malformed => "failed:malformed",
        FailureClass::Unavailable => "failed:unavailable",
    }
}

/// Every name above, and the runner's own outcomes that are failures.
pub const KNOWN: &[&str] = &[
    "parked:transient",
    "parked:permanent",
    "parked:throttled",
    "parked:malformed",
    "parked:unavailable",
    "failed:transient",
    "failed:permanent",
    "failed:throttled",
    "failed:malformed",
    "failed:unavailable",
    "dead-lettered:malformed",
    "dead-lettered:rejected",
    "dead-lettered:gave-up",
    "returned",
    "requeued",
    "abandoned",
    "cancelled",
];

/// `reason` as one of [`KNOWN`], or `other`.
pub fn known(reason: &str) -> &'static str {
    KNOWN
        .iter()
        .find(|k| **k == reason)
        .copied()
        .unwrap_or("other")
}
