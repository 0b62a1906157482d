//! What a request carries: its cookies and its `Bearer` token; and the secrets it is checked
//! with, made and compared here only.

use axum::http::HeaderMap;
use cookie::{Cookie, SameSite};
use sha2::{Digest, Sha256};

/// The session cookie.
pub const SESSION_COOKIE: &str = "wh_session";
/// The sign-in form's own CSRF cookie.
pub const SIGNIN_COOKIE: &str = "wh_signin";

/// 32 random bytes as hex: a session id or a CSRF token.
pub(super) fn random_token() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Compares two secrets by their SHA-256, so that the time taken says nothing about how much
/// of a guess was right.
pub(super) fn same_secret(a: &str, b: &str) -> bool {
    Sha256::digest(a.as_bytes()) == Sha256::digest(b.as_bytes())
}

pub(super) fn digest(id: &str) -> Vec<u8> {
    Sha256::digest(id.as_bytes()).to_vec()
}

/// The value of cookie `name` in the request.
pub fn cookie_value(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(Cookie::split_parse)
        .filter_map(Result::ok)
        .find(|c| c.name() == name)
        .map(|c| c.value().to_string())
}

/// The request's `Authorization: Bearer` token, if it has one.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

/// A `Set-Cookie` value: HttpOnly, SameSite=Strict, path `/`, Secure when the browser came
/// over HTTPS; `None` as the value ends the cookie.
pub fn set_cookie(tls: bool, name: &str, value: Option<&str>) -> String {
    let mut cookie = Cookie::build((name.to_string(), value.unwrap_or("").to_string()))
        .http_only(true)
        .same_site(SameSite::Strict)
        .path("/")
        .secure(tls);
    if value.is_none() {
        cookie = cookie.max_age(cookie::time::Duration::ZERO);
    }
    cookie.build().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_are_http_only_strict_and_secure_over_https() {
        let set = set_cookie(false, SESSION_COOKIE, Some("abc"));
        assert!(set.contains("HttpOnly"), "{set}");
        assert!(set.contains("SameSite=Strict"), "{set}");
        assert!(!set.contains("Secure"), "{set}");
        assert!(set_cookie(true, SESSION_COOKIE, Some("abc")).contains("Secure"));
        assert!(set_cookie(true, SESSION_COOKIE, None).contains("Max-Age=0"));
    }

    #[test]
    fn a_bearer_token_is_read_from_its_header() {
        let mut headers = HeaderMap::new();
        assert_eq!(bearer(&headers), None);
        headers.insert(
            axum::http::header::AUTHORIZATION,
            "Bearer wht_abc ".parse().unwrap(),
        );
        assert_eq!(bearer(&headers), Some("wht_abc"));
    }
}
