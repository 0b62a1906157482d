//! The history's ranges (`range.rs`) and its charts' tables (`table.rs`), apart from its
//! pages (the host's `console::history`).

pub mod range;
pub mod table;
