//! A Google service account's key file and the assertion it signs (RS256), written here with
//! ring (rustls's provider, already linked) rather than a JWT crate: one header, one claim
//! set, one signature.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::SystemRandom;
use ring::signature::{RSA_PKCS1_SHA256, RsaKeyPair};
use serde::Deserialize;
use tokio_rustls::rustls::pki_types::PrivatePkcs8KeyDer;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;

/// How long an assertion is good for: Google's maximum.
const ASSERTION_LIFETIME_SECS: u64 = 3600;

/// A service account's identity and signing key.
pub(crate) struct ServiceKey {
    pub client_email: String,
    key_id: Option<String>,
    key: RsaKeyPair,
}

impl std::fmt::Debug for ServiceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceKey")
            .field("client_email", &self.client_email)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct KeyFile {
    #[serde(rename = "type")]
    kind: Option<String>,
    client_email: String,
    private_key: String,
    private_key_id: Option<String>,
}

impl ServiceKey {
    /// Reads a JSON key as Google's console downloads it. The error names what is wrong and
    /// never holds the key.
    pub(crate) fn read(path: &Path) -> Result<Self, String> {
        let shown = path.display();
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("the key file {shown} cannot be read: {e}"))?;
        let file: KeyFile = serde_json::from_str(&text).map_err(|e| {
            format!("the key file {shown} is not a service account's JSON key: {e}")
        })?;
        if file.kind.as_deref().is_some_and(|k| k != "service_account") {
            return Err(format!(
                "the key file {shown} is of type `{}`, not `service_account`",
                file.kind.unwrap_or_default()
            ));
        }
        let der = PrivatePkcs8KeyDer::from_pem_slice(file.private_key.as_bytes()).map_err(|e| {
            format!("the key file {shown}: `private_key` is not a PKCS#8 PEM key: {e}")
        })?;
        let key = RsaKeyPair::from_pkcs8(der.secret_pkcs8_der())
            .map_err(|e| format!("the key file {shown}: `private_key` is not an RSA key: {e}"))?;
        Ok(Self {
            client_email: file.client_email,
            key_id: file.private_key_id,
            key,
        })
    }

    /// The signed assertion acting as `subject`, for `scope`, addressed to `audience` (the
    /// token URL).
    pub(crate) fn assertion(
        &self,
        subject: &str,
        scope: &str,
        audience: &str,
    ) -> Result<String, String> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(|e| format!("the clock is before 1970: {e}"))?
            .as_secs();
        let mut header = serde_json::json!({ "alg": "RS256", "typ": "JWT" });
        if let Some(id) = &self.key_id {
            header["kid"] = id.clone().into();
        }
        let claims = serde_json::json!({
            "iss": self.client_email,
            "sub": subject,
            "scope": scope,
            "aud": audience,
            "iat": now,
            "exp": now + ASSERTION_LIFETIME_SECS,
        });
        let signed = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let mut signature = vec![0; self.key.public().modulus_len()];
        self.key
            .sign(
                &RSA_PKCS1_SHA256,
                &SystemRandom::new(),
                signed.as_bytes(),
                &mut signature,
            )
            .map_err(|_| "the assertion could not be signed".to_string())?;
        Ok(format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_file_that_is_not_json_is_named_without_its_text() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("key.json");
        std::fs::write(&path, "-----BEGIN PRIVATE KEY-----\nsecret\n")
            .unwrap_or_else(|e| panic!("{e}"));
        let err = ServiceKey::read(&path).err().unwrap_or_default();
        assert!(err.contains("is not a service account's JSON key"), "{err}");
        assert!(!err.contains("secret"), "{err}");
    }

    #[test]
    fn a_key_that_is_not_pem_is_refused_naming_private_key() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("key.json");
        std::fs::write(
            &path,
            r#"{"type": "service_account", "client_email": "a@b.iam.gserviceaccount.com", "private_key": "nope"}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let err = ServiceKey::read(&path).err().unwrap_or_default();
        assert!(
            err.contains("`private_key` is not a PKCS#8 PEM key"),
            "{err}"
        );
    }
}
