//! The SASL exchanges that carry a token: XOAUTH2 (Google's and Microsoft's) and
//! OAUTHBEARER (RFC 7628), as the client's first message, before base64. A server that
//! refuses the token answers a challenge holding a JSON error; the client then sends an
//! empty response and the server ends the exchange with its own failure, which is what gets
//! recorded.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use crate::AuthMethod;

/// `user=USER^Aauth=Bearer TOKEN^A^A`.
pub fn xoauth2(user: &str, token: &str) -> String {
    format!("user={user}\x01auth=Bearer {token}\x01\x01")
}

/// `n,a=USER,^Ahost=HOST^Aport=PORT^Aauth=Bearer TOKEN^A^A`, the user name escaped as RFC
/// 5801's saslname (`,` as `=2C`, `=` as `=3D`).
pub fn oauthbearer(user: &str, host: &str, port: u16, token: &str) -> String {
    let user = user.replace('=', "=3D").replace(',', "=2C");
    format!("n,a={user},\x01host={host}\x01port={port}\x01auth=Bearer {token}\x01\x01")
}

/// The first message of `method` (none for passwords).
pub fn initial_response(
    method: AuthMethod,
    user: &str,
    host: &str,
    port: u16,
    token: &str,
) -> Option<String> {
    match method {
        AuthMethod::Password => None,
        AuthMethod::Xoauth2 => Some(xoauth2(user, token)),
        AuthMethod::Oauthbearer => Some(oauthbearer(user, host, port, token)),
    }
}

/// A server's error challenge as text: base64 decoded when it is, else as sent.
pub fn challenge_text(challenge: &[u8]) -> String {
    let trimmed = challenge.trim_ascii();
    match STANDARD.decode(trimmed) {
        Ok(decoded) if !decoded.is_empty() => String::from_utf8_lossy(&decoded).into_owned(),
        _ => String::from_utf8_lossy(trimmed).into_owned(),
    }
}

/// Base64 of `text`, as SMTP's AUTH carries it.
pub fn base64(text: &str) -> String {
    STANDARD.encode(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xoauth2_is_googles_format() {
        assert_eq!(
            xoauth2(
                "someuser@example.com",
                "ya29.vF9dft4qmTc2Nvb3RlckBhdHRhdmlzdGEuY29tCg"
            ),
            "user=someuser@example.com\x01auth=Bearer ya29.vF9dft4qmTc2Nvb3RlckBhdHRhdmlzdGEuY29tCg\x01\x01"
        );
        // Google's own example, base64 encoded.
        assert_eq!(
            base64(&xoauth2(
                "someuser@example.com",
                "ya29.vF9dft4qmTc2Nvb3RlckBhdHRhdmlzdGEuY29tCg"
            )),
            "dXNlcj1zb21ldXNlckBleGFtcGxlLmNvbQFhdXRoPUJlYXJlciB5YTI5LnZGOWRmdDRxbVRjMk52YjNSbGNrQmhkSFJoZG1semRHRXVZMjl0Q2cBAQ=="
        );
    }

    #[test]
    fn oauthbearer_is_rfc_7628s_format_with_the_user_escaped() {
        assert_eq!(
            oauthbearer(
                "user@example.com",
                "server.example.com",
                143,
                "vF9dft4qmTc2Nvb3RlckBhbHRhdmlzdGEuY29tCg=="
            ),
            "n,a=user@example.com,\x01host=server.example.com\x01port=143\x01auth=Bearer vF9dft4qmTc2Nvb3RlckBhbHRhdmlzdGEuY29tCg==\x01\x01"
        );
        assert!(oauthbearer("a,b=c", "h", 1, "t").starts_with("n,a=a=2Cb=3Dc,"));
    }

    #[test]
    fn an_error_challenge_reads_as_its_json() {
        let challenge =
            base64(r#"{"status":"401","schemes":"bearer","scope":"https://mail.google.com/"}"#);
        assert!(challenge_text(challenge.as_bytes()).contains(r#""status":"401""#));
        assert_eq!(challenge_text(b"not base64!"), "not base64!");
    }
}
