//! Customers' personal data masked out of what a console page or API answer shows: every
//! e-mail address as `a***@example.com`, a sender's name as `A***`, and bodies (a mail's
//! text, a dead letter's bytes, an edit's diff) replaced by [`HIDDEN`]. It works on the JSON
//! a page is rendered from, so a field added later is masked by the same rules: an address is
//! found by its shape wherever it is, a body by its field's name.

use std::sync::LazyLock;

use regex::Regex;
use serde_json::{Map, Value};

/// What stands in place of a body.
pub const HIDDEN: &str = "[hidden: personal data]";

/// Fields that hold a body: their text goes whole, their sizes stay.
const BODIES: &[&str] = &[
    "body",
    "body_text",
    "body_hex",
    "body_preview",
    "text_body",
    "html_body",
    "diff",
];

/// Fields that hold a person's name.
const NAMES: &[&str] = &["from_name"];

/// Fields left as they are: identifiers shaped like addresses (a Message-ID is
/// `<local@host>`), and the search form, which shows back what the caller typed.
const KEPT: &[&str] = &["message_id", "in_reply_to", "reference_ids", "form"];

static ADDRESS: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~.\-]+@[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)*")
        .unwrap_or_else(|e| unreachable!("a constant pattern: {e}"))
});

/// `alice.smith@example.com` as `a***@example.com`.
pub fn address(found: &str) -> String {
    match found.rsplit_once('@') {
        Some((local, domain)) => format!("{}***@{domain}", first_char(local)),
        None => format!("{}***", first_char(found)),
    }
}

/// A person's name as `A***`.
pub fn name(text: &str) -> String {
    format!("{}***", first_char(text))
}

fn first_char(text: &str) -> String {
    text.chars().next().map(String::from).unwrap_or_default()
}

/// Every address in `text` masked.
pub fn addresses_in(text: &str) -> String {
    ADDRESS
        .replace_all(text, |c: &regex::Captures<'_>| address(&c[0]))
        .into_owned()
}

/// `value` with its personal data masked.
pub fn masked(value: Value) -> Value {
    match value {
        Value::String(text) => Value::String(addresses_in(&text)),
        Value::Array(items) => Value::Array(items.into_iter().map(masked).collect()),
        Value::Object(fields) => Value::Object(
            fields
                .into_iter()
                .map(|(key, value)| {
                    let value = field(&key, value);
                    (key, value)
                })
                .collect::<Map<_, _>>(),
        ),
        other => other,
    }
}

fn field(key: &str, value: Value) -> Value {
    if KEPT.contains(&key) {
        value
    } else if BODIES.contains(&key) {
        hidden(value)
    } else if NAMES.contains(&key) {
        match value {
            Value::String(text) => Value::String(name(&text)),
            other => masked(other),
        }
    } else {
        masked(value)
    }
}

/// A body's text hidden; an object's numbers and flags (its size, whether it was cut) kept.
fn hidden(value: Value) -> Value {
    match value {
        Value::Null => Value::Null,
        Value::Object(fields) => Value::Object(
            fields
                .into_iter()
                .map(|(key, value)| {
                    let value = match value {
                        kept @ (Value::Number(_) | Value::Bool(_) | Value::Null) => kept,
                        _ => Value::String(HIDDEN.to_string()),
                    };
                    (key, value)
                })
                .collect(),
        ),
        _ => Value::String(HIDDEN.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_address_keeps_its_first_letter_and_its_domain() {
        assert_eq!(address("alice.smith@example.com"), "a***@example.com");
        assert_eq!(addresses_in("to fail-x1@localhost"), "to f***@localhost");
        assert_eq!(
            addresses_in("550 5.1.1 <bob@shop.example.ro>: no such user"),
            "550 5.1.1 <b***@shop.example.ro>: no such user"
        );
    }

    #[test]
    fn addresses_are_masked_wherever_they_are() {
        let shown = masked(json!({
            "to_addresses": ["carol@example.com"],
            "steps": [{ "text": "an answer was sent to dan@example.org" }],
            "count": 3,
        }));
        assert_eq!(
            shown,
            json!({
                "to_addresses": ["c***@example.com"],
                "steps": [{ "text": "an answer was sent to d***@example.org" }],
                "count": 3,
            })
        );
    }

    #[test]
    fn bodies_go_but_their_sizes_stay() {
        let shown = masked(json!({
            "text_body": "Hello, my parcel is late",
            "body": { "text": "{\"to\":\"x\"}", "hex": null, "bytes": 10, "cut": false },
            "body_preview": "{\"to\":\"x\"}",
            "diff": [{ "field": "to", "before": "a", "after": "b" }],
        }));
        assert_eq!(shown["text_body"], HIDDEN);
        assert_eq!(
            shown["body"],
            json!({ "text": HIDDEN, "hex": null, "bytes": 10, "cut": false })
        );
        assert_eq!(shown["body_preview"], HIDDEN);
        assert_eq!(shown["diff"], HIDDEN);
    }

    #[test]
    fn a_body_of_bytes_goes_whole() {
        let shown = masked(json!({ "body": [104, 105] }));
        assert_eq!(shown["body"], HIDDEN);
    }

    #[test]
    fn message_ids_and_the_search_form_are_kept() {
        let shown = masked(json!({
            "message_id": "abc.123@mail.example.com",
            "form": { "to": "erin@example.com" },
            "from_name": "Erin Example",
        }));
        assert_eq!(shown["message_id"], "abc.123@mail.example.com");
        assert_eq!(shown["form"]["to"], "erin@example.com");
        assert_eq!(shown["from_name"], "E***");
    }
}
