//! Open circuits (`dependency_circuits`), shared by every replica: a dependency (the SMTP
//! relay, an IMAP account, a webhook host) whose own failures (see `worker_core::circuit`)
//! opened its circuit is not called until a probe succeeds. The table holds the open ones
//! ([`table`]); each replica keeps a view of them and counts its own calls ([`Circuits`]).
//!
//! Opening, a failed probe and closing announce themselves on [`crate::pauses::CHANNEL`] on
//! commit, so that every replica learns of them as it learns of a pause (the host's watcher
//! reads the table again on each notice, and on its poll): ten replicas do not each hammer a
//! broken relay, and a consumer stopped for an open circuit on one replica stops on all.

mod breaker;
pub mod table;

pub use breaker::{Admission, CircuitReport, Circuits};
pub use table::{OpenCircuit, close_by_hand, list};
