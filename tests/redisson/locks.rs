//! What every exclusive lock kind shares with its Redisson counterpart (`Lock` and `RLock`,
//! `FairLock` and `RFairLock`, `FencedLock` and `RFencedLock`, `WriteLock` and the write half
//! of `RReadWriteLock`), both ways: exclusion and wake-ups, re-entry and inspection, a
//! force-unlock, an unlock by the wrong side, both watchdogs at once. Each scenario is written
//! once over [`Peer`] and run for every kind on a single node here, and on a cluster by
//! `cluster.rs`.

use std::time::Instant;

use redbaton::{Error, Owner};

use super::*;
use crate::family::{Family, Held};
use crate::peer::{JavaLock, Reply};
use crate::support::RENEWED_LEASE;

/// A redbaton lock kind with its Redisson counterpart.
pub trait Peer: Family {
    /// The driver's name of the Redisson kind.
    const JAVA: &'static str;
    /// What the kind appends to an owner's hash field (the write lock's `:write`).
    const SUFFIX: &'static str = "";
}

impl Peer for redbaton::Lock {
    const JAVA: &'static str = "lock";
}

impl Peer for redbaton::FencedLock {
    const JAVA: &'static str = "fenced";
}

impl Peer for redbaton::FairLock {
    const JAVA: &'static str = "fair";
}

impl Peer for redbaton::WriteLock {
    const JAVA: &'static str = "write";
    const SUFFIX: &'static str = ":write";
}

/// A redbaton waiter (`lock()`) on `lock`, parked where nobody listened before: resolves to
/// when it acquired (ms) and its hold.
pub async fn rust_waiter<K: Family>(env: &Env, lock: &K) -> tokio::task::JoinHandle<(f64, Held)> {
    let waiting = lock.clone();
    parked_task(env, &lock.channel(), async move {
        waiting.lock().await.unwrap()
    })
    .await
}

/// A Java waiter (`lock()`) on `lock`, parked on a channel under `channel` where nobody
/// listened before.
pub async fn java_waiter(
    env: &Env,
    lock: &JavaLock,
    channel: &str,
) -> tokio::task::JoinHandle<Reply> {
    parked_java(env, channel, || lock.spawn_lock(None)).await
}

/// Each side keeps the other out, and each side's release wakes the other's parked waiter by
/// its message, well before the 30 s lease could have.
pub async fn exclusion_and_wake_ups<K: Peer>(env: &Env, name: &str) {
    let kind = K::KIND;
    let rust = env.rust().await;
    let java = env.java().await;
    let lock = K::make(&rust, name);
    let channel = lock.channel();
    let (j1, j2) = (java.lock(1, K::JAVA, name), java.lock(2, K::JAVA, name));

    // Redisson holds: redbaton is kept out, then woken by Redisson's unlock.
    j1.lock(None).await;
    assert!(
        lock.try_lock().await.unwrap().is_none(),
        "{kind} {name:?}: Redisson holds it"
    );
    let wait = Duration::from_millis(300);
    assert!(lock.try_lock_for(wait).await.unwrap().is_none(), "{kind}");
    let waiter = rust_waiter(env, &lock).await;
    assert!(!waiter.is_finished(), "{kind}: redbaton waited while held");
    let released = j1.unlock().await.unwrap().t0;
    let (acquired, held) = within(&format!("{kind}: redbaton waiter"), WOKEN_WITHIN, waiter).await;
    let to_rust = acquired - released;

    // redbaton holds: Redisson is kept out, then woken by redbaton's unlock.
    assert!(
        !j2.try_lock(Some(Duration::ZERO), None).await,
        "{kind}: redbaton holds it"
    );
    assert!(!j2.try_lock(Some(wait), None).await, "{kind}");
    let waiter = java_waiter(env, &j2, &channel).await;
    assert!(!waiter.is_finished(), "{kind}: Redisson waited while held");
    let released = now_ms();
    held.unlock().await.unwrap();
    let to_java =
        java_acquired(&format!("{kind}: Redisson waiter"), WOKEN_WITHIN, waiter).await - released;
    j2.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap(), "{kind}: free at the end");
    report(&format!(
        "{kind} {name:?} ({:?}): woken by the message, Redisson -> redbaton {to_rust:.1} ms, \
         redbaton -> Redisson {to_java:.1} ms",
        env.mode
    ));
    rust.shutdown().await.unwrap();
}

/// Both sides read `name`'s remaining lease alike: between `lease` less a few seconds and
/// `most`.
async fn ttl_agree(
    kind: &str,
    plain: &redbaton::Lock,
    java: &JavaLock,
    lease: Duration,
    most: Duration,
) {
    let rust = plain
        .remaining_ttl()
        .await
        .unwrap()
        .expect("held")
        .as_millis() as i64;
    let java = java.ttl().await;
    let (lease, most) = (lease.as_millis() as i64, most.as_millis() as i64);
    for ttl in [rust, java] {
        assert!(
            ttl > lease - 5000 && ttl <= most,
            "{kind}: remaining lease {ttl} ms, expected {lease} (redbaton {rust}, Redisson {java})"
        );
    }
    assert!(
        (rust - java).abs() < 3000,
        "{kind}: redbaton {rust} ms, Redisson {java} ms"
    );
}

/// Re-entry counts, hold counts, `isLocked` and `remainTimeToLive` read the same from both
/// sides; an unlock by an owner that does not hold it fails on its side and changes nothing.
pub async fn reentry_and_inspection<K: Peer>(env: &Env, name: &str) {
    let kind = K::KIND;
    let rust = env.rust().await;
    let java = env.java().await;
    let lock = K::make(&rust, name);
    // The same hash as a plain lock: `remaining_ttl` of any kind's key.
    let plain = rust.lock(name);
    let key = lock.key();
    let (j1, j2) = (java.lock(1, K::JAVA, name), java.lock(2, K::JAVA, name));
    let count = |fields: std::collections::HashMap<String, String>, field: &str| {
        fields.get(field).and_then(|c| c.parse::<i64>().ok())
    };

    // Redisson holds it twice.
    j1.lock(None).await;
    j1.lock(None).await;
    let owner: Owner = java
        .owner(1)
        .await
        .parse()
        .expect("Redisson's field is <uuid>:<tid>");
    let field = format!("{owner}{}", K::SUFFIX);
    assert_eq!(count(env.fields(&key).await, &field), Some(2), "{kind}");
    assert_eq!(j1.hold_count().await, 2, "{kind}");
    let state = plain.state().await.unwrap();
    let holds: Vec<_> = state
        .owners
        .iter()
        .map(|h| (h.owner.as_str(), h.count))
        .collect();
    assert_eq!(
        holds,
        [(owner.to_string().as_str(), 2)],
        "{kind}: the state lists Redisson's hold"
    );
    let as_java = lock.with_owner(owner.clone());
    assert_eq!(
        as_java.hold_count().await.unwrap(),
        2,
        "{kind}: redbaton reads Redisson's count"
    );
    assert_eq!(
        j2.hold_count().await,
        0,
        "{kind}: another thread holds nothing"
    );
    assert_eq!(
        lock.hold_count().await.unwrap(),
        0,
        "{kind}: outside every scope"
    );
    assert!(j1.is_held().await && !j2.is_held().await, "{kind}");
    assert!(
        lock.is_locked().await.unwrap() && j2.is_locked().await,
        "{kind}"
    );
    // Redisson's write re-entry adds its lease to the expiry left; the others set it.
    let reentered = if K::SUFFIX.is_empty() {
        LEASE
    } else {
        LEASE * 2
    };
    ttl_agree(kind, &plain, &j2, LEASE, reentered).await;
    let wrong = j2.unlock().await.unwrap_err();
    assert_eq!(
        wrong.class, "IllegalMonitorStateException",
        "{kind}: {wrong:?}"
    );
    assert_eq!(
        j1.hold_count().await,
        2,
        "{kind}: the wrong thread's unlock changed nothing"
    );
    j1.unlock().await.unwrap();
    assert_eq!(as_java.hold_count().await.unwrap(), 1, "{kind}");
    assert!(
        lock.try_lock().await.unwrap().is_none(),
        "{kind}: still held once"
    );
    j1.unlock().await.unwrap();
    assert!(
        !lock.is_locked().await.unwrap() && !j2.is_locked().await,
        "{kind}: free"
    );
    assert_eq!(j2.ttl().await, -2, "{kind}");
    assert_eq!(plain.remaining_ttl().await.unwrap(), None, "{kind}");

    // redbaton holds it twice.
    let outer = lock.lock().await.unwrap();
    let inner = outer.reenter().await.unwrap();
    let owner = outer.owner();
    let field = format!("{owner}{}", K::SUFFIX);
    assert_eq!(count(env.fields(&key).await, &field), Some(2), "{kind}");
    assert_eq!(
        lock.with_owner(owner.clone()).hold_count().await.unwrap(),
        2,
        "{kind}"
    );
    assert_eq!(j1.hold_count().await, 0, "{kind}: Redisson holds nothing");
    assert!(!j1.is_held().await && j1.is_locked().await, "{kind}");
    ttl_agree(kind, &plain, &j1, LEASE, LEASE).await;
    assert!(!j1.try_lock(Some(Duration::ZERO), None).await, "{kind}");
    let wrong = j1.unlock().await.unwrap_err();
    assert_eq!(
        wrong.class, "IllegalMonitorStateException",
        "{kind}: {wrong:?}"
    );
    assert_eq!(
        count(env.fields(&key).await, &field),
        Some(2),
        "{kind}: untouched"
    );
    inner.unlock().await.unwrap();
    assert_eq!(count(env.fields(&key).await, &field), Some(1), "{kind}");
    assert!(
        !j1.try_lock(Some(Duration::ZERO), None).await,
        "{kind}: still held once"
    );
    outer.unlock().await.unwrap();
    assert!(
        !j1.is_locked().await && !lock.is_locked().await.unwrap(),
        "{kind}: free"
    );

    // A fixed lease reads the same from both sides.
    let lease = Duration::from_secs(10);
    j1.lock(Some(lease)).await;
    ttl_agree(kind, &plain, &j2, lease, lease).await;
    j1.unlock().await.unwrap();
    let held = lock.lock_with_lease(lease).await.unwrap();
    ttl_agree(kind, &plain, &j1, lease, lease).await;
    held.unlock().await.unwrap();
    rust.shutdown().await.unwrap();
}

/// A force-unlock from either side ends the other side's hold (whose own unlock then fails
/// on its side: `NotHeld`, `IllegalMonitorStateException`) and wakes the other side's waiter
/// long before the holder's 60 s lease would.
pub async fn force_unlock_from_either_side<K: Peer>(env: &Env, name: &str) {
    let kind = K::KIND;
    let lease = Duration::from_secs(60);
    let holder = env.rust().await;
    let waiting = env.rust().await;
    let java = env.java().await;
    let channel = K::make(&holder, name).channel();

    // Redisson forces: redbaton's holder is out, redbaton's waiter wakes.
    let held = K::make(&holder, name).lock_with_lease(lease).await.unwrap();
    let waiter = rust_waiter(env, &K::make(&waiting, name)).await;
    assert!(
        java.lock(9, K::JAVA, name).force_unlock().await,
        "{kind}: it was held"
    );
    let (_, taken) = within(&format!("{kind}: redbaton waiter"), WOKEN_WITHIN, waiter).await;
    let outcome = held.unlock().await;
    assert!(
        matches!(outcome, Err(Error::NotHeld { .. })),
        "{kind}: {outcome:?}"
    );
    let fields = env.fields(&K::make(&holder, name).key()).await;
    assert!(
        fields.contains_key(&format!("{}{}", taken.owner(), K::SUFFIX)),
        "{kind}: the forced-out guard's unlock left the new hold alone: {fields:?}"
    );
    taken.unlock().await.unwrap();

    // redbaton forces: Redisson's holder is out, Redisson's waiter wakes.
    let (j1, j2) = (java.lock(1, K::JAVA, name), java.lock(2, K::JAVA, name));
    j1.lock(Some(lease)).await;
    let waiter = java_waiter(env, &j2, &channel).await;
    assert!(
        K::make(&holder, name).force_unlock().await.unwrap(),
        "{kind}: it was held"
    );
    java_acquired(&format!("{kind}: Redisson waiter"), WOKEN_WITHIN, waiter).await;
    let wrong = j1.unlock().await.unwrap_err();
    assert_eq!(
        wrong.class, "IllegalMonitorStateException",
        "{kind}: {wrong:?}"
    );
    assert!(
        j2.is_held().await,
        "{kind}: the forced-out thread's unlock left the new hold alone"
    );
    j2.unlock().await.unwrap();
    holder.shutdown().await.unwrap();
    waiting.shutdown().await.unwrap();
}

/// Both watchdogs at once, with a 2 s lease on both sides: Redisson holds `names.0` and
/// redbaton `names.1`, each renewed by its own watchdog for three leases while the other side
/// waits on it, and neither disturbs the other; then each release wakes the other's waiter.
pub async fn watchdogs_renew_their_own<K: Peer>(env: &Env, names: (&str, &str)) {
    let kind = K::KIND;
    let rust = env.rust_with(RENEWED_LEASE).await;
    let java = env.java_with(RENEWED_LEASE).await;
    let (java_held, rust_held) = (K::make(&rust, names.0), K::make(&rust, names.1));
    let j1 = java.lock(1, K::JAVA, names.0);
    j1.lock(None).await;
    let java_field = format!("{}{}", java.owner(1).await, K::SUFFIX);
    let mine = rust_held.lock().await.unwrap();
    let rust_field = format!("{}{}", mine.owner(), K::SUFFIX);
    let rust_waiting = rust_waiter(env, &java_held).await;
    let j2 = java.lock(2, K::JAVA, names.1);
    let java_waiting = java_waiter(env, &j2, &rust_held.channel()).await;

    let until = Instant::now() + RENEWED_LEASE * 3;
    while Instant::now() < until {
        for (key, field) in [
            (java_held.key(), &java_field),
            (rust_held.key(), &rust_field),
        ] {
            let pttl: i64 = env.raw.pttl(&key).await.unwrap();
            let fields = env.fields(&key).await;
            assert!(
                pttl > 0 && fields.get(field).map(String::as_str) == Some("1"),
                "{kind}: {key:?} lost {field}: PTTL {pttl}, {fields:?}"
            );
        }
        assert!(
            !rust_waiting.is_finished() && !java_waiting.is_finished(),
            "{kind}: got in"
        );
        assert!(!mine.is_lost(), "{kind}: redbaton's hold was lost");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        j1.is_held().await,
        "{kind}: Redisson's hold outlived three leases"
    );

    // The short lease bounds every park, so these wake-ups prove nothing about messages;
    // they show each side sees the other's release.
    let bound = RENEWED_LEASE * 2;
    j1.unlock().await.unwrap();
    let (_, taken) = within(&format!("{kind}: redbaton waiter"), bound, rust_waiting).await;
    mine.unlock().await.unwrap();
    java_acquired(&format!("{kind}: Redisson waiter"), bound, java_waiting).await;
    taken.unlock().await.unwrap();
    j2.unlock().await.unwrap();
    rust.shutdown().await.unwrap();
}

/// The scenarios above as tests of one kind on a single node.
macro_rules! lock_kind {
    ($module:ident, $kind:ty) => {
        mod $module {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn core_exclusion_and_wake_ups() {
                super::exclusion_and_wake_ups::<$kind>(&Env::single().await, "orders:42").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn core_reentry_and_inspection() {
                super::reentry_and_inspection::<$kind>(&Env::single().await, "{orders}:42").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn force_unlock_from_either_side() {
                super::force_unlock_from_either_side::<$kind>(&Env::single().await, "stuck:7")
                    .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn watchdogs_renew_their_own() {
                let env = Env::single().await;
                super::watchdogs_renew_their_own::<$kind>(&env, ("renewed:java", "renewed:rust"))
                    .await;
            }
        }
    };
}

lock_kind!(lock, redbaton::Lock);
lock_kind!(fair_lock, redbaton::FairLock);
lock_kind!(fenced_lock, redbaton::FencedLock);
lock_kind!(write_lock, redbaton::WriteLock);
