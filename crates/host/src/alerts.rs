//! Alerts: thresholds from settings, evaluated on fresh readings. Crossing a threshold logs
//! one error with what crossed and by how much; going back under logs once more. Active
//! alerts show on `/status`. No alert affects readiness: restarting the host cures none.

use std::collections::BTreeMap;
use std::sync::Mutex;

use chrono::{DateTime, Utc};
use serde::Serialize;

/// One alert that is active now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ActiveAlert {
    pub name: String,
    pub value: f64,
    pub threshold: f64,
    pub since: DateTime<Utc>,
    pub message: String,
}

/// What one evaluation changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    Crossed,
    Cleared,
    Unchanged,
}

/// The alerts in force, keyed by name (e.g. `dead-letter-depth:email.send`).
#[derive(Debug, Default)]
pub struct AlertBook {
    active: Mutex<BTreeMap<String, ActiveAlert>>,
}

impl AlertBook {
    /// Compares `value` with `threshold` (an alert is active while value > threshold), logs a
    /// transition once, and returns it. `what` describes the reading for the log line.
    pub fn evaluate(&self, name: &str, what: &str, value: f64, threshold: f64) -> Transition {
        let Ok(mut active) = self.active.lock() else {
            return Transition::Unchanged;
        };
        let over = value > threshold;
        match (over, active.contains_key(name)) {
            (true, false) => {
                let message = format!(
                    "{what} is {value} (threshold {threshold}, over by {})",
                    value - threshold
                );
                tracing::error!(alert = name, value, threshold, "alert: {message}");
                active.insert(
                    name.to_string(),
                    ActiveAlert {
                        name: name.to_string(),
                        value,
                        threshold,
                        since: Utc::now(),
                        message,
                    },
                );
                Transition::Crossed
            }
            (true, true) => {
                if let Some(alert) = active.get_mut(name) {
                    alert.value = value;
                    alert.message = format!(
                        "{what} is {value} (threshold {threshold}, over by {})",
                        value - threshold
                    );
                }
                Transition::Unchanged
            }
            (false, true) => {
                active.remove(name);
                tracing::info!(
                    alert = name,
                    value,
                    threshold,
                    "alert cleared: {what} is back to {value} (threshold {threshold})"
                );
                Transition::Cleared
            }
            (false, false) => Transition::Unchanged,
        }
    }

    pub fn active(&self) -> Vec<ActiveAlert> {
        self.active
            .lock()
            .map(|a| a.values().cloned().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_alert_crosses_once_stays_quiet_and_clears_once() {
        let book = AlertBook::default();
        assert_eq!(
            book.evaluate("dld:q", "dead letters in q", 5.0, 10.0),
            Transition::Unchanged
        );
        assert_eq!(
            book.evaluate("dld:q", "dead letters in q", 12.0, 10.0),
            Transition::Crossed
        );
        assert_eq!(
            book.evaluate("dld:q", "dead letters in q", 15.0, 10.0),
            Transition::Unchanged
        );
        let active = book.active();
        assert_eq!(active.len(), 1);
        assert_eq!(active[0].value, 15.0);
        assert!(
            active[0].message.contains("over by 5"),
            "{}",
            active[0].message
        );
        assert_eq!(
            book.evaluate("dld:q", "dead letters in q", 3.0, 10.0),
            Transition::Cleared
        );
        assert_eq!(
            book.evaluate("dld:q", "dead letters in q", 3.0, 10.0),
            Transition::Unchanged
        );
        assert!(book.active().is_empty());
    }

    #[test]
    fn a_value_at_the_threshold_is_not_over_it() {
        let book = AlertBook::default();
        assert_eq!(book.evaluate("a", "x", 10.0, 10.0), Transition::Unchanged);
    }
}
