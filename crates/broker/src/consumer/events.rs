//! What the runner reports, for the host's metrics and attempt log.

use std::time::Duration;

use worker_core::{AttemptObserver, TryRecord};

use super::Outcome;

/// One settled delivery, as reported to [`ConsumerEvents`].
#[derive(Debug, Clone)]
pub struct DeliveryReport<'a> {
    pub queue: &'a str,
    pub message_id: Option<&'a str>,
    pub attempt: u32,
    /// In-process tries made for this delivery.
    pub tries: u32,
    pub outcome: &'a Outcome,
    pub elapsed: Duration,
}

/// The host's hook for metrics: every in-process try and every settled delivery.
pub trait ConsumerEvents: Send + Sync {
    fn on_try(&self, _queue: &str, _record: &TryRecord<'_>) {}
    /// Every in-process try, with the delivery it belongs to: its message id and its attempt
    /// across parks (for the attempt log). The runner calls this one; by default it calls
    /// [`on_try`](Self::on_try).
    fn on_delivery_try(
        &self,
        queue: &str,
        _message_id: Option<&str>,
        _attempt: u32,
        record: &TryRecord<'_>,
    ) {
        self.on_try(queue, record);
    }
    fn on_settled(&self, _settled: &DeliveryReport<'_>) {}
    /// Where each handler try is recorded while it runs, for the host's watchdog; `None`
    /// records nothing.
    fn liveness(&self) -> Option<&worker_core::liveness::Liveness> {
        None
    }
}

/// Events that go nowhere.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoEvents;

impl ConsumerEvents for NoEvents {}

/// Forwards the in-process tries of one delivery to the events, with the delivery they
/// belong to.
pub(super) struct TryForwarder<'a> {
    pub events: &'a dyn ConsumerEvents,
    pub queue: &'a str,
    pub message_id: Option<&'a str>,
    pub attempt: u32,
}

impl AttemptObserver for TryForwarder<'_> {
    fn on_try(&self, record: &TryRecord<'_>) {
        self.events
            .on_delivery_try(self.queue, self.message_id, self.attempt, record);
    }
}
