//! One person's address, as a request names it, and where it occurs in text and bytes.
//!
//! An address is found case-insensitively (ASCII) wherever it stands on its own: in a bare
//! field, in `Ann <ann@example.com>`, inside a JSON or byte body; not inside a longer address
//! (`joann@example.com`, `ann@example.com.au`).

use std::ops::Range;

/// A bare, lower-case mail address (`ann@example.com`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address(String);

/// Why a request's address was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a mail address (local@domain, or Name <local@domain>)")]
pub struct NotAnAddress(pub String);

/// Characters an address can continue with on its left (its local part's).
fn local_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"._%+-'".contains(&b)
}

/// Characters an address can continue with on its right (its domain's).
fn domain_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-'
}

impl Address {
    /// The address in `text`: bare, or the part in angle brackets of `Name <addr>`; trimmed and
    /// lower-cased.
    pub fn parse(text: &str) -> Result<Self, NotAnAddress> {
        let trimmed = text.trim();
        let bare = match (trimmed.rfind('<'), trimmed.rfind('>')) {
            (Some(open), Some(close)) if open < close => &trimmed[open + 1..close],
            _ => trimmed,
        }
        .trim();
        let refused = || NotAnAddress(text.to_string());
        let (local, domain) = bare.split_once('@').ok_or_else(refused)?;
        if local.is_empty()
            || domain.is_empty()
            || domain.contains('@')
            || bare
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || "<>\"\\,;".contains(c))
        {
            return Err(refused());
        }
        Ok(Self(bare.to_lowercase()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Where the address stands in `bytes`, on its own, ignoring ASCII case.
    pub fn find_in(&self, bytes: &[u8]) -> Vec<Range<usize>> {
        let needle = self.0.as_bytes();
        let mut found = Vec::new();
        if needle.is_empty() || bytes.len() < needle.len() {
            return found;
        }
        let mut at = 0;
        while at + needle.len() <= bytes.len() {
            let end = at + needle.len();
            if bytes[at..end].eq_ignore_ascii_case(needle)
                && (at == 0 || !local_char(bytes[at - 1]))
                && !continues_domain(&bytes[end..])
            {
                found.push(at..end);
                at = end;
            } else {
                at += 1;
            }
        }
        found
    }

    /// Whether the address stands in `text`.
    pub fn is_in(&self, text: &str) -> bool {
        !self.find_in(text.as_bytes()).is_empty()
    }

    /// `text` with each place the address stands replaced by `with`.
    pub fn replace_in(&self, text: &str, with: &str) -> String {
        let mut out = String::with_capacity(text.len());
        let mut last = 0;
        for range in self.find_in(text.as_bytes()) {
            out.push_str(&text[last..range.start]);
            out.push_str(with);
            last = range.end;
        }
        out.push_str(&text[last..]);
        out
    }

    /// A PostgreSQL regular expression (for `~*`) that finds the address as [`Self::find_in`]
    /// does: to pick the rows that hold it, which are then read and changed here.
    pub fn pattern(&self) -> String {
        let mut escaped = String::new();
        for c in self.0.chars() {
            if c.is_ascii_punctuation() {
                escaped.push('\\');
            }
            escaped.push(c);
        }
        format!("(?<![a-z0-9._%+'-]){escaped}(?![a-z0-9-]|\\.[a-z0-9-])")
    }
}

/// After an address's last character: the domain goes on (`.au`, `-mail`, more letters).
fn continues_domain(rest: &[u8]) -> bool {
    match rest {
        [b, ..] if domain_char(*b) => true,
        [b'.', b, ..] if domain_char(*b) => true,
        _ => false,
    }
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_read_bare_from_a_display_name_and_lower_cased() {
        let a = Address::parse("  Ann Example <Ann@Example.COM> ").unwrap();
        assert_eq!(a.as_str(), "ann@example.com");
        assert_eq!(Address::parse("ann@example.com").unwrap(), a);
        assert!(Address::parse("ann").is_err());
        assert!(Address::parse("a@b@c").is_err());
        assert!(Address::parse("a b@c").is_err());
    }

    #[test]
    fn an_address_is_found_on_its_own_in_any_case_but_not_inside_a_longer_one() {
        let a = Address::parse("ann@example.com").unwrap();
        assert!(a.is_in("From: Ann <ANN@example.com>"));
        assert!(a.is_in("{\"from\":\"ann@Example.com\"}"));
        assert!(a.is_in("write to ann@example.com."));
        assert!(!a.is_in("joann@example.com"));
        assert!(!a.is_in("ann@example.com.au"));
        assert!(!a.is_in("ann@example.community"));
        assert_eq!(
            a.replace_in("to ANN@example.com and ann@example.com", "[erased]"),
            "to [erased] and [erased]"
        );
    }

    #[test]
    fn the_pattern_escapes_the_address() {
        let a = Address::parse("a.b+c@ex-ample.com").unwrap();
        assert!(
            a.pattern().contains("a\\.b\\+c\\@ex\\-ample\\.com"),
            "{}",
            a.pattern()
        );
    }
}
