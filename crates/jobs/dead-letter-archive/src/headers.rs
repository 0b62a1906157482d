//! Dead letters' headers as JSON, for operators to read and for a replay to turn back into
//! AMQP, and what PostgreSQL cannot hold (NUL) kept out of text and jsonb.

use chrono::{DateTime, SecondsFormat};
use serde_json::{Map, Value};
use worker_broker::{HeaderValue, Headers};
use worker_store::dead_letters::hex;

/// Headers as an operator reads them: strings as strings, numbers as numbers, byte strings
/// that are not UTF-8 as `{"hex": "…"}`, timestamps as RFC 3339 strings.
pub fn table_to_json(table: &Headers) -> Value {
    Value::Object(
        table
            .iter()
            .map(|(k, v)| (scrub_str(k), value_to_json(v)))
            .collect(),
    )
}

fn value_to_json(v: &HeaderValue) -> Value {
    match v {
        HeaderValue::Bool(b) => Value::Bool(*b),
        HeaderValue::I8(n) => (*n).into(),
        HeaderValue::U8(n) => (*n).into(),
        HeaderValue::I16(n) => (*n).into(),
        HeaderValue::U16(n) => (*n).into(),
        HeaderValue::I32(n) => (*n).into(),
        HeaderValue::U32(n) => (*n).into(),
        HeaderValue::I64(n) => (*n).into(),
        HeaderValue::F32(f) => serde_json::Number::from_f64(f64::from(*f))
            .map(Value::Number)
            .unwrap_or(Value::Null),
        HeaderValue::F64(f) => serde_json::Number::from_f64(*f)
            .map(Value::Number)
            .unwrap_or(Value::Null),
        HeaderValue::Decimal { scale, value } => {
            serde_json::json!({"decimal": value, "scale": scale})
        }
        HeaderValue::ShortString(s) => Value::String(scrub_str(s)),
        HeaderValue::LongString(s) => bytes_to_json(s),
        HeaderValue::Array(a) => Value::Array(a.iter().map(value_to_json).collect()),
        HeaderValue::Timestamp(t) => i64::try_from(*t)
            .ok()
            .and_then(|s| DateTime::from_timestamp(s, 0))
            .map(|t| Value::String(t.to_rfc3339_opts(SecondsFormat::Secs, true)))
            .unwrap_or_else(|| (*t).into()),
        HeaderValue::Table(t) => table_to_json(t),
        HeaderValue::Bytes(b) => serde_json::json!({"hex": hex(b)}),
        HeaderValue::Void => Value::Null,
    }
}

fn bytes_to_json(bytes: &[u8]) -> Value {
    match std::str::from_utf8(bytes) {
        Ok(s) => Value::String(scrub_str(s)),
        Err(_) => serde_json::json!({"hex": hex(bytes)}),
    }
}

/// Readable JSON headers back to AMQP, for a row whose exact headers could not be kept (and
/// for outbox rows, whose headers are JSON to begin with); see
/// [`worker_broker::headers_from_json`].
pub fn json_to_table(headers: &Value) -> Headers {
    worker_broker::headers_from_json(headers)
}

/// PostgreSQL text and jsonb cannot hold NUL: it becomes U+FFFD.
pub(crate) fn scrub_str(s: &str) -> String {
    if s.contains('\0') {
        s.replace('\0', "\u{FFFD}")
    } else {
        s.to_string()
    }
}

/// Whether a JSON value holds a NUL anywhere (jsonb would refuse it).
pub(crate) fn contains_nul(v: &Value) -> bool {
    match v {
        Value::String(s) => s.contains('\0'),
        Value::Array(a) => a.iter().any(contains_nul),
        Value::Object(o) => o.iter().any(|(k, v)| k.contains('\0') || contains_nul(v)),
        _ => false,
    }
}

/// A JSON value with every NUL in its strings and keys replaced.
pub(crate) fn scrub_json(v: Value) -> Value {
    match v {
        Value::String(s) => Value::String(scrub_str(&s)),
        Value::Array(a) => Value::Array(a.into_iter().map(scrub_json).collect()),
        Value::Object(o) => Value::Object(
            o.into_iter()
                .map(|(k, v)| (scrub_str(&k), scrub_json(v)))
                .collect::<Map<String, Value>>(),
        ),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> HeaderValue {
        HeaderValue::text(v)
    }

    #[test]
    fn json_headers_back_to_amqp() {
        let t =
            json_to_table(&serde_json::json!({"a": "x", "n": 3, "f": 1.5, "b": true, "z": null}));
        assert_eq!(t.get("a"), Some(&s("x")));
        assert_eq!(t.get("n"), Some(&HeaderValue::I64(3)));
        assert_eq!(t.get("f"), Some(&HeaderValue::F64(1.5)));
        assert_eq!(t.get("b"), Some(&HeaderValue::Bool(true)));
        assert_eq!(t.get("z"), Some(&HeaderValue::Void));
    }
}
