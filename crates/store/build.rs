//! Rebuilds this crate when a migration is added or changed: `sqlx::migrate!` embeds the
//! folder's files at compile time, and cargo does not watch that folder on its own.
fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
