//! The catalog of every kind redbaton has, semaphores included: the one list a test that
//! means "for every kind" iterates, so a new kind is added here once.
//!
//! - [`KINDS`]: every kind as a value ([`Kind`]), with [`hold`] (take it, waiting, and how to
//!   give it back) and [`Kind::waiter`] (what a hold of it excludes); the cluster suite runs
//!   slot migrations and bad names over it.
//! - [`lock_family!`](crate::lock_family): the kinds with `Lock`'s method set (every kind but
//!   the semaphores) as `(module, type)` pairs, handed to a macro: the family suite runs
//!   `testkit::lock_family!(conformance);` (tests/family.rs). Each of them is described for the
//!   suite by `family_kind!` in `family/mod.rs`; a kind missing there does not compile.

use std::future::Future;
use std::pin::Pin;

use redbaton::Client;

/// One kind of lock or semaphore.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Lock,
    /// A read hold, waited for by a writer (readers share).
    Read,
    Write,
    Fair,
    Fenced,
    Semaphore,
    LeasedSemaphore,
}

/// Every kind.
pub const KINDS: [Kind; 7] = [
    Kind::Lock,
    Kind::Read,
    Kind::Write,
    Kind::Fair,
    Kind::Fenced,
    Kind::Semaphore,
    Kind::LeasedSemaphore,
];

impl Kind {
    /// The kind a waiter of a hold of this kind asks for: what the hold excludes.
    pub fn waiter(self) -> Kind {
        match self {
            Kind::Read => Kind::Write,
            kind => kind,
        }
    }

    /// Whether it is in the lock family ([`lock_family!`](crate::lock_family)): `Lock`'s
    /// method set and a `Guard<Kind>`, not permits.
    pub fn is_lock(self) -> bool {
        !matches!(self, Kind::Semaphore | Kind::LeasedSemaphore)
    }
}

/// Gives a hold back.
pub type Release = Pin<Box<dyn Future<Output = redbaton::Result<()>> + Send>>;

/// Takes `name` as `kind` (waiting for it; a semaphore is given one permit first if it has
/// none set), and how to give it back.
pub async fn hold(client: &Client, kind: Kind, name: &str) -> redbaton::Result<Release> {
    fn boxed<F>(f: F) -> Release
    where
        F: Future<Output = redbaton::Result<()>> + Send + 'static,
    {
        Box::pin(f)
    }
    Ok(match kind {
        Kind::Lock => {
            let g = client.lock(name).lock().await?;
            boxed(async move { g.unlock().await })
        }
        Kind::Read => {
            let g = client.read_write_lock(name).read().lock().await?;
            boxed(async move { g.unlock().await })
        }
        Kind::Write => {
            let g = client.read_write_lock(name).write().lock().await?;
            boxed(async move { g.unlock().await })
        }
        Kind::Fair => {
            let g = client.fair_lock(name).lock().await?;
            boxed(async move { g.unlock().await })
        }
        Kind::Fenced => {
            let g = client.fenced_lock(name).lock().await?;
            boxed(async move { g.unlock().await })
        }
        Kind::Semaphore => {
            let semaphore = client.semaphore(name);
            semaphore.try_set_permits(1).await?;
            let permit = semaphore.acquire().await?;
            boxed(async move { permit.release().await })
        }
        Kind::LeasedSemaphore => {
            let semaphore = client.leased_semaphore(name);
            semaphore.try_set_permits(1).await?;
            let permit = semaphore.acquire().await?;
            boxed(async move { permit.release().await })
        }
    })
}

/// Calls `$each!(module, Type)` for every kind of the lock family, in [`KINDS`]'s order:
/// `testkit::lock_family!(conformance);` is the family suite.
#[macro_export]
macro_rules! lock_family {
    ($each:ident) => {
        $each!(lock, redbaton::Lock);
        $each!(read_lock, redbaton::ReadLock);
        $each!(write_lock, redbaton::WriteLock);
        $each!(fair_lock, redbaton::FairLock);
        $each!(fenced_lock, redbaton::FencedLock);
    };
}

// Every kind of the lock family is in `KINDS`, and the two lists have as many locks.
const _: () = {
    let mut locks = 0;
    let mut i = 0;
    while i < KINDS.len() {
        if !matches!(KINDS[i], Kind::Semaphore | Kind::LeasedSemaphore) {
            locks += 1;
        }
        i += 1;
    }
    let mut family = 0;
    macro_rules! count {
        ($module:ident, $kind:ty) => {
            family += 1;
        };
    }
    lock_family!(count);
    assert!(locks == family, "lock_family! and KINDS disagree");
};
