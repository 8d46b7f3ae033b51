//! The lock family's conformance suite: the invariants of DESIGN.md, written once and run
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
//! 2. Add one line to `tests/family.rs`: `conformance!(read_lock, redbaton::ReadLock);` —
//!    one `#[tokio::test]` per invariant, in a module named by the first argument.
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
//! # The tests (one function each below, documented with what it asserts)
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
//! This file is mounted at the crate root next to `mod support;`:
//! `#[path = "support/family.rs"] mod family;` (the macros refer to `crate::family`).
#![allow(dead_code)]

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use fred::types::CustomCommand;
use redbaton::{Client, Error, Result};
use tokio::time::Instant;

use crate::support::{command_calls, eventually, script_calls, RedisServer, RENEWED_LEASE};

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

/// One `#[tokio::test]` per invariant for `$kind`, in a module `$module`.
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
pub(crate) use conformance;

// ---------------------------------------------------------------------------------------
// Helpers

/// The lock name every test uses (each test has its own server).
const NAME: &str = "family:orders:42";

/// A client with default settings (30 s watchdog lease: a wake-up within a few seconds can
/// only be the unlock message).
async fn client(server: &RedisServer) -> Client {
    Client::connect(&server.url()).await.unwrap()
}

/// A client whose watchdog lease is `lease`.
async fn leased(url: String, lease: Duration) -> Client {
    Client::builder()
        .url(url)
        .watchdog_lease(lease)
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

/// Every key with its serialized value and TTL: equal snapshots mean nothing changed.
async fn snapshot(raw: &fred::clients::Client) -> Vec<(String, Option<Vec<u8>>, i64)> {
    let mut keys: Vec<String> = raw
        .custom(CustomCommand::new_static("KEYS", None, false), vec!["*"])
        .await
        .unwrap();
    keys.sort();
    let mut out = Vec::new();
    for key in keys {
        let dump: Option<Vec<u8>> = raw
            .custom(
                CustomCommand::new_static("DUMP", None, false),
                vec![key.clone()],
            )
            .await
            .unwrap();
        let pttl: i64 = raw.pttl(&key).await.unwrap();
        out.push((key, dump, pttl));
    }
    out
}

/// `EXISTS key`.
async fn exists(raw: &fred::clients::Client, key: &str) -> bool {
    let n: i64 = raw.exists(key).await.unwrap();
    n == 1
}

fn is_invalid<T>(outcome: &Result<T>) -> bool {
    matches!(outcome, Err(Error::InvalidArgument(_)))
}

fn is_wrong_type<T>(outcome: &Result<T>) -> bool {
    matches!(outcome, Err(Error::WrongType { .. }))
}

fn describe<T>(outcome: &Result<T>) -> String {
    match outcome {
        Ok(_) => "Ok(..)".to_owned(),
        Err(e) => format!("Err({e:?})"),
    }
}

/// Spawns a waiter that takes `lock`, reports `index` on `acquired`, and keeps the hold until
/// `release` is notified (then unlocks).
fn spawn_holder<L: AnyLock + Clone>(
    lock: L,
    index: usize,
    acquired: tokio::sync::mpsc::UnboundedSender<usize>,
    release: Arc<tokio::sync::Notify>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let held = lock.lock().await.unwrap();
        let released = release.notified();
        acquired.send(index).unwrap();
        released.await;
        held.unlock().await.unwrap();
    })
}

// ---------------------------------------------------------------------------------------
// The invariants

/// Invariant 1 (mutual exclusion). The rival and the kind exclude each other (both ways,
/// `try_lock` and a bounded `try_lock_for`); exclusive kinds exclude another client and
/// another task of the same client; shared kinds share. Then a contention run with a
/// history checker: an exclusive kind's holders are never two at once, and a guarded
/// read-modify-write counter in Redis ends exact; for a shared kind, rival holders (which
/// increment the counter) never overlap with the kind's holders or with each other.
pub async fn exclusion<K: Family>() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let a = client(&server).await;
    let b = client(&server).await;
    let kind = K::KIND;

    let mine = K::make(&a, NAME);
    let held = mine.lock().await.unwrap();
    let rival = K::rival(&b, NAME);
    assert!(
        rival.try_lock().await.unwrap().is_none(),
        "{kind}: the rival must be excluded while held"
    );
    let started = Instant::now();
    assert!(
        rival
            .try_lock_for(Duration::from_millis(300))
            .await
            .unwrap()
            .is_none(),
        "{kind}: the rival's bounded wait must time out"
    );
    assert!(started.elapsed() >= Duration::from_millis(300));
    let other_client = K::make(&b, NAME).try_lock().await.unwrap();
    let other_task = {
        let mine = mine.clone();
        tokio::spawn(async move { mine.try_lock().await.unwrap() })
            .await
            .unwrap()
    };
    if K::EXCLUSIVE {
        assert!(
            other_client.is_none(),
            "{kind}: another client must be excluded"
        );
        assert!(
            other_task.is_none(),
            "{kind}: another task must be excluded"
        );
        assert!(
            mine.try_lock().await.unwrap().is_none(),
            "{kind}: this task, outside the hold's scope, is another owner"
        );
    } else {
        let other_client = other_client.expect("a shared kind: another client shares");
        let other_task = other_task.expect("a shared kind: another task shares");
        other_client.unlock().await.unwrap();
        other_task.unlock().await.unwrap();
    }
    held.unlock().await.unwrap();
    assert!(
        !mine.is_locked().await.unwrap(),
        "{kind}: free after unlock"
    );

    // The other way round: the rival's hold excludes the kind.
    let rival_held = rival.try_lock().await.unwrap().expect("free now");
    assert!(
        mine.try_lock().await.unwrap().is_none(),
        "{kind}: excluded by the rival's hold"
    );
    rival_held.unlock().await.unwrap();

    // Contention with a history checker.
    let inside = Arc::new(AtomicI32::new(0));
    let rival_inside = Arc::new(AtomicI32::new(0));
    let violations = Arc::new(AtomicI32::new(0));
    let mut tasks = Vec::new();
    let mut increments = 0;
    for (c, client) in [&a, &b].into_iter().enumerate() {
        for t in 0..3 {
            // Exclusive kinds: every task increments. Shared kinds: the rival's tasks
            // increment, the kind's tasks only read.
            let as_rival = !K::EXCLUSIVE && (c + t) % 2 == 0;
            let lock: Arc<dyn AnyLock> = if as_rival {
                K::rival(client, NAME)
            } else {
                Arc::new(K::make(client, NAME))
            };
            let writes = K::EXCLUSIVE || as_rival;
            if writes {
                increments += 8;
            }
            let counter = client.redis().clone();
            let (inside, rival_inside, violations) =
                (inside.clone(), rival_inside.clone(), violations.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..8 {
                    let held = lock.lock().await.unwrap();
                    let (mine, theirs) = if as_rival {
                        (&rival_inside, &inside)
                    } else {
                        (&inside, &rival_inside)
                    };
                    let before = mine.fetch_add(1, Ordering::SeqCst);
                    let exclusive_here = as_rival || K::EXCLUSIVE;
                    if theirs.load(Ordering::SeqCst) != 0 || (exclusive_here && before != 0) {
                        violations.fetch_add(1, Ordering::SeqCst);
                    }
                    let value: Option<i64> = counter.get("family:counter").await.unwrap();
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    if writes {
                        let _: () = counter
                            .set("family:counter", value.unwrap_or(0) + 1, None, None, false)
                            .await
                            .unwrap();
                    }
                    mine.fetch_sub(1, Ordering::SeqCst);
                    held.unlock().await.unwrap();
                }
            }));
        }
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("the contention run ends")
            .unwrap();
    }
    assert_eq!(
        violations.load(Ordering::SeqCst),
        0,
        "{kind}: holders overlapped"
    );
    let total: i64 = raw.get("family:counter").await.unwrap();
    assert_eq!(total, increments, "{kind}: a guarded increment was lost");
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// Invariant 6 (reentry is exact) and 14 (re-entry by scope). Outside a hold's scope an
/// acquire is a new owner (`try_lock` refuses, the count outside is 0); inside `guard.run`,
/// every acquire method re-enters at once, and so do `guard.reenter()` and a nested
/// `lock.run`: one owner field whose count follows every acquire and every release (in any
/// order); the key has the kind's Redis type while held and is gone after the last release.
pub async fn reentry<K: Family>() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let a = client(&server).await;
    let kind = K::KIND;
    let lock = K::make(&a, NAME);
    assert_eq!(lock.hold_count().await.unwrap(), 0);
    let first = lock.lock().await.unwrap();
    if K::EXCLUSIVE {
        assert!(
            lock.try_lock().await.unwrap().is_none(),
            "{kind}: outside the hold's scope, another owner"
        );
    }
    assert_eq!(
        lock.hold_count().await.unwrap(),
        0,
        "{kind}: no scope, no owner"
    );
    let owned = lock.with_owner(first.owner());
    let nested = tokio::sync::Mutex::new(Vec::new());
    let started = Instant::now();
    first
        .run(async {
            let mut nested = nested.lock().await;
            nested.push(lock.try_lock().await.unwrap().expect("re-enters"));
            nested.push(
                lock.try_lock_for(Duration::from_secs(1))
                    .await
                    .unwrap()
                    .expect("re-enters"),
            );
            nested.push(lock.lock_with_lease(Duration::from_secs(60)).await.unwrap());
            nested.push(
                lock.try_lock_with_lease(Duration::from_secs(1), Duration::from_secs(60))
                    .await
                    .unwrap()
                    .expect("re-enters"),
            );
            assert_eq!(lock.hold_count().await.unwrap(), 5, "{kind}: seen in scope");
            // A lock's own run nests too: one more hold while it runs.
            lock.run(Box::pin(async {
                assert_eq!(lock.hold_count().await.unwrap(), 6, "{kind}: nested run");
            }))
            .await
            .unwrap();
        })
        .await
        .unwrap();
    let mut guards = vec![first];
    guards.extend(nested.into_inner());
    guards.push(guards[0].reenter().await.unwrap());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{kind}: nested acquires never wait"
    );
    assert_eq!(
        owned.hold_count().await.unwrap(),
        6,
        "{kind}: six holds, one owner"
    );
    let key = lock.key();
    let key_type: String = raw.r#type(&key).await.unwrap();
    assert_eq!(key_type, K::KEY_TYPE, "{kind}: the key's type");
    // Release out of order: the middle, the first, then the rest.
    let order = [2usize, 0, 5, 3, 1, 4];
    let mut slots: Vec<Option<Held>> = guards.into_iter().map(Some).collect();
    for (done, &i) in order.iter().enumerate() {
        let held = slots[i].take().unwrap();
        held.unlock().await.unwrap();
        let left = 5 - done as u32;
        assert_eq!(
            owned.hold_count().await.unwrap(),
            left,
            "{kind}: count after {} releases",
            done + 1
        );
        assert_eq!(
            lock.is_locked().await.unwrap(),
            left > 0,
            "{kind}: is_locked"
        );
    }
    assert!(
        !exists(&raw, &key).await,
        "{kind}: the key goes with the last hold"
    );
    a.shutdown().await.unwrap();
}

/// Invariant 14 (one holder means one holder). Critical sections on one name, polled together
/// in one task — `join!`, `select!`, `FuturesUnordered`, `for_each_concurrent`,
/// `buffer_unordered` — are never inside at once (an exclusive kind; a shared kind's sections
/// never overlap a rival's); on two names they run together.
pub async fn one_holder_per_scope<K: Family>() {
    use futures::stream::{self, FuturesUnordered, StreamExt};
    use std::sync::atomic::AtomicUsize;

    let server = RedisServer::start();
    let a = client(&server).await;
    let kind = K::KIND;
    // An exclusive kind excludes itself; a shared one is checked against its rival.
    let this: Arc<dyn AnyLock> = Arc::new(K::make(&a, NAME));
    let other = K::rival(&a, NAME);
    // Holders inside now: shared ones (a shared kind's) and exclusive ones (the rest).
    let (shared, exclusive) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let overlaps = AtomicUsize::new(0);
    let section = |lock: Arc<dyn AnyLock>, sharing: bool| {
        let (shared, exclusive, overlaps) = (&shared, &exclusive, &overlaps);
        async move {
            let held = lock.lock().await.unwrap();
            let (mine, theirs) = if sharing {
                (shared, exclusive)
            } else {
                (exclusive, shared)
            };
            // Left on drop too: `select!` drops the section that loses, inside or not.
            struct Inside<'a>(&'a AtomicUsize);
            impl Drop for Inside<'_> {
                fn drop(&mut self) {
                    self.0.fetch_sub(1, Ordering::SeqCst);
                }
            }
            let me = mine.fetch_add(1, Ordering::SeqCst) + 1;
            let inside = Inside(mine);
            if theirs.load(Ordering::SeqCst) > 0 || (!sharing && me > 1) {
                overlaps.fetch_add(1, Ordering::SeqCst);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            drop(inside);
            held.unlock().await.unwrap();
        }
    };
    // Alternates the kind and its rival, so a shared kind meets a writer every other time.
    let pick = |i: usize| {
        if i % 2 == 0 {
            section(this.clone(), !K::EXCLUSIVE)
        } else {
            section(other.clone(), false)
        }
    };
    let check = |how: &str| {
        let seen = overlaps.swap(0, Ordering::SeqCst);
        assert_eq!(seen, 0, "{kind}: {seen} overlapping holds under {how}");
    };

    tokio::join!(pick(0), pick(1), pick(2));
    check("join!");
    for _ in 0..3 {
        tokio::select! {
            _ = pick(0) => {}
            _ = pick(1) => {}
        }
    }
    check("select!");
    let mut unordered: FuturesUnordered<_> = (0..4).map(pick).collect();
    while unordered.next().await.is_some() {}
    check("FuturesUnordered");
    stream::iter(0..4).for_each_concurrent(4, pick).await;
    check("for_each_concurrent");
    stream::iter(0..4)
        .map(pick)
        .buffer_unordered(4)
        .collect::<Vec<()>>()
        .await;
    check("buffer_unordered");

    // Two names: each section waits until the other is inside too, so they must overlap.
    let both = tokio::sync::Barrier::new(2);
    let overlapping = |name: &'static str| {
        let (lock, both) = (K::make(&a, name), &both);
        async move {
            let held = lock.lock().await.unwrap();
            tokio::time::timeout(Duration::from_secs(20), both.wait())
                .await
                .unwrap_or_else(|_| panic!("{kind}: two names did not run together"));
            held.unlock().await.unwrap();
        }
    };
    tokio::join!(overlapping("family-a"), overlapping("family-b"));
    a.shutdown().await.unwrap();
}

/// Invariants 2 and 3 (a waiter parks on its channel and is woken by the release). While the
/// rival holds, a waiter subscribes to the kind's channel and then sends nothing for 1.5 s
/// (no polling: the lease is 30 s); the rival's release wakes it within seconds — only the
/// message can do that. Its subscription is gone afterwards.
pub async fn wake_up_without_polling<K: Family>() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let holder = client(&server).await;
    let waiters = client(&server).await;
    let kind = K::KIND;
    let rival = K::rival(&holder, NAME).lock().await.unwrap();
    let lock = K::make(&waiters, NAME);
    let channel = lock.channel();
    let waiter = {
        let lock = lock.clone();
        tokio::spawn(async move {
            let held = lock.lock().await.unwrap();
            let at = Instant::now();
            held.unlock().await.unwrap();
            at
        })
    };
    assert!(
        eventually(Duration::from_secs(5), || async {
            channels(&raw).await.iter().any(|c| c.starts_with(&channel))
        })
        .await,
        "{kind}: the waiter subscribes to its channel ({channel}); subscribed: {:?}",
        channels(&raw).await
    );
    let parked = quiet_script_calls(&raw).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        script_calls(&raw).await,
        parked,
        "{kind}: a parked waiter sends nothing"
    );
    assert!(!waiter.is_finished(), "{kind}: still waiting");
    let released = Instant::now();
    rival.unlock().await.unwrap();
    let acquired = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("woken")
        .unwrap();
    let handoff = acquired.duration_since(released);
    assert!(
        handoff < Duration::from_secs(3),
        "{kind}: woken after {handoff:?}: by the lease (30 s), not by the message"
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            channels(&raw).await.is_empty()
        })
        .await,
        "{kind}: the subscription is dropped: {:?}",
        channels(&raw).await
    );
    holder.shutdown().await.unwrap();
    waiters.shutdown().await.unwrap();
}

/// Invariant 4 (wake as many as can enter). Five waiters of one process park behind the
/// rival; one release of the rival wakes exactly as many as the kind's rule says — `One`:
/// the release and one winning attempt run, nothing else; `All`: every waiter re-checks once.
/// An exclusive kind then has exactly one holder (the others park again); a shared kind has
/// all five.
pub async fn wake_one_or_all<K: Family>() {
    assert!(
        K::EXCLUSIVE || K::WAKE == WakeRule::All,
        "a shared kind must wake all: any number of its waiters may enter"
    );
    const WAITERS: usize = 5;
    let server = RedisServer::start();
    let raw = server.raw().await;
    let holder = client(&server).await;
    let waiters = client(&server).await;
    let kind = K::KIND;
    let rival = K::rival(&holder, NAME).lock().await.unwrap();
    let (acquired_tx, mut acquired_rx) = tokio::sync::mpsc::unbounded_channel();
    let release = Arc::new(tokio::sync::Notify::new());
    let tasks: Vec<_> = (0..WAITERS)
        .map(|i| {
            spawn_holder(
                K::make(&waiters, NAME),
                i,
                acquired_tx.clone(),
                release.clone(),
            )
        })
        .collect();
    assert!(
        eventually(Duration::from_secs(5), || async {
            !channels(&raw).await.is_empty()
        })
        .await
    );
    let before = quiet_script_calls(&raw).await;
    rival.unlock().await.unwrap();
    let expected_holders = if K::EXCLUSIVE { 1 } else { WAITERS };
    for n in 0..expected_holders {
        tokio::time::timeout(Duration::from_secs(5), acquired_rx.recv())
            .await
            .unwrap_or_else(|_| panic!("{kind}: only {n} waiters were woken and entered"));
    }
    let after = quiet_script_calls(&raw).await;
    let attempts = after - before - 1;
    // `All` also leaves one wake-up stored for a waiter that was busy with an attempt when
    // the message came (it must re-check, or it would miss the release): when the waiters
    // that lost park again, one of them takes it and re-checks once more.
    let expected_attempts = match K::WAKE {
        WakeRule::One => 1..=1,
        WakeRule::All if K::EXCLUSIVE => WAITERS as u64..=WAITERS as u64 + 1,
        WakeRule::All => WAITERS as u64..=WAITERS as u64,
    };
    assert!(
        expected_attempts.contains(&attempts),
        "{kind}: {attempts} attempts after one release, expected {expected_attempts:?} (wake rule {:?})",
        K::WAKE
    );
    assert!(
        acquired_rx.try_recv().is_err(),
        "{kind}: {expected_holders} holder(s) expected, more entered"
    );
    for task in &tasks {
        task.abort();
    }
    holder.shutdown().await.unwrap();
    waiters.shutdown().await.unwrap();
}

/// Invariants 3 and 4 (no waiter is left behind): four waiters queued behind the rival all
/// get the lock after its release, each woken by the previous holder's release (the leases
/// are 30 s) — in arrival order for a FIFO kind.
pub async fn every_waiter_gets_its_turn<K: Family>() {
    const WAITERS: usize = 4;
    let server = RedisServer::start();
    let raw = server.raw().await;
    let holder = client(&server).await;
    let waiters = client(&server).await;
    let kind = K::KIND;
    let rival = K::rival(&holder, NAME).lock().await.unwrap();
    let (acquired_tx, mut acquired_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let lock = K::make(&waiters, NAME);
        let acquired_tx = acquired_tx.clone();
        tasks.push(tokio::spawn(async move {
            let held = lock.lock().await.unwrap();
            acquired_tx.send(i).unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
            held.unlock().await.unwrap();
        }));
        if K::FIFO {
            // Arrival order is what FIFO promises: let each one queue before the next.
            quiet_script_calls(&raw).await;
        }
    }
    quiet_script_calls(&raw).await;
    rival.unlock().await.unwrap();
    let mut order = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while order.len() < WAITERS {
        match tokio::time::timeout_at(deadline, acquired_rx.recv()).await {
            Ok(Some(i)) => order.push(i),
            _ => panic!("{kind}: waiters left behind; got the lock in order {order:?}"),
        }
    }
    if K::FIFO {
        assert_eq!(
            order,
            (0..WAITERS).collect::<Vec<_>>(),
            "{kind}: FIFO order"
        );
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert!(!K::make(&waiters, NAME).is_locked().await.unwrap());
    holder.shutdown().await.unwrap();
    waiters.shutdown().await.unwrap();
}

/// Invariant 7 (leases end): a holder whose process dies (its runtime is dropped: no unlock,
/// no shutdown, no renewal) holds the lock for one watchdog lease (1 s here), then the rival
/// gets it.
pub async fn dead_holders_lease_ends<K: Family>() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let url = server.url();
    let kind = K::KIND;
    let key = tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let key = runtime.block_on(async {
            let dead = leased(url, Duration::from_secs(1)).await;
            let lock = K::make(&dead, NAME);
            std::mem::forget(lock.lock().await.unwrap());
            lock.key()
        });
        drop(runtime); // every task of the holder, its watchdog included, stops here
        key
    })
    .await
    .unwrap();
    let died = Instant::now();
    assert!(exists(&raw, &key).await, "{kind}: the dead holder's hold");
    let other = client(&server).await;
    let rival = K::rival(&other, NAME);
    let got = rival
        .try_lock_for(Duration::from_secs(6))
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{kind}: the dead holder's lease never ended"));
    let took = died.elapsed();
    assert!(
        took < Duration::from_secs(4),
        "{kind}: the rival got it {took:?} after the holder died (lease 1 s)"
    );
    got.unlock().await.unwrap();
    other.shutdown().await.unwrap();
}

/// Invariants 7 and 8 with a fixed lease: it is never renewed, the rival gets the lock after
/// it, the guard says it is lost (by its own clock and Redis's), and its unlock is
/// `NotHeld` without touching the rival's hold.
pub async fn fixed_lease_ends_and_the_guard_knows<K: Family>() {
    let server = RedisServer::start();
    let a = client(&server).await;
    let b = client(&server).await;
    let kind = K::KIND;
    let lock = K::make(&a, NAME);
    let started = Instant::now();
    let held = lock
        .lock_with_lease(Duration::from_millis(500))
        .await
        .unwrap();
    let rival = K::rival(&b, NAME);
    let got = rival
        .try_lock_for(Duration::from_secs(6))
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{kind}: the fixed lease was renewed or never set"));
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(3000),
        "{kind}: the 500 ms lease ended after {took:?}"
    );
    tokio::time::timeout(Duration::from_secs(1), held.lost())
        .await
        .unwrap_or_else(|_| panic!("{kind}: lost() after the lease"));
    assert!(held.is_lost());
    let stale = held.unlock().await;
    assert!(
        matches!(stale, Err(Error::NotHeld { .. })),
        "{kind}: a stale unlock: {}",
        describe(&stale)
    );
    assert!(
        rival.is_locked().await.unwrap(),
        "{kind}: the stale unlock left the rival's hold alone"
    );
    got.unlock().await.unwrap();
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// Invariants 7 and 8 with the watchdog: a hold outlives two watchdog leases with its guard
/// not lost, the rival excluded and the key's expiry within one lease; after the unlock
/// nothing keeps it.
pub async fn watchdog_renews<K: Family>() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let lease = RENEWED_LEASE;
    let a = leased(server.url(), lease).await;
    let b = client(&server).await;
    let kind = K::KIND;
    let lock = K::make(&a, NAME);
    let held = lock.lock().await.unwrap();
    // Unrenewed, the key would be gone after one lease.
    tokio::time::sleep(lease * 2).await;
    assert!(!held.is_lost(), "{kind}: lost although renewed");
    let rival = K::rival(&b, NAME);
    assert!(
        rival.try_lock().await.unwrap().is_none(),
        "{kind}: the lease ran out: the watchdog did not renew it"
    );
    let pttl: i64 = raw.pttl(&lock.key()).await.unwrap();
    assert!(
        pttl > 0 && pttl <= lease.as_millis() as i64,
        "{kind}: the key expires within one lease: pttl {pttl}"
    );
    held.unlock().await.unwrap();
    let got = rival.try_lock().await.unwrap();
    assert!(got.is_some(), "{kind}: free after the unlock");
    got.unwrap().unlock().await.unwrap();
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// Invariant 8 (lost means told). `lost()` stays pending while the lock is held, and fires
/// (within a few renewal periods) when another client force-unlocks it and when its key is
/// deleted underneath. A lost guard's unlock is `NotHeld` and leaves a newer hold of the same
/// owner alone.
pub async fn lost_fires<K: Family>() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let lease = RENEWED_LEASE;
    let a = leased(server.url(), lease).await;
    let b = client(&server).await;
    let kind = K::KIND;
    let lock = K::make(&a, NAME);

    let held = lock.lock().await.unwrap();
    assert!(
        tokio::time::timeout(lease, held.lost()).await.is_err(),
        "{kind}: lost() fired while held"
    );
    assert!(
        K::make(&b, NAME).force_unlock().await.unwrap(),
        "{kind}: force_unlock found the hold"
    );
    // The next renewal (every third of the lease) finds it gone; at the latest the lease
    // runs out by the local clock.
    tokio::time::timeout(lease * 2, held.lost())
        .await
        .unwrap_or_else(|_| panic!("{kind}: lost() after force_unlock"));
    assert!(held.is_lost());
    // The same owner takes it anew.
    let owned = lock.with_owner(held.owner());
    let again = owned.lock().await.unwrap();
    let stale = held.unlock().await;
    assert!(
        matches!(stale, Err(Error::NotHeld { .. })),
        "{kind}: a lost guard's unlock: {}",
        describe(&stale)
    );
    assert_eq!(
        owned.hold_count().await.unwrap(),
        1,
        "{kind}: the newer hold survives the stale unlock"
    );

    // Deleted underneath: the watchdog's renewal finds it gone.
    let _: i64 = raw.del(&lock.key()).await.unwrap();
    tokio::time::timeout(lease * 2, again.lost())
        .await
        .unwrap_or_else(|_| panic!("{kind}: lost() after the key was deleted"));
    assert!(matches!(again.unlock().await, Err(Error::NotHeld { .. })));
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// Invariant 9 (cancellation safety). Ten parked waiters aborted leave no subscription and
/// take nothing when the rival releases; acquires cancelled at random points (mid-flight
/// included) leave no hold; a dropped guard is released in the background.
pub async fn cancellation_leaves_nothing_behind<K: Family>() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let holder = client(&server).await;
    let waiters = client(&server).await;
    let kind = K::KIND;
    let lock = K::make(&waiters, NAME);
    let key = lock.key();

    let rival = K::rival(&holder, NAME).lock().await.unwrap();
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let lock = lock.clone();
            tokio::spawn(async move { lock.lock().await.map(|_| ()) })
        })
        .collect();
    assert!(
        eventually(Duration::from_secs(5), || async {
            !channels(&raw).await.is_empty()
        })
        .await,
        "{kind}: the waiters subscribe"
    );
    quiet_script_calls(&raw).await;
    for task in &tasks {
        task.abort();
    }
    for task in tasks {
        assert!(task.await.unwrap_err().is_cancelled());
    }
    assert!(
        eventually(Duration::from_secs(5), || async {
            channels(&raw).await.is_empty()
        })
        .await,
        "{kind}: a subscription was left behind: {:?}",
        channels(&raw).await
    );
    rival.unlock().await.unwrap();
    // Nothing may take it now; give a leaked waiter time to show itself.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !exists(&raw, &key).await,
        "{kind}: an aborted waiter took the lock"
    );

    for round in 0..20u64 {
        let tasks: Vec<_> = (0..8u64)
            .map(|i| {
                let lock = lock.clone();
                tokio::spawn(async move {
                    let cut = Duration::from_micros(20 + (round * 37 + i * 53) % 600);
                    let _ = tokio::time::timeout(cut, lock.lock()).await;
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    }
    assert!(
        eventually(Duration::from_secs(5), || async {
            !exists(&raw, &key).await
        })
        .await,
        "{kind}: a cancelled acquire left a hold behind"
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            channels(&raw).await.is_empty()
        })
        .await,
        "{kind}: a cancelled acquire left a subscription behind"
    );

    let held = lock.lock().await.unwrap();
    drop(held);
    assert!(
        eventually(Duration::from_secs(5), || async {
            !exists(&raw, &key).await
        })
        .await,
        "{kind}: a dropped guard is released in the background"
    );
    holder.shutdown().await.unwrap();
    waiters.shutdown().await.unwrap();
}

/// Shutdown releases what the client holds (re-entered holds included), its guards report
/// lost, and every later call is `Error::ShutDown`.
pub async fn shutdown_releases_and_refuses<K: Family>() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let a = client(&server).await;
    let kind = K::KIND;
    let lock = K::make(&a, NAME);
    let outer = lock.lock().await.unwrap();
    let inner = outer.reenter().await.unwrap();
    a.shutdown().await.unwrap();
    assert!(
        !exists(&raw, &lock.key()).await,
        "{kind}: shutdown releases"
    );
    assert!(
        outer.is_lost() && inner.is_lost(),
        "{kind}: guards are lost"
    );
    let after = lock.try_lock().await;
    assert!(
        matches!(after, Err(Error::ShutDown)),
        "{kind}: after shutdown: {}",
        describe(&after)
    );
    let made_after = K::make(&a, NAME).lock().await;
    assert!(matches!(made_after, Err(Error::ShutDown)));
    assert!(matches!(lock.is_locked().await, Err(Error::ShutDown)));
}

/// Invariant 10 (bad input). An empty name, a name over the limit, and leases under 1 ms or
/// over `MAX_LEASE` are `Error::InvalidArgument` from every method, before anything is sent;
/// a zero and an endless wait work.
pub async fn bad_input_is_refused_before_anything_is_sent<K: Family>() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let a = client(&server).await;
    let kind = K::KIND;
    let sent = |calls: std::collections::HashMap<String, u64>| -> u64 {
        calls
            .iter()
            .filter(|(name, _)| name.as_str() != "info")
            .map(|(_, n)| n)
            .sum()
    };
    let before = sent(command_calls(&raw).await);
    let long = "n".repeat(redbaton::MAX_NAME_LEN + 1);
    let second = Duration::from_secs(1);
    macro_rules! invalid {
        ($what:expr, $outcome:expr) => {{
            let outcome = $outcome;
            assert!(
                is_invalid(&outcome),
                "{kind}: {}: {}",
                $what,
                describe(&outcome)
            );
        }};
    }
    for name in ["", long.as_str()] {
        let lock = K::make(&a, name);
        let what = |method: &str| format!("{method} on a name of {} bytes", name.len());
        invalid!(what("lock"), lock.lock().await);
        invalid!(what("try_lock"), lock.try_lock().await);
        invalid!(what("try_lock_for"), lock.try_lock_for(second).await);
        invalid!(what("lock_with_lease"), lock.lock_with_lease(second).await);
        invalid!(
            what("try_lock_with_lease"),
            lock.try_lock_with_lease(second, second).await
        );
        invalid!(what("is_locked"), lock.is_locked().await);
        invalid!(what("hold_count"), lock.hold_count().await);
        invalid!(what("force_unlock"), lock.force_unlock().await);
    }
    let lock = K::make(&a, NAME);
    for lease in [
        Duration::ZERO,
        Duration::from_micros(999),
        redbaton::MAX_LEASE + Duration::from_millis(1),
        Duration::MAX,
    ] {
        invalid!(
            format!("lease {lease:?}"),
            lock.lock_with_lease(lease).await
        );
        invalid!(
            format!("lease {lease:?}"),
            lock.try_lock_with_lease(second, lease).await
        );
    }
    assert_eq!(
        sent(command_calls(&raw).await),
        before,
        "{kind}: bad input reached Redis"
    );
    // The extremes that are valid work.
    let held = lock
        .try_lock_for(Duration::ZERO)
        .await
        .unwrap()
        .expect("a zero wait is one attempt");
    let owned = lock.with_owner(held.owner());
    let again = owned
        .try_lock_for(Duration::MAX)
        .await
        .unwrap()
        .expect("an endless wait re-enters");
    let longest = owned.lock_with_lease(redbaton::MAX_LEASE).await.unwrap();
    let shortest = owned
        .lock_with_lease(Duration::from_millis(1))
        .await
        .unwrap();
    assert_eq!(owned.hold_count().await.unwrap(), 4);
    for held in [shortest, longest, again, held] {
        held.unlock().await.unwrap();
    }
    assert!(!lock.is_locked().await.unwrap());
    a.shutdown().await.unwrap();
}

/// Invariant 10 (a key of the wrong type). With a string, a list or a set (or a hash, for a
/// kind whose key is not a hash) at the lock's key, every acquire method, `hold_count` and
/// `force_unlock` return `Error::WrongType`, and Redis is exactly as it was: the key's value
/// and TTL unchanged, no other key created, no subscription left.
pub async fn wrong_type_keys_are_refused_and_untouched<K: Family>() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let a = client(&server).await;
    let kind = K::KIND;
    let lock = K::make(&a, NAME);
    let key = lock.key();
    let second = Duration::from_secs(1);
    let bounded = Duration::from_secs(5);
    macro_rules! wrong_type {
        ($what:expr, $outcome:expr) => {{
            let outcome = $outcome;
            assert!(
                is_wrong_type(&outcome),
                "{kind}: {}: {}",
                $what,
                describe(&outcome)
            );
        }};
    }
    for key_type in ["string", "list", "set", "hash"] {
        if key_type == K::KEY_TYPE {
            continue;
        }
        let _: () = raw.flushall(false).await.unwrap();
        match key_type {
            "string" => raw.set(&key, "user data", None, None, false).await.unwrap(),
            "list" => raw.rpush(&key, vec!["a", "b"]).await.unwrap(),
            "set" => raw.sadd(&key, "a").await.unwrap(),
            _ => raw.hset(&key, ("f", "v")).await.unwrap(),
        }
        let _: () = raw.pexpire(&key, 60_000, None).await.unwrap();
        let before = snapshot(&raw).await;
        let what = |method: &str| format!("{method} on a {key_type} key");
        let waited = |outcome: std::result::Result<Result<Held>, tokio::time::error::Elapsed>| {
            outcome.unwrap_or_else(|_| panic!("{kind}: waited on a {key_type}"))
        };
        wrong_type!(
            what("lock"),
            waited(tokio::time::timeout(bounded, lock.lock()).await)
        );
        wrong_type!(what("try_lock"), lock.try_lock().await);
        wrong_type!(what("try_lock_for"), lock.try_lock_for(second).await);
        wrong_type!(
            what("lock_with_lease"),
            waited(tokio::time::timeout(bounded, lock.lock_with_lease(second)).await)
        );
        wrong_type!(
            what("try_lock_with_lease"),
            lock.try_lock_with_lease(second, second).await
        );
        // Without an owner nothing is read: ask as one.
        let owned = lock.with_owner(format!("{}:1", a.id()).parse().unwrap());
        wrong_type!(what("hold_count"), owned.hold_count().await);
        wrong_type!(what("force_unlock"), lock.force_unlock().await);
        let after = snapshot(&raw).await;
        // The TTL ticks down between the snapshots: compare it coarsely.
        let coarse = |s: &[(String, Option<Vec<u8>>, i64)]| {
            s.iter()
                .map(|(k, v, t)| (k.clone(), v.clone(), *t > 50_000))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            coarse(&after),
            coarse(&before),
            "{kind}: a {key_type} key (and nothing else) is left exactly as it was"
        );
        assert!(
            eventually(Duration::from_secs(5), || async {
                channels(&raw).await.is_empty()
            })
            .await,
            "{kind}: no subscription left"
        );
    }
    a.shutdown().await.unwrap();
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
