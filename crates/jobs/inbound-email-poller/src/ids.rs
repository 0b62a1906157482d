//! The ids derived here (UUID v5): a mail's row and its event keep theirs across restarts
//! and re-runs, and a mail's identity hash.

use uuid::Uuid;

/// The namespace of the row and event ids derived here.
const ID_NAMESPACE: Uuid = Uuid::from_u128(0x8c0f_3d2a_61b4_4f57_a9e2_1d7c_5b30_f4a6);

/// The inbound email row's id: derived from (account, mailbox, UIDVALIDITY, UID).
pub fn inbound_email_id(account: &str, mailbox: &str, uidvalidity: u32, uid: u32) -> Uuid {
    let name = format!("{account}\u{0}{mailbox}\u{0}{uidvalidity}\u{0}{uid}");
    Uuid::new_v5(&ID_NAMESPACE, name.as_bytes())
}

/// The `email.received` event's id for an inbound email row.
pub fn event_id(inbound_email_id: Uuid) -> Uuid {
    let mut name = b"email.received:".to_vec();
    name.extend_from_slice(inbound_email_id.as_bytes());
    Uuid::new_v5(&ID_NAMESPACE, &name)
}

/// The hex SHA-256 of `bytes`, under a label that keeps a header's hash apart from a whole
/// mail's.
pub(crate) fn content_hash(label: &[u8], bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::new()
        .chain_update(label)
        .chain_update(bytes)
        .finalize();
    digest.iter().map(|b| format!("{b:02x}")).collect()
}
