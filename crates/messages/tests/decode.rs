//! Property tests of the message decoders as the consumers use them (`worker_core::decode`,
//! the pipeline's step 2): any body either decodes or is refused with a reason, never a
//! panic; every message survives a round trip; a field of the wrong type is refused by name.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use chrono::{DateTime, TimeZone, Utc};
use proptest::prelude::*;
use serde_json::{Value, json};
use uuid::Uuid;
use worker_core::decode;
use worker_messages::{
    ActionCommand, AutomationAction, DomainEvent, EmailReceived, EmailSendCommand,
};

fn uuid() -> impl Strategy<Value = Uuid> {
    any::<u128>().prop_map(Uuid::from_u128)
}

fn time() -> impl Strategy<Value = DateTime<Utc>> {
    (0i64..4_102_444_800, 0u32..1_000_000_000)
        .prop_map(|(secs, nanos)| Utc.timestamp_opt(secs, nanos).unwrap())
}

fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        ".{0,16}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map(".{0,8}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Bodies a broker could deliver: random bytes, and JSON that is almost right.
fn any_body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..256),
        any_json().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        (uuid(), uuid(), uuid(), any_json()).prop_map(|(a, b, c, index)| {
            serde_json::to_vec(&json!({
                "action_execution_id": a, "automation_id": b, "event_id": c,
                "action_index": index,
            }))
            .unwrap()
        }),
    ]
}

/// Decodes `body` as `T`: a value, or a refusal that says what was expected and why.
fn decoded_or_refused<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<(), TestCaseError> {
    if let Err(err) = decode::<T>(body) {
        prop_assert!(!err.detail.is_empty());
        prop_assert!(!err.to_string().is_empty());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn any_body_decodes_or_is_refused_with_a_reason(body in any_body()) {
        decoded_or_refused::<ActionCommand>(&body)?;
        decoded_or_refused::<DomainEvent>(&body)?;
        decoded_or_refused::<EmailSendCommand>(&body)?;
        decoded_or_refused::<EmailReceived>(&body)?;
        decoded_or_refused::<AutomationAction>(&body)?;
    }

    #[test]
    fn an_action_command_round_trips(
        action_execution_id in uuid(), automation_id in uuid(), event_id in uuid(),
        action_index in any::<u32>(),
    ) {
        let command = ActionCommand { action_execution_id, automation_id, event_id, action_index };
        let body = serde_json::to_vec(&command).unwrap();
        prop_assert_eq!(decode::<ActionCommand>(&body).unwrap(), command);
    }

    #[test]
    fn a_domain_event_round_trips(
        id in uuid(), event_type in ".{0,24}", occurred_at in time(), data in any_json(),
    ) {
        let event = DomainEvent { id, event_type, occurred_at, data };
        let body = serde_json::to_vec(&event).unwrap();
        prop_assert_eq!(decode::<DomainEvent>(&body).unwrap(), event);
    }

    #[test]
    fn an_email_send_command_round_trips(outbound_email_id in uuid()) {
        let command = EmailSendCommand { outbound_email_id };
        let body = serde_json::to_vec(&command).unwrap();
        prop_assert_eq!(decode::<EmailSendCommand>(&body).unwrap(), command);
    }

    /// A command whose `action_index` is anything but a u32 is refused, naming the field.
    #[test]
    fn a_wrong_action_index_is_refused_by_name(
        ids in (uuid(), uuid(), uuid()),
        index in any_json().prop_filter("not a u32", |v| {
            v.as_u64().is_none_or(|n| u32::try_from(n).is_err())
        }),
    ) {
        let body = serde_json::to_vec(&json!({
            "action_execution_id": ids.0, "automation_id": ids.1, "event_id": ids.2,
            "action_index": index,
        }))
        .unwrap();
        let err = decode::<ActionCommand>(&body).unwrap_err();
        prop_assert!(err.detail.contains("action_index"), "{}", err.detail);
    }

    /// Bytes after a complete message are refused: a body is one JSON value.
    #[test]
    fn trailing_bytes_after_a_message_are_refused(
        outbound_email_id in uuid(), tail in "[^ \t\r\n]{1,8}",
    ) {
        let mut body = serde_json::to_vec(&EmailSendCommand { outbound_email_id }).unwrap();
        body.extend_from_slice(tail.as_bytes());
        prop_assert!(decode::<EmailSendCommand>(&body).is_err());
    }
}
