//! Conditions: tests on one field of an event's `data`, found by a dotted path.
//!
//! A condition is stored as `{"path": "subject", "op": "contains", "value": "ping"}`
//! ([`ConditionSpec`]) and compiled once per evaluation into a [`Condition`] (its path turned
//! into a JSON pointer, its regular expression built). An automation matches when all of its
//! conditions hold; no conditions at all means every event of its type matches.
//!
//! | op | holds when the field is … |
//! |---|---|
//! | `equals` | equal to `value` as JSON (`"5"` is not `5`); strings compared ignoring case when `ignore_case` is set |
//! | `contains` | a string containing the string `value`; or an array with an element that equals `value` |
//! | `matches` | a string matching the regular expression `value` (Rust `regex` syntax: linear time, no look-around; `(?i)` for case); or an array with such a string |
//!
//! A missing field or `null` never holds. Paths: `subject`, `from`, `to.0` (an array index),
//! `headers.x-mailer`; a path starting with `/` is taken as a JSON pointer as is; the empty
//! path is the whole `data`.

use regex::{Regex, RegexBuilder};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The largest compiled regular expression a condition may have, in bytes: enough for any
/// sensible pattern, small enough that a hostile one cannot eat the host's memory.
pub const REGEX_SIZE_LIMIT: usize = 256 * 1024;

/// A condition as stored in `automations.conditions` and written in import files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConditionSpec {
    /// A dotted path into the event's `data` (`subject`, `to.0`), or a JSON pointer (`/to/0`).
    pub path: String,
    pub op: Op,
    /// What to compare with: any JSON for `equals`; a string for `contains` on a string
    /// field (any JSON for an array field); the regular expression for `matches`.
    pub value: Value,
    /// Compare strings ignoring case (`equals`, `contains`). For `matches`, write `(?i)`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ignore_case: bool,
}

/// The comparison a condition makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Equals,
    Contains,
    Matches,
}

/// Why a condition cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConditionError {
    #[error("path `{path}` has an empty segment")]
    EmptySegment { path: String },
    #[error("`matches` needs a string regular expression as its value, not {found}")]
    PatternNotAString { found: &'static str },
    #[error("invalid regular expression `{pattern}`: {detail}")]
    InvalidRegex { pattern: String, detail: String },
    #[error("`ignore_case` on `matches` is not supported: write (?i) in the pattern")]
    IgnoreCaseOnMatches,
}

/// A condition ready to evaluate.
#[derive(Debug, Clone)]
pub struct Condition {
    pointer: String,
    test: Test,
}

#[derive(Debug, Clone)]
enum Test {
    Equals { value: Value, ignore_case: bool },
    Contains { value: Value, ignore_case: bool },
    Matches(Regex),
}

impl ConditionSpec {
    /// Checks the path and builds the regular expression.
    pub fn compile(&self) -> Result<Condition, ConditionError> {
        let pointer = to_pointer(&self.path)?;
        let test = match self.op {
            Op::Equals => Test::Equals {
                value: self.value.clone(),
                ignore_case: self.ignore_case,
            },
            Op::Contains => Test::Contains {
                value: self.value.clone(),
                ignore_case: self.ignore_case,
            },
            Op::Matches => {
                if self.ignore_case {
                    return Err(ConditionError::IgnoreCaseOnMatches);
                }
                let Value::String(pattern) = &self.value else {
                    return Err(ConditionError::PatternNotAString {
                        found: json_kind(&self.value),
                    });
                };
                let regex = RegexBuilder::new(pattern)
                    .size_limit(REGEX_SIZE_LIMIT)
                    .build()
                    .map_err(|err| ConditionError::InvalidRegex {
                        pattern: pattern.clone(),
                        detail: err.to_string(),
                    })?;
                Test::Matches(regex)
            }
        };
        Ok(Condition { pointer, test })
    }
}

impl Condition {
    /// Whether the condition holds for an event whose fields are `data`.
    pub fn holds(&self, data: &Value) -> bool {
        let Some(field) = data.pointer(&self.pointer) else {
            return false;
        };
        match (&self.test, field) {
            (_, Value::Null) => false,
            (Test::Equals { value, ignore_case }, field) => same(field, value, *ignore_case),
            (Test::Contains { value, ignore_case }, Value::String(text)) => match value {
                Value::String(needle) if *ignore_case => {
                    text.to_lowercase().contains(&needle.to_lowercase())
                }
                Value::String(needle) => text.contains(needle.as_str()),
                _ => false,
            },
            (Test::Contains { value, ignore_case }, Value::Array(items)) => {
                items.iter().any(|item| same(item, value, *ignore_case))
            }
            (Test::Contains { .. }, _) => false,
            (Test::Matches(regex), Value::String(text)) => regex.is_match(text),
            (Test::Matches(regex), Value::Array(items)) => items
                .iter()
                .any(|item| item.as_str().is_some_and(|text| regex.is_match(text))),
            (Test::Matches(_), _) => false,
        }
    }
}

/// Compiles every condition of one automation, stopping at the first bad one (with its
/// position).
pub fn compile_all(specs: &[ConditionSpec]) -> Result<Vec<Condition>, (usize, ConditionError)> {
    specs
        .iter()
        .enumerate()
        .map(|(at, spec)| spec.compile().map_err(|err| (at, err)))
        .collect()
}

fn same(field: &Value, value: &Value, ignore_case: bool) -> bool {
    match (field, value) {
        (Value::String(a), Value::String(b)) if ignore_case => a.to_lowercase() == b.to_lowercase(),
        _ => field == value,
    }
}

/// `subject` -> `/subject`, `to.0` -> `/to/0`, `a~b/c` -> `/a~0b~1c`; `/x/y` stays; `` -> ``.
pub fn to_pointer(path: &str) -> Result<String, ConditionError> {
    if path.is_empty() || path.starts_with('/') {
        return Ok(path.to_string());
    }
    let mut pointer = String::with_capacity(path.len() + 1);
    for segment in path.split('.') {
        if segment.is_empty() {
            return Err(ConditionError::EmptySegment {
                path: path.to_string(),
            });
        }
        pointer.push('/');
        pointer.push_str(&segment.replace('~', "~0").replace('/', "~1"));
    }
    Ok(pointer)
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn spec(path: &str, op: Op, value: Value) -> ConditionSpec {
        ConditionSpec {
            path: path.into(),
            op,
            value,
            ignore_case: false,
        }
    }

    fn data() -> Value {
        json!({
            "subject": "Re: ping me",
            "from": "alice@localhost",
            "to": ["demo@localhost", "ops@localhost"],
            "size": 42,
            "flags": {"seen": false, "a.b": 1, "x/y": 2},
            "text": null
        })
    }

    #[test]
    fn dotted_paths_become_pointers() {
        assert_eq!(to_pointer("subject").unwrap(), "/subject");
        assert_eq!(to_pointer("to.0").unwrap(), "/to/0");
        assert_eq!(to_pointer("a~b.c/d").unwrap(), "/a~0b/c~1d");
        assert_eq!(to_pointer("/flags/a.b").unwrap(), "/flags/a.b");
        assert_eq!(to_pointer("").unwrap(), "");
        assert!(matches!(
            to_pointer("a..b"),
            Err(ConditionError::EmptySegment { .. })
        ));
    }

    #[test]
    fn equals_compares_json_values() {
        let d = data();
        assert!(
            spec("from", Op::Equals, json!("alice@localhost"))
                .compile()
                .unwrap()
                .holds(&d)
        );
        assert!(
            !spec("from", Op::Equals, json!("ALICE@localhost"))
                .compile()
                .unwrap()
                .holds(&d)
        );
        let mut loose = spec("from", Op::Equals, json!("ALICE@localhost"));
        loose.ignore_case = true;
        assert!(loose.compile().unwrap().holds(&d));
        assert!(
            spec("size", Op::Equals, json!(42))
                .compile()
                .unwrap()
                .holds(&d)
        );
        assert!(
            !spec("size", Op::Equals, json!("42"))
                .compile()
                .unwrap()
                .holds(&d)
        );
        assert!(
            spec("flags.seen", Op::Equals, json!(false))
                .compile()
                .unwrap()
                .holds(&d)
        );
        assert!(
            spec("to.1", Op::Equals, json!("ops@localhost"))
                .compile()
                .unwrap()
                .holds(&d)
        );
        assert!(
            spec("/flags/a.b", Op::Equals, json!(1))
                .compile()
                .unwrap()
                .holds(&d)
        );
        assert!(
            spec("flags.x/y", Op::Equals, json!(2))
                .compile()
                .unwrap()
                .holds(&d)
        );
    }

    #[test]
    fn contains_looks_in_strings_and_arrays() {
        let d = data();
        assert!(
            spec("subject", Op::Contains, json!("ping"))
                .compile()
                .unwrap()
                .holds(&d)
        );
        assert!(
            !spec("subject", Op::Contains, json!("PING"))
                .compile()
                .unwrap()
                .holds(&d)
        );
        let mut loose = spec("subject", Op::Contains, json!("PING"));
        loose.ignore_case = true;
        assert!(loose.compile().unwrap().holds(&d));
        assert!(
            spec("to", Op::Contains, json!("ops@localhost"))
                .compile()
                .unwrap()
                .holds(&d)
        );
        assert!(
            !spec("to", Op::Contains, json!("ops"))
                .compile()
                .unwrap()
                .holds(&d)
        );
        assert!(
            !spec("size", Op::Contains, json!("4"))
                .compile()
                .unwrap()
                .holds(&d)
        );
    }

    #[test]
    fn matches_runs_the_regex_on_strings_and_arrays() {
        let d = data();
        assert!(
            spec("subject", Op::Matches, json!(r"(?i)^re:\s+PING"))
                .compile()
                .unwrap()
                .holds(&d)
        );
        assert!(
            !spec("subject", Op::Matches, json!(r"^ping"))
                .compile()
                .unwrap()
                .holds(&d)
        );
        assert!(
            spec("to", Op::Matches, json!(r"^ops@"))
                .compile()
                .unwrap()
                .holds(&d)
        );
        assert!(
            !spec("size", Op::Matches, json!(r"4"))
                .compile()
                .unwrap()
                .holds(&d)
        );
    }

    #[test]
    fn a_missing_or_null_field_never_holds() {
        let d = data();
        for op in [Op::Equals, Op::Contains, Op::Matches] {
            assert!(!spec("nope", op, json!("x")).compile().unwrap().holds(&d));
            assert!(!spec("text", op, json!("")).compile().unwrap().holds(&d));
        }
        assert!(
            !spec("text", Op::Equals, Value::Null)
                .compile()
                .unwrap()
                .holds(&d)
        );
    }

    #[test]
    fn bad_conditions_are_refused_with_why() {
        let bad = spec("subject", Op::Matches, json!("(unclosed"))
            .compile()
            .unwrap_err();
        assert!(matches!(bad, ConditionError::InvalidRegex { .. }), "{bad}");
        assert!(bad.to_string().contains("(unclosed"), "{bad}");
        let not_string = spec("subject", Op::Matches, json!(3))
            .compile()
            .unwrap_err();
        assert_eq!(
            not_string,
            ConditionError::PatternNotAString { found: "a number" }
        );
        let huge = spec("subject", Op::Matches, json!(r"\w{1000}\w{1000}"))
            .compile()
            .unwrap_err();
        assert!(
            matches!(huge, ConditionError::InvalidRegex { .. }),
            "{huge}"
        );
        let (at, _) = compile_all(&[
            spec("subject", Op::Contains, json!("a")),
            spec("x", Op::Matches, json!("[")),
        ])
        .unwrap_err();
        assert_eq!(at, 1);
    }

    #[test]
    fn specs_read_from_json_and_refuse_unknown_ops() {
        let ok: ConditionSpec =
            serde_json::from_value(json!({"path": "subject", "op": "contains", "value": "ping"}))
                .unwrap();
        assert_eq!(ok, spec("subject", Op::Contains, json!("ping")));
        assert!(
            serde_json::from_value::<ConditionSpec>(
                json!({"path": "s", "op": "like", "value": "x"})
            )
            .is_err()
        );
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    /// Arbitrary JSON, a few levels deep.
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

    fn any_op() -> impl Strategy<Value = Op> {
        prop_oneof![Just(Op::Equals), Just(Op::Contains), Just(Op::Matches)]
    }

    /// A path segment as written in a dotted path: no dot, not empty.
    fn segment() -> impl Strategy<Value = String> {
        "[^.]{1,8}"
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Any condition an import file could hold either compiles or is refused with a
        /// reason, and a compiled one evaluates any event's data without a panic.
        #[test]
        fn any_condition_compiles_or_is_refused_and_never_panics(
            path in ".{0,24}",
            op in any_op(),
            value in prop_oneof![any_json(), ".{0,24}".prop_map(Value::String)],
            ignore_case in any::<bool>(),
            data in any_json(),
        ) {
            let spec = ConditionSpec { path, op, value, ignore_case };
            match spec.compile() {
                Ok(condition) => {
                    let _ = condition.holds(&data);
                }
                Err(err) => prop_assert!(!err.to_string().is_empty()),
            }
        }

        /// A dotted path reaches the field it names, whatever its segments hold (`~`, `/`
        /// included): `equals` with the field's own value holds, with another does not.
        #[test]
        fn a_dotted_path_reaches_its_field(
            segments in proptest::collection::vec(segment(), 1..5),
            field in any_json(),
        ) {
            let mut data = field.clone();
            for segment in segments.iter().rev() {
                data = Value::Object([(segment.clone(), data)].into_iter().collect());
            }
            let path = segments.join(".");
            prop_assume!(!path.starts_with('/'));
            let equals = |value: Value| ConditionSpec {
                path: path.clone(),
                op: Op::Equals,
                value,
                ignore_case: false,
            };
            let holds = equals(field.clone()).compile().unwrap().holds(&data);
            prop_assert_eq!(holds, !field.is_null(), "null never holds");
            let other = json!({"not": field.clone()});
            prop_assert!(!equals(other).compile().unwrap().holds(&data));
        }

        /// `contains` with `ignore_case` finds any piece of a string, in any case.
        #[test]
        fn contains_ignoring_case_finds_any_piece(
            text in "[a-zA-Z0-9 ]{0,30}",
            start in 0usize..30,
            len in 0usize..30,
        ) {
            let start = start.min(text.len());
            let end = (start + len).min(text.len());
            let needle = text[start..end].to_uppercase();
            let spec = ConditionSpec {
                path: "subject".into(),
                op: Op::Contains,
                value: Value::String(needle),
                ignore_case: true,
            };
            let event = json!({"subject": text});
            prop_assert!(spec.compile().unwrap().holds(&event));
        }

        /// Any pattern text: a regular expression or a refusal that quotes it, never a panic;
        /// a pattern that is a literal (escaped) matches its own text.
        #[test]
        fn any_pattern_compiles_or_is_refused_with_the_pattern(pattern in ".{0,24}") {
            let spec = ConditionSpec {
                path: "subject".into(),
                op: Op::Matches,
                value: Value::String(pattern.clone()),
                ignore_case: false,
            };
            match spec.compile() {
                Ok(condition) => {
                    let _ = condition.holds(&json!({"subject": pattern.clone()}));
                }
                Err(ConditionError::InvalidRegex { pattern: quoted, .. }) => {
                    prop_assert_eq!(quoted, pattern.clone());
                }
                Err(other) => prop_assert!(false, "unexpected refusal {other}"),
            }
            let literal = ConditionSpec {
                value: Value::String(regex::escape(&pattern)),
                ..spec
            };
            let event = json!({"subject": pattern});
            prop_assert!(literal.compile().unwrap().holds(&event));
        }
    }
}
