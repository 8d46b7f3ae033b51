//! # redbaton
//!
//! Distributed locks and semaphores on Redis, on Redisson's wire format: Java services using
//! Redisson and Rust services using redbaton share locks by name. Waiters park on one shared
//! subscriber connection per [`Client`] and are woken by unlock messages, never by polling; one
//! watchdog task per client renews the leases, and every guard tells its holder when its lease
//! was lost.
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
//! ## The kinds
//!
//! A [`Client`] hands out a handle on every kind (cheap, `Clone + Send + Sync`; nothing is sent
//! until it is used). Each lock kind has the same acquire methods (`lock`, `lock_with_lease`,
//! `try_lock`, `try_lock_for`, `try_lock_with_lease`) and `run`, and its guard releases on
//! [`unlock`](Guard::unlock) or on drop and reports a lost lease through [`lost`](Guard::lost).
//! Code generic over the kinds is written over [`Kind`] (a `Guard<K>` for any `K: Kind`).
//!
//! | kind | made by | what it is |
//! | --- | --- | --- |
//! | [`Lock`] | [`Client::lock`] | a reentrant lock (guard: [`LockGuard`]) |
//! | [`FairLock`] | [`Client::fair_lock`] | a reentrant lock served first come, first served across every process (guard: [`FairGuard`]) |
//! | [`ReadWriteLock`] | [`Client::read_write_lock`] | many readers or one writer: halves [`ReadLock`] and [`WriteLock`], guards [`ReadGuard`] and [`WriteGuard`]; no writer preference |
//! | [`FencedLock`] | [`Client::fenced_lock`] | a [`Lock`] whose every acquisition carries a fencing token, for stores that must refuse a stale holder (guard: [`FencedGuard`]) |
//! | [`Semaphore`] | [`Client::semaphore`] | a counter of permits that belong to nobody in Redis: a process that dies holding some keeps them for good (permits: [`SemaphorePermit`], given back on drop) |
//! | [`LeasedSemaphore`] | [`Client::leased_semaphore`] | permits with ids and leases, renewed by the watchdog like locks (permit: [`LeasedPermit`]) |
//! | [`MultiLock`] | [`MultiLock::new`] over [`Lock`]s, [`MultiLock::of`] over another [`Exclusive`] kind | several locks, all or nothing, never waiting while it holds some: deadlock-free (guard: [`MultiLockGuard`]) |
//! | [`RedLock`] | [`RedLock::new`] over [`Lock`]s, [`RedLock::of`] over another [`Exclusive`] kind | one lock per independent Redis master, held while a majority is (guard: [`RedLockGuard`]) |
//!
//! Inspection: [`Lock::state`] and [`ReadWriteLock::state`] (each [`Holder`]: an owner with its
//! count; a read/write lock's mode; the remaining lease; subscribers),
//! `is_locked`, `hold_count`, `remaining_ttl`, [`FairLock::queued`]. Settings: [`Config`] and
//! [`Client::builder`].
//!
//! ## One holder means one holder
//!
//! Every acquisition is a new owner, unless it is made inside the scope of a hold: the future
//! run by [`Lock::run`] or [`Guard::run`] (and the other kinds' `run`), or explicitly with
//! [`Guard::reenter`]. The owner is not the tokio task: futures polled together in one task —
//! `join!`, `select!`, `FuturesUnordered`, `for_each_concurrent`, `buffer_unordered` — are
//! separate owners and wait for each other, and a task spawned inside a scope is another owner
//! too. Redisson's owner is a thread, a sequential execution; in async Rust that is a hold's
//! scope.
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
//!
//! let guard = lock.lock().await?;
//! let again = guard.reenter().await?; // the same owner, without a closure; never waits
//! again.unlock().await?;
//! guard.unlock().await?;
//! # Ok(()) }
//! ```
//!
//! A second `lock()` beside a guard still held, outside its scope, is another owner and waits
//! for that guard (for ever, if the same code keeps it): `try_lock()` says `None`, and `lock()`
//! logs a warning naming the fix. On a read/write lock, a read inside a write hold's scope is
//! the downgrade, and a write waited for inside a read hold's scope fails with
//! [`Error::WouldDeadlock`]. [`Lock::run`] returns [`Error::LeaseLost`] when the lease is lost
//! before the work is done (the work's future is dropped). See [`Lock`] for the semantics and
//! cancellation safety, [`Guard`] for release and lost leases, [`Owner`] to name an owner
//! explicitly.
//!
//! ## Coming from Redisson
//!
//! | Redisson | redbaton |
//! | --- | --- |
//! | `RLock` (`getLock`) | [`Lock`] ([`Client::lock`]) |
//! | `RFairLock` (`getFairLock`) | [`FairLock`] ([`Client::fair_lock`]) |
//! | `RReadWriteLock` (`getReadWriteLock`), `readLock()` / `writeLock()` | [`ReadWriteLock`] ([`Client::read_write_lock`]), [`read()`](ReadWriteLock::read) / [`write()`](ReadWriteLock::write) |
//! | `RFencedLock` (`getFencedLock`) | [`FencedLock`] ([`Client::fenced_lock`]) |
//! | `RSemaphore` (`getSemaphore`) | [`Semaphore`] ([`Client::semaphore`]) |
//! | `RPermitExpirableSemaphore` (`getPermitExpirableSemaphore`) | [`LeasedSemaphore`] ([`Client::leased_semaphore`]) |
//! | `RedissonMultiLock` | [`MultiLock`] ([`MultiLock::new`]) |
//! | `RedissonRedLock` | [`RedLock`] ([`RedLock::new`]) |
//!
//! Differences a porter meets: the owner is a hold's scope, not a thread (above); Redisson's
//! `Config.lockWatchdogTimeout` is [`Config::watchdog_lease`] and `fairLockWaitTimeout` is
//! [`Config::fair_lock_wait`]; every wait is bounded by the holder's lease, so a lost message
//! never hangs a waiter. Every method of Redisson's lock and semaphore interfaces, with its
//! name here or why it is not offered, is in the repository's `docs/REDISSON-MAP.md`; what
//! each kind keeps in Redis, and where our scripts differ from Redisson's, in `docs/WIRE.md`.
//!
//! ## Topologies
//!
//! - **Single node**: `redis://host:6379` (TLS: `rediss://`).
//! - **Sentinel**: `redis-sentinel://s1:26379?sentinelServiceName=mymaster&node=s2:26379`;
//!   clients follow the promoted replica.
//! - **Cluster**: `redis-cluster://h1:7000?node=h2:7001`. Wake-ups use classic pub/sub by
//!   default (`PUBLISH`, broadcast to every node) or sharded pub/sub
//!   ([`PubSubMode::Sharded`]: `SPUBLISH`, Redis 7), which Redisson uses on Redis 7 clusters;
//!   every client sharing a lock must use the same mode. Cluster redirections (MOVED, ASK,
//!   TRYAGAIN during a slot migration) are followed within the command timeout.
//! - **Replica sync** ([`ReplicaSync`], default `Auto`): every script that changes a lock is
//!   followed by `WAIT` wherever the primary has replicas, so a failover does not hand a held
//!   lock to a second owner unless it promotes a replica that had not acknowledged it.
//! - **Redlock**: one [`Client`] per independent master, combined by [`RedLock`].
//!
//! Every URL form is listed under [`Config::url`].
//!
//! ## Failure guarantees, in short
//!
//! - A crashed holder's lock expires after its lease (the watchdog lease, 30 s by default) and
//!   a waiter elsewhere gets it; a live holder's lease is renewed every third of it.
//! - A holder learns of a lost lease (a fixed lease ran out, a force-unlock, Redis restarted
//!   empty or unreachable for a whole lease) through [`Guard::lost`], measured by its own
//!   monotonic clock so that it fires no later than Redis expires the key; its `unlock()` then
//!   returns [`Error::NotHeld`] and never touches a newer hold.
//! - Every round trip has a timeout ([`Error::Timeout`]); a lock script is never re-sent
//!   blind, and a dropped or timed-out acquire or release leaves no hold behind (its round
//!   trip is finished in the background). [`Client::shutdown`] releases what is still held.
//! - A dropped subscriber connection is re-established and every waiter re-checks: a lost
//!   wake-up costs at most the holder's remaining lease, never a hang.
//! - Bad input is refused with [`Error::InvalidArgument`] before anything is sent; a key of
//!   another type gives [`Error::WrongType`] and is never modified.
//! - Not covered: a failover that promotes a replica which never received the hold, a holder
//!   that pauses past its lease (use a [`FencedLock`] and let the store check tokens), clocks
//!   that jump on the server. The repository's `docs/FAILURES.md` has every case, per
//!   deployment, and the ACLs a Redis user needs.
//!
//! ## How soon a loss is felt
//!
//! A guard learns its hold is gone through [`Guard::lost`] (and `run` stops its work with
//! [`Error::LeaseLost`]); how soon depends on how it was lost. The defaults:
//! [`Config::watchdog_lease`] 30 s (renewed every 10 s), [`Config::lease_check_interval`]
//! 500 ms, [`Config::command_timeout`] 5 s.
//!
//! | the loss | felt |
//! | --- | --- |
//! | a fixed lease (`lock_with_lease`, …) runs out | at its end by the client's monotonic clock, less the drift allowance (1 % + 2 ms); no round trip |
//! | another client force-unlocks it, Redis restarts empty, a failover promotes a replica that never had it, it expired and another owner took it | at the watchdog's next check: within `lease_check_interval` plus a round trip; within a round trip while this client has tasks waiting on that lock (the unlock message says so) |
//! | Redis is unreachable or stalls | when the lease runs out counted from the *send* time of the last renewal Redis acknowledged, less the drift allowance: at most one watchdog lease after it (a stall that lasts a whole lease loses the hold; renewals every third of the lease leave two thirds of slack) |
//! | an acquire's reply comes after the lease it took ran out | never handed out: the hold is released and the acquire tries again within the caller's wait (invariant 18) |
//! | the process dies | nothing tells it; Redis expires the lock one lease after the last renewal, and a waiter elsewhere gets it |
//!
//! A [`LeasedPermit`] is felt the same way (the same watchdog); a [`SemaphorePermit`] has no
//! lease and is never lost. Keep `command_timeout` well under a third of the watchdog lease
//! (connecting logs a warning otherwise): a renewal stalled that long must still leave time
//! for the next one.
//!
//! ## Your own commands, single flight, and ending
//!
//! - [`Client::redis`] is a fred client for your own commands, with connections of its own
//!   and no command timeout: nothing you send on it (a long `BLPOP`) delays a lock call or a
//!   renewal. A fred error converts into [`Error`] with `?`.
//! - [`Lock::wait_until_free`] (and [`ReadWriteLock::wait_until_free`],
//!   [`FencedLock::wait_until_free`]) waits until nobody holds a lock without taking it: one
//!   caller computes under the lock, the others wait there and are all woken by its unlock.
//! - Call [`Client::shutdown`] before the runtime ends: dropped guards release, and dropped
//!   permits give back, in background tasks that a runtime ending cancels (the locks then stay
//!   held until their leases end).
//!
//! ## Versions
//!
//! - **Redis and Valkey**: the whole test suite runs against Redis 7.0.15 (Debian 12's
//!   `redis-server`), and a compatibility tier of it against Redis 6.2.14 and Valkey 8.1.8:
//!   single node, Sentinel and Cluster. [`Client::connect`] asks the server what it is
//!   ([`Client::server`]) and refuses a Redis older than 6.2 ([`OLDEST_REDIS`]), and
//!   [`PubSubMode::Sharded`] before Redis 7.0 (`SSUBSCRIBE`, `SPUBLISH`,
//!   `PUBSUB SHARDNUMSUB`), with [`Error::Unsupported`]. Every Valkey is taken; the
//!   `valkey…://` schemes mean what their `redis…://` twins do, Sentinel and Cluster included.
//!   The README's version table has every server, topology and pub/sub mode, and
//!   docs/VERSIONS.md what differs between them.
//! - **Redisson**: the wire format (keys, fields, TTLs, channels, messages, scripts' effects)
//!   was checked against Redisson's source at `redisson-4.7.0-62-g66863978b` (4.7.1-SNAPSHOT),
//!   with older behaviour checked against 3.23.0, 3.24.0 and 3.43.0. The tests run every kind
//!   against the real Java Redisson 4.7.0 (a core set against 3.52.0), both ways, on a single
//!   node and a cluster with classic and sharded pub/sub, and share `Lock`s with node-redisson
//!   1.0.4 (a Node.js port of `RLock`).
//! - **fred**: redbaton is built on fred 10 and re-exports it as [`fred`].
//!
//! ## Features
//!
//! - `tls` (default): `rediss://` (and `rediss-cluster://`, `rediss-sentinel://`,
//!   `valkeys://`) URLs and `Config::tls_ca_file`, through rustls with the ring provider.
//!   Without it a TLS URL is refused with [`Error::InvalidArgument`] rather than reached in
//!   plain text.
//! - `metrics` (off): records acquisitions, waits, hand-offs, renewals and lost leases through
//!   the [`metrics`](https://docs.rs/metrics) facade (the `redbaton::metrics` module describes
//!   each one). Without it the recording calls compile to nothing.

#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

// The layers, top down: the facade (`client`) and the kinds; the engine every kind shares;
// the connection; and the floor (settings, errors, owners, metrics). Imports run downwards
// only (`scripts/module-graph.py` checks it).
mod client;
mod kinds;

mod engine;

mod conn;

mod config;
mod error;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
#[cfg(not(feature = "metrics"))]
mod metrics;
mod owner;

/// The Redis client crate redbaton is built on, fred 10: [`Client::redis`] returns its client,
/// for commands redbaton does not wrap. Use this path rather than a `fred` dependency of your
/// own, so the versions always match.
pub use fred;

pub use client::Client;
pub use config::{
    Builder, Config, PubSubMode, ReplicaSync, AUTO_REPLICA_TIMEOUT, DEFAULT_BATON_PASSES,
    DEFAULT_FAIR_LOCK_WAIT, DEFAULT_LEASE_CHECK_INTERVAL, DEFAULT_WATCHDOG_LEASE, MAX_LEASE,
    MIN_LEASE, MIN_WATCHDOG_LEASE,
};
pub use engine::guard::Guard;
pub use engine::kind::{Kind, MAX_NAME_LEN};
pub use error::{Error, Result};
pub use kinds::fair_lock::{FairGuard, FairLock};
pub use kinds::fenced_lock::{FencedGuard, FencedLock};
pub use kinds::leased_semaphore::{LeasedPermit, LeasedSemaphore, PermitId, MAX_PERMITS_AT_ONCE};
pub use kinds::lock::Lock;
pub use kinds::rwlock::{ReadGuard, ReadLock, ReadWriteLock, WriteGuard, WriteLock};
pub use kinds::semaphore::{
    Semaphore, SemaphorePermit, DEFAULT_RECHECK_INTERVAL, MAX_PERMITS, MAX_RECHECK_INTERVAL,
};

/// A hold of a [`Lock`].
pub type LockGuard = Guard<Lock>;
pub use conn::server::{ServerVersion, OLDEST_REDIS};
pub use kinds::multilock::{Exclusive, MultiLock, MultiLockGuard, RedLockGuard};
pub use kinds::redlock::RedLock;
pub use kinds::state::{Holder, LockState, ReadWriteMode};
pub use owner::Owner;

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
        send_static::<crate::SemaphorePermit>();
        send_static::<crate::Error>();
        send_static::<crate::Client>();
        sync::<crate::Lock>();
        sync::<crate::Client>();
    }
}
