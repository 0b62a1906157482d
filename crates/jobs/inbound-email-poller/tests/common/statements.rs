//! Counting the statements the poller sends: every statement sqlx runs is logged as an event
//! of target `sqlx::query`, with its summary (its first words).

use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::{Layer, Registry};

/// The statements seen, by their summary, in order.
#[derive(Clone, Default)]
pub struct Statements(Arc<Mutex<Vec<String>>>);

impl Statements {
    pub fn taken(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    /// Statements that begin or end a transaction explicitly.
    pub fn transaction_control(&self) -> usize {
        self.taken()
            .iter()
            .filter(|s| {
                let s = s.trim_start().to_ascii_uppercase();
                s.starts_with("BEGIN") || s.starts_with("COMMIT") || s.starts_with("ROLLBACK")
            })
            .count()
    }
}

struct Summary(Option<String>);

impl Visit for Summary {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "summary" {
            self.0 = Some(value.to_string());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "summary" {
            self.0 = Some(format!("{value:?}"));
        }
    }
}

struct Counter(Statements);

impl<S: tracing::Subscriber> Layer<S> for Counter {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if event.metadata().target().starts_with("sqlx::query") {
            let mut summary = Summary(None);
            event.record(&mut summary);
            let mut seen = (self.0).0.lock().unwrap();
            seen.push(summary.0.unwrap_or_default());
        }
    }
}

/// Runs `work` with a subscriber on this thread that counts sqlx's statements (the test's
/// runtime must be current-thread, so that every poll of `work` runs here).
pub async fn counting<T>(work: impl Future<Output = T>) -> (T, Statements) {
    let statements = Statements::default();
    let subscriber = Registry::default().with(Counter(statements.clone()));
    let _guard = tracing::subscriber::set_default(subscriber);
    let out = work.await;
    (out, statements)
}
