//! Operator accounts and their API tokens (`operator_accounts`, `operator_tokens`), which
//! every replica reads, so that one account signs in anywhere. Each change is recorded in the
//! audit trail in the same transaction. Hashing is the caller's: this module stores the
//! argon2id string of a password and the SHA-256 of a token, and compares nothing itself
//! except a token's digest.

mod account;
mod bootstrap;
mod manage;
mod personal_data;
mod sign_in;

pub use account::{Account, AccountError, BOOTSTRAP, NAME_MAX_CHARS, Role, RoleText, valid_name};
pub use bootstrap::{BootstrapSync, sync_bootstrap};
pub use manage::{add, add_token, disable, enable, list, remove, set_password, set_role};
pub use personal_data::{ViewerSight, reveal, set_reveal_right, viewer_sight};
pub use sign_in::{SignInBudget, by_token, credentials, from_proxy, take_sign_in_turn};
