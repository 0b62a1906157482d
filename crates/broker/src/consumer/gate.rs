//! A consume loop's [`Gate`]: an operator's pause, as the loop sees it. The host decides when
//! a queue is paused (it knows the jobs and where pauses are kept); the loop only obeys.
//!
//! Closed, the loop stops taking deliveries by `basic.cancel`, works off what it already holds
//! (the prefetched deliveries too), acks them as they complete and closes its channel: a
//! delivery is never returned for a pause, since a return counts against the queue's delivery
//! limit. While the gate is closed no session consumes, a new connection's neither, so a
//! reconnect does not undo a pause. Opened again, the loop consumes on the current connection.

use tokio::sync::watch;

/// Whether a consume loop may consume: `closed` while its job is paused. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Gate {
    closed: watch::Receiver<bool>,
}

impl Gate {
    /// A gate that follows `closed` (`true` while paused).
    pub fn new(closed: watch::Receiver<bool>) -> Self {
        Self { closed }
    }

    /// A gate and the sender that opens and closes it, closed at first when `closed`.
    pub fn channel(closed: bool) -> (watch::Sender<bool>, Self) {
        let (tx, rx) = watch::channel(closed);
        (tx, Self::new(rx))
    }

    pub fn is_closed(&self) -> bool {
        *self.closed.borrow()
    }

    /// Returns once the gate is closed; never, once its sender is gone with it open.
    pub async fn closed(&mut self) {
        if self.closed.wait_for(|closed| *closed).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Returns once the gate is open; never, once its sender is gone with it closed.
    pub async fn opened(&mut self) {
        if self.closed.wait_for(|closed| !*closed).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Waits for `gate` to close; never, without one.
pub(super) async fn closing(gate: Option<&mut Gate>) {
    match gate {
        Some(gate) => gate.closed().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_gate_reports_closing_and_opening() {
        let (tx, mut gate) = Gate::channel(false);
        assert!(!gate.is_closed());
        let waited = tokio::time::timeout(Duration::from_millis(20), gate.closed()).await;
        assert!(waited.is_err(), "open: closed() waits");
        tx.send(true).unwrap();
        gate.closed().await;
        assert!(gate.is_closed());
        tx.send(false).unwrap();
        gate.opened().await;
        assert!(!gate.is_closed());
    }

    #[tokio::test]
    async fn a_gate_left_closed_by_its_sender_never_opens() {
        let (tx, mut gate) = Gate::channel(true);
        drop(tx);
        let waited = tokio::time::timeout(Duration::from_millis(20), gate.opened()).await;
        assert!(waited.is_err());
    }
}
