//! The keyed hash (HMAC-SHA256, RFC 2104) an erasure records in place of the address, and the
//! pseudonym that replaces the address in the reply limit's rows: without the key, neither can
//! be turned back into the address, nor checked against a guess.

use sha2::{Digest, Sha256};

use super::Address;

/// The key of the keyed hash: the host's `privacy.hash_key_file`, or one derived from a
/// secret it already holds (see the host's settings).
#[derive(Clone)]
pub struct HashKey(Vec<u8>);

impl std::fmt::Debug for HashKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HashKey(..)")
    }
}

impl HashKey {
    pub fn new(key: impl Into<Vec<u8>>) -> Self {
        Self(key.into())
    }

    /// A key derived from `secret` for this one use (so the secret itself is never the key).
    pub fn derived_from(secret: &[u8]) -> Self {
        Self(hmac_sha256(secret, b"worker-host privacy hash key v1").to_vec())
    }

    /// The address's keyed hash, in hex.
    pub fn hash(&self, address: &Address) -> String {
        hex(&hmac_sha256(&self.0, address.as_str().as_bytes()))
    }

    /// What replaces the address where a count must still add up (the reply limit's rows):
    /// the same for one address, different for two, and no address anyone can mail.
    pub fn pseudonym(&self, address: &Address) -> String {
        format!("erased-{}@invalid", &self.hash(address)[..16])
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

/// HMAC-SHA256 (RFC 2104).
fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut block = [0u8; BLOCK];
    if key.len() > BLOCK {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.map(|b| b ^ byte);
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hmac_is_rfc_4231s() {
        // RFC 4231, test cases 2 and 6 (a key longer than the block).
        assert_eq!(
            hex(&hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(
            hex(&hmac_sha256(
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            )),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn one_address_one_pseudonym_and_another_key_another() {
        let ann = Address::parse("Ann@example.com").unwrap();
        let bob = Address::parse("bob@example.com").unwrap();
        let key = HashKey::new(b"k".to_vec());
        assert_eq!(key.pseudonym(&ann), key.pseudonym(&ann));
        assert_ne!(key.pseudonym(&ann), key.pseudonym(&bob));
        assert_ne!(HashKey::new(b"j".to_vec()).hash(&ann), key.hash(&ann));
        assert!(!key.hash(&ann).contains("ann"));
        assert!(key.pseudonym(&ann).ends_with("@invalid"));
    }
}
