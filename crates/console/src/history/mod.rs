//! The history's ranges (`range.rs`) and its charts' tables (`table.rs`), apart from its
//! pages (`web/history.rs`).

pub mod range;
pub mod table;
