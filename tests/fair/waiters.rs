//! The queue: waiters that give up leave it at once; try_lock, a silent head, a cluster.

use super::*;
use support::monitor::ScriptRuns;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentry_renewal_and_force_unlock() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = Client::builder()
        .url(server.url())
        .watchdog_lease(RENEWED_LEASE)
        .connect()
        .await
        .unwrap();
    let lock = client.fair_lock("fair-reentry");
    let outer = lock.lock().await.unwrap();
    let inner = outer
        .run(|| async { lock.try_lock().await.unwrap().expect("re-enters in scope") })
        .await
        .unwrap();
    let owned = lock.with_owner(outer.owner());
    assert_eq!(owned.hold_count().await.unwrap(), 2);
    assert!(owned.is_held_in_scope().await.unwrap());
    assert!(queue(&raw, &lock).await.is_empty());
    inner.unlock().await.unwrap();
    assert_eq!(owned.hold_count().await.unwrap(), 1);

    // The watchdog renews a fair hold past two leases.
    tokio::time::sleep(RENEWED_LEASE * 2).await;
    assert!(!outer.is_lost());
    assert_eq!(owned.hold_count().await.unwrap(), 1);
    assert!(lock.remaining_ttl().await.unwrap().is_some());

    // force_unlock wakes the head on its channel.
    let (waiter, taker) = spawn_lock_taker(&lock).await;
    assert!(queue_becomes(&raw, &lock, &[&waiter]).await);
    let forced_at = Instant::now();
    assert!(lock.force_unlock().await.unwrap());
    let took = tokio::time::timeout(Duration::from_secs(10), taker)
        .await
        .unwrap()
        .unwrap();
    assert!(took.duration_since(forced_at) < PROMPT);
    assert!(eventually(Duration::from_secs(10), || async { outer.is_lost() }).await);
    assert!(matches!(outer.unlock().await, Err(Error::NotHeld { .. })));
    assert!(!lock.force_unlock().await.unwrap());
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_times_out_leaves_the_queue_and_the_next_is_served() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server).await;
    let lock = client.fair_lock("fair-timeout");
    let holder = lock.lock().await.unwrap();

    let (w1, timed_out) = spawn_as(&lock, |lock| async move {
        lock.try_lock_for(Duration::from_millis(1500))
            .await
            .unwrap()
    })
    .await;
    assert!(queue_becomes(&raw, &lock, &[&w1]).await);
    let (w2, taker) = spawn_lock_taker(&lock).await;
    assert!(queue_becomes(&raw, &lock, &[&w1, &w2]).await);
    let s2 = score(&raw, &lock, &w2).await.unwrap() as i64;

    let outcome = tokio::time::timeout(Duration::from_secs(10), timed_out)
        .await
        .unwrap()
        .unwrap();
    assert!(outcome.is_none(), "the wait ran out");
    // It left at once, and the one behind moved up by the wait it had queued with (1.5 s).
    assert!(queue_becomes(&raw, &lock, &[&w2]).await);
    assert_eq!(score(&raw, &lock, &w1).await, None);
    assert_eq!(score(&raw, &lock, &w2).await.unwrap() as i64, s2 - 1500);

    let released = Instant::now();
    holder.unlock().await.unwrap();
    let took = tokio::time::timeout(Duration::from_secs(10), taker)
        .await
        .expect("the next waiter is served, not left behind a gone head")
        .unwrap();
    assert!(took.duration_since(released) < PROMPT);
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_waiter_leaves_the_queue_at_once() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server).await;
    let lock = client.fair_lock("fair-cancel");
    let holder = lock.lock().await.unwrap();

    let (w1, cancelled) = spawn_lock_taker(&lock).await;
    assert!(queue_becomes(&raw, &lock, &[&w1]).await);
    let (w2, taker) = spawn_lock_taker(&lock).await;
    assert!(queue_becomes(&raw, &lock, &[&w1, &w2]).await);
    let s2 = score(&raw, &lock, &w2).await.unwrap() as i64;

    // Dropping the waiting future (here: aborting its task) gives up its place.
    cancelled.abort();
    assert!(cancelled.await.unwrap_err().is_cancelled());
    assert!(queue_becomes(&raw, &lock, &[&w2]).await);
    assert_eq!(score(&raw, &lock, &w1).await, None);
    assert_eq!(
        score(&raw, &lock, &w2).await.unwrap() as i64,
        s2 - 300_000,
        "moved up by the wait the cancelled one had queued with"
    );

    // A waiter dropped by a timeout around it leaves too.
    let (w3, wrapped) = spawn_as(&lock, |lock| async move {
        tokio::time::timeout(Duration::from_millis(800), lock.lock())
            .await
            .is_err()
    })
    .await;
    assert!(wrapped.await.unwrap(), "the outer timeout fired");
    assert!(queue_becomes(&raw, &lock, &[&w2]).await, "{w3} left");

    let released = Instant::now();
    holder.unlock().await.unwrap();
    let took = tokio::time::timeout(Duration::from_secs(10), taker)
        .await
        .expect("the next waiter is served")
        .unwrap();
    assert!(took.duration_since(released) < PROMPT);
    client.shutdown().await.unwrap();
}

/// Waits until `n` scripts more than `base` ran: with the holder a peer (no renewals of
/// ours), each waiter has made its two attempts (queue, then re-check once subscribed) and
/// is parked until a message or the holder's PTTL. Scripts run, not calls: one waiter's
/// re-check and the next one's first attempt may travel together in one call. (The peer's
/// EVALs count too; none runs between a test's base and its wait.)
async fn parked(runs: &ScriptRuns, base: u64, n: u64) -> bool {
    eventually(Duration::from_secs(10), || async {
        runs.count().await >= base + n
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_ended_by_an_error_leaves_the_queue() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let runs = ScriptRuns::start(&server, &raw).await;
    let client = client(&server).await;
    let lock = client.fair_lock("fair-error");
    let holder = FairPeer::new(&server.url(), "fair-error").await;
    assert_eq!(holder.try_lock(1, 60_000, 300_000).await, None);
    let base = runs.count().await;
    let (w1, failing) = spawn_as(&lock, |lock| async move { lock.lock().await.map(drop) }).await;
    assert!(queue_becomes(&raw, &lock, &[&w1]).await);
    let (w2, w2_task) = spawn_lock_taker(&lock).await;
    assert!(queue_becomes(&raw, &lock, &[&w1, &w2]).await);
    assert!(parked(&runs, base, 4).await);

    // The key loses its expiry (no longer a lock), and w1 is woken to look.
    let _: bool = raw.persist("fair-error").await.unwrap();
    let _: i64 = raw
        .publish(format!("redisson_lock__channel:{{fair-error}}:{w1}"), "0")
        .await
        .unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(10), failing)
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(outcome, Err(Error::WrongType { .. })),
        "{outcome:?}"
    );
    assert!(
        queue_becomes(&raw, &lock, &[&w2]).await,
        "the failed waiter left"
    );
    w2_task.abort();
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_that_gives_up_on_a_free_lock_wakes_the_next() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let runs = ScriptRuns::start(&server, &raw).await;
    let client = client(&server).await;
    let lock = client.fair_lock("fair-free-head");
    let holder = FairPeer::new(&server.url(), "fair-free-head").await;
    assert_eq!(holder.try_lock(1, 60_000, 300_000).await, None);
    let base = runs.count().await;
    let (w1, head) = spawn_lock_taker(&lock).await;
    assert!(queue_becomes(&raw, &lock, &[&w1]).await);
    let (w2, taker) = spawn_lock_taker(&lock).await;
    assert!(queue_becomes(&raw, &lock, &[&w1, &w2]).await);
    assert!(parked(&runs, base, 4).await);

    // The lock goes away without a message: w1 is next, but parked on the holder's lease.
    let _: i64 = raw.del("fair-free-head").await.unwrap();
    head.abort();
    let gave_up = Instant::now();
    // Leaving, it wakes w2, now next for a free lock; nothing else would before w2's park ends.
    let took = tokio::time::timeout(Duration::from_secs(10), taker)
        .await
        .expect("the new head is woken")
        .unwrap();
    assert!(took.duration_since(gave_up) < PROMPT);
    assert!(
        queue(&raw, &lock).await.is_empty(),
        "{w1} and {w2} both left"
    );
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_never_queues_nor_jumps_the_queue() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let runs = ScriptRuns::start(&server, &raw).await;
    let client = client(&server).await;
    let lock = client.fair_lock("fair-try");
    let holder = FairPeer::new(&server.url(), "fair-try").await;
    assert_eq!(holder.try_lock(1, 60_000, 300_000).await, None);
    let base = runs.count().await;
    let (w1, head) = spawn_lock_taker(&lock).await;
    assert!(queue_becomes(&raw, &lock, &[&w1]).await);
    assert!(parked(&runs, base, 2).await);
    let (_, tried) = spawn_as(&lock, |lock| async move { lock.try_lock().await.unwrap() }).await;
    assert!(tried.await.unwrap().is_none());
    assert_eq!(
        queue(&raw, &lock).await,
        std::slice::from_ref(&w1),
        "a single try never queues"
    );

    // Free, but w1 is next (parked: the key was deleted without a message): refused.
    let _: i64 = raw.del("fair-try").await.unwrap();
    let (_, tried) = spawn_as(&lock, |lock| async move { lock.try_lock().await.unwrap() }).await;
    assert!(tried.await.unwrap().is_none(), "no jumping ahead of {w1}");
    assert_eq!(queue(&raw, &lock).await, [w1]);
    let exists: i64 = raw.exists("fair-try").await.unwrap();
    assert_eq!(exists, 0);
    head.abort();
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_behind_a_silent_head_parks_instead_of_spinning() {
    // Redisson's script answers a queued waiter 0 while the lock is free for someone else;
    // ours must park instead (until the head's timeout, at most one watchdog lease).
    let server = RedisServer::start();
    let raw = server.raw().await;
    let runs = ScriptRuns::start(&server, &raw).await;
    let client = Client::builder()
        .url(server.url())
        .watchdog_lease(Duration::from_secs(3))
        .connect()
        .await
        .unwrap();
    let lock = client.fair_lock("silent-head");
    // A peer thread holds (3 s lease), another peer thread queues first and stays silent.
    let peer = FairPeer::new(&server.url(), "silent-head").await;
    assert_eq!(peer.try_lock(9, 3_000, 300_000).await, None);
    assert!(peer.try_lock(1, 3_000, 300_000).await.is_some());
    let base = runs.count().await;
    let (ours, taker) = spawn_lock_taker(&lock).await;
    assert!(queue_becomes(&raw, &lock, &[&peer.lock_name(1), &ours]).await);
    assert!(parked(&runs, base, 2).await);

    // Released: the silent head is woken but never comes; the lock stays free with it as
    // head. Ours tries again once its park (the holder's PTTL, under 3 s) ends, and parks.
    assert_eq!(peer.unlock(9).await, Some(1));
    let released = runs.count().await;
    assert!(parked(&runs, released, 1).await, "ours tries again");
    let before = runs.count().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = runs.count().await;
    assert!(
        after - before <= 5,
        "{} scripts in 2 s: the waiter spins",
        after - before
    );
    assert!(!taker.is_finished());

    // The peer gives up the Redisson way (no message): ours is next for a free lock and,
    // unwoken, still tries within a watchdog lease (3 s here), not at the peer's timeout
    // (5 minutes away).
    let gave_up = Instant::now();
    peer.acquire_failed(1, 300_000).await;
    let took = tokio::time::timeout(Duration::from_secs(15), taker)
        .await
        .expect("served within a watchdog lease")
        .unwrap();
    assert!(took.duration_since(gave_up) < Duration::from_secs(8));
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_hand_offs_follow_the_queue_in_both_pubsub_modes() {
    let cluster = support::cluster::RedisCluster::start(3, 0);
    for mode in support::pubsub_modes() {
        let client = Client::builder()
            .url(cluster.url())
            .pubsub(mode)
            .connect()
            .await
            .unwrap();
        for name in [format!("fair-{mode:?}"), format!("{{tag}}:fair-{mode:?}")] {
            let lock = client.fair_lock(&name);
            let holder = lock.lock().await.unwrap();
            let order = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
            let mut tasks = Vec::new();
            for i in 1..=4 {
                let order = order.clone();
                let (_, task) = spawn_as(&lock, move |lock| async move {
                    let guard = lock.lock().await.unwrap();
                    order.lock().push(guard.owner().to_string());
                    guard.unlock().await.unwrap();
                })
                .await;
                tasks.push(task);
                assert!(
                    eventually(Duration::from_secs(10), || async {
                        lock.queued().await.unwrap().len() == i
                    })
                    .await
                );
            }
            let queued = lock.queued().await.unwrap();
            let released = Instant::now();
            holder.unlock().await.unwrap();
            for task in tasks {
                tokio::time::timeout(Duration::from_secs(20), task)
                    .await
                    .unwrap()
                    .unwrap();
            }
            // One lost hand-off would cost a 30 s lease.
            assert!(
                released.elapsed() < Duration::from_secs(8),
                "{mode:?} {name}"
            );
            assert_eq!(
                *order.lock(),
                queued,
                "{mode:?} {name}: served in queue order"
            );
            assert!(lock.queued().await.unwrap().is_empty());
        }
        client.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_takes_its_waiters_out_of_the_queue() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let holder_client = client(&server).await;
    let lock = holder_client.fair_lock("fair-shutdown");
    let holder = lock.lock().await.unwrap();
    let client = client(&server).await;
    let fair = client.fair_lock("fair-shutdown");
    let (w1, first) = spawn_as(&fair, |lock| async move { lock.lock().await.map(drop) }).await;
    assert!(queue_becomes(&raw, &lock, &[&w1]).await);
    let (w2, second) = spawn_as(&fair, |lock| async move { lock.lock().await.map(drop) }).await;
    assert!(queue_becomes(&raw, &lock, &[&w1, &w2]).await);

    // A graceful shutdown (a service restarting) must not leave its places in the queue for
    // the others to wait out (5 minutes each by default).
    client.shutdown().await.unwrap();
    assert!(
        queue(&raw, &lock).await.is_empty(),
        "left before shutdown returned"
    );
    for waiter in [first, second] {
        assert!(matches!(waiter.await.unwrap(), Err(Error::ShutDown)));
    }
    holder.unlock().await.unwrap();
    holder_client.shutdown().await.unwrap();
}

#[test]
fn fair_types_move_between_tasks() {
    fn send_sync_static<T: Send + Sync + 'static>() {}
    send_sync_static::<redbaton::FairLock>();
    send_sync_static::<redbaton::FairGuard>();
}
