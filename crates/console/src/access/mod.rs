//! Who may see and who may act. Every request is made by a [`Caller`]: an operator account
//! signed in through a console session, an API token (`Authorization: Bearer`), or a trusted
//! auth proxy's header; or nobody.
//!
//! - Reading needs a signed-in account of any role, unless `admin.open_reading` is set (only
//!   on loopback, and never for a request that came through a proxy).
//! - Acting needs the `operator` role or above and, from a session, the session's CSRF token
//!   in the form and no sign that another site sent the request. A `Bearer` request needs no
//!   CSRF token: a browser never adds that header by itself.
//! - Sessions live in PostgreSQL ([`worker_store::sessions`]), so every replica knows them,
//!   and end after `admin.session_idle` without use or `admin.session_lifetime` in all. A page
//!   that reloads itself asks with [`REFRESH_MARKER`] in its query, which does not count as a
//!   use. The cookie `wh_session` is HttpOnly and SameSite=Strict, and Secure when the browser
//!   came over HTTPS through a trusted proxy.
//! - `admin.operator_token` is the credential of the `bootstrap` admin account: typed at
//!   sign-in (with the operator's own name, recorded beside the account) or sent as a token.
//!   It is kept as that account's API token
//!   ([`operators::sync_bootstrap`](worker_store::operators::sync_bootstrap) at start), so
//!   that every replica checks it in the database: a token changed or removed on one
//!   replica's start stops working on all of them, and ends the sessions made with it.
//! - Credentials are tried no faster than [`Throttle`](crate::throttle::Throttle)
//!   allows.
//!
//! The files: `rules.rs` (the [`Caller`] and what it may do, each [`Refusal`], and another
//! site's requests refused), `request.rs` (what a request carries: cookies and a `Bearer`
//! token; and how secrets are made and compared), `identify.rs` ([`Access`]: who a request
//! is, and the scrape token), `sessions.rs` (signing in and out), `decoy.rs` (the hash a wrong
//! account name is checked against).

mod decoy;
mod identify;
mod request;
mod rules;
mod sessions;

pub use identify::Access;
pub use request::{SESSION_COOKIE, SIGNIN_COOKIE, bearer, cookie_value, set_cookie};
pub use rules::{Caller, Credential, Refusal, Signed};

/// The query parameter of a page that reloads itself: that request does not keep its session
/// alive, so that a tab left open on a running action still ends at the idle limit.
pub const REFRESH_MARKER: &str = "refresh=auto";
/// The longest name an operator may give at sign-in.
pub const NAME_MAX_CHARS: usize = 80;
