//! The operator's console, as far as it has left the host (issue 40): what it needs of no
//! running host. It depends on the store, core, the pages' frame and the job crates (for the
//! parts of a mail's story each owns), never on the host.
//!
//! - [`settings`]: the `[admin]` section, whose keys the host's settings file keeps;
//! - [`credentials`]: operators' passwords (argon2id, `[admin.password_hashing]`) and API
//!   tokens (`wht_…` and their SHA-256);
//! - [`story`]: a mail's story, for the console's `/mail` pages and `worker-host mail`.

pub mod credentials;
pub mod settings;
pub mod story;
