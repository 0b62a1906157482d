//! The dead-letter filter as the console's forms and links carry it: every field text, an
//! empty one absent, turned into the archive's [`Filter`] with an error that names the field.

use chrono::{DateTime, Utc};
use job_dead_letter_archive::{Filter, Status};
use serde::{Deserialize, Serialize};

use crate::page::Problem;

/// The filter fields of a query string or a form.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct FilterForm {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    /// Died at or after: RFC 3339, a browser's `datetime-local` (UTC), or an age (`2h`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    /// Died before; as `since`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
    /// Text in the error, the message id or the body.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub search: Option<String>,
    /// `dead` (when absent), `replayed`, `purged` or `all`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

/// A field as given: trimmed, and absent when empty.
pub fn given(field: &Option<String>) -> Option<String> {
    field
        .as_deref()
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_string)
}

/// A time as an operator gives it ([`job_dead_letter_archive::parse_time`]), the error
/// naming the field.
pub fn parse_time(field: &str, text: &str) -> Result<DateTime<Utc>, Problem> {
    job_dead_letter_archive::parse_time(text, Utc::now())
        .map_err(|e| Problem::bad_request(format!("{field}: {e}")))
}

impl FilterForm {
    /// The fields given, trimmed; empty ones dropped.
    pub fn cleaned(&self) -> Self {
        Self {
            queue: given(&self.queue),
            reason: given(&self.reason),
            fingerprint: given(&self.fingerprint),
            since: given(&self.since),
            until: given(&self.until),
            search: given(&self.search),
            status: given(&self.status).filter(|s| s != "dead"),
        }
    }

    /// The state asked for: `None` for every state (`all`).
    fn status(&self) -> Result<Option<Status>, Problem> {
        match given(&self.status).as_deref() {
            None | Some("dead") => Ok(Some(Status::Dead)),
            Some("all") => Ok(None),
            Some(other) => Status::parse(other).map(Some).ok_or_else(|| {
                Problem::bad_request(format!(
                    "status: expected dead, replayed, purged or all, found `{other}`"
                ))
            }),
        }
    }

    /// The archive's filter, checked; `status` as the form says.
    pub fn filter(&self) -> Result<Filter, Problem> {
        let time = |field: &str, value: &Option<String>| {
            given(value)
                .map(|text| parse_time(field, &text))
                .transpose()
        };
        let filter = Filter {
            id: None,
            queue: given(&self.queue),
            reason: given(&self.reason),
            fingerprint: given(&self.fingerprint).map(|f| f.to_ascii_lowercase()),
            since: time("since", &self.since)?,
            until: time("until", &self.until)?,
            search: given(&self.search),
            limit: None,
            status: self.status()?,
        };
        filter
            .validate()
            .map_err(|e| Problem::bad_request(e.replace("--", "")))?;
        Ok(filter)
    }

    /// The filter for a bulk action: the form's, on dead letters only (the only ones a
    /// replay or a purge acts on).
    pub fn bulk_filter(&self) -> Result<Filter, Problem> {
        Ok(Filter {
            status: None,
            ..self.filter()?
        })
    }

    /// The fields as a query string, empty ones left out.
    pub fn query(&self) -> String {
        serde_urlencoded::to_string(self.cleaned()).unwrap_or_default()
    }

    /// The same filter narrowed to one group.
    pub fn group(&self, queue: &str, fingerprint: &str) -> Self {
        Self {
            queue: Some(queue.to_string()),
            fingerprint: Some(fingerprint.to_string()),
            ..self.cleaned()
        }
    }

    /// Whether any field narrows it.
    pub fn narrows(&self) -> bool {
        let clean = self.cleaned();
        Self {
            status: None,
            ..clean
        } != Self::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_fields_are_absent_and_dead_is_the_default_state() {
        let form = FilterForm {
            queue: Some(" email.send ".into()),
            reason: Some(String::new()),
            status: Some("dead".into()),
            ..FilterForm::default()
        };
        assert_eq!(form.query(), "queue=email.send");
        let filter = form.filter().unwrap();
        assert_eq!(filter.queue.as_deref(), Some("email.send"));
        assert_eq!(filter.reason, None);
        assert_eq!(filter.status, Some(Status::Dead));
        assert!(form.narrows());
        assert!(!FilterForm::default().narrows());
    }

    #[test]
    fn all_states_and_bad_states() {
        let all = FilterForm {
            status: Some("all".into()),
            ..FilterForm::default()
        };
        assert_eq!(all.filter().unwrap().status, None);
        let bad = FilterForm {
            status: Some("gone".into()),
            ..FilterForm::default()
        };
        assert!(bad.filter().unwrap_err().detail.contains("status"));
    }

    #[test]
    fn times_come_as_rfc3339_browser_local_or_an_age() {
        let rfc = parse_time("since", "2026-12-01T10:00:00Z").unwrap();
        let local = parse_time("since", "2026-12-01T10:00").unwrap();
        assert_eq!(rfc, local);
        let age = parse_time("since", "2h").unwrap();
        assert!(Utc::now() - age >= chrono::Duration::minutes(119));
        let bad = parse_time("until", "yesterday-ish").unwrap_err();
        assert!(bad.detail.starts_with("until:"), "{}", bad.detail);
    }

    #[test]
    fn an_age_too_far_back_is_an_error_naming_the_field() {
        let bad = parse_time("since", "300000y").unwrap_err();
        assert!(bad.detail.starts_with("since:"), "{}", bad.detail);
        let form = FilterForm {
            until: Some("300000y".into()),
            ..FilterForm::default()
        };
        let bad = form.filter().unwrap_err();
        assert!(bad.detail.starts_with("until:"), "{}", bad.detail);
    }

    #[test]
    fn a_bulk_action_ignores_the_state_shown() {
        let form = FilterForm {
            status: Some("replayed".into()),
            queue: Some("q".into()),
            ..FilterForm::default()
        };
        let filter = form.bulk_filter().unwrap();
        assert_eq!((filter.status, filter.queue.as_deref()), (None, Some("q")));
    }
}
