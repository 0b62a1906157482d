//! The operator's console, as far as it has left the host (issue 40): what it needs of no
//! running host. It depends on the store, core, the pages' frame and the job crates (for the
//! parts of a mail's story each owns), never on the host.
//!
//! - [`settings`]: the `[admin]` section, whose keys the host's settings file keeps;
//! - [`credentials`]: operators' passwords (argon2id, `[admin.password_hashing]`) and API
//!   tokens (`wht_…` and their SHA-256);
//! - [`story`]: a mail's story, for the console's `/mail` pages and `worker-host mail`;
//! - [`access`]: who may read and act (sessions, tokens, an auth proxy's user, the rules);
//!   [`forwarded`]: which proxies' forwarded headers count; [`throttle`]: how fast credentials
//!   may be tried;
//! - [`masking`]: customers' personal data hidden from who may not see it;
//! - [`chart`]: the history's charts, drawn as SVG;
//! - [`page`]: a problem as a page or as JSON, and the guards on reading and acting;
//! - [`filter`]: the dead letters' filter form; [`edit`]: an operator's edit of a mail or a
//!   dead letter's body; [`history`]: the history's ranges and chart tables.
//!
//! The pages and the API are still the host's (its `console` module), until the interface
//! the host implements for them (readiness, the jobs, pause and run now, alerts) is here.

pub mod access;
pub mod chart;
pub mod credentials;
pub mod edit;
pub mod filter;
pub mod forwarded;
pub mod history;
pub mod masking;
pub mod page;
pub mod settings;
pub mod story;
pub mod throttle;
