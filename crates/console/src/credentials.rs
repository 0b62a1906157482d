//! Operators' credentials: passwords hashed with argon2id (the parameters of
//! `[admin.password_hashing]`, kept inside each PHC string so that a later change of them
//! leaves older hashes readable), and API tokens, 32 random bytes shown once and kept only as
//! their SHA-256.

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::{Algorithm, Argon2, Params, Version};
use sha2::{Digest, Sha256};

use crate::settings::PasswordHashing;

/// The shortest password an account may have.
pub const PASSWORD_MIN_CHARS: usize = 12;
/// What every API token starts with, so that a leaked one is recognised in a log or a repo.
pub const TOKEN_PREFIX: &str = "wht_";

/// Why a password cannot be used or checked.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CredentialError {
    #[error("a password needs at least {PASSWORD_MIN_CHARS} characters")]
    TooShort,
    #[error("argon2 refuses the hashing parameters: {0}")]
    Parameters(String),
    #[error("hashing the password failed: {0}")]
    Hashing(String),
}

fn hasher(settings: PasswordHashing) -> Result<Argon2<'static>, CredentialError> {
    let params = Params::new(
        settings.memory_kib,
        settings.iterations,
        settings.parallelism,
        None,
    )
    .map_err(|e| CredentialError::Parameters(e.to_string()))?;
    Ok(Argon2::new(Algorithm::Argon2id, Version::V0x13, params))
}

/// The argon2id PHC string of `password`, with a fresh salt.
pub fn hash_password(password: &str, settings: PasswordHashing) -> Result<String, CredentialError> {
    if password.chars().count() < PASSWORD_MIN_CHARS {
        return Err(CredentialError::TooShort);
    }
    let salt = SaltString::encode_b64(&rand::random::<[u8; 16]>())
        .map_err(|e| CredentialError::Hashing(e.to_string()))?;
    hasher(settings)?
        .hash_password(password.as_bytes(), &salt)
        .map(|hash| hash.to_string())
        .map_err(|e| CredentialError::Hashing(e.to_string()))
}

/// Whether `password` is the one `stored` was made from (a stored string that is not a PHC
/// hash matches nothing).
pub fn verify_password(password: &str, stored: &str) -> bool {
    PasswordHash::new(stored).is_ok_and(|hash| {
        Argon2::default()
            .verify_password(password.as_bytes(), &hash)
            .is_ok()
    })
}

/// A new API token, as shown once to the operator.
pub fn new_token() -> String {
    let bytes: [u8; 32] = rand::random();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("{TOKEN_PREFIX}{hex}")
}

/// What the database keeps of a token.
pub fn token_digest(token: &str) -> Vec<u8> {
    Sha256::digest(token.trim().as_bytes()).to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Cheap parameters: the tests check the format, not the cost.
    const CHEAP: PasswordHashing = PasswordHashing {
        memory_kib: 1024,
        iterations: 1,
        parallelism: 1,
    };

    #[test]
    fn a_hashed_password_verifies_and_another_does_not() {
        let hash = hash_password("correct horse battery", CHEAP).unwrap();
        assert!(hash.starts_with("$argon2id$v=19$m=1024,t=1,p=1$"), "{hash}");
        assert!(verify_password("correct horse battery", &hash));
        assert!(!verify_password("correct horse battery!", &hash));
        assert!(!verify_password("anything", "not a hash"));
    }

    #[test]
    fn two_hashes_of_one_password_differ_by_their_salt() {
        let a = hash_password("the same password", CHEAP).unwrap();
        let b = hash_password("the same password", CHEAP).unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn a_short_password_is_refused() {
        assert_eq!(
            hash_password("short", CHEAP),
            Err(CredentialError::TooShort)
        );
    }

    #[test]
    fn the_default_parameters_are_the_ones_written_in_the_hash() {
        let hash = hash_password("default parameters", PasswordHashing::default()).unwrap();
        assert!(hash.contains("$m=19456,t=2,p=1$"), "{hash}");
    }

    #[test]
    fn a_token_is_prefixed_random_and_kept_as_its_digest() {
        let token = new_token();
        assert!(token.starts_with(TOKEN_PREFIX));
        assert_eq!(token.len(), TOKEN_PREFIX.len() + 64);
        assert_ne!(token, new_token());
        assert_eq!(token_digest(&token).len(), 32);
        assert_eq!(token_digest(&token), token_digest(&format!(" {token}\n")));
    }
}
