//! Mailbox names on the wire: IMAP4rev1 carries them in modified UTF-7 (RFC 3501 §5.1.3),
//! so `Entwürfe` is sent as `Entw&APw-rfe` and `R&D` as `R&-D`. The settings take the name as
//! people write it; one already in modified UTF-7 is sent as it is. Written here rather than
//! taken from `utf7-imap`, which brings an old base64 and encoding_rs for these few lines.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD_NO_PAD;

/// `name` as the server takes it.
pub fn encode(name: &str) -> String {
    if is_encoded(name) {
        return name.to_string();
    }
    let mut out = String::with_capacity(name.len());
    let mut wide: Vec<u16> = Vec::new();
    for c in name.chars() {
        if (' '..='~').contains(&c) {
            flush(&mut wide, &mut out);
            if c == '&' {
                out.push_str("&-");
            } else {
                out.push(c);
            }
        } else {
            let mut units = [0u16; 2];
            wide.extend_from_slice(c.encode_utf16(&mut units));
        }
    }
    flush(&mut wide, &mut out);
    out
}

/// A run of other characters: `&`, their UTF-16BE in base64 with `,` for `/`, `-`.
fn flush(wide: &mut Vec<u16>, out: &mut String) {
    if wide.is_empty() {
        return;
    }
    let bytes: Vec<u8> = wide.iter().flat_map(|u| u.to_be_bytes()).collect();
    out.push('&');
    out.push_str(&STANDARD_NO_PAD.encode(bytes).replace('/', ","));
    out.push('-');
    wide.clear();
}

/// Whether `name` is already modified UTF-7: printable ASCII, each `&` opening a base64 run
/// closed by `-`.
fn is_encoded(name: &str) -> bool {
    if !name.chars().all(|c| (' '..='~').contains(&c)) || !name.contains('&') {
        return false;
    }
    let mut rest = name;
    while let Some(at) = rest.find('&') {
        let after = &rest[at + 1..];
        let Some(end) = after.find('-') else {
            return false;
        };
        if !after[..end]
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '+' || c == ',')
        {
            return false;
        }
        rest = &after[end + 1..];
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc_3501s_example_is_encoded_as_the_rfc_gives_it() {
        assert_eq!(
            encode("~peter/mail/台北/日本語"),
            "~peter/mail/&U,BTFw-/&ZeVnLIqe-"
        );
    }

    #[test]
    fn accents_and_ampersands_are_encoded() {
        assert_eq!(encode("Entwürfe"), "Entw&APw-rfe");
        assert_eq!(encode("R&D"), "R&-D");
        assert_eq!(encode("INBOX"), "INBOX");
        assert_eq!(encode("Éléments envoyés"), "&AMk-l&AOk-ments envoy&AOk-s");
    }

    #[test]
    fn a_name_already_encoded_is_kept() {
        assert_eq!(encode("Entw&APw-rfe"), "Entw&APw-rfe");
        assert_eq!(encode("R&-D"), "R&-D");
    }
}
