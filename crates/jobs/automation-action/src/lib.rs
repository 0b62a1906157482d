//! # job-automation-action: runs one action of one automation for one event
//!
//! A [`ConsumerJob`](worker_core::ConsumerJob) on the `automation.action` queue. Its input, an [`ActionCommand`](worker_messages::ActionCommand),
//! names an action execution that the trigger consumer wrote; the execution row holds the
//! action and the event as they were when the event matched. The executor runs the action
//! and records the execution's outcome.
//!
//! ## The guard, and when it commits
//!
//! Every command is guarded on its action execution id (processed-message scope
//! [`GUARD_SCOPE`], `automation.action`). The mark is taken in the transaction that records
//! the success, never before: a duplicate command (a redelivery, or the trigger's deliberately
//! undeduplicated re-emission) that finds the mark, or finds the execution `succeeded` (the
//! mark swept by retention), is acknowledged as [`Handled::Duplicate`](worker_core::Handled::Duplicate) without doing anything.
//!
//! * **`send_email`** touches only the database, so it stays **one transaction**: the
//!   execution row locked with the guard's mark read in the same statement, the email
//!   rendered from the event's fields ([`render`]), then one statement (a CTE) that takes the
//!   mark and, only if it is new, writes the `outbound_emails` row (id
//!   [`worker_messages::outbound_email_id`] of the execution id), its recipients, an outbox
//!   row for the [`EmailSendCommand`](worker_messages::EmailSendCommand) (routing key
//!   `email.send`) and sets the row `succeeded`, all committed together: exactly once. A concurrent duplicate waits on the row's lock, then finds it `succeeded`. A
//!   template that does not render is a permanent failure. Mail that must not be answered
//!   ([`loops`], RFC 3834), and recipients past the reply limit ([`ReplyLimit`]; the
//!   execution when no `to` is left) are not mailed: the execution is recorded `skipped`
//!   with its `skip_reason`, the mark taken, in the same transaction.
//! * **`webhook`** POSTs `{"event": …, "action": {"type": "webhook"}}` ([`webhook::body`]:
//!   never the webhook's own URL or headers) with its own timeout, and
//!   **holds no database connection while it calls**:
//!   1. *claim*, in a short transaction: the guard is checked and the row locked; a `pending`
//!      (or `failed`, replayed) row becomes `running` with `claimed_by` (this executor's
//!      process uuid, [`ActionExecutor::owner`]) and `claimed_at`. A fresh `running` claim
//!      means another try is calling right now: this one **backs off** with a transient
//!      failure and leaves the row alone. A claim older than the stale limit
//!      ([`ActionExecutor::with_stale_claim_after`]; by default the webhook timeout, the
//!      record budget and [`STALE_CLAIM_MARGIN`]) was left by a process that died: it is
//!      taken over. So is a claim of this very process that no try in it holds any more
//!      (its try was cancelled, or could not record its failure).
//!   2. *call*, with no connection held: one slow receiver cannot starve the pool.
//!   3. *record*, in a second short transaction: after a 2xx, the mark and `succeeded`;
//!      after a failure, `failed` (permanent) or back to `pending` (transient, throttled),
//!      only while the claim is still this try's.
//!
//!   Recording a success is retried on any database error for [`DEFAULT_RECORD_BUDGET`]
//!   ([`ActionExecutor::with_record_budget`]): a receiver that acted is never recorded as
//!   failed. Should the database stay away longer, the try ends as an unknown outcome
//!   ([`Failure::unknown`](worker_core::Failure::unknown): parked, not retried in process) and the row stays `running` until
//!   a later delivery takes the claim over and calls again.
//!
//!   The call may not reach inside the installation (loopback, private ranges, link-local
//!   metadata addresses, …) unless [`ActionExecutor::with_webhook_allow`] names the place:
//!   see [`address`]. A refused call is a permanent failure (`webhook-refused`), with nothing
//!   sent.
//!
//!   The call is outside the database, so a webhook is **at least once**: a crash, a
//!   cancelled try or a database outage longer than the record budget, after the receiver
//!   acted but before the success was recorded, calls it again on a later try, rather than
//!   never. The `Idempotency-Key` header (the execution id) lets a receiver deduplicate.
//!
//! ## Outcomes
//!
//! | ends | execution row | the command |
//! |---|---|---|
//! | done | `succeeded`, `attempts + 1`, `finished_at`; the guard's mark | acked |
//! | skipped (a `send_email` not to answer) | `skipped`, `skip_reason`, `finished_at`; the guard's mark | acked |
//! | duplicate (the mark, or a `succeeded` row) | unchanged | acked |
//! | backed off: a fresh `running` claim of another try | unchanged | retried in process, then parked |
//! | transient or throttled | back to (or still) `pending`; `attempts + 1`, `last_error` | retried in process, then parked in the broker's retry tiers |
//! | permanent | `failed`, `attempts + 1`, `last_error`, `finished_at` | dead-lettered (`rejected`) |
//! | unavailable: the webhook host's circuit is open, or this try's failure to connect opened it ([`circuit`]) | unchanged, or back to `pending` with `last_error` and `attempts` as they were | parked, its attempt unchanged, in the first retry tier that waits until the host's next probe |
//! | a 2xx whose success could not be recorded within the budget | still `running` | parked as an unknown outcome |
//!
//! A failure is recorded without the guard's mark: a dead-lettered command replayed after a
//! fix runs again. When the broker gives up on a command after its last retry tier, its
//! execution stays `pending` with the last error; the dead letter says `gave-up`. Database
//! errors are classified once, by [`worker_store::classify_sqlx`].
//!
//! ## How the host runs it
//!
//! From its one line in the host's job list (`crates/host/src/jobs.rs`), built from its
//! settings section; ARCHITECTURE.md ("Adding a job") walks through that wiring.
//!
//! The unit's `timeout` should exceed `webhook_timeout` plus the record budget, so that the
//! unit is not cancelled while it records a success.

pub mod address;
pub mod check;
pub mod circuit;
mod claim;
mod execution;
mod executor;
pub mod loops;
pub mod render;
pub mod reply_limit;
mod send_email;
pub mod settings;
pub mod skips;
pub mod story;
pub mod webhook;

use std::time::Duration;

pub use address::WebhookAllow;
pub use check::check_rendered;
pub use executor::{ActionExecutor, BuildError};
pub use render::{RenderedEmail, render_email};
pub use reply_limit::{
    DEFAULT_RECIPIENTS_MAX, DEFAULT_REPLY_LIMIT, DEFAULT_REPLY_WINDOW, ReplyLimit,
};
pub use settings::{AutoReplySettings, AutomationActionSettings};
pub use skips::{SkipKind, skips_since};
pub use webhook::WebhookClient;

/// The job's name, in logs, metrics and the attempt log.
pub const JOB_NAME: &str = "automation-action";

/// What the host needs to know of this job (its name, kind and lease).
pub const JOB: worker_core::JobSpec = worker_core::catalog::JobSpec::consumer(JOB_NAME);

/// The processed-message scope of the guard.
pub const GUARD_SCOPE: &str = "automation.action";

/// The domain of the Message-ID headers of the emails it queues (`<email id>@worker-host`).
pub const MESSAGE_ID_DOMAIN: &str = "worker-host";

/// The longest `last_error` kept on an execution row, in bytes.
pub const LAST_ERROR_MAX: usize = 2048;

/// How long recording a webhook's success is retried on database errors.
pub const DEFAULT_RECORD_BUDGET: Duration = Duration::from_secs(10);

/// Added to the webhook timeout and the record budget to make the stale limit of a claim.
pub const STALE_CLAIM_MARGIN: Duration = Duration::from_secs(30);
