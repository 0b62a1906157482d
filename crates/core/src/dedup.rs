//! The processed-message guard: the one mechanism that makes an effect happen once under
//! at-least-once delivery.
//!
//! A consumer marks `(scope, id)` inside the same transaction as its effect. The first mark
//! wins and the effect commits with it; a redelivery finds the mark and is acknowledged as a
//! [`Handled::Duplicate`](crate::job::Handled::Duplicate) without repeating the effect. Core
//! states the contract; the store crate implements it on PostgreSQL.

use crate::failure::Failure;

/// Marks messages as processed, inside the caller's transaction.
pub trait ProcessedGuard: Send + Sync {
    /// The caller's transaction type, chosen by the adapter.
    type Tx: Send;

    /// `Ok(true)`: this call made the mark, so go on with the effect in the same transaction.
    /// `Ok(false)`: already processed, so skip the effect. The mark only becomes durable when
    /// `tx` commits.
    fn try_mark_processed(
        &self,
        tx: &mut Self::Tx,
        scope: &str,
        id: &str,
    ) -> impl Future<Output = Result<bool, Failure>> + Send;
}
