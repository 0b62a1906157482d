//! The singleton lease: at most one replica runs a given timer job's tick at a time.
//!
//! Core only states the contract; the store crate implements it on PostgreSQL advisory locks.
//! [`NoLease`] stands in where a job may run on every replica or there is only one.
//!
//! A lease has three moments: [`SingletonLease::try_acquire`] before the tick,
//! [`SingletonLease::watch`] during it (it resolves if the lease is lost, so that the tick is
//! cancelled before another replica can start one), and [`SingletonLease::release`] after it.
//! A guard dropped without `release` must still give the lease up (the crash path).

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

    /// Resolves, with why, once the lease held by `guard` is lost (its database session gone,
    /// say): the holder must then stop its work at once, since another replica may now take
    /// the lease. Never resolves while the lease holds. By default the lease cannot be lost.
    fn watch<'a>(
        &'a self,
        guard: &'a mut Self::Guard,
    ) -> impl Future<Output = Failure> + Send + 'a {
        let _ = guard;
        std::future::pending()
    }

    /// Gives the lease back after the work, in order (an adapter unlocks it and keeps its
    /// connection). By default the guard is dropped. Not called after [`watch`](Self::watch)
    /// resolved: such a guard is dropped.
    fn release(&self, guard: Self::Guard) -> impl Future<Output = ()> + Send {
        drop(guard);
        std::future::ready(())
    }
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
    fn watch<'a>(
        &'a self,
        guard: &'a mut Self::Guard,
    ) -> impl Future<Output = Failure> + Send + 'a {
        L::watch(self, guard)
    }

    fn release(&self, guard: Self::Guard) -> impl Future<Output = ()> + Send {
        L::release(self, guard)
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
    fn watch<'a>(
        &'a self,
        guard: &'a mut Self::Guard,
    ) -> impl Future<Output = Failure> + Send + 'a {
        L::watch(self, guard)
    }

    fn release(&self, guard: Self::Guard) -> impl Future<Output = ()> + Send {
        L::release(self, guard)
    }
}

/// A lease asked for under a fixed key, whatever name the job gives: a renamed job keeps the
/// key its first release used, so that two releases side by side never both hold it.
#[derive(Debug, Clone)]
pub struct Keyed<L> {
    pub lease: L,
    pub key: &'static str,
}

impl<L: SingletonLease> SingletonLease for Keyed<L> {
    type Guard = L::Guard;

    fn try_acquire(
        &self,
        _job: &str,
    ) -> impl Future<Output = Result<Option<Self::Guard>, Failure>> + Send {
        self.lease.try_acquire(self.key)
    }
    fn watch<'a>(
        &'a self,
        guard: &'a mut Self::Guard,
    ) -> impl Future<Output = Failure> + Send + 'a {
        self.lease.watch(guard)
    }

    fn release(&self, guard: Self::Guard) -> impl Future<Output = ()> + Send {
        self.lease.release(guard)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Records the names it was asked under.
    #[derive(Default)]
    struct Recording(Mutex<Vec<String>>);

    impl SingletonLease for Recording {
        type Guard = ();

        async fn try_acquire(&self, job: &str) -> Result<Option<()>, Failure> {
            self.0.lock().unwrap().push(job.to_string());
            Ok(Some(()))
        }
    }

    #[tokio::test]
    async fn a_keyed_lease_is_asked_for_under_its_key_whatever_the_job_says() {
        let keyed = Keyed {
            lease: Recording::default(),
            key: "dead-letter-maintenance",
        };
        keyed.try_acquire("dead-letter-archive").await.unwrap();
        assert_eq!(
            *keyed.lease.0.lock().unwrap(),
            ["dead-letter-maintenance".to_string()]
        );
    }
}
