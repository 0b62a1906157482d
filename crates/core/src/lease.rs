//! The singleton lease: at most one replica runs a given timer job's tick at a time.
//!
//! Core only states the contract; the store crate implements it on PostgreSQL advisory locks.
//! [`NoLease`] stands in where a job may run on every replica or there is only one.

use std::sync::Arc;

use crate::failure::Failure;

/// A lease per job name, shared by every replica of the host.
pub trait SingletonLease: Send + Sync {
    /// Held while the lease is; dropping it (or an adapter-specific release) gives it up.
    type Guard: Send;

    /// `Ok(Some(guard))`: this replica holds the lease until the guard is dropped or released.
    /// `Ok(None)`: another replica holds it; skip this tick. `Err`: the lease could not be
    /// asked for (the database is down, say).
    fn try_acquire(
        &self,
        job: &str,
    ) -> impl Future<Output = Result<Option<Self::Guard>, Failure>> + Send;
}

/// A lease that is always free: for jobs that are safe to run on every replica at once.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoLease;

impl SingletonLease for NoLease {
    type Guard = ();

    async fn try_acquire(&self, _job: &str) -> Result<Option<()>, Failure> {
        Ok(Some(()))
    }
}

impl<L: SingletonLease> SingletonLease for Arc<L> {
    type Guard = L::Guard;

    fn try_acquire(
        &self,
        job: &str,
    ) -> impl Future<Output = Result<Option<Self::Guard>, Failure>> + Send {
        L::try_acquire(self, job)
    }
}

impl<L: SingletonLease> SingletonLease for &L {
    type Guard = L::Guard;

    fn try_acquire(
        &self,
        job: &str,
    ) -> impl Future<Output = Result<Option<Self::Guard>, Failure>> + Send {
        L::try_acquire(self, job)
    }
}
