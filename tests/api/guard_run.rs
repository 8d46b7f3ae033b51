//! `run` — the lock held around an async closure — against a real redis-server: the output
//! and the release, reentry inside, exclusion of others, the closure's future dropped when
//! the lease is lost, `Guard::run` on a guard acquired another way, and the multi-lock's.

use testkit as support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use redbaton::{Client, Error, MultiLock, RedLock};
use support::{eventually, RedisServer, RENEWED_LEASE};
use tokio::sync::oneshot;

async fn client(server: &RedisServer) -> Client {
    Client::connect(&server.url()).await.unwrap()
}

/// A client whose watchdog renews every 667 ms, so a lock taken from under it is noticed soon.
async fn short_lease_client(server: &RedisServer) -> Client {
    Client::builder()
        .url(server.url())
        .watchdog_lease(RENEWED_LEASE)
        .connect()
        .await
        .unwrap()
}

/// Sets its flag when dropped: proves a future (which owns it) was dropped.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// What a piece of endless work reports: that it started, that it was dropped, and that it
/// (wrongly) got past its wait.
struct Probe {
    started: oneshot::Receiver<()>,
    dropped: Arc<AtomicBool>,
    completed: Arc<AtomicBool>,
}

impl Probe {
    async fn started(&mut self) {
        (&mut self.started).await.expect("the closure started");
    }

    fn dropped(&self) -> bool {
        self.dropped.load(Ordering::SeqCst)
    }

    fn completed(&self) -> bool {
        self.completed.load(Ordering::SeqCst)
    }
}

/// A closure's future that says it started, then never completes unless dropped, and the
/// probe that watches it.
fn endless_work() -> (impl std::future::Future<Output = u32>, Probe) {
    let (started_tx, started) = oneshot::channel();
    let probe = Probe {
        started,
        dropped: Arc::new(AtomicBool::new(false)),
        completed: Arc::new(AtomicBool::new(false)),
    };
    let (dropped, completed) = (probe.dropped.clone(), probe.completed.clone());
    let work = async move {
        let _flag = DropFlag(dropped);
        let _ = started_tx.send(());
        std::future::pending::<()>().await;
        completed.store(true, Ordering::SeqCst);
        1
    };
    (work, probe)
}

#[tokio::test]
async fn run_returns_the_output_and_frees_the_lock() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let lock = client.lock("run:value");
    let inner = lock.clone();
    let out = lock
        .run(|| async move {
            assert_eq!(inner.hold_count().await.unwrap(), 1, "held while it runs");
            "done"
        })
        .await;
    assert_eq!(out, Ok("done"));
    assert!(
        !lock.is_locked().await.unwrap(),
        "released after the closure"
    );
    let raw = server.raw().await;
    let exists: i64 = raw.exists("run:value").await.unwrap();
    assert_eq!(exists, 0);

    // An acquire error is returned, and the closure is not called.
    let called = AtomicBool::new(false);
    let out = client
        .lock("")
        .run(|| async { called.store(true, Ordering::SeqCst) })
        .await;
    assert!(matches!(out, Err(Error::InvalidArgument(_))), "{out:?}");
    assert!(!called.load(Ordering::SeqCst));
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_closure_re_enters_the_lock_it_runs_under() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let lock = client.lock("run:reentry");
    let out = lock
        .run(|| async {
            let nested = lock.lock().await.unwrap();
            assert_eq!(lock.hold_count().await.unwrap(), 2);
            nested.unlock().await.unwrap();
            let deeper = lock
                .run(|| async { lock.hold_count().await.unwrap() })
                .await
                .unwrap();
            (deeper, lock.hold_count().await.unwrap())
        })
        .await
        .unwrap();
    assert_eq!(
        out,
        (2, 1),
        "a nested run re-enters, and gives its hold back"
    );
    assert!(!lock.is_locked().await.unwrap());
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn other_clients_are_excluded_while_the_closure_runs() {
    let server = RedisServer::start();
    let a = client(&server).await;
    let b = client(&server).await;
    let lock = a.lock("run:exclusion");
    let other = b.lock("run:exclusion");
    let inside = Arc::new(AtomicBool::new(false));
    let (go_tx, go) = oneshot::channel::<()>();

    let waiter = tokio::spawn({
        let other = other.clone();
        let inside = inside.clone();
        async move {
            // Started once the closure holds the lock.
            go.await.unwrap();
            let guard = other.lock().await.unwrap();
            let overlapped = inside.load(Ordering::SeqCst);
            guard.unlock().await.unwrap();
            overlapped
        }
    });

    let out = lock
        .run(|| async {
            inside.store(true, Ordering::SeqCst);
            assert!(
                other.try_lock().await.unwrap().is_none(),
                "another client is refused while the closure runs"
            );
            go_tx.send(()).unwrap();
            // Time for the waiter to park on the lock (it must still not get in).
            tokio::time::sleep(Duration::from_millis(300)).await;
            inside.store(false, Ordering::SeqCst);
            7
        })
        .await;
    assert_eq!(out, Ok(7));
    let overlapped = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter gets the lock once run released it")
        .unwrap();
    assert!(!overlapped, "the waiter got in while the closure ran");
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_force_unlock_cancels_the_closure_with_lease_lost() {
    let server = RedisServer::start();
    let a = short_lease_client(&server).await;
    let b = client(&server).await;
    let lock = a.lock("run:lost");
    let (work, mut probe) = endless_work();
    let running = tokio::spawn({
        let lock = lock.clone();
        async move { lock.run(|| work).await }
    });
    probe.started().await;
    assert!(!probe.dropped());
    assert!(b.lock("run:lost").force_unlock().await.unwrap());

    // Noticed at the next renewal (every third of the lease); generously bounded.
    let out = tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .expect("run returns once the lease is lost")
        .unwrap();
    assert_eq!(
        out,
        Err(Error::LeaseLost {
            name: "run:lost".into()
        })
    );
    assert!(probe.dropped(), "the closure's future was dropped");
    assert!(!probe.completed());
    // Nothing of the lost hold lingers: another client takes the lock at once.
    let g = b.lock("run:lost").try_lock().await.unwrap();
    g.expect("free after the lost run").unlock().await.unwrap();
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test]
async fn guard_run_on_a_guard_from_try_lock_for() {
    let server = RedisServer::start();
    let a = client(&server).await;
    let b = client(&server).await;
    let lock = a.lock("run:guard");
    let held = b.lock("run:guard").lock().await.unwrap();
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        held.unlock().await.unwrap();
    });
    let guard = lock
        .try_lock_for(Duration::from_secs(5))
        .await
        .unwrap()
        .expect("acquired once the other client released");
    release.await.unwrap();

    // The closure may borrow the guard.
    let out = guard
        .run(|| async { (guard.is_lost(), lock.hold_count().await.unwrap()) })
        .await;
    assert_eq!(out, Ok((false, 1)));
    assert!(!guard.is_lost());
    assert!(
        lock.with_owner(guard.owner())
            .is_held_in_scope()
            .await
            .unwrap(),
        "Guard::run leaves the guard held"
    );
    assert!(b.lock("run:guard").try_lock().await.unwrap().is_none());
    guard.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test]
async fn guard_run_stops_when_a_fixed_lease_runs_out() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let lock = client.lock("run:fixed");
    let guard = lock
        .try_lock_with_lease(Duration::from_secs(1), Duration::from_millis(300))
        .await
        .unwrap()
        .unwrap();
    let (work, probe) = endless_work();
    let out = tokio::time::timeout(Duration::from_secs(5), guard.run(|| work))
        .await
        .expect("run returns once the fixed lease ran out");
    assert!(matches!(out, Err(Error::LeaseLost { .. })), "{out:?}");
    assert!(probe.dropped(), "the closure's future was dropped");
    assert!(!probe.completed());
    assert!(guard.is_lost());

    // A guard already lost does not call the closure.
    let called = AtomicBool::new(false);
    let out = guard
        .run(|| async { called.store(true, Ordering::SeqCst) })
        .await;
    assert!(matches!(out, Err(Error::LeaseLost { .. })), "{out:?}");
    assert!(!called.load(Ordering::SeqCst));
    assert!(matches!(guard.unlock().await, Err(Error::NotHeld { .. })));
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn dropping_run_mid_work_releases_the_lock() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let lock = client.lock("run:cancelled");
    let (work, mut probe) = endless_work();
    let running = tokio::spawn({
        let lock = lock.clone();
        async move { lock.run(|| work).await }
    });
    probe.started().await;
    assert!(lock.is_locked().await.unwrap());
    running.abort();
    assert!(running.await.unwrap_err().is_cancelled());
    assert!(probe.dropped());
    assert!(
        eventually(Duration::from_secs(5), || async {
            !lock.is_locked().await.unwrap()
        })
        .await,
        "the dropped guard released the lock in the background"
    );
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_failed_release_after_the_work_keeps_the_output() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server).await;
    let lock = client.lock("run:release-fails");
    let out = lock
        .run(|| async {
            // The lock's key is replaced by a string: the release script meets WRONGTYPE.
            let _: () = raw
                .set("run:release-fails", "not a lock", None, None, false)
                .await
                .unwrap();
            "work done"
        })
        .await;
    assert_eq!(
        out,
        Ok("work done"),
        "the release error is logged, not returned"
    );
    let value: String = raw.get("run:release-fails").await.unwrap();
    assert_eq!(value, "not a lock", "nothing else was touched");
    let _: i64 = raw.del("run:release-fails").await.unwrap();
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn every_kind_runs_under_its_lock() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let fair = client.fair_lock("run:fair");
    assert_eq!(fair.run(|| async { 1 }).await, Ok(1));
    assert!(!client.lock("run:fair").is_locked().await.unwrap());
    let fenced = client.fenced_lock("run:fenced");
    assert_eq!(fenced.run(|| async { 2 }).await, Ok(2));
    assert!(!fenced.is_locked().await.unwrap());
    let rw = client.read_write_lock("run:rw");
    let out = rw
        .write()
        .run(|| async { rw.read().run(|| async { 3 }).await })
        .await;
    assert_eq!(out, Ok(Ok(3)), "the writer may read under its write lock");
    assert!(!client.lock("run:rw").is_locked().await.unwrap());
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn multi_lock_and_redlock_run() {
    let server = RedisServer::start();
    let a = short_lease_client(&server).await;
    let b = client(&server).await;
    let both = MultiLock::new(vec![a.lock("run:multi:1"), a.lock("run:multi:2")]);
    assert_eq!(both.run(|| async { "both" }).await, Ok("both"));
    for name in ["run:multi:1", "run:multi:2"] {
        assert!(!b.lock(name).is_locked().await.unwrap(), "{name} released");
    }
    let redlock = RedLock::new(vec![a.lock("run:red")]);
    assert_eq!(redlock.run(|| async { "red" }).await, Ok("red"));
    assert!(!b.lock("run:red").is_locked().await.unwrap());

    // One part taken away: the multi-lock's hold is lost, and its closure dropped.
    let (work, mut probe) = endless_work();
    let running = tokio::spawn(async move { both.run(|| work).await });
    probe.started().await;
    assert!(b.lock("run:multi:2").force_unlock().await.unwrap());
    let out = tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .expect("run returns once a part is lost")
        .unwrap();
    assert_eq!(
        out,
        Err(Error::LeaseLost {
            name: "run:multi:1,run:multi:2".into()
        })
    );
    assert!(probe.dropped());
    assert!(
        !b.lock("run:multi:1").is_locked().await.unwrap(),
        "the part still held was released before run returned"
    );
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}
