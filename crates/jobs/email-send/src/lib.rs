//! # job-email-send: sends the stored outbound emails over SMTP
//!
//! A [`ConsumerJob`](worker_core::ConsumerJob) on the `email.send` queue. Its input, an [`EmailSendCommand`](worker_messages::EmailSendCommand), names an
//! `outbound_emails` row (written by the action executor, or anything else that queues mail);
//! this job sends it over a small pool of lettre SMTP connections and records the outcome on
//! the row.
//!
//! ## Claim, send, record: no database connection held across the send
//!
//! Every try is three steps, and only the first and the last touch the database, each in a
//! single statement (its own short transaction: one round trip):
//!
//! 1. **Claim.** Lock the row, read its status and the processed-message guard (scope
//!    [`GUARD_SCOPE`], `email.send`; read only — it is marked in step 3). `sent`, or a marked
//!    guard: [`Handled::Duplicate`](worker_core::Handled::Duplicate), nothing is sent. A fresh `sending` claim: another try is
//!    at it, so this one backs off with a transient failure ("being sent by another
//!    worker"); the redelivery later finds the row `sent` and is a duplicate. Otherwise
//!    (`queued`, `unknown`, `failed` — a replayed dead letter — or a stale `sending` claim)
//!    the row becomes `sending` with `claimed_by` (this process, [`EmailSender::instance`])
//!    and `claimed_at`.
//! 2. **Send**, with no database connection held, under the send timeout.
//! 3. **Record.** Accepted: the row `sent` with the server's answer and the guard's mark, in
//!    one statement, retried on *any* database error for the record budget
//!    ([`EmailSender::with_record_budget`], 30 s by default): a mail the server accepted is
//!    never recorded `failed`. Not accepted: the claim is released (below).
//!
//! ## The row
//!
//! ```text
//! queued ──past its limit at the claim──▶ expired (never sent)
//! queued ──claim──▶ sending ──accepted──────────────────────────▶ sent
//!   ▲                  │ ├──4xx, timeout or broken before the "."──▶ queued (attempts + 1)
//!   │                  │ ├──5xx, bad address, client refusal──────▶ failed
//!   │                  │ └──no answer after the final "."─────────▶ unknown
//!   │                  └──(the try died: crash, cancel, record failed) stays sending;
//!   │                     older than the stale age, a later try takes it over
//!   └── unknown and failed are claimed again only by a later delivery of the command
//! ```
//!
//! ## Stale replies are not sent
//!
//! A reply past its limit when its turn comes (the claim, step 1) is recorded `expired` and
//! never sent: the row's own `expires_at` (an automation's `max_age`), else `created_at` plus
//! `jobs.email_send.max_age` (unset: no limit). The limit counts from `created_at`, when the
//! reply was queued, not from when the mail it answers arrived: every outbound mail has one
//! (a mail no inbound one caused too), the inbound pipeline takes seconds, and the waits this
//! guards against (an outage, parked tiers, a replay of dead letters) all come after it. The
//! message is acked as [`Handled::Skipped`](worker_core::Handled::Skipped) with reason
//! [`EXPIRED`]: a success, nothing dead-lettered, counted by the runner with its reason. The
//! limit it passed is kept in `expires_at`, for the mail's story. A replay's dry run counts
//! the dead letters that would expire ([`expiry::would_expire`]).
//!
//! ## Exactly one mail, but for one window
//!
//! * A failure before the final "." of DATA (no connection, a 4xx or 5xx to MAIL, RCPT or
//!   DATA, a timeout while connecting or writing the body) is certain: the server does not
//!   have the mail, and the next try sends it.
//! * The server's answer to the final "." is certain too: `sent`, or released as above.
//! * **No answer after the final "."** (the send timeout, a broken connection) is an
//!   unknown outcome: the server may have taken the mail. The row becomes `unknown` with
//!   `last_error` saying so, the handler returns [`Failure::unknown`](worker_core::Failure::unknown) (never tried again in
//!   process; the runner parks the message), and the unknown counter goes up
//!   ([`EmailSender::on_unknown`]; the host's `worker_email_unknown_outcomes_total`). The
//!   next delivery sends it again: **one possible duplicate per unknown outcome**, visible.
//! * **The try dies between the server's acceptance and the record** (the process killed,
//!   the handler cancelled by shutdown or its per-try timeout, the database unreachable for
//!   the whole record budget): the row stays `sending`. A redelivery within the stale age
//!   backs off; after it (the send timeout + the record budget + [`CLAIM_MARGIN`] by
//!   default, [`EmailSender::with_claim_stale_after`]) a later try takes the claim over,
//!   counts an unknown outcome, and sends again. This is the protocol's own window.
//!
//! Both duplicates carry the same Message-ID (`<email id@worker-host>`), so a receiving
//! client may fold them. A lost database session at any other moment costs nothing: the
//! claim's transaction rolls back before the send, and the record is retried after it.
//!
//! ## The SMTP pool
//!
//! At most `pool_size` connections, each used by one send at a time. A connection goes back
//! to the pool only after a whole mail transaction ended with the server's positive answer
//! read; any error, timeout or cancelled send closes it, so a late answer is never read as
//! another mail's (lettre's own pool hands such a connection back). An idle connection is
//! checked with NOOP before reuse once it has sat idle 5 s (a mail sent on one reused sooner
//! that the server had dropped is tried once more on a new connection), and closed after a
//! minute idle.
//!
//! ## The sending rate
//!
//! `[smtp.rate]` limits what the SMTP account sends, all replicas together: messages a minute,
//! messages a day, recipients (To and Cc) a day; a key left unset takes the preset of
//! `smtp.oauth`'s provider (Microsoft 365: 30 a minute and 10,000 recipients a day; Google:
//! 2,000 messages a day), else sets no limit. The budget is kept in PostgreSQL
//! (`smtp_send_rate`, a row per `host:port/username`), taken after the claim in one short
//! transaction that locks the account's row ([`rate`]). A mail whose turn has not come waits up
//! to [`rate::WAIT_IN_PROCESS`] in the handler; a longer wait releases the claim uncharged and
//! returns `Failure::Unavailable` with that wait: the runner parks it, attempt unchanged. A
//! mail taken counts even when its send then fails (the provider may have counted it).
//!
//! A provider's quota answer (`432 4.3.2`, `554 5.2.0 ...SubmissionQuotaExceededException`,
//! `550 5.4.5`) is the account's: the relay's circuit opens until the window rolls over (when
//! our oldest send in it ages out; with none, a minute or an hour) and the mail goes back to its
//! queue uncharged, while the host stops the consumers on every replica.
//!
//! ## Timeouts
//!
//! | bound | covers |
//! |---|---|
//! | `smtp.connect_timeout` ([`SmtpSettings`]) | TCP connect, greeting, STARTTLS and AUTH together; the NOOP on an idle connection |
//! | `send_timeout` (a constructor parameter, `jobs.email_send.timeout`) | the whole send: waiting for a connection, connecting, MAIL, RCPT, DATA and the answer to the final "." |
//! | the record budget | recording the outcome, retried on database errors |
//!
//! ## Classification ([`classify`], the one place)
//!
//! | the send ended with | class | row |
//! |---|---|---|
//! | the server's 2xx to the final "." | success | `sent`, `smtp_response` = its answer |
//! | over `[smtp.rate]` (never sent) | unavailable, with its wait | `queued`, attempts unchanged |
//! | a quota answer (`554 5.2.0 ...SubmissionQuotaExceeded`, `550 5.4.5`, `432 4.3.2`) | unavailable; the relay's circuit opens | `queued`, attempts unchanged |
//! | a 4xx answer (`451 4.3.0 try later`) | transient | `queued`, `attempts + 1`, `last_error` |
//! | a 5xx answer (`550 5.1.1 no such user`) | permanent, `smtp-5xx`, detail the answer | `failed`, `last_error` = the answer |
//! | no connection, a broken one or a timeout before the final ".", another TLS failure | transient | `queued` |
//! | a timeout or a broken connection after the final "." | unknown ([`Failure::unknown`](worker_core::Failure::unknown)) | `unknown` |
//! | lettre refused to go on (no STARTTLS offered, no usable AUTH mechanism, no SMTPUTF8) | permanent, `smtp-client` | `failed` |
//! | the server's certificate did not verify (unknown CA, another name, expired) | permanent, `smtp-tls` | `failed` |
//! | an address in the row that does not parse | permanent, `bad-address` | `failed` |
//!
//! One refused recipient fails the whole mail (SMTP has no partial send here).
//!
//! ## Headers
//!
//! `Message-ID: <{row.message_id}>`; `In-Reply-To` and `References` from the row (ids stored
//! without angle brackets); `Date`; and `Auto-Submitted: auto-replied` (a reply) or
//! `auto-generated` (RFC 3834), so that well-behaved auto-responders do not answer back.
//!
//! ## How the host runs it
//!
//! From its one line in the host's job list (`crates/host/src/jobs.rs`), built from its
//! settings section; ARCHITECTURE.md ("Adding a job") walks through that wiring.

mod auth;
mod config;
mod dsn;
pub mod edit;
mod error;
pub mod expiry;
mod message;
pub mod rate;
pub mod relay;
mod sender;
pub mod settings;
mod smtp;
mod store;
pub mod story;

use std::time::Duration;

pub use config::{SmtpConfigError, SmtpSettings};
pub use error::{SendError, classify, server_answer};
pub use rate::{RateSettings, RateView};
pub use sender::EmailSender;
pub use settings::{EmailSendSettings, runner_timeout};
pub use smtp::try_sign_in;

/// The job's name, in logs, metrics and the attempt log.
pub const JOB_NAME: &str = "email-send";

/// What the host needs to know of this job (its name, kind and lease).
pub const JOB: worker_core::JobSpec = worker_core::catalog::JobSpec::consumer(JOB_NAME);

/// The processed-message scope of the guard.
pub const GUARD_SCOPE: &str = "email.send";

/// The skip reason of a reply recorded `expired` (past `jobs.email_send.max_age` or its own
/// `expires_at`): counted in `worker_messages_total{outcome="skipped", reason="expired"}`.
pub const EXPIRED: &str = "expired";

/// The longest `last_error` or `smtp_response` kept on a row, in bytes.
pub const LAST_ERROR_MAX: usize = 2048;

/// How long recording a claim's outcome is retried on database errors, by default.
pub const DEFAULT_RECORD_BUDGET: Duration = Duration::from_secs(30);

/// Added to the send timeout and the record budget to make the default stale-claim age.
pub const CLAIM_MARGIN: Duration = Duration::from_secs(60);

/// SMTP connections open at once, unless `smtp.pool_size` says otherwise.
pub const DEFAULT_POOL_SIZE: u32 = 4;
