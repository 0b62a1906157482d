//! The decoy: an argon2id string that matches no password, verified when no account has the
//! name given, so that a wrong name takes as long as a wrong password. It is made with the
//! configured `[admin.password_hashing]` parameters, the same as every stored password's
//! (argon2 verifies with the parameters in the string it is given): with the library's
//! defaults instead, a name that exists would answer at another speed than one that does
//! not, once the settings change them.

use std::sync::OnceLock;

use super::request::random_token;
use crate::credentials;
use crate::settings::PasswordHashing;

/// The decoy of one parameter set, made at its first use (a hash costs what a sign-in does).
#[derive(Debug)]
pub struct Decoy {
    hashing: PasswordHashing,
    hash: OnceLock<String>,
}

impl Decoy {
    pub fn new(hashing: PasswordHashing) -> Self {
        Self {
            hashing,
            hash: OnceLock::new(),
        }
    }

    /// The decoy's argon2id string. Blocks for one hash the first time.
    pub fn hash(&self) -> &str {
        self.hash.get_or_init(|| {
            credentials::hash_password(&random_token(), self.hashing).unwrap_or_default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_decoy_is_hashed_with_the_configured_parameters() {
        let cheap = PasswordHashing {
            memory_kib: 1024,
            iterations: 1,
            parallelism: 1,
        };
        let decoy = Decoy::new(cheap);
        assert!(
            decoy.hash().contains("$m=1024,t=1,p=1$"),
            "{}",
            decoy.hash()
        );
        assert!(!credentials::verify_password(
            "anything at all",
            decoy.hash()
        ));
    }
}
