//! How a replay or a purge runs: dry or for real, at what rate, what the operator confirmed,
//! who runs it, and the [`Control`] that tells its audit row's id and stops it between
//! batches.
//!
//! A bulk action works in batches and writes its counts to its audit row after each one, so
//! whoever watches it (the console's progress page, on any replica) reads its progress from
//! the database; a stop is seen before the next batch and during a paced wait, and what was
//! not reached stays dead.

use std::sync::{Arc, Mutex};

use sqlx::PgPool;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use worker_core::Failure;
use worker_store::audit::{Actor, EntryKind, NewEntry};
use worker_store::dead_letters::count;

use crate::query::Filter;

/// A replay's or a purge's options.
#[derive(Debug, Clone)]
pub struct Run {
    /// Move nothing; list and count what would go (recorded as a dry run).
    pub dry_run: bool,
    /// At most this many messages per second.
    pub rate: Option<u32>,
    /// What the operator was shown and confirmed (the dry run's count), recorded; a real run
    /// acts on at most this many, oldest first as the dry run listed them, so that what died
    /// since the dry run is not swept along unseen.
    pub planned: Option<u64>,
    pub actor: Actor,
    pub control: Control,
}

impl Run {
    /// A run by `actor`, for real, unpaced, not planned, that nothing stops.
    pub fn new(actor: Actor) -> Self {
        Self {
            dry_run: false,
            rate: None,
            planned: None,
            actor,
            control: Control::default(),
        }
    }

    #[must_use]
    pub fn dry(mut self, dry_run: bool) -> Self {
        self.dry_run = dry_run;
        self
    }

    #[must_use]
    pub fn rate(mut self, rate: Option<u32>) -> Self {
        self.rate = rate;
        self
    }

    #[must_use]
    pub fn planned(mut self, planned: Option<u64>) -> Self {
        self.planned = planned;
        self
    }

    #[must_use]
    pub fn controlled_by(mut self, control: Control) -> Self {
        self.control = control;
        self
    }

    /// The most this run acts on: the filter's `limit`, or the confirmed count when that is
    /// smaller.
    pub(crate) fn cap(&self, limit: Option<u32>) -> Option<u64> {
        self.planned_cap(limit).or(limit.map(u64::from))
    }

    /// The confirmed count, when it is what bounds this run (a real run, below the limit).
    fn planned_cap(&self, limit: Option<u32>) -> Option<u64> {
        if self.dry_run {
            return None;
        }
        self.planned
            .filter(|planned| limit.is_none_or(|limit| *planned < u64::from(limit)))
    }

    /// How many dead letters still match `filter` beyond the confirmed count, once the run
    /// has acted on `reached` of them and left `failed` of those dead; `None` when the
    /// confirmed count did not stop it.
    pub(crate) async fn beyond_planned(
        &self,
        pool: &PgPool,
        filter: &Filter,
        reached: u64,
        failed: u64,
    ) -> Result<Option<u64>, Failure> {
        let Some(planned) = self.planned_cap(filter.limit) else {
            return Ok(None);
        };
        if reached < planned {
            return Ok(None);
        }
        let unlimited = Filter {
            limit: None,
            ..filter.clone()
        };
        let dead = count(pool, &unlimited).await?;
        Ok(Some(dead.saturating_sub(failed)).filter(|more| *more > 0))
    }
}

/// The audit note of a run that stopped at the confirmed count with `more` still matching.
pub(crate) fn beyond_planned_note(planned: Option<u64>, more: u64) -> String {
    format!(
        "stopped at the {} confirmed: {more} more matched and stay dead",
        planned.unwrap_or_default()
    )
}

/// Checks a bulk action's filter and rate; the message names the flag.
pub(crate) fn check(filter: &Filter, rate: Option<u32>) -> Result<(), Failure> {
    filter
        .validate()
        .map_err(|e| Failure::permanent("bad-filter", e))?;
    if rate == Some(0) {
        return Err(Failure::permanent(
            "bad-filter",
            "--rate must be at least 1",
        ));
    }
    Ok(())
}

/// The audit row of a bulk action over `filter`.
pub(crate) fn new_entry<'a>(kind: EntryKind, filter: &Filter, run: &'a Run) -> NewEntry<'a> {
    NewEntry {
        kind,
        actor: &run.actor,
        target: serde_json::to_value(filter).unwrap_or_default(),
        rate: run.rate,
        dry_run: run.dry_run,
        planned: run.planned,
    }
}

/// A bulk action as whoever started it sees it while it runs: its audit row's id once it is
/// recorded, and a way to stop it, with why (who asked). Clones share one state.
#[derive(Debug, Clone)]
pub struct Control {
    token: CancellationToken,
    why: Arc<Mutex<Option<String>>>,
    action: Arc<watch::Sender<Option<i64>>>,
}

impl Default for Control {
    fn default() -> Self {
        Self {
            token: CancellationToken::new(),
            why: Arc::default(),
            action: Arc::new(watch::channel(None).0),
        }
    }
}

impl Control {
    /// Called by the run once its audit row is written.
    pub(crate) fn begun(&self, action_id: i64) {
        self.action.send_replace(Some(action_id));
    }

    /// The audit row's id, once the run has written it.
    pub fn action_id(&self) -> Option<i64> {
        *self.action.borrow()
    }

    /// Waits until the run has written its audit row, and returns its id.
    pub async fn begun_as(&self) -> i64 {
        let mut seen = self.action.subscribe();
        loop {
            if let Some(id) = *seen.borrow_and_update() {
                return id;
            }
            // The sender lives as long as `self`: this never ends for want of one.
            if seen.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Asks the action to stop before its next batch; the first reason given is kept.
    pub fn stop(&self, why: impl Into<String>) {
        if let Ok(mut slot) = self.why.lock()
            && slot.is_none()
        {
            *slot = Some(why.into());
        }
        self.token.cancel();
    }

    pub fn is_stopped(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Why it was stopped, once it was.
    pub fn why(&self) -> Option<String> {
        if !self.is_stopped() {
            return None;
        }
        self.why
            .lock()
            .ok()
            .and_then(|w| w.clone())
            .or_else(|| Some("stopped".into()))
    }

    /// Waits until it is stopped.
    pub async fn stopped(&self) {
        self.token.cancelled().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_keeps_the_first_reason_and_is_shared_by_its_clones() {
        let stop = Control::default();
        let seen = stop.clone();
        assert_eq!(seen.why(), None);
        stop.stop("cancelled by alice");
        stop.stop("shutting down");
        assert!(seen.is_stopped());
        assert_eq!(seen.why().as_deref(), Some("cancelled by alice"));
    }

    #[tokio::test]
    async fn the_starter_learns_the_action_id_once_it_is_recorded() {
        let control = Control::default();
        assert_eq!(control.action_id(), None);
        let run = control.clone();
        let waiter = tokio::spawn(async move { control.begun_as().await });
        run.begun(42);
        assert_eq!(waiter.await.unwrap(), 42);
        assert_eq!(run.action_id(), Some(42));
    }
}
