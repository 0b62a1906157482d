//! A customer's personal data (issue 38; docs/PRIVACY.md maps where it lives, [`tables`] is
//! that map in code): an edit's diff aged out of the audit trail ([`aged_diffs`]), everything
//! the host holds about one address found ([`find`]), exported ([`export`], GDPR Art. 15) and
//! erased ([`erase`], Art. 17), the address itself recorded only as a keyed hash
//! ([`keyed_hash`]).

pub mod address;
pub mod aged_diffs;
pub mod erase;
pub mod export;
pub mod find;
pub mod keyed_hash;
pub mod tables;

pub use address::{Address, NotAnAddress};
pub use keyed_hash::HashKey;

/// What replaces a subject, a body, a name or a quoted address.
pub const ERASED: &str = "[erased]";
