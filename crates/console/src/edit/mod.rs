//! An operator's edit of a failed mail or of a dead letter's body, apart from its pages
//! ([`crate::web::edit`]): the form and its checks (`form.rs`), a mail's edited copy sent
//! (`apply.rs`) and a dead letter's edited body replayed (`raw.rs`).

pub mod apply;
pub mod form;
pub mod raw;
