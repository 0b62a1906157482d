//! Secrets in settings: held in [`Secret`], which never shows its value in `Debug`, in logs
//! or when the effective settings are printed.

use std::path::Path;

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// What a secret prints as, wherever it would otherwise show.
pub const REDACTED: &str = "[redacted]";

/// A secret value: a password or a credential.
#[derive(Clone)]
pub struct Secret(SecretString);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(SecretString::from(value.into()))
    }

    /// The value itself, for the one place that must hand it to a client library.
    pub fn expose(&self) -> &str {
        self.0.expose_secret()
    }

    /// Reads a secret from a file, trimming one trailing line break (as `echo` or an editor
    /// leaves it, and as Docker and Kubernetes secrets are mounted).
    pub fn from_file(path: &Path) -> std::io::Result<Self> {
        let text = std::fs::read_to_string(path)?;
        let value = text
            .strip_suffix('\n')
            .map(|t| t.strip_suffix('\r').unwrap_or(t))
            .unwrap_or(&text);
        Ok(Self::new(value))
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(REDACTED)
    }
}

/// Any scalar is taken as the secret's text: a password of digits only (`98765432123`) is
/// still a password, whether it came from an unquoted TOML value or from an environment
/// variable. A value of the wrong shape (a list, a table) is refused by its shape alone, so
/// that the error cannot quote it.
impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct AnyScalar;

        impl serde::de::Visitor<'_> for AnyScalar {
            type Value = Secret;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a secret as text")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Secret, E> {
                Ok(Secret::new(v))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Secret, E> {
                Ok(Secret::new(v))
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Secret, E> {
                Ok(Secret::new(v.to_string()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Secret, E> {
                Ok(Secret::new(v.to_string()))
            }
            fn visit_i128<E: serde::de::Error>(self, v: i128) -> Result<Secret, E> {
                Ok(Secret::new(v.to_string()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Secret, E> {
                Ok(Secret::new(v.to_string()))
            }
            fn visit_u128<E: serde::de::Error>(self, v: u128) -> Result<Secret, E> {
                Ok(Secret::new(v.to_string()))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Secret, E> {
                Ok(Secret::new(v.to_string()))
            }
            fn visit_char<E: serde::de::Error>(self, v: char) -> Result<Secret, E> {
                Ok(Secret::new(v.to_string()))
            }
        }

        deserializer.deserialize_any(AnyScalar)
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(REDACTED)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_serialize_never_show_the_value() {
        let secret = Secret::new("hunter2");
        assert_eq!(format!("{secret:?}"), REDACTED);
        assert_eq!(
            serde_json::to_string(&secret).unwrap(),
            format!("\"{REDACTED}\"")
        );
        assert_eq!(secret.expose(), "hunter2");
    }

    #[test]
    fn a_file_secret_loses_its_trailing_line_break_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw");
        std::fs::write(&path, " two words \n").unwrap();
        assert_eq!(Secret::from_file(&path).unwrap().expose(), " two words ");
    }
}
