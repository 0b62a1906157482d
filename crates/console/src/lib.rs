//! The operator's console: pages on the admin port to see what failed, why and how often, and
//! to put it right, with the same data as JSON under `/api/`. The host serves its routes
//! ([`web::routes`]) and implements [`runtime::Runtime`], the one way the console reaches the
//! running host (its jobs and their counts, the sampler's readings, run now, the consumers'
//! gates). Everything else goes through the store, the broker and the job crates, as the
//! command line does. It depends on the store, core, the broker, the pages' frame and the job
//! crates (for what each owns), never on the host.
//!
//! - [`web`]: the pages and the API, one file per subject;
//! - [`runtime`]: what the console needs of the running host;
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
//!   dead letter's body; [`history`]: the history's ranges and chart tables;
//! - [`open_circuits`]: an open circuit as every surface shows it; [`parked`]: "send parked
//!   now", for the console and `worker-host queues send-now`.

pub mod access;
pub mod chart;
pub mod credentials;
pub mod edit;
pub mod filter;
pub mod forwarded;
pub mod history;
pub mod masking;
pub mod open_circuits;
pub mod page;
pub mod parked;
pub mod runtime;
pub mod settings;
pub mod story;
pub mod throttle;
pub mod web;
