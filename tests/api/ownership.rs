//! Ownership by a hold's scope (invariant 14, docs/DESIGN.md): what the family suite's
//! `one_holder_per_scope` and `reentry` do not cover — the warning for an un-scoped nested
//! acquire, a try that cannot deadlock, fair waiters joined in one task, multi-locks.

use testkit as support;
use testkit::captured;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use captured::Captured;
use fred::prelude::*;
use parking_lot::Mutex;
use redbaton::{Client, MultiLock};
use support::{eventually, RedisServer};

async fn client(server: &RedisServer) -> Client {
    Client::connect(&server.url()).await.unwrap()
}

/// Straight-line code that locks again beside a held guard is another owner: `try_lock`
/// refuses, and `lock()` waits — with a warning that names the fix, since that wait cannot
/// end while the first guard is kept.
#[tokio::test]
async fn a_second_lock_beside_a_held_guard_is_refused_and_warned_about() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let lock = client.lock("beside");
    // This test's runtime is current-thread: every poll runs on this thread, under it.
    let (captured, _default) = Captured::warnings();

    let guard = lock.lock().await.unwrap();
    assert!(lock.try_lock().await.unwrap().is_none(), "a try is refused");
    assert!(
        !captured.text().contains("reenter"),
        "a try is not warned about"
    );
    let waited = tokio::time::timeout(Duration::from_millis(500), lock.lock()).await;
    assert!(waited.is_err(), "a second owner waits for the first");
    let log = captured.text();
    assert!(
        log.contains("WARN") && log.contains("guard.reenter()") && log.contains("beside"),
        "the wait is warned about, naming the fix: {log:?}"
    );
    assert_eq!(log.matches("WARN").count(), 1, "once per wait: {log:?}");
    // In a task that holds nothing, a wait is no mistake: no warning.
    let other = lock.clone();
    let elsewhere = tokio::spawn(async move {
        tokio::time::timeout(Duration::from_millis(300), other.lock())
            .await
            .is_err()
    });
    assert!(elsewhere.await.unwrap());
    assert_eq!(captured.text().matches("WARN").count(), 1);
    guard.unlock().await.unwrap();
    client.shutdown().await.unwrap();
}

/// A write try in the task that just dropped a read guard (its release still under way in
/// the background) is a new owner: it gets the lock or `None`, never `WouldDeadlock`. With
/// the task as owner, 164 of 200 tries failed so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_try_after_a_dropped_read_guard_is_never_a_deadlock() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let rw = client.read_write_lock("drop-then-write");
    let (mut got, mut busy) = (0, 0);
    for _ in 0..200 {
        drop(rw.read().lock().await.unwrap());
        match rw.write().try_lock().await {
            Ok(Some(guard)) => {
                got += 1;
                guard.unlock().await.unwrap();
            }
            Ok(None) => busy += 1,
            Err(e) => panic!("a write try after a dropped read guard failed: {e}"),
        }
    }
    assert_eq!(got + busy, 200);
    // A waiting write inside the read hold's scope would wait on itself: refused at once.
    let read = rw.read().lock().await.unwrap();
    let waited = read
        .run(|| async { rw.write().try_lock_for(Duration::from_secs(30)).await })
        .await
        .unwrap();
    assert!(
        matches!(waited, Err(redbaton::Error::WouldDeadlock { .. })),
        "{waited:?}"
    );
    read.unlock().await.unwrap();
    client.shutdown().await.unwrap();
}

/// Two fair-lock waiters joined in one task are two owners: two queue entries, served in
/// turn, never holding at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_joined_fair_waiters_are_two_queue_entries_served_in_turn() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let holder_client = client(&server).await;
    let client = client(&server).await;
    let name = "fair-joined";
    let holder = holder_client.fair_lock(name).lock().await.unwrap();
    let lock = client.fair_lock(name);
    let queue_key = lock.queue_key().to_owned();
    let inside = AtomicUsize::new(0);
    let served = Mutex::new(Vec::new());
    let waiter = |who: &'static str| {
        let (lock, inside, served) = (&lock, &inside, &served);
        async move {
            let guard = lock.lock().await.unwrap();
            assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
            served.lock().push((who, guard.owner()));
            tokio::time::sleep(Duration::from_millis(50)).await;
            inside.fetch_sub(1, Ordering::SeqCst);
            guard.unlock().await.unwrap();
        }
    };
    let release = async {
        let queued = eventually(Duration::from_secs(10), || async {
            let queue: Vec<String> = raw.lrange(&queue_key, 0, -1).await.unwrap();
            queue.len() == 2
        })
        .await;
        assert!(queued, "each joined waiter has its own queue entry");
        let queue: Vec<String> = raw.lrange(&queue_key, 0, -1).await.unwrap();
        assert_ne!(queue[0], queue[1]);
        holder.unlock().await.unwrap();
        queue
    };
    let (queue, (), ()) = tokio::join!(release, waiter("a"), waiter("b"));
    let served = served.into_inner();
    assert_eq!(served.len(), 2);
    let order: Vec<String> = served.iter().map(|(_, o)| o.to_string()).collect();
    assert_eq!(order, queue, "served in the queue's order");
    holder_client.shutdown().await.unwrap();
    client.shutdown().await.unwrap();
}

/// A multi-lock: joined sections never hold it at once; inside its guard's `run` (or with
/// `reenter`) its parts re-enter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_lock_sections_joined_in_one_task_exclude_and_nest_by_scope() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let multi = MultiLock::new(vec![client.lock("m:1"), client.lock("m:2")]);
    let inside = AtomicUsize::new(0);
    let section = || async {
        let guard = multi.lock().await.unwrap();
        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
        tokio::time::sleep(Duration::from_millis(30)).await;
        inside.fetch_sub(1, Ordering::SeqCst);
        guard.unlock().await.unwrap();
    };
    tokio::join!(section(), section(), section());

    let outer = multi.lock().await.unwrap();
    assert!(multi.try_lock().await.unwrap().is_none(), "another owner");
    let nested = outer.run(|| multi.try_lock()).await.unwrap().unwrap();
    let nested = nested.expect("re-enters in scope");
    let again = outer.reenter().await.unwrap();
    for part in ["m:1", "m:2"] {
        let owner = outer.guards().iter().find(|g| g.lock().name() == part);
        let owned = client.lock(part).with_owner(owner.unwrap().owner());
        assert_eq!(owned.hold_count().await.unwrap(), 3, "{part}");
    }
    again.unlock().await.unwrap();
    nested.unlock().await.unwrap();
    outer.unlock().await.unwrap();
    assert!(!client.lock("m:1").is_locked().await.unwrap());
    client.shutdown().await.unwrap();
}
