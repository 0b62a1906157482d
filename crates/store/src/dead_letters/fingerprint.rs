//! Error fingerprints: one cause, one short id, however many ids and numbers its messages carry.
//!
//! [`normalize`] replaces what varies between two failures of the same cause with
//! placeholders, in this order (earlier rules keep later ones from eating their parts):
//!
//! | what | example | becomes |
//! |---|---|---|
//! | quoted strings (`'…'`, `"…"`, `` `…` ``) | `'orders.dead'` | `<str>` |
//! | timestamps (RFC 3339 / ISO 8601) | `2026-11-29T10:00:00.123Z` | `<ts>` |
//! | UUIDs | `6f1c…-…` | `<uuid>` |
//! | e-mail addresses | `ann@example.com` | `<email>` |
//! | IPv4 and `[IPv6]` addresses, with a port | `10.0.0.7:5432` | `<ip>` |
//! | hex ids: `0x…`, or 8+ hex digits mixing letters and digits | `deadbeef42` | `<hex>` |
//! | numbers (any run of digits, decimals too) | `order 1234`, `v2.5` | `<n>` |
//!
//! then collapses whitespace and cuts the text to [`NORMALIZED_MAX`] characters.
//! [`fingerprint`] is the first 12 hex digits of the SHA-256 of the normalized text. Both are
//! kept on each archived row, so that an operator can read what a fingerprint stands for.

use std::sync::LazyLock;

use regex::{Captures, Regex};
use sha2::{Digest, Sha256};

/// The longest normalized text kept, in characters.
pub const NORMALIZED_MAX: usize = 1000;

/// What a dead letter without any error text normalizes to.
pub const NO_ERROR: &str = "(no error recorded)";

struct Rule {
    pattern: Regex,
    placeholder: &'static str,
}

#[allow(clippy::expect_used)] // the patterns are constants, checked by the unit tests
fn rule(pattern: &str, placeholder: &'static str) -> Rule {
    Rule {
        pattern: Regex::new(pattern).expect("a valid constant pattern"),
        placeholder,
    }
}

static RULES: LazyLock<Vec<Rule>> = LazyLock::new(|| {
    vec![
        rule(r#""[^"]*"|'[^']*'|`[^`]*`"#, "<str>"),
        rule(
            r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?",
            "<ts>",
        ),
        rule(
            r"(?i)\b[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}\b",
            "<uuid>",
        ),
        rule(
            r"(?i)\b[a-z0-9._%+-]+@[a-z0-9-]+(?:\.[a-z0-9-]+)*\.[a-z]{2,}\b",
            "<email>",
        ),
        rule(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d{1,5})?\b", "<ip>"),
        rule(r"(?i)\[[0-9a-f:]*:[0-9a-f:.]*\](?::\d{1,5})?", "<ip>"),
        rule(r"(?i)\b0x[0-9a-f]+\b", "<hex>"),
    ]
});

#[allow(clippy::expect_used)]
static HEX_RUN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?i)\b[0-9a-f]{8,}\b").expect("a valid constant pattern"));

#[allow(clippy::expect_used)]
static NUMBER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\d+(?:\.\d+)*").expect("a valid constant pattern"));

#[allow(clippy::expect_used)]
static SPACES: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\s+").expect("a valid constant pattern"));

/// The error text with what varies between failures of one cause replaced by placeholders
/// (see the module docs). `None` or a blank text gives [`NO_ERROR`].
pub fn normalize(error: Option<&str>) -> String {
    let Some(error) = error.map(str::trim).filter(|e| !e.is_empty()) else {
        return NO_ERROR.to_string();
    };
    let mut text = error.to_string();
    for rule in RULES.iter() {
        text = rule
            .pattern
            .replace_all(&text, rule.placeholder)
            .into_owned();
    }
    // A run of hex letters only ("deadbeef", "effaced") is more likely a word than an id, and
    // a run of digits only is a number, whatever its length.
    text = HEX_RUN
        .replace_all(&text, |c: &Captures<'_>| {
            let run = &c[0];
            let digits = run.bytes().any(|b| b.is_ascii_digit());
            let letters = run.bytes().any(|b| b.is_ascii_alphabetic());
            if digits && letters {
                "<hex>".to_string()
            } else {
                run.to_string()
            }
        })
        .into_owned();
    text = NUMBER.replace_all(&text, "<n>").into_owned();
    text = SPACES.replace_all(&text, " ").into_owned();
    match text.char_indices().nth(NORMALIZED_MAX) {
        Some((cut, _)) => text[..cut].to_string(),
        None => text,
    }
}

/// The fingerprint of a normalized text: the first 12 hex digits of its SHA-256.
pub fn fingerprint_of_normalized(normalized: &str) -> String {
    let digest = Sha256::digest(normalized.as_bytes());
    hex(&digest[..6])
}

/// The normalized text of `error` and its fingerprint.
pub fn fingerprint(error: Option<&str>) -> (String, String) {
    let normalized = normalize(error);
    let fingerprint = fingerprint_of_normalized(&normalized);
    (fingerprint, normalized)
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_numbers_and_addresses_become_placeholders() {
        let cases = [
            (
                "order 6f1c2a9e-3b4d-4c5e-8f70-1a2b3c4d5e6f not found",
                "order <uuid> not found",
            ),
            (
                "mailbox ann.lee+x@example.co.uk is full",
                "mailbox <email> is full",
            ),
            (
                "connect to 10.0.0.7:5432 refused after 3 tries",
                "connect to <ip> refused after <n> tries",
            ),
            ("connect to [::1]:25 refused", "connect to <ip> refused"),
            (
                "object deadbeef0042 gone, ptr 0x7ffe",
                "object <hex> gone, ptr <hex>",
            ),
            ("no queue bound to 'orders.dead'", "no queue bound to <str>"),
            (
                "expired at 2026-11-29T10:00:00.123Z (took 1.5s)",
                "expired at <ts> (took <n>s)",
            ),
            ("   550   5.1.1  user\nunknown ", "<n> <n> user unknown"),
            (
                "the effaced deadbeef words stay",
                "the effaced deadbeef words stay",
            ),
            ("ids 1234567 and 12345678", "ids <n> and <n>"),
        ];
        for (raw, want) in cases {
            assert_eq!(normalize(Some(raw)), want, "{raw}");
        }
        assert_eq!(normalize(None), NO_ERROR);
        assert_eq!(normalize(Some("  ")), NO_ERROR);
    }

    #[test]
    fn one_cause_one_fingerprint_another_cause_another() {
        let (a, na) = fingerprint(Some(
            "smtp 550: mailbox ann@example.com unavailable (message 6f1c2a9e-3b4d-4c5e-8f70-1a2b3c4d5e6f, try 3)",
        ));
        let (b, nb) = fingerprint(Some(
            "smtp 550: mailbox bob@example.org unavailable (message 0a1b2c3d-0000-4c5e-8f70-ffffffffffff, try 12)",
        ));
        assert_eq!(a, b, "{na} / {nb}");
        assert_eq!(na, nb);
        assert_eq!(a.len(), 12);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));

        let (c, _) = fingerprint(Some(
            "smtp 421: service not available for ann@example.com (try 3)",
        ));
        assert_ne!(a, c, "a different cause has a different fingerprint");
        let (none, text) = fingerprint(None);
        assert_eq!(text, NO_ERROR);
        assert_ne!(none, a);
        // Stable across runs and builds: the fingerprint of a fixed text never changes.
        assert_eq!(fingerprint_of_normalized(""), "e3b0c44298fc");
    }

    #[test]
    fn long_errors_are_cut_on_a_character_boundary() {
        let long = "é".repeat(5000);
        let n = normalize(Some(&long));
        assert_eq!(n.chars().count(), NORMALIZED_MAX);
    }
}
