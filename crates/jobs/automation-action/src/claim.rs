//! A `webhook` execution's claim, its call with no database connection held, and the
//! record of how the call ended (see the crate docs): [`WebhookClaims`].

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;
use worker_core::{Failure, Handled, ProcessedGuard as _, RetryPolicy};
use worker_messages::WebhookAction;
use worker_store::circuits::{Admission, Circuits};
use worker_store::{ProcessedMessages, classify};

use crate::circuit::{self, Verdict};
use crate::execution::{Execution, last_error};
use crate::webhook::{self, WebhookClient};
use crate::{DEFAULT_RECORD_BUDGET, GUARD_SCOPE, JOB_NAME, STALE_CLAIM_MARGIN};

/// The webhook side of one executor: its HTTP client, who its claims say they are, and how
/// long a claim lives and a success is retried.
#[derive(Debug, Clone)]
pub(crate) struct WebhookClaims {
    pub(crate) pool: PgPool,
    pub(crate) guard: ProcessedMessages,
    pub(crate) client: WebhookClient,
    /// This process's claims carry it (`claimed_by`); drawn once per executor, shared by
    /// its clones.
    pub(crate) owner: Uuid,
    /// The executions a webhook try of this process has claimed and not yet recorded.
    pub(crate) in_flight: Arc<Mutex<HashSet<Uuid>>>,
    pub(crate) stale_after: Duration,
    pub(crate) record_budget: Duration,
    pub(crate) record_backoff: RetryPolicy,
    /// Each host's circuit ([`crate::circuit`]); none: every host is always called.
    pub(crate) circuits: Option<Circuits>,
}

/// Why the first transaction did not go on.
pub(crate) enum Refused {
    /// Another try holds a fresh claim: leave its row alone and try later.
    BackOff(Failure),
    /// A failure of this try, recorded on the row (unless it is `running` or `succeeded`).
    Failed(Failure),
}

impl From<Failure> for Refused {
    fn from(failure: Failure) -> Self {
        Self::Failed(failure)
    }
}

/// A webhook execution this try claimed, with what the call needs.
pub(crate) struct Claim {
    id: Uuid,
    claimed_at: DateTime<Utc>,
    action: WebhookAction,
    body: Value,
    _slot: InFlight,
}

/// This process's hold on one execution, from its claim until its outcome is recorded:
/// a second try in this process backs off while it lives, and may take the claim over once
/// it is dropped.
struct InFlight {
    id: Uuid,
    set: Arc<Mutex<HashSet<Uuid>>>,
}

impl InFlight {
    fn take(set: &Arc<Mutex<HashSet<Uuid>>>, id: Uuid) -> Option<Self> {
        // A poisoned set only means a panic elsewhere while it was held; its contents are
        // still right (every change is a single insert or remove).
        let fresh = set
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id);
        fresh.then(|| Self {
            id,
            set: Arc::clone(set),
        })
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.set
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
    }
}

impl WebhookClaims {
    /// Calls under `webhook_timeout`, a fresh owner, and the default stale limit (the
    /// timeout + [`DEFAULT_RECORD_BUDGET`] + [`STALE_CLAIM_MARGIN`]) and record budget.
    pub(crate) fn new(pool: PgPool, webhook_timeout: Duration) -> Result<Self, reqwest::Error> {
        Ok(Self {
            pool,
            guard: ProcessedMessages::new(),
            client: WebhookClient::new(webhook_timeout)?,
            owner: Uuid::new_v4(),
            in_flight: Arc::default(),
            stale_after: webhook_timeout + DEFAULT_RECORD_BUDGET + STALE_CLAIM_MARGIN,
            record_budget: DEFAULT_RECORD_BUDGET,
            record_backoff: RetryPolicy {
                max_tries: u32::MAX,
                base_delay: Duration::from_millis(100),
                factor: 2.0,
                max_delay: Duration::from_secs(2),
                jitter: true,
            },
            circuits: None,
        })
    }

    /// Sets the locked row `running` for this try, unless another try holds a fresh claim.
    pub(crate) async fn claim(
        &self,
        tx: &mut PgConnection,
        id: Uuid,
        execution: &Execution,
        action: &WebhookAction,
    ) -> Result<Claim, Refused> {
        if let Some(failure) = self.circuit_open(action) {
            // Not tried: the row is left as it was, and no attempt is counted.
            return Err(Refused::BackOff(failure));
        }
        // Taken under the row's lock, so that two tries of this process cannot both see
        // the other's claim as left behind.
        let Some(slot) = InFlight::take(&self.in_flight, id) else {
            return Err(Refused::BackOff(Failure::transient(format!(
                "action execution {id} is running in this process; backing off"
            ))));
        };
        if execution.status == "running" {
            let claimed = format!(
                "claimed by {} at {}",
                execution
                    .claimed_by
                    .map_or_else(|| "nobody".to_string(), |o| o.to_string()),
                execution
                    .claimed_at
                    .map_or_else(|| "an unknown time".to_string(), |t| t.to_rfc3339()),
            );
            if execution.claimed_by == Some(self.owner) {
                tracing::info!(claim = %claimed, "taking over a claim no try of this process holds any more");
            } else if execution.stale {
                tracing::warn!(claim = %claimed, "taking over a stale claim; its process most likely died");
            } else {
                return Err(Refused::BackOff(Failure::transient(format!(
                    "action execution {id} is running elsewhere ({claimed}); backing off"
                ))));
            }
        }
        let claimed_at: DateTime<Utc> = sqlx::query_scalar(
            "UPDATE action_executions SET status = 'running', claimed_by = $2, \
                 claimed_at = now(), updated_at = now() \
             WHERE id = $1 RETURNING claimed_at",
        )
        .bind(id)
        .bind(self.owner)
        .fetch_one(&mut *tx)
        .await
        .map_err(classify)?;
        Ok(Claim {
            id,
            claimed_at,
            action: action.clone(),
            body: webhook::body(&execution.event),
            _slot: slot,
        })
    }

    /// The failure of an action whose host's circuit is open and not due for its probe, as
    /// this replica last saw it (no statement): the action is parked until the probe.
    fn circuit_open(&self, action: &WebhookAction) -> Option<Failure> {
        let circuits = self.circuits.as_ref()?;
        let dependency = circuit::dependency(&action.url)?;
        let open = circuits.open_circuit(&dependency)?;
        let probe_in = open.probe_in(Utc::now());
        // Due: this try may be the probe, which `admit` decides after the claim.
        (!probe_in.is_zero()).then(|| {
            let detail = format!("its circuit is open: {}", open.reason);
            circuit::unavailable(&dependency, detail, probe_in)
        })
    }

    /// Calls the webhook with no connection held (when its host's circuit lets it), then
    /// records how it ended.
    pub(crate) async fn call_and_record(&self, claim: Claim) -> Result<Handled, Failure> {
        let host = match (&self.circuits, circuit::dependency(&claim.action.url)) {
            (Some(circuits), Some(dependency)) => Some((circuits, dependency)),
            _ => None,
        };
        let admission = match &host {
            Some((circuits, dependency)) => circuits.admit(dependency).await,
            None => Admission::Go,
        };
        if let (Admission::Wait { reason, probe_in }, Some((_, dependency))) = (&admission, &host) {
            // Another try took the probe since the claim: this one is released uncharged.
            let detail = format!("its circuit is open: {reason}");
            let failure = circuit::unavailable(dependency, detail, *probe_in);
            self.record_claimed_failure(&claim, &failure).await;
            return Err(failure);
        }
        let result = self
            .client
            .attempt(&claim.action, &claim.body, &claim.id.to_string())
            .await;
        let mut called = webhook::classify(&claim.action.redacted_url(), &result, Utc::now());
        if let Some((circuits, dependency)) = &host {
            match circuit::verdict(&result) {
                Verdict::Answered => circuits.succeeded(dependency, &admission).await,
                Verdict::Failed(fault) => {
                    if let Err(failure) = &called {
                        let detail = failure.detail().to_string();
                        let opened = circuits
                            .failed(dependency, fault, &detail, &admission)
                            .await;
                        if let Some(probe_in) = opened {
                            // The host is out of service: this try is charged nothing.
                            called = Err(circuit::unavailable(dependency, detail, probe_in));
                        }
                    }
                }
                Verdict::Silent => {}
            }
        }
        match called {
            Ok(()) => self.record_success(&claim).await,
            Err(failure) => {
                self.record_claimed_failure(&claim, &failure).await;
                Err(failure)
            }
        }
    }

    /// The mark and `succeeded`, retried on any database error within the record budget:
    /// the receiver acted, so this try must not end as a failure of the action.
    async fn record_success(&self, claim: &Claim) -> Result<Handled, Failure> {
        let id = claim.id;
        let recorded =
            worker_core::persist(JOB_NAME, self.record_budget, &self.record_backoff, || {
                self.try_record_success(id)
            })
            .await;
        match recorded {
            Ok(()) => {
                tracing::info!(action = "webhook", "action done");
                Ok(Handled::Done)
            }
            Err(err) => {
                tracing::error!(
                    error = %err,
                    "the webhook answered 2xx but its success could not be recorded; \
                     the execution stays running until a later try takes it over"
                );
                Err(Failure::unknown(format!(
                    "the webhook answered 2xx but recording its success failed for {}: {err}",
                    humantime::format_duration(self.record_budget)
                )))
            }
        }
    }

    async fn try_record_success(&self, id: Uuid) -> Result<(), Failure> {
        let mut tx = self.pool.begin().await.map_err(classify)?;
        // Already there only when a takeover of this claim succeeded too: no harm.
        self.guard
            .try_mark_processed(&mut tx, GUARD_SCOPE, &id.to_string())
            .await?;
        // Whoever holds the claim now, the receiver has acted: a success is a fact.
        sqlx::query(
            "UPDATE action_executions SET status = 'succeeded', attempts = attempts + 1, \
                 last_error = NULL, updated_at = now(), finished_at = now() \
             WHERE id = $1 AND status <> 'succeeded'",
        )
        .bind(id)
        .execute(&mut *tx)
        .await
        .map_err(classify)?;
        tx.commit().await.map_err(classify)
    }

    /// Ends this try's claim with its failure: `failed` for a permanent one, back to
    /// `pending` otherwise, only while the claim is still this try's. A try whose host was
    /// out of service (`Failure::Unavailable`) was not one: no attempt is counted. Best effort: a row left
    /// `running` is taken over by this process's next try, or by any once it is stale.
    async fn record_claimed_failure(&self, claim: &Claim, failure: &Failure) {
        let recorded = sqlx::query(
            "UPDATE action_executions SET attempts = attempts + $6, last_error = $4, \
                 status = CASE WHEN $5 THEN 'failed' ELSE 'pending' END, \
                 finished_at = CASE WHEN $5 THEN now() ELSE finished_at END, \
                 claimed_by = CASE WHEN $5 THEN claimed_by END, \
                 claimed_at = CASE WHEN $5 THEN claimed_at END, \
                 updated_at = now() \
             WHERE id = $1 AND status = 'running' AND claimed_by = $2 AND claimed_at = $3",
        )
        .bind(claim.id)
        .bind(self.owner)
        .bind(claim.claimed_at)
        .bind(last_error(failure))
        .bind(failure.is_permanent())
        .bind(i32::from(!failure.is_unavailable()))
        .execute(&self.pool)
        .await;
        match recorded {
            Ok(done) if done.rows_affected() == 0 => tracing::warn!(
                "the claim was taken over before this try's failure was recorded; left as is"
            ),
            Ok(_) => {}
            Err(err) => tracing::warn!(
                error = %worker_core::error_chain(&err),
                "could not record the failed try on the action execution"
            ),
        }
    }
}
