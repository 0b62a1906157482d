//! What an erasure of one person's data needs of the host, for `worker-host privacy` and the
//! console's `/privacy` alike: the key of the keyed hash that names an address
//! ([`hash_key`]), and the broker's dead queues emptied into the archive first
//! ([`archive_dead_queues`]), so that a dead letter still in a queue is erased with the rest.

use worker_store::privacy::HashKey;

use crate::exit::Fatal;
use crate::settings::Settings;

/// The key of the keyed hash that names an address in the audit trail and makes its
/// pseudonym: derived from `admin.privacy_key` (or its `_file`), else from the database's
/// password, which every replica and command already holds and no console user sees.
/// Rotating that password changes a key derived from it: erasures after it get other hashes
/// and pseudonyms, which is why `config check` suggests the key of its own.
pub fn hash_key(settings: &Settings) -> Result<HashKey, Fatal> {
    let secret = settings
        .admin
        .privacy_key
        .as_ref()
        .or(settings.database.password.as_ref())
        .ok_or_else(|| {
            Fatal::usage("privacy needs admin.privacy_key (or admin.privacy_key_file), or database.password: its keyed hash is derived from it")
        })?;
    Ok(HashKey::derived_from(secret.expose().as_bytes()))
}

/// Empties every dead queue of the topology into the archive, each message archived (the
/// archiver's own step, idempotent) before it is acked; returns how many. Messages a running
/// host's archiver holds unacked are its to archive, within its insert timeout.
pub async fn archive_dead_queues(settings: &Settings, pool: &sqlx::PgPool) -> Result<u64, Fatal> {
    use job_dead_letter_archive::{Archiver, dead_queues, drain::drain};

    let topology = settings
        .topology()
        .map_err(crate::topology::topology_failure)?;
    let archiver = Archiver::new(
        pool.clone(),
        settings.jobs.dead_letter_archive.job.archiver.clone(),
    );
    crate::broker_session::with_session(settings, "privacy done", |session| async move {
        drain(&archiver, &session, &dead_queues(&topology)).await
    })
    .await?
    .map_err(|e| Fatal::unavailable(format!("archiving the dead queues: {e}")))
}
