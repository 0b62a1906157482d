//! The operator's console: pages on the admin port to see what failed, why and how often, and
//! to put it right, with the same data as JSON under `/api/`.
//!
//! Every query and action goes through the libraries the command line uses
//! (`job_dead_letter_archive`, `worker_store::{outbox, pauses, audit}`): there is no second
//! implementation here, only pages; what only the running host knows comes through
//! [`crate::runtime::Runtime`]. The pages are rendered on the server ([`views`]) and work
//! without JavaScript; a running bulk action's page reloads itself. [`access`] decides who
//! may read and act, and `caller.rs` finds out who each request comes from before its
//! handler runs. Every action is also under `/api/` for scripts with an API token: the same
//! handlers, answering JSON.
//!
//! - `overview.rs`: `/`, the jobs, queues, dead letters, outbox, links, alerts and replicas;
//! - `dead_letters.rs`: `/dead-letters` (groups), `/dead-letters/messages`, one dead letter;
//! - `bulk.rs`: replay and purge (a dry run, then a confirmed run at a rate), their progress
//!   and cancel, and the audit trail (`/actions`);
//! - `jobs.rs`: a timer job, run now, pause and resume;
//! - `circuits.rs`: the open circuits a job's page and the overview show, and closing one;
//! - `history.rs`: the history's charts (overview, a job, `/queues/{name}`) and their JSON;
//!   `chart.rs` draws them as SVG;
//! - `outbox.rs`: pending and failed rows, retry;
//! - `send_now.rs`: a queue's parked messages sent now (a dry run, then the confirmed count);
//! - `mail.rs`: `/mail`, a search for mails with their end states, and `/mail/{id}`, one
//!   mail's story;
//! - `audit_log.rs`: `/audit-log`, other teams' audit entries, searched and paged;
//! - `sign_in.rs`: the operator session;
//! - `accounts.rs`: `/accounts`, the operator accounts, which an admin manages;
//! - `personal.rs`: who sees customers' personal data ([`masking`] hides it from the rest),
//!   and a viewer's audited reveal; `privacy.rs`: `/privacy`, an admin's erasure of one
//!   person's data;
//! - [`crate::forwarded`]: which proxies' forwarded headers count; [`crate::throttle`]: how
//!   fast credentials may be tried.

mod accounts;
mod audit_log;
mod bulk;
pub mod caller;
mod circuits;
mod dead_letters;
pub mod edit;
mod history;
mod jobs;
mod mail;
mod outbox;
mod overview;
pub mod page;
mod personal;
mod privacy;
mod send_now;
mod sign_in;

use crate::{access, filter, masking};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::runtime::Runtime;

pub use access::Access;
pub use bulk::BulkRuns;
pub use worker_pages::Views;

/// What the console reads and acts through.
#[derive(Debug)]
pub struct Console {
    /// The console's own pool (`admin.console_connections`), apart from the jobs' pool.
    pub pool: sqlx::PgPool,
    pub publisher: worker_broker::Publisher,
    /// The running host: its jobs, readings, timers and gates.
    pub runtime: Arc<dyn Runtime>,
    /// `installation`, on every page's frame.
    pub installation: String,
    /// `admin.environment`: the band at the top of every page.
    pub environment: Option<worker_pages::environment::Environment>,
    pub access: Access,
    pub bulk: BulkRuns,
    pub views: Views,
    /// This replica's name.
    pub replica: String,
    /// How long the archive keeps replayed and purged dead letters before the sweep.
    pub archive_retention: Duration,
    /// `jobs.retention.audit_log`: how long the audit log keeps an entry (`None`: kept).
    pub audit_log_retention: Option<Duration>,
    /// How long the tables a mail's story reads keep their rows.
    pub story_retention: crate::story::Retention,
    /// The rate a bulk action offers first.
    pub bulk_rate: u32,
    /// `jobs.email_send.max_age`: a replay's plan counts the replies it would expire.
    pub email_max_age: Option<Duration>,
    /// How passwords an admin sets here are hashed.
    pub password_hashing: crate::settings::PasswordHashing,
    pub tracker: TaskTracker,
    pub shutdown: CancellationToken,
    /// How an operator's edit of a failed mail is checked and sent.
    pub edits: edit::EditSettings,
    /// The keyed hash's key an admin's erasure of a person's data needs (`/privacy`); `None`
    /// when the settings give none, and the page says so.
    pub privacy_key: Option<worker_store::privacy::HashKey>,
}

/// The pages' templates, with the console's own filters: an audit entry's stored kind as
/// operators read it (`trigger` as "run now"), and a value as indented JSON (escaped by the
/// page like any text).
pub fn views() -> Result<Views, minijinja::Error> {
    Ok(Views::new()?
        .with_filter("shown_kind", |stored: String| {
            worker_store::audit::shown(&stored).to_string()
        })
        .with_filter("pretty_json", |value: minijinja::Value| {
            serde_json::to_string_pretty(&value).unwrap_or_else(|e| format!("({e})"))
        }))
}

/// The operator actions, each a form's target and, under `/api/`, a script's.
fn operator_actions() -> Router<Arc<Console>> {
    Router::new()
        .route("/dead-letters/replay", post(bulk::replay_plan))
        .route("/dead-letters/purge", post(bulk::purge_plan))
        .route("/dead-letters/replay/run", post(bulk::replay_start))
        .route("/dead-letters/purge/run", post(bulk::purge_start))
        .route("/actions/{id}/cancel", post(bulk::cancel))
        .route("/jobs/{name}/run-now", post(jobs::run_now))
        // The route's name before "run now": operators' scripts still post to it.
        .route("/jobs/{name}/trigger", post(jobs::run_now))
        .route("/jobs/{name}/pause", post(jobs::pause))
        .route("/jobs/{name}/resume", post(jobs::resume))
        .route(
            "/jobs/{name}/circuits/{dependency}/close",
            post(circuits::close_from_job),
        )
        .route("/circuits/{dependency}/close", post(circuits::close))
        .route("/outbox/retry", post(outbox::retry))
        .route("/accounts/add", post(accounts::add))
        .route("/accounts/{name}/{change}", post(accounts::change))
        .route("/outbound/{id}/edited", post(edit::edit_submit))
        .route("/dead-letters/{id}/edited", post(edit::body_edit_submit))
        .route("/reveal", post(personal::reveal))
        .route("/accounts/{name}/personal-data", post(personal::set_right))
        .route("/privacy/erase", post(privacy::erase))
        .route("/queues/{name}/send-now", post(send_now::plan))
        .route("/queues/{name}/send-now/run", post(send_now::run))
}

/// The console's routes, pages and API.
pub fn routes(console: Arc<Console>) -> Router {
    let identified = Router::new()
        .route("/", get(overview::page))
        .route("/dead-letters", get(dead_letters::groups_page))
        .route("/dead-letters/messages", get(dead_letters::messages_page))
        .route("/dead-letters/{id}", get(dead_letters::one_page))
        .route("/actions", get(bulk::trail_page))
        .route("/actions/{id}", get(bulk::entry_page))
        .route("/jobs/{name}", get(jobs::page))
        .route("/queues/{name}", get(history::queue_html))
        .route("/outbox", get(outbox::page))
        .route("/mail", get(mail::search_page))
        .route("/mail/{id}", get(mail::story_page))
        .route("/audit-log", get(audit_log::page))
        .route("/accounts", get(accounts::page))
        .route("/privacy", get(privacy::page))
        .route("/outbound/{id}", get(edit::mail_page))
        .route("/outbound/{id}/edit", get(edit::edit_page))
        .route("/dead-letters/{id}/edit", get(edit::body_edit_page))
        .route("/sign-in", get(sign_in::form).post(sign_in::submit))
        .route("/sign-out", post(sign_in::sign_out))
        .merge(operator_actions())
        .nest(
            "/api",
            operator_actions().layer(axum::middleware::from_fn(caller::api_answers)),
        )
        .route("/api/overview", get(overview::api))
        .route("/api/dead-letters", get(dead_letters::groups_api))
        .route(
            "/api/dead-letters/messages",
            get(dead_letters::messages_api),
        )
        .route("/api/dead-letters/{id}", get(dead_letters::one_api))
        .route("/api/actions", get(bulk::trail_api))
        .route("/api/actions/{id}", get(bulk::entry_api))
        .route("/api/jobs/{name}", get(jobs::api))
        .route("/api/jobs/{name}/history", get(history::job_api))
        .route("/api/history", get(history::overview_api))
        .route("/api/queues/{name}", get(history::queue_api))
        .route("/api/outbox", get(outbox::api))
        .route("/api/mail", get(mail::search_api))
        .route("/api/mail/{id}", get(mail::story_api))
        .route("/api/audit-log", get(audit_log::api))
        .route("/api/accounts", get(accounts::api))
        .route("/api/outbound/{id}", get(edit::mail_api))
        .layer(axum::middleware::from_fn_with_state(
            console.clone(),
            caller::identify,
        ));
    Router::new()
        .route("/console.css", get(worker_pages::stylesheet))
        .merge(identified)
        .with_state(console)
}
