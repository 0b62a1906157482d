//! The frame of the operator's pages, shared by the console (on the host's admin port) and the
//! fleet view (`worker-host fleet`), so that neither depends on the other: the templates and
//! their filters ([`views`]), the stylesheet, the headers every page carries ([`secure`]),
//! an installation's environment band ([`environment`]) and the `Host` check against DNS
//! rebinding ([`allowed_hosts`]).

pub mod allowed_hosts;
pub mod environment;
pub mod views;

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

pub use views::Views;

/// The policy of every admin response: nothing but this origin's stylesheet and forms; no
/// script at all, inline or not, and no framing.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; style-src 'self'; img-src 'self'; \
     form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Adds the security headers to a response: the policy, `Cache-Control: no-store` (a page
/// may show a message's body), no sniffing, no referrer (a URL may hold a search).
pub async fn secure(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::CACHE_CONTROL, "no-store"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_FRAME_OPTIONS, "DENY"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// `/console.css`.
pub async fn stylesheet() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        views::STYLESHEET,
    )
}
