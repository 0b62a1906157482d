//! Reading a refused declare: RabbitMQ names the argument that differs only in the text of
//! its PRECONDITION_FAILED, so that text is parsed into a [`DeclareConflict`] an operator can
//! act on.

use lapin::protocol::{AMQPErrorKind, AMQPSoftError};

use super::error::{DeclareConflict, TopologyError};

/// Turns a refused declare into a [`TopologyError::Conflict`] when the broker said which
/// argument differs (RabbitMQ: "inequivalent arg 'x-…' for queue 'q' in vhost 'v': received
/// the value '3' of type 'long' but current is none").
pub(super) fn classify_declare_error(
    kind: &'static str,
    name: &str,
    source: lapin::Error,
) -> TopologyError {
    if let lapin::ErrorKind::ProtocolError(e) = source.kind()
        && matches!(
            e.kind(),
            AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED)
        )
    {
        let raw = e.get_message().to_string();
        let (argument, wanted, existing) = parse_inequivalent(&raw).unwrap_or_else(|| {
            (
                "its arguments or type".into(),
                "other arguments".into(),
                "different ones".into(),
            )
        });
        return TopologyError::Conflict(Box::new(DeclareConflict {
            kind,
            name: name.into(),
            argument,
            wanted,
            existing,
            raw,
        }));
    }
    TopologyError::Broker {
        what: format!("the {kind} {name}"),
        source,
    }
}

fn parse_inequivalent(text: &str) -> Option<(String, String, String)> {
    let rest = text.split_once("inequivalent arg '")?.1;
    let (argument, rest) = rest.split_once('\'')?;
    let rest = rest.split_once("received ")?.1;
    let (received, current) = rest.split_once(" but current is ")?;
    Some((
        argument.to_string(),
        describe_value(received),
        describe_value(current),
    ))
}

/// "the value '3' of type 'long'" → "3"; "none" → "none (not set)".
fn describe_value(text: &str) -> String {
    let text = text.trim();
    if text == "none" {
        return "none (not set)".into();
    }
    text.split_once('\'')
        .and_then(|(_, rest)| rest.split_once('\''))
        .map(|(value, _)| value.to_string())
        .unwrap_or_else(|| text.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn inequivalent_arg_messages_are_parsed() {
        let raw = "PRECONDITION_FAILED - inequivalent arg 'x-delivery-limit' for queue 'email.send' in vhost 'v': received the value '3' of type 'long' but current is the value '5' of type 'long'";
        let (arg, wanted, existing) = parse_inequivalent(raw).unwrap();
        assert_eq!(
            (arg.as_str(), wanted.as_str(), existing.as_str()),
            ("x-delivery-limit", "3", "5")
        );
        let raw = "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'q' in vhost 'v': received the value 'quorum' of type 'longstr' but current is none";
        let (arg, wanted, existing) = parse_inequivalent(raw).unwrap();
        assert_eq!(
            (arg.as_str(), wanted.as_str(), existing.as_str()),
            ("x-queue-type", "quorum", "none (not set)")
        );
        // What 3.10.8 answers when a placement setting is added to (or taken from, or changed
        // on) a queue that exists.
        let raw = "PRECONDITION_FAILED - inequivalent arg 'x-queue-leader-locator' for queue 'q' in vhost 'v': received the value 'balanced' of type 'longstr' but current is none";
        let (arg, wanted, existing) = parse_inequivalent(raw).unwrap();
        assert_eq!(
            (arg.as_str(), wanted.as_str(), existing.as_str()),
            ("x-queue-leader-locator", "balanced", "none (not set)")
        );
        let raw = "PRECONDITION_FAILED - inequivalent arg 'x-quorum-initial-group-size' for queue 'q' in vhost 'v': received '3' but current is '2'";
        let (arg, wanted, existing) = parse_inequivalent(raw).unwrap();
        assert_eq!(
            (arg.as_str(), wanted.as_str(), existing.as_str()),
            ("x-quorum-initial-group-size", "3", "2")
        );
    }
}
