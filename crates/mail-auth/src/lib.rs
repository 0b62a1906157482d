//! # worker-mail-auth: OAuth2 sign-in for the mail connections
//!
//! Microsoft 365 takes no password over IMAP, and Google Workspace none over IMAP or SMTP:
//! both want a token, sent as SASL XOAUTH2 (or OAUTHBEARER). This crate holds what the
//! poller and the sender share for that:
//!
//! * [`OAuthSettings`] — `[oauth.NAME]`: the flow (`client_credentials`, `refresh_token`,
//!   `service_account`), a provider preset that fills in the token URL and scope, and the
//!   checks `config check` runs ([`worker_core::Section`]).
//! * [`TokenSource`] — one source at run time: one cached token, renewed a margin before it
//!   expires with one request in flight; a refusal of the settings (`invalid_client`,
//!   `invalid_grant`, `unauthorized_client`) is permanent and asked again only after
//!   [`PERMANENT_PAUSE`]; a 5xx, a 429 or a timeout is transient. [`TokenSources`] holds them
//!   by name.
//! * [`sasl`] — the XOAUTH2 and OAUTHBEARER messages, and an error challenge made readable.
//! * [`AuthMethod`] — the `auth` key of an IMAP account and of `[smtp]`.
//!
//! ```
//! use worker_mail_auth::{AuthMethod, sasl};
//! let first = sasl::initial_response(AuthMethod::Xoauth2, "ops@example.com", "imap.example.com", 993, "tok");
//! assert_eq!(first.as_deref(), Some("user=ops@example.com\x01auth=Bearer tok\x01\x01"));
//! ```

mod error;
mod grant;
mod jwt;
pub mod sasl;
mod settings;
mod source;

pub use error::TokenError;
pub use settings::{
    AuthMethod, Flow, GOOGLE_SCOPE, GOOGLE_TOKEN_URL, MICROSOFT_APP_SCOPE,
    MICROSOFT_DELEGATED_SCOPE, MICROSOFT_SMTP_CONNECTIONS, OAuthSettings, Provider, SendingLimits,
    check_token_url,
};
pub use source::{AccessToken, PERMANENT_PAUSE, TRANSIENT_PAUSE, TokenSource, TokenSources};
