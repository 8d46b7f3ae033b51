//! # redbaton
//!
//! Reentrant distributed locks on Redis, compatible with Redisson's `RLock`: Java services
//! using Redisson and Rust services using redbaton share locks by name.
//!
//! - **Reentrant by scope, one holder per hold**: a hash of owner id → reentry count, changed
//!   by Lua scripts. Every acquisition is a new owner unless it is made inside a hold's scope
//!   (the future run by [`Lock::run`] or [`Guard::run`], or [`Guard::reenter`]): futures
//!   joined in one tokio task exclude each other, and code inside a hold re-enters it.
//! - **Waiting costs Redis almost nothing**: waiters park on one shared subscriber connection
//!   per [`Client`] and are woken, one at a time, by the unlock message; the lock's remaining
//!   lease bounds every wait, so a lost message never hangs anyone. Between tasks of one
//!   client, a release hands the lock to the next parked task in its own round trip.
//! - **Leases end**: a crashed holder's lock expires; a live holder's lease is renewed by one
//!   watchdog task per client, and a guard tells its holder when the lease was lost.
//!
//! ```no_run
//! # async fn run() -> redbaton::Result<()> {
//! let client = redbaton::Client::connect("redis://127.0.0.1:6379").await?;
//! let lock = client.lock("order:42");
//! let guard = lock.lock().await?;
//! // ... the critical section ...
//! guard.unlock().await?;
//! client.shutdown().await?;
//! # Ok(()) }
//! ```
//!
//! ## One holder means one holder
//!
//! The owner of a hold is not the tokio task. Futures polled together in one task — `join!`,
//! `select!`, `FuturesUnordered`, `for_each_concurrent`, `buffer_unordered` — are separate
//! owners and wait for each other; re-entry comes from the scope of a hold:
//!
//! ```no_run
//! # async fn run(lock: redbaton::Lock) -> redbaton::Result<()> {
//! let section = || async {
//!     let guard = lock.lock().await?; // one at a time, though both run in this task
//!     guard.unlock().await
//! };
//! let (a, b) = tokio::join!(section(), section());
//! (a?, b?);
//!
//! lock.run(|| async {
//!     let nested = lock.lock().await?; // inside the hold's scope: re-enters (count 2)
//!     nested.unlock().await
//! })
//! .await??;
//! # Ok(()) }
//! ```
//!
//! See [`Lock`] for the semantics and cancellation safety, [`LockGuard`] for release and lost
//! leases, and [`Config`] for settings.
//!
//! ## Features
//!
//! - `tls` (default): `rediss://` URLs and `Config::tls_ca_file`, through rustls with the
//!   ring provider. Without it a TLS URL is refused with [`Error::InvalidArgument`] rather
//!   than reached in plain text.

#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod acquire;
mod baton;
mod client;
mod config;
mod conn;
mod error;
mod guard;
mod holds;
mod hub;
mod kinds;
mod leased_semaphore;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
#[cfg(not(feature = "metrics"))]
mod metrics;
mod multilock;
mod owner;
mod redlock;
mod scope;
mod semaphore;
mod state;
mod watchdog;

pub use client::Client;
pub use config::{
    Builder, Config, PubSubMode, ReplicaSync, AUTO_REPLICA_TIMEOUT, DEFAULT_BATON_PASSES,
    DEFAULT_FAIR_LOCK_WAIT, DEFAULT_WATCHDOG_LEASE, MAX_LEASE, MIN_WATCHDOG_LEASE,
};
pub use error::{Error, Result};
pub use guard::Guard;
pub use kinds::fair::{FairGuard, FairLock};
pub use kinds::fenced::{FencedGuard, FencedLock};
pub use kinds::reentrant::Lock;
pub use kinds::rwlock::{ReadGuard, ReadLock, ReadWriteLock, WriteGuard, WriteLock};
pub use kinds::MAX_NAME_LEN;
pub use leased_semaphore::{LeasedPermit, LeasedSemaphore, PermitId};
pub use semaphore::{Semaphore, DEFAULT_RECHECK_INTERVAL, MAX_PERMITS, MAX_RECHECK_INTERVAL};

/// A hold of a [`Lock`].
pub type LockGuard = Guard<Lock>;
pub use multilock::{MultiLock, MultiLockGuard, RedLockGuard};
pub use owner::Owner;
pub use redlock::RedLock;
pub use state::LockState;

/// The README's examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

#[cfg(test)]
mod assertions {
    fn send_static<T: Send + 'static>() {}
    fn sync<T: Sync>() {}

    #[test]
    fn public_types_move_between_tasks() {
        send_static::<crate::LockGuard>();
        send_static::<crate::MultiLockGuard>();
        send_static::<crate::MultiLock>();
        send_static::<crate::RedLock>();
        sync::<crate::RedLock>();
        send_static::<crate::Lock>();
        send_static::<crate::Semaphore>();
        sync::<crate::Semaphore>();
        send_static::<crate::LeasedSemaphore>();
        sync::<crate::LeasedSemaphore>();
        send_static::<crate::LeasedPermit>();
        send_static::<crate::Error>();
        send_static::<crate::Client>();
        sync::<crate::Lock>();
        sync::<crate::Client>();
    }
}
