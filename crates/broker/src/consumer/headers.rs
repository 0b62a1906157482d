//! The headers the pipeline reads and writes, and the one reader of `x-attempt`.

use lapin::types::{AMQPValue, FieldTable};

/// The attempt across parks; absent on a first delivery, never on a dead letter.
pub const ATTEMPT_HEADER: &str = "x-attempt";
/// `malformed`, `rejected` or `gave-up`.
pub const DEAD_REASON_HEADER: &str = "x-dead-reason";
/// The attempts the message had when it died.
pub const DEAD_ATTEMPTS_HEADER: &str = "x-dead-attempts";
/// The last error, at most [`DEAD_ERROR_MAX`] bytes.
pub const DEAD_ERROR_HEADER: &str = "x-dead-error";
/// The failure class: `transient`, `permanent`, `throttled` or `malformed`.
pub const DEAD_CLASS_HEADER: &str = "x-dead-class";
/// The queue the message died in.
pub const DEAD_QUEUE_HEADER: &str = "x-dead-queue";
/// When it died, RFC 3339.
pub const DEAD_AT_HEADER: &str = "x-dead-at";
/// Bound on `x-dead-error`, so that a huge error cannot make a dead letter unpublishable.
pub const DEAD_ERROR_MAX: usize = 2048;

/// The message's schema version, set by its publisher (`worker_messages::SCHEMA_VERSION_HEADER`
/// names it for them; this crate knows no message type). Absent means version 1.
pub const SCHEMA_VERSION_HEADER: &str = "x-schema-version";

/// Reads `x-attempt`: missing is attempt 1; any AMQP integer type is read; anything else,
/// zero or a negative number is malformed, with why.
pub fn attempt_of(headers: Option<&FieldTable>) -> Result<u32, String> {
    positive_of(headers, ATTEMPT_HEADER, "attempt count")
}

/// Reads `x-schema-version`: missing is version 1 (what every message was before the header
/// existed); like `x-attempt`, any AMQP integer type is read and anything else, zero or a
/// negative number is malformed, with why.
pub fn schema_version_of(headers: Option<&FieldTable>) -> Result<u32, String> {
    positive_of(headers, SCHEMA_VERSION_HEADER, "schema version")
}

/// A positive integer header, 1 when it is missing.
fn positive_of(headers: Option<&FieldTable>, name: &str, what: &str) -> Result<u32, String> {
    let Some(value) = headers.and_then(|h| h.inner().get(name)) else {
        return Ok(1);
    };
    let n: i64 = match value {
        AMQPValue::ShortShortInt(v) => i64::from(*v),
        AMQPValue::ShortShortUInt(v) => i64::from(*v),
        AMQPValue::ShortInt(v) => i64::from(*v),
        AMQPValue::ShortUInt(v) => i64::from(*v),
        AMQPValue::LongInt(v) => i64::from(*v),
        AMQPValue::LongUInt(v) => i64::from(*v),
        AMQPValue::LongLongInt(v) => *v,
        other => {
            return Err(format!(
                "its {name} is a {:?}, not an integer",
                other.get_type()
            ));
        }
    };
    if n < 1 {
        return Err(format!("its {name} is {n}, not positive"));
    }
    u32::try_from(n).map_err(|_| format!("its {name} is {n}, beyond any {what}"))
}

#[cfg(test)]
mod tests {
    use lapin::types::LongString;

    use super::*;

    fn headers(value: AMQPValue) -> FieldTable {
        let mut h = FieldTable::default();
        h.insert(ATTEMPT_HEADER.into(), value);
        h
    }

    /// Any AMQP value an `x-attempt` header can carry: every integer type at any value, and
    /// the other types with arbitrary contents.
    fn any_attempt_value() -> impl proptest::strategy::Strategy<Value = AMQPValue> {
        use proptest::prelude::*;
        prop_oneof![
            any::<i8>().prop_map(AMQPValue::ShortShortInt),
            any::<u8>().prop_map(AMQPValue::ShortShortUInt),
            any::<i16>().prop_map(AMQPValue::ShortInt),
            any::<u16>().prop_map(AMQPValue::ShortUInt),
            any::<i32>().prop_map(AMQPValue::LongInt),
            any::<u32>().prop_map(AMQPValue::LongUInt),
            any::<i64>().prop_map(AMQPValue::LongLongInt),
            any::<bool>().prop_map(AMQPValue::Boolean),
            any::<f32>().prop_map(AMQPValue::Float),
            any::<f64>().prop_map(AMQPValue::Double),
            ".*".prop_map(|s: String| AMQPValue::LongString(LongString::from(s))),
            proptest::collection::vec(any::<u8>(), 0..64)
                .prop_map(|b| AMQPValue::ByteArray(b.into())),
            Just(AMQPValue::Void),
        ]
    }

    /// The integer an AMQP value holds, if it is of an integer type.
    fn integer(value: &AMQPValue) -> Option<i64> {
        Some(match value {
            AMQPValue::ShortShortInt(v) => i64::from(*v),
            AMQPValue::ShortShortUInt(v) => i64::from(*v),
            AMQPValue::ShortInt(v) => i64::from(*v),
            AMQPValue::ShortUInt(v) => i64::from(*v),
            AMQPValue::LongInt(v) => i64::from(*v),
            AMQPValue::LongUInt(v) => i64::from(*v),
            AMQPValue::LongLongInt(v) => *v,
            _ => return None,
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(512))]

        /// Any header value: an attempt exactly when it is an integer from 1 to u32::MAX,
        /// otherwise a refusal that names the header; never a panic.
        #[test]
        fn any_attempt_header_is_an_attempt_or_a_refusal_with_a_reason(value in any_attempt_value()) {
            let read = attempt_of(Some(&headers(value.clone())));
            match integer(&value).filter(|n| (1..=i64::from(u32::MAX)).contains(n)) {
                Some(n) => proptest::prop_assert_eq!(read, Ok(u32::try_from(n).unwrap())),
                None => {
                    let why = read.unwrap_err();
                    proptest::prop_assert!(why.contains(ATTEMPT_HEADER), "{}", why);
                }
            }
        }

        /// What a park writes (`LongLongInt` of the next attempt) reads back as that attempt,
        /// whatever other headers the delivery carries.
        #[test]
        fn the_attempt_a_park_writes_reads_back(
            attempt in 1u32..,
            others in proptest::collection::btree_map("[a-z-]{1,12}", ".{0,20}", 0..8),
        ) {
            let mut h = FieldTable::default();
            for (key, value) in others {
                h.insert(key.into(), AMQPValue::LongString(LongString::from(value)));
            }
            h.insert(ATTEMPT_HEADER.into(), AMQPValue::LongLongInt(i64::from(attempt)));
            proptest::prop_assert_eq!(attempt_of(Some(&h)), Ok(attempt));
        }
    }

    #[test]
    fn every_integer_type_is_an_attempt() {
        assert_eq!(attempt_of(None), Ok(1));
        assert_eq!(attempt_of(Some(&FieldTable::default())), Ok(1));
        for v in [
            AMQPValue::ShortShortInt(3),
            AMQPValue::ShortShortUInt(3),
            AMQPValue::ShortInt(3),
            AMQPValue::ShortUInt(3),
            AMQPValue::LongInt(3),
            AMQPValue::LongUInt(3),
            AMQPValue::LongLongInt(3),
        ] {
            assert_eq!(attempt_of(Some(&headers(v.clone()))), Ok(3), "{v:?}");
        }
    }

    #[test]
    fn a_message_without_a_schema_version_is_version_1() {
        assert_eq!(schema_version_of(None), Ok(1));
        assert_eq!(schema_version_of(Some(&FieldTable::default())), Ok(1));
        let mut h = FieldTable::default();
        h.insert(SCHEMA_VERSION_HEADER.into(), AMQPValue::LongLongInt(3));
        assert_eq!(schema_version_of(Some(&h)), Ok(3));
        assert_eq!(
            attempt_of(Some(&h)),
            Ok(1),
            "each header is read on its own"
        );
        h.insert(
            SCHEMA_VERSION_HEADER.into(),
            AMQPValue::LongString("3".into()),
        );
        let err = schema_version_of(Some(&h)).unwrap_err();
        assert!(err.contains(SCHEMA_VERSION_HEADER), "{err}");
    }

    #[test]
    fn strings_floats_zero_and_negatives_are_malformed() {
        for v in [
            AMQPValue::LongString("2".into()),
            AMQPValue::Float(2.0),
            AMQPValue::Double(2.0),
            AMQPValue::Boolean(true),
            AMQPValue::LongLongInt(0),
            AMQPValue::LongInt(-3),
            AMQPValue::LongLongInt(i64::MAX),
        ] {
            let err = attempt_of(Some(&headers(v.clone()))).unwrap_err();
            assert!(err.contains(ATTEMPT_HEADER), "{v:?}: {err}");
        }
    }
}
