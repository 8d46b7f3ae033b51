//! The lock family's conformance suite: the invariants of docs/DESIGN.md, written once and run
//! against every lock kind, each against its own `redis-server`.
//!
//! # Adding a kind
//!
//! 1. Describe the kind in the catalog at the end of this file with `family_kind!` — how to
//!    make a handle, its *rival* (what its holds exclude), the type of its Redis key, how a
//!    release wakes its waiters, and whether two owners' holds exclude each other:
//!
//!    ```ignore
//!    family_kind!(redbaton::ReadLock {
//!        make: |client, name| client.read_write_lock(name).read(),
//!        rival: |client, name| client.read_write_lock(name).write(),
//!        key_type: "hash",
//!        wake: WakeRule::All,  // a write-unlock publishes "1": every reader may enter
//!        exclusive: false,     // readers share
//!        fifo: false,
//!    });
//!    ```
//!
//!    `family_kind!` works for any kind with `Lock`'s method set (the five acquire methods,
//!    `is_locked`, `hold_count`, `force_unlock`, `channel`, `key`) and a `Guard<Kind>` guard;
//!    otherwise implement [`AnyLock`], [`AnyGuard`] and [`Family`] by hand.
//! 2. Add it to the catalog of kinds (`kinds.rs`: [`KINDS`](crate::kinds::KINDS) and
//!    `lock_family!`, which `tests/family.rs` hands `conformance!`): one `#[tokio::test]` per
//!    invariant, in a module named by the pair's first element.
//!
//! # How kinds differ
//!
//! - **Rival**: the hold, by another client, that this kind's holds exclude and that
//!   excludes them. For exclusive kinds (lock, fenced, fair, write) it is the kind itself
//!   (the default); a read lock's rival is the write lock. Every test that needs "held
//!   elsewhere" uses the rival, so shared kinds run the same tests.
//! - **Exclusive** (`exclusive`): two owners of the kind exclude each other. When `false`
//!   (readers), the exclusion test checks that they share instead, and that the rival
//!   excludes them all.
//! - **Wake rule** (`wake`): how many of this kind's parked waiters (in one process) one
//!   release of the rival wakes — `One` (an unlock message `0`) or `All` (a write-unlock
//!   `1`). A shared kind must wake all: any number of its waiters may then enter.
//! - **FIFO** (`fifo`): waiters get the lock in the order they arrived (the fair lock).
//!
//! A kind whose waiters each listen on their own channel (Redisson's fair lock) returns the
//! channels' common prefix from `channel()`: the suite only checks that a waiter subscribes to
//! a channel starting with it, and that no subscription is left behind.
//!
//! # The tests (one function each in the other files here, documented with what it asserts)
//!
//! `exclusion`, `reentry`, `wake_up_without_polling`, `wake_one_or_all`,
//! `every_waiter_gets_its_turn`, `dead_holders_lease_ends`,
//! `fixed_lease_ends_and_the_guard_knows`, `watchdog_renews`, `lost_fires`,
//! `cancellation_leaves_nothing_behind`, `shutdown_releases_and_refuses`,
//! `bad_input_is_refused_before_anything_is_sent`, `wrong_type_keys_are_refused_and_untouched`.
//!
//! The suite assumes the classic pub/sub mode and a server used by one test alone (it reads
//! `INFO commandstats` and `PUBSUB CHANNELS`).
//!
//! A test crate reaches it as `testkit::family` (`use testkit::family;`); `conformance!`
//! is exported at the kit's root too, and refers to this module through `$crate`.
#![allow(dead_code)]

mod holders;
mod leases;
mod refusals;
mod waiters;

pub use holders::*;
pub use leases::*;
pub use refusals::*;
pub use waiters::*;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use fred::types::CustomCommand;
use redbaton::{Client, Error, Result};
use tokio::time::Instant;

use crate::monitor::ScriptRuns;
use crate::{command_calls, eventually, script_calls, RedisServer, RENEWED_LEASE};

/// Implements [`AnyGuard`], [`AnyLock`] and [`Family`] for a kind with `Lock`'s method set.
macro_rules! family_kind {
    ($kind:ty {
        make: |$client:ident, $name:ident| $make:expr,
        $(rival: |$rclient:ident, $rname:ident| $rival:expr,)?
        key_type: $key_type:expr,
        wake: $wake:expr,
        exclusive: $exclusive:expr,
        fifo: $fifo:expr $(,)?
    }) => {
        impl $crate::family::AnyGuard for redbaton::Guard<$kind> {
            fn unlock(
                self: Box<Self>,
            ) -> $crate::family::Fut<'static, redbaton::Result<()>> {
                Box::pin(async move { redbaton::Guard::<$kind>::unlock(*self).await })
            }
            fn lost(&self) -> $crate::family::Fut<'_, ()> {
                Box::pin(redbaton::Guard::<$kind>::lost(self))
            }
            fn is_lost(&self) -> bool {
                redbaton::Guard::<$kind>::is_lost(self)
            }
            fn reenter(&self) -> $crate::family::Fut<'_, redbaton::Result<$crate::family::Held>> {
                Box::pin(async move {
                    redbaton::Guard::<$kind>::reenter(self)
                        .await
                        .map($crate::family::Held::new)
                })
            }
            fn run<'a>(
                &'a self,
                work: $crate::family::Fut<'a, ()>,
            ) -> $crate::family::Fut<'a, redbaton::Result<()>> {
                Box::pin(redbaton::Guard::<$kind>::run(self, || work))
            }
            fn owner(&self) -> redbaton::Owner {
                redbaton::Guard::<$kind>::owner(self)
            }
        }

        impl $crate::family::AnyLock for $kind {
            fn lock(&self) -> $crate::family::Fut<'_, redbaton::Result<$crate::family::Held>> {
                Box::pin(async move { <$kind>::lock(self).await.map($crate::family::Held::new) })
            }
            fn lock_with_lease(
                &self,
                lease: std::time::Duration,
            ) -> $crate::family::Fut<'_, redbaton::Result<$crate::family::Held>> {
                Box::pin(async move {
                    <$kind>::lock_with_lease(self, lease)
                        .await
                        .map($crate::family::Held::new)
                })
            }
            fn try_lock(
                &self,
            ) -> $crate::family::Fut<'_, redbaton::Result<Option<$crate::family::Held>>> {
                Box::pin(async move {
                    <$kind>::try_lock(self)
                        .await
                        .map(|g| g.map($crate::family::Held::new))
                })
            }
            fn try_lock_for(
                &self,
                wait: std::time::Duration,
            ) -> $crate::family::Fut<'_, redbaton::Result<Option<$crate::family::Held>>> {
                Box::pin(async move {
                    <$kind>::try_lock_for(self, wait)
                        .await
                        .map(|g| g.map($crate::family::Held::new))
                })
            }
            fn try_lock_with_lease(
                &self,
                wait: std::time::Duration,
                lease: std::time::Duration,
            ) -> $crate::family::Fut<'_, redbaton::Result<Option<$crate::family::Held>>> {
                Box::pin(async move {
                    <$kind>::try_lock_with_lease(self, wait, lease)
                        .await
                        .map(|g| g.map($crate::family::Held::new))
                })
            }
            fn is_locked(&self) -> $crate::family::Fut<'_, redbaton::Result<bool>> {
                Box::pin(<$kind>::is_locked(self))
            }
            fn hold_count(&self) -> $crate::family::Fut<'_, redbaton::Result<u32>> {
                Box::pin(<$kind>::hold_count(self))
            }
            fn with_owner(&self, owner: redbaton::Owner) -> Box<dyn $crate::family::AnyLock> {
                Box::new(<$kind>::with_owner(self, owner))
            }
            fn run<'a>(
                &'a self,
                work: $crate::family::Fut<'a, ()>,
            ) -> $crate::family::Fut<'a, redbaton::Result<()>> {
                Box::pin(<$kind>::run(self, || work))
            }
            fn force_unlock(&self) -> $crate::family::Fut<'_, redbaton::Result<bool>> {
                Box::pin(<$kind>::force_unlock(self))
            }
            fn channel(&self) -> String {
                <$kind>::channel(self).to_owned()
            }
            fn key(&self) -> String {
                <$kind>::key(self).to_owned()
            }
        }

        impl $crate::family::Family for $kind {
            const KIND: &'static str = stringify!($kind);
            const KEY_TYPE: &'static str = $key_type;
            const WAKE: $crate::family::WakeRule = $wake;
            const EXCLUSIVE: bool = $exclusive;
            const FIFO: bool = $fifo;

            fn make($client: &redbaton::Client, $name: &str) -> Self {
                $make
            }

            $(
                fn rival(
                    $rclient: &redbaton::Client,
                    $rname: &str,
                ) -> std::sync::Arc<dyn $crate::family::AnyLock> {
                    std::sync::Arc::new($rival)
                }
            )?
        }
    };
}
#[allow(unused_imports)]
pub(crate) use family_kind;

/// One `#[tokio::test]` per invariant for `$kind`, in a module `$module` (of the calling
/// test crate, which needs `tokio`).
#[macro_export]
macro_rules! conformance {
    ($module:ident, $kind:ty) => {
        mod $module {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn exclusion() {
                $crate::family::exclusion::<$kind>().await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn reentry() {
                $crate::family::reentry::<$kind>().await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn one_holder_per_scope() {
                $crate::family::one_holder_per_scope::<$kind>().await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn wake_up_without_polling() {
                $crate::family::wake_up_without_polling::<$kind>().await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn wake_one_or_all() {
                $crate::family::wake_one_or_all::<$kind>().await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn every_waiter_gets_its_turn() {
                $crate::family::every_waiter_gets_its_turn::<$kind>().await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn dead_holders_lease_ends() {
                $crate::family::dead_holders_lease_ends::<$kind>().await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn fixed_lease_ends_and_the_guard_knows() {
                $crate::family::fixed_lease_ends_and_the_guard_knows::<$kind>().await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn watchdog_renews() {
                $crate::family::watchdog_renews::<$kind>().await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn force_unlock_is_felt_within_a_second() {
                $crate::family::force_unlock_is_felt_within_a_second::<$kind>().await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_stall_past_the_call_bound_leaves_nothing_held() {
                $crate::family::a_stall_past_the_call_bound_leaves_nothing_held::<$kind>().await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn lost_fires() {
                $crate::family::lost_fires::<$kind>().await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn cancellation_leaves_nothing_behind() {
                $crate::family::cancellation_leaves_nothing_behind::<$kind>().await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn shutdown_releases_and_refuses() {
                $crate::family::shutdown_releases_and_refuses::<$kind>().await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn bad_input_is_refused_before_anything_is_sent() {
                $crate::family::bad_input_is_refused_before_anything_is_sent::<$kind>().await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn wrong_type_keys_are_refused_and_untouched() {
                $crate::family::wrong_type_keys_are_refused_and_untouched::<$kind>().await
            }
        }
    };
}
pub use crate::conformance;

/// A boxed future: the erased handles return these.
pub type Fut<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// How many of a kind's parked waiters one release of its rival wakes, in one process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WakeRule {
    /// One (unlock message `0`): only one can enter.
    One,
    /// Every one (message `1`): they re-check, and all that can enter do.
    All,
}

/// A guard of any kind.
pub trait AnyGuard: Send + Sync {
    /// Releases the hold.
    fn unlock(self: Box<Self>) -> Fut<'static, Result<()>>;
    /// Resolves when the lease is lost.
    fn lost(&self) -> Fut<'_, ()>;
    /// Whether the lease is lost.
    fn is_lost(&self) -> bool;
    /// `reenter()`: a nested hold of this owner.
    fn reenter(&self) -> Fut<'_, Result<Held>>;
    /// `run(|| work)`: `work` polled inside this hold's scope.
    fn run<'a>(&'a self, work: Fut<'a, ()>) -> Fut<'a, Result<()>>;
    /// The hold's owner.
    fn owner(&self) -> redbaton::Owner;
}

/// One hold of any kind (an erased guard).
pub struct Held(Box<dyn AnyGuard>);

impl Held {
    /// Erases `guard`.
    pub fn new(guard: impl AnyGuard + 'static) -> Held {
        Held(Box::new(guard))
    }

    /// Releases the hold.
    pub async fn unlock(self) -> Result<()> {
        self.0.unlock().await
    }

    /// Resolves when the lease is lost.
    pub async fn lost(&self) {
        self.0.lost().await
    }

    /// Whether the lease is lost.
    pub fn is_lost(&self) -> bool {
        self.0.is_lost()
    }

    /// A nested hold of this owner, without a scope (`guard.reenter()`).
    pub async fn reenter(&self) -> Result<Held> {
        self.0.reenter().await
    }

    /// `work`, polled inside this hold's scope (`guard.run`).
    pub async fn run<'a>(&'a self, work: impl Future<Output = ()> + Send + 'a) -> Result<()> {
        self.0.run(Box::pin(work)).await
    }

    /// The hold's owner.
    pub fn owner(&self) -> redbaton::Owner {
        self.0.owner()
    }
}

/// A lock handle of any kind.
pub trait AnyLock: Send + Sync + 'static {
    /// `lock()`.
    fn lock(&self) -> Fut<'_, Result<Held>>;
    /// `lock_with_lease(lease)`.
    fn lock_with_lease(&self, lease: Duration) -> Fut<'_, Result<Held>>;
    /// `try_lock()`.
    fn try_lock(&self) -> Fut<'_, Result<Option<Held>>>;
    /// `try_lock_for(wait)`.
    fn try_lock_for(&self, wait: Duration) -> Fut<'_, Result<Option<Held>>>;
    /// `try_lock_with_lease(wait, lease)`.
    fn try_lock_with_lease(&self, wait: Duration, lease: Duration)
        -> Fut<'_, Result<Option<Held>>>;
    /// `is_locked()`.
    fn is_locked(&self) -> Fut<'_, Result<bool>>;
    /// `hold_count()` of the enclosing hold's owner (0 outside every scope).
    fn hold_count(&self) -> Fut<'_, Result<u32>>;
    /// `with_owner(owner)`: this lock as an explicit owner.
    fn with_owner(&self, owner: redbaton::Owner) -> Box<dyn AnyLock>;
    /// `run(|| work)`: acquires, polls `work` inside the hold's scope, releases.
    fn run<'a>(&'a self, work: Fut<'a, ()>) -> Fut<'a, Result<()>>;
    /// `force_unlock()`.
    fn force_unlock(&self) -> Fut<'_, Result<bool>>;
    /// The channel (or, for a kind with a channel per waiter, the prefix of every waiter's
    /// channel) the kind's waiters subscribe to.
    fn channel(&self) -> String;
    /// The Redis key of the lock.
    fn key(&self) -> String;
}

/// A lock kind under test: see the module docs.
pub trait Family: AnyLock + Clone {
    /// The kind's name, for failure messages.
    const KIND: &'static str;
    /// The Redis type of the lock key (`TYPE key`).
    const KEY_TYPE: &'static str;
    /// What one release of the rival wakes among this kind's parked waiters.
    const WAKE: WakeRule;
    /// Whether two owners of this kind exclude each other.
    const EXCLUSIVE: bool;
    /// Whether waiters acquire in arrival order.
    const FIFO: bool;

    /// A handle on `name` through `client`.
    fn make(client: &Client, name: &str) -> Self;

    /// A handle on `name` whose holds exclude this kind's holds and are excluded by them.
    fn rival(client: &Client, name: &str) -> Arc<dyn AnyLock> {
        Arc::new(Self::make(client, name))
    }
}

// ---------------------------------------------------------------------------------------
// Helpers

/// The lock name every test uses (each test has its own server).
const NAME: &str = "family:orders:42";

/// A client with default settings (30 s watchdog lease: a wake-up within a few seconds can
/// only be the unlock message).
/// A client of `server` with the default settings, but for the lease check: holds are checked
/// at renewals only (every 10 s), as the suite counts the scripts a waiter sends and a check
/// between renewals is a script too.
async fn client(server: &RedisServer) -> Client {
    Client::builder()
        .url(server.url())
        .lease_check_interval(Duration::from_secs(3600))
        .connect()
        .await
        .unwrap()
}

/// Waits until no script has run for 400 ms (waiters made their attempts and parked) and
/// returns the count; bounded at 10 s.
pub async fn quiet_script_calls(raw: &fred::clients::Client) -> u64 {
    let start = Instant::now();
    let mut last = script_calls(raw).await;
    loop {
        tokio::time::sleep(Duration::from_millis(400)).await;
        let now = script_calls(raw).await;
        if now == last {
            return now;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "scripts kept running: waiters never parked (polling?)"
        );
        last = now;
    }
}

/// The channels with at least one subscriber (`PUBSUB CHANNELS`).
pub async fn channels(raw: &fred::clients::Client) -> Vec<String> {
    let reply: Vec<String> = raw
        .custom(
            CustomCommand::new_static("PUBSUB", None, false),
            vec!["CHANNELS"],
        )
        .await
        .unwrap();
    reply
}

/// `EXISTS key`.
async fn exists(raw: &fred::clients::Client, key: &str) -> bool {
    let n: i64 = raw.exists(key).await.unwrap();
    n == 1
}

fn describe<T>(outcome: &Result<T>) -> String {
    match outcome {
        Ok(_) => "Ok(..)".to_owned(),
        Err(e) => format!("Err({e:?})"),
    }
}

// ---------------------------------------------------------------------------------------
// The kinds (see "Adding a kind" above)

family_kind!(redbaton::Lock {
    make: |client, name| client.lock(name),
    key_type: "hash",
    wake: WakeRule::One,
    exclusive: true,
    fifo: false,
});

family_kind!(redbaton::FencedLock {
    make: |client, name| client.fenced_lock(name),
    key_type: "hash",
    wake: WakeRule::One,
    exclusive: true,
    fifo: false,
});

family_kind!(redbaton::ReadLock {
    make: |client, name| client.read_write_lock(name).read(),
    rival: |client, name| client.read_write_lock(name).write(),
    key_type: "hash",
    wake: WakeRule::All, // a write-unlock publishes "1": every parked reader may enter
    exclusive: false,    // readers share
    fifo: false,
});

family_kind!(redbaton::WriteLock {
    make: |client, name| client.read_write_lock(name).write(),
    key_type: "hash",
    wake: WakeRule::All, // a write-unlock publishes "1" (Redisson): every parked waiter re-checks
    exclusive: true,
    fifo: false,
});

family_kind!(redbaton::FairLock {
    make: |client, name| client.fair_lock(name),
    key_type: "hash",
    wake: WakeRule::One, // a release publishes "0" on the head's own channel
    exclusive: true,
    fifo: true,
});
