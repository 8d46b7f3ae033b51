//! The fair lock (Redisson's `RFairLock`) against real redis-server processes: FIFO order
//! across processes, waiters that give up (timeout, cancellation, error) leaving the queue at
//! once, a crashed waiter purged after its wait, interplay with a "Redisson peer" running
//! Lua written from REDISSON.md §4.1 (both directions), exclusion with the plain lock, and the
//! wire layout.

mod support;

#[path = "support/redisson_peer.rs"]
mod redisson_peer;

use std::future::Future;
use std::io::BufRead;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fred::prelude::*;
use redbaton::{Client, Error, FairLock};
use redisson_peer::FairPeer;
use support::child::{after_tag, child_arg, spawn_child, ChildProcess};
use support::{command_calls, eventually, numsub, RedisServer, RENEWED_LEASE};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Generous bound for "woken by a message, not by a lease or a wait time".
const PROMPT: Duration = Duration::from_secs(2);

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

async fn client(server: &RedisServer) -> Client {
    Client::connect(&server.url()).await.unwrap()
}

async fn queue(raw: &fred::clients::Client, lock: &FairLock) -> Vec<String> {
    raw.lrange(lock.queue_key(), 0, -1).await.unwrap()
}

async fn score(raw: &fred::clients::Client, lock: &FairLock, field: &str) -> Option<f64> {
    raw.zscore(lock.timeout_key(), field).await.unwrap()
}

/// Waits until the queue is exactly `expected`.
async fn queue_becomes(raw: &fred::clients::Client, lock: &FairLock, expected: &[&str]) -> bool {
    eventually(Duration::from_secs(10), || async {
        queue(raw, lock).await == expected
    })
    .await
}

/// Spawns a task that runs `body` on `lock` as an owner of its own (an explicit one, so the
/// test knows its field in advance; an acquisition outside a hold's scope would take a fresh
/// number only when it starts), and returns that owner's field.
async fn spawn_as<T, Fut>(
    lock: &FairLock,
    body: impl FnOnce(FairLock) -> Fut + Send + 'static,
) -> (String, JoinHandle<T>)
where
    T: Send + 'static,
    Fut: Future<Output = T> + Send + 'static,
{
    static NEXT: AtomicU64 = AtomicU64::new(1 << 40);
    let client_id = lock.client_id().to_owned();
    let owner = format!("{client_id}:{}", NEXT.fetch_add(1, Ordering::Relaxed));
    let lock = lock.with_owner(owner.parse().unwrap());
    let handle = tokio::spawn(body(lock));
    (owner, handle)
}

/// A waiter that takes the lock, notes when, and releases it at once.
async fn spawn_lock_taker(lock: &FairLock) -> (String, JoinHandle<Instant>) {
    spawn_as(lock, |lock| async move {
        let guard = lock.lock().await.unwrap();
        let at = Instant::now();
        guard.unlock().await.unwrap();
        at
    })
    .await
}

#[tokio::test]
async fn wire_layout_matches_redisson() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server).await;
    let lock = client.fair_lock("deploy:1");
    assert_eq!(lock.queue_key(), "redisson_lock_queue:{deploy:1}");
    assert_eq!(lock.timeout_key(), "redisson_lock_timeout:{deploy:1}");
    assert_eq!(lock.channel(), "redisson_lock__channel:{deploy:1}");
    assert_eq!(
        lock.waiter_channel(),
        None,
        "no owner outside a hold's scope"
    );
    let owner: redbaton::Owner = format!("{}:7", client.id()).parse().unwrap();
    assert_eq!(
        lock.with_owner(owner.clone()).waiter_channel(),
        Some(format!("redisson_lock__channel:{{deploy:1}}:{owner}"))
    );
    assert_eq!(
        client.fair_lock("{app}:x").queue_key(),
        "redisson_lock_queue:{app}:x"
    );

    // The hold is the RLock hash: field <uuid>:<number> → count, with the lease.
    let guard = lock.lock().await.unwrap();
    let fields: std::collections::HashMap<String, i64> = raw.hgetall("deploy:1").await.unwrap();
    assert_eq!(fields.len(), 1);
    assert_eq!(fields.get(&guard.owner().to_string()), Some(&1));
    let pttl: i64 = raw.pttl("deploy:1").await.unwrap();
    assert!(
        pttl > 25_000 && pttl <= 30_000,
        "watchdog lease, got {pttl}"
    );
    assert!(
        queue(&raw, &lock).await.is_empty(),
        "a free lock is taken unqueued"
    );

    // Waiters queue in the list, with timeouts in the zset: the first one's is now + the
    // holder's PTTL + its wait (300 s by default), the next one's the previous one's + its
    // own wait (a timed wait queues with that wait).
    let (release_w1, released) = tokio::sync::oneshot::channel::<()>();
    let before = now_ms();
    let (w1, w1_task) = spawn_as(&lock, |lock| async move {
        let guard = lock.lock().await.unwrap();
        let _ = released.await;
        guard.unlock().await.unwrap();
    })
    .await;
    assert!(queue_becomes(&raw, &lock, &[&w1]).await);
    let after = now_ms();
    let s1 = score(&raw, &lock, &w1).await.unwrap() as i64;
    assert!(
        s1 >= before + 300_000 + 20_000 && s1 <= after + 300_000 + 30_000,
        "timeout of the first waiter: {} ms from now",
        s1 - after
    );
    let (w2, w2_task) = spawn_as(&lock, |lock| async move {
        lock.try_lock_for(Duration::from_secs(60))
            .await
            .unwrap()
            .expect("served within a minute")
            .unlock()
            .await
            .unwrap();
    })
    .await;
    assert!(queue_becomes(&raw, &lock, &[&w1, &w2]).await);
    let s2 = score(&raw, &lock, &w2).await.unwrap() as i64;
    assert_eq!(s2, s1 + 60_000, "the previous timeout + its own wait");

    // Each waiter listens on its own channel, none on the plain lock's.
    let prefix = "redisson_lock__channel:{deploy:1}";
    for field in [&w1, &w2] {
        let channel = format!("{prefix}:{field}");
        assert!(
            eventually(Duration::from_secs(10), || async {
                numsub(&raw, &channel).await == 1
            })
            .await,
            "{channel} subscribed"
        );
    }
    assert_eq!(numsub(&raw, prefix).await, 0);
    // Both through the client's one shared subscriber connection.
    let pubsub_clients: String = raw
        .custom(
            fred::types::CustomCommand::new_static("CLIENT", None, false),
            vec!["LIST", "TYPE", "pubsub"],
        )
        .await
        .unwrap();
    assert_eq!(
        pubsub_clients.lines().count(),
        1,
        "one subscriber connection per client: {pubsub_clients}"
    );

    // A release publishes "0" to the head's channel only.
    let subscriber = Builder::from_config(Config::from_url(&server.url()).unwrap())
        .build_subscriber_client()
        .unwrap();
    subscriber.init().await.unwrap();
    let mut messages = subscriber.message_rx();
    subscriber.psubscribe(format!("{prefix}*")).await.unwrap();
    let _: Value = subscriber.ping(None).await.unwrap();
    guard.unlock().await.unwrap();
    let message = tokio::time::timeout(Duration::from_secs(5), messages.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&*message.channel, format!("{prefix}:{w1}"));
    assert_eq!(message.value.as_str().as_deref(), Some("0"));

    // The head took it: it left the queue, and the timeouts behind it moved up by its wait.
    assert!(queue_becomes(&raw, &lock, &[&w2]).await);
    assert!(
        eventually(Duration::from_secs(10), || async {
            raw.hexists::<bool, _, _>("deploy:1", &w1).await.unwrap()
        })
        .await
    );
    assert_eq!(score(&raw, &lock, &w1).await, None);
    assert_eq!(score(&raw, &lock, &w2).await.unwrap() as i64, s2 - 300_000);

    // Its release wakes the next on its own channel.
    release_w1.send(()).unwrap();
    let message = tokio::time::timeout(Duration::from_secs(5), messages.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&*message.channel, format!("{prefix}:{w2}"));
    w1_task.await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), w2_task)
        .await
        .unwrap()
        .unwrap();
    assert!(queue(&raw, &lock).await.is_empty());
    let members: i64 = raw.zcard(lock.timeout_key()).await.unwrap();
    assert_eq!(members, 0);
    assert!(
        eventually(Duration::from_secs(10), || async {
            numsub(&raw, &format!("{prefix}:{w1}")).await == 0
                && numsub(&raw, &format!("{prefix}:{w2}")).await == 0
        })
        .await
    );
    client.shutdown().await.unwrap();
}

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

/// How many scripts redbaton ran (EVALSHA; the peer's EVALs are not counted).
async fn scripts_run(raw: &fred::clients::Client) -> u64 {
    command_calls(raw)
        .await
        .get("evalsha")
        .copied()
        .unwrap_or(0)
}

/// Waits until `n` scripts more than `base` ran: with the holder a peer (no renewals of
/// ours), each waiter has made its two attempts (queue, then re-check once subscribed) and
/// is parked until a message or the holder's PTTL.
async fn parked(raw: &fred::clients::Client, base: u64, n: u64) -> bool {
    eventually(Duration::from_secs(10), || async {
        scripts_run(raw).await >= base + n
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_ended_by_an_error_leaves_the_queue() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server).await;
    let lock = client.fair_lock("fair-error");
    let holder = FairPeer::new(&server.url(), "fair-error").await;
    assert_eq!(holder.try_lock(1, 60_000, 300_000).await, None);
    let base = scripts_run(&raw).await;
    let (w1, failing) = spawn_as(&lock, |lock| async move { lock.lock().await.map(drop) }).await;
    assert!(queue_becomes(&raw, &lock, &[&w1]).await);
    let (w2, w2_task) = spawn_lock_taker(&lock).await;
    assert!(queue_becomes(&raw, &lock, &[&w1, &w2]).await);
    assert!(parked(&raw, base, 4).await);

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
    let client = client(&server).await;
    let lock = client.fair_lock("fair-free-head");
    let holder = FairPeer::new(&server.url(), "fair-free-head").await;
    assert_eq!(holder.try_lock(1, 60_000, 300_000).await, None);
    let base = scripts_run(&raw).await;
    let (w1, head) = spawn_lock_taker(&lock).await;
    assert!(queue_becomes(&raw, &lock, &[&w1]).await);
    let (w2, taker) = spawn_lock_taker(&lock).await;
    assert!(queue_becomes(&raw, &lock, &[&w1, &w2]).await);
    assert!(parked(&raw, base, 4).await);

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
    let client = client(&server).await;
    let lock = client.fair_lock("fair-try");
    let holder = FairPeer::new(&server.url(), "fair-try").await;
    assert_eq!(holder.try_lock(1, 60_000, 300_000).await, None);
    let base = scripts_run(&raw).await;
    let (w1, head) = spawn_lock_taker(&lock).await;
    assert!(queue_becomes(&raw, &lock, &[&w1]).await);
    assert!(parked(&raw, base, 2).await);
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
async fn plain_and_fair_locks_on_one_name_exclude_each_other() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server).await;
    let plain = client.lock("shared-name");
    let fair = client.fair_lock("shared-name");

    let held = plain.lock().await.unwrap();
    let (_, refused) = spawn_as(&fair, |fair| async move {
        (
            fair.try_lock().await.unwrap().is_none(),
            fair.try_lock_for(Duration::from_millis(300))
                .await
                .unwrap()
                .is_none(),
        )
    })
    .await;
    assert_eq!(refused.await.unwrap(), (true, true));
    assert!(
        queue_becomes(&raw, &fair, &[]).await,
        "the timed-out fair waiter left"
    );
    held.unlock().await.unwrap();

    let held = fair.lock().await.unwrap();
    let plain_task = plain.clone();
    let refused = tokio::spawn(async move {
        (
            plain_task.try_lock().await.unwrap().is_none(),
            plain_task
                .try_lock_for(Duration::from_millis(300))
                .await
                .unwrap()
                .is_none(),
        )
    });
    assert_eq!(refused.await.unwrap(), (true, true));
    held.unlock().await.unwrap();
    let again = tokio::spawn(async move { plain.try_lock().await.unwrap().is_some() });
    assert!(again.await.unwrap(), "free again for the plain lock");
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redisson_peer_queued_behind_us_is_woken_on_its_own_channel() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server).await;
    let lock = client.fair_lock("mixed-a");
    let guard = lock.lock().await.unwrap();

    let peer = FairPeer::new(&server.url(), "mixed-a").await;
    let mut inbox = peer.subscribe(7).await;
    let ttl = peer.try_lock(7, 30_000, 300_000).await;
    assert!(matches!(ttl, Some(t) if t > 0), "the peer queues: {ttl:?}");
    assert!(queue_becomes(&raw, &lock, &[&peer.lock_name(7)]).await);

    // One of ours queues behind the peer.
    let (ours, taker) = spawn_lock_taker(&lock).await;
    assert!(queue_becomes(&raw, &lock, &[&peer.lock_name(7), &ours]).await);

    guard.unlock().await.unwrap();
    assert_eq!(
        inbox.next(PROMPT).await.as_deref(),
        Some("0"),
        "our release wakes the peer on its own channel"
    );
    assert_eq!(
        peer.try_lock(7, 30_000, 300_000).await,
        None,
        "the peer takes it"
    );
    let count: Option<i64> = raw.hget("mixed-a", peer.lock_name(7)).await.unwrap();
    assert_eq!(count, Some(1));
    assert!(queue_becomes(&raw, &lock, &[&ours]).await);

    // The peer's release wakes ours in turn.
    let released = Instant::now();
    assert_eq!(peer.unlock(7).await, Some(1));
    let took = tokio::time::timeout(Duration::from_secs(10), taker)
        .await
        .unwrap()
        .unwrap();
    assert!(took.duration_since(released) < PROMPT);
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn we_queued_behind_a_redisson_peer_are_served_in_its_order() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server).await;
    let lock = client.fair_lock("mixed-b");
    let peer = FairPeer::new(&server.url(), "mixed-b").await;
    assert_eq!(
        peer.try_lock(1, 30_000, 300_000).await,
        None,
        "the peer holds"
    );

    // Queue: ours, a peer thread, ours.
    let (first, first_task) = spawn_lock_taker(&lock).await;
    assert!(queue_becomes(&raw, &lock, &[&first]).await);
    assert!(peer.try_lock(2, 30_000, 5_000).await.is_some());
    let (last, last_task) = spawn_lock_taker(&lock).await;
    let expected = [first.as_str(), &peer.lock_name(2), last.as_str()];
    assert!(queue_becomes(&raw, &lock, &expected).await);
    let s_last = score(&raw, &lock, &last).await.unwrap() as i64;
    let s_peer = score(&raw, &lock, &peer.lock_name(2)).await.unwrap() as i64;
    let s_first = score(&raw, &lock, &first).await.unwrap() as i64;
    assert_eq!(
        s_peer,
        s_first + 5_000,
        "the peer queued behind our timeout"
    );
    assert_eq!(s_last, s_peer + 300_000, "we queued behind the peer's");

    // A non-queuing try of the peer is refused and does not queue.
    assert!(!peer.try_lock_no_queue(3, 30_000).await);
    assert_eq!(queue(&raw, &lock).await, expected);

    // The peer thread gives up the Redisson way: ours behind it move up by its wait.
    peer.acquire_failed(2, 5_000).await;
    assert!(queue_becomes(&raw, &lock, &[&first, &last]).await);
    assert_eq!(
        score(&raw, &lock, &last).await.unwrap() as i64,
        s_last - 5_000
    );

    // The peer's release wakes our head on its own channel.
    let released = Instant::now();
    assert_eq!(peer.unlock(1).await, Some(1));
    let took = tokio::time::timeout(Duration::from_secs(10), first_task)
        .await
        .unwrap()
        .unwrap();
    assert!(took.duration_since(released) < PROMPT);
    let took_last = tokio::time::timeout(Duration::from_secs(10), last_task)
        .await
        .unwrap()
        .unwrap();
    assert!(took_last >= took);
    assert!(queue(&raw, &lock).await.is_empty());
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_behind_a_silent_head_parks_instead_of_spinning() {
    // Redisson's script answers a queued waiter 0 while the lock is free for someone else;
    // ours must park instead (until the head's timeout, at most one watchdog lease).
    let server = RedisServer::start();
    let raw = server.raw().await;
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
    let base = scripts_run(&raw).await;
    let (ours, taker) = spawn_lock_taker(&lock).await;
    assert!(queue_becomes(&raw, &lock, &[&peer.lock_name(1), &ours]).await);
    assert!(parked(&raw, base, 2).await);

    // Released: the silent head is woken but never comes; the lock stays free with it as
    // head. Ours tries again once its park (the holder's PTTL, under 3 s) ends, and parks.
    assert_eq!(peer.unlock(9).await, Some(1));
    let released = scripts_run(&raw).await;
    assert!(parked(&raw, released, 1).await, "ours tries again");
    let before = scripts_run(&raw).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = scripts_run(&raw).await;
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
    for mode in [redbaton::PubSubMode::Classic, redbaton::PubSubMode::Sharded] {
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

/// The words of a `MONITOR` line: (client address or `lua`, command words).
fn monitor_words(line: &str) -> Option<(String, Vec<String>)> {
    let rest = line.split_once(" [")?.1;
    let (who, args) = rest.split_once("] ")?;
    let addr = who.split_whitespace().nth(1)?.to_owned();
    let words = args
        .split("\" \"")
        .map(|w| w.trim_matches('"').to_owned())
        .collect();
    Some((addr, words))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_shows_a_hand_off_on_the_heads_own_channel() {
    // One fair hand-off as the server sees it: the release script publishes "0" on the head's
    // own channel (nothing on the plain lock's), then the woken head's acquire takes the lock.
    let server = RedisServer::start();
    let raw = server.raw().await;
    let holder_client = client(&server).await;
    let lock = holder_client.fair_lock("handoff");
    let holder = lock.lock().await.unwrap();
    let waiter_client = client(&server).await;
    let (head, taker) = spawn_lock_taker(&waiter_client.fair_lock("handoff")).await;
    assert!(queue_becomes(&raw, &lock, &[&head]).await);
    let channel = format!("redisson_lock__channel:{{handoff}}:{head}");
    assert!(
        eventually(Duration::from_secs(10), || async {
            numsub(&raw, &channel).await == 1
        })
        .await
    );

    let mut monitor = std::process::Command::new("redis-cli")
        .args(["-p", &server.port.to_string(), "monitor"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("redis-cli");
    let stdout = monitor.stdout.take().unwrap();
    let (lines_tx, lines_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines: Vec<String> = Vec::new();
    let started = Instant::now();
    while !lines.iter().any(|l| l.contains("monitor-marker")) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "MONITOR did not start"
        );
        let _: Option<String> = raw.get("monitor-marker").await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        lines.extend(lines_rx.try_iter());
    }

    holder.unlock().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), taker)
        .await
        .expect("the head is served")
        .unwrap();
    // The head took the lock: its HSET (inside its acquire script) shows in MONITOR.
    let took = |lines: &[String]| {
        lines
            .iter()
            .filter_map(|l| monitor_words(l))
            .any(|(addr, w)| addr == "lua" && w[0] == "hset" && w.get(2) == Some(&head))
    };
    let started = Instant::now();
    while !took(&lines) && started.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        lines.extend(lines_rx.try_iter());
    }
    let _ = monitor.kill();
    let _ = monitor.wait();

    let parsed: Vec<(usize, String, Vec<String>)> = lines
        .iter()
        .enumerate()
        .filter_map(|(i, l)| monitor_words(l).map(|(a, w)| (i, a, w)))
        .collect();
    let publish = parsed
        .iter()
        .find(|(_, addr, w)| addr == "lua" && w[0].eq_ignore_ascii_case("publish"))
        .expect("the release published");
    assert_eq!(publish.2[1], channel, "published on the head's own channel");
    assert_eq!(publish.2[2], "0");
    assert_eq!(
        parsed
            .iter()
            .filter(|(_, addr, w)| addr == "lua" && w[0].eq_ignore_ascii_case("publish"))
            .count(),
        1,
        "one publish (the head's), none on the plain lock's channel"
    );
    // The woken head's acquire: an EVALSHA from a client with the 3 fair-lock keys and the
    // head's field, after the publish, whose script takes the lock.
    let acquire = parsed
        .iter()
        .find(|(i, addr, w)| {
            *i > publish.0
                && addr != "lua"
                && w[0].eq_ignore_ascii_case("evalsha")
                && w.get(2).map(String::as_str) == Some("3")
                && w.get(3).map(String::as_str) == Some("handoff")
                && w.get(7) == Some(&head)
        })
        .expect("the head's acquire after the publish");
    let hset = parsed
        .iter()
        .find(|(i, addr, w)| *i > acquire.0 && addr == "lua" && w[0] == "hset")
        .expect("the head's acquire took the lock");
    assert_eq!(hset.2[2], head);
    // The release before the publish, for the excerpt.
    let release = parsed
        .iter()
        .rev()
        .find(|(i, addr, w)| {
            *i < publish.0 && addr != "lua" && w[0].eq_ignore_ascii_case("evalsha")
        })
        .expect("the release script")
        .0;
    println!("MONITOR excerpt of one fair hand-off:");
    for line in &lines[release..=(hset.0 + 1).min(lines.len() - 1)] {
        println!("{line}");
    }
    waiter_client.shutdown().await.unwrap();
    holder_client.shutdown().await.unwrap();
}

// --- child processes -------------------------------------------------------------------------

/// The child of `fifo_order_across_three_processes`: once told to go, starts five tasks
/// 25 ms apart (so the processes' waiters interleave in the queue) that wait for the fair
/// lock; each, once it holds it, appends its owner to the order list, then releases.
async fn child_fifo_waiters(arg: String) {
    let parts: Vec<&str> = arg.split('|').collect();
    let [url, name, order_key] = parts[..] else {
        panic!("bad child argument {arg:?}")
    };
    let client = Client::connect(url).await.unwrap();
    let redis = client.redis();
    let _: i64 = redis.incr(format!("{order_key}:ready")).await.unwrap();
    let go = format!("{order_key}:go");
    assert!(
        eventually(Duration::from_secs(60), || async {
            redis.exists::<i64, _>(&go).await.unwrap() == 1
        })
        .await
    );
    let mut tasks = Vec::new();
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(25)).await;
        let lock = client.fair_lock(name);
        let redis = client.redis().clone();
        let order_key = order_key.to_owned();
        tasks.push(tokio::spawn(async move {
            let guard = lock.lock().await.unwrap();
            let _: i64 = redis
                .rpush(&order_key, guard.owner().to_string())
                .await
                .unwrap();
            guard.unlock().await.unwrap();
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    client.shutdown().await.unwrap();
    println!("DONE");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_order_across_three_processes() {
    if let Some(arg) = child_arg() {
        return child_fifo_waiters(arg).await;
    }
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server).await;
    let name = "fifo";
    let order_key = "fifo-order";
    let lock = client.fair_lock(name);
    let holder = lock.lock().await.unwrap();

    let arg = format!("{}|{name}|{order_key}", server.url());
    let mut children: Vec<ChildProcess> = (0..3)
        .map(|_| spawn_child("fifo_order_across_three_processes", &arg))
        .collect();
    assert!(
        eventually(Duration::from_secs(60), || async {
            raw.get::<Option<i64>, _>(format!("{order_key}:ready"))
                .await
                .unwrap()
                == Some(3)
        })
        .await,
        "three children connected"
    );
    let _: () = raw
        .set(format!("{order_key}:go"), 1, None, None, false)
        .await
        .unwrap();
    assert!(
        eventually(Duration::from_secs(60), || async {
            queue(&raw, &lock).await.len() == 15
        })
        .await,
        "3 processes × 5 waiters queue"
    );
    let queued = queue(&raw, &lock).await;
    let clients: std::collections::BTreeSet<&str> = queued
        .iter()
        .map(|f| f.rsplit_once(':').unwrap().0)
        .collect();
    assert_eq!(clients.len(), 3, "three processes: {queued:?}");

    let released = Instant::now();
    holder.unlock().await.unwrap();
    let outputs: Vec<_> = children
        .iter_mut()
        .map(|child| {
            let stdout = child.0.stdout.take().unwrap();
            // Read to the end: a closed pipe would fail the child's last prints.
            tokio::task::spawn_blocking(move || {
                let lines: Vec<String> = std::io::BufReader::new(stdout)
                    .lines()
                    .map_while(Result::ok)
                    .collect();
                lines.iter().any(|l| after_tag(l, "DONE").is_some())
            })
        })
        .collect();
    for output in outputs {
        let done = tokio::time::timeout(Duration::from_secs(60), output)
            .await
            .expect("every child finishes")
            .unwrap();
        assert!(done, "a child finished its five waiters");
    }
    let all_served = released.elapsed();
    let order: Vec<String> = raw.lrange(order_key, 0, -1).await.unwrap();
    let position = |field: &str| {
        let client = field.rsplit_once(':').unwrap().0;
        let process = clients.iter().position(|c| *c == client).unwrap();
        format!("p{process}:{}", field.rsplit_once(':').unwrap().1)
    };
    println!(
        "FIFO queue order:       {:?}",
        queued.iter().map(|f| position(f)).collect::<Vec<_>>()
    );
    println!(
        "FIFO acquisition order: {:?}",
        order.iter().map(|f| position(f)).collect::<Vec<_>>()
    );
    println!("all 15 served {all_served:?} after the release");
    assert_eq!(order, queued, "acquired in queue order");
    // One lost hand-off would cost a 30 s lease.
    assert!(all_served < Duration::from_secs(25), "{all_served:?}");
    assert!(queue(&raw, &lock).await.is_empty());
    for child in &mut children {
        let status = child.0.wait().unwrap();
        assert!(status.success());
    }
    client.shutdown().await.unwrap();
}

/// The child of `a_crashed_waiter_is_purged_after_its_wait`: queues for the fair lock with a
/// 4 s wait time and says so; killed while it waits.
async fn child_fair_waiter(arg: String) {
    let (url, name) = arg.split_once('|').unwrap();
    let client = Client::builder()
        .url(url)
        .fair_lock_wait(Duration::from_secs(4))
        .connect()
        .await
        .unwrap();
    let lock = client.fair_lock(name);
    tokio::spawn(async move {
        let owner: redbaton::Owner = format!("{}:{}", client.id(), 1u64 << 40).parse().unwrap();
        let lock = lock.with_owner(owner.clone());
        println!("WAITING {owner}");
        let _guard = lock.lock().await.unwrap();
        println!("ACQUIRED");
        std::future::pending::<()>().await;
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_waiter_is_purged_after_its_wait() {
    if let Some(arg) = child_arg() {
        return child_fair_waiter(arg).await;
    }
    let server = RedisServer::start();
    let raw = server.raw().await;
    let name = "fair-crash";
    // The holder's lease is short (2 s, renewed), so the crashed waiter's timeout is at most
    // that plus its 4 s wait away.
    let holder_client = Client::builder()
        .url(server.url())
        .watchdog_lease(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let lock = holder_client.fair_lock(name);
    let holder = lock.lock().await.unwrap();

    let mut child = spawn_child(
        "a_crashed_waiter_is_purged_after_its_wait",
        &format!("{}|{name}", server.url()),
    );
    let stdout = child.0.stdout.take().unwrap();
    let crashed = tokio::task::spawn_blocking(move || {
        let mut lines = std::io::BufReader::new(stdout).lines();
        lines.find_map(|line| after_tag(&line.ok()?, "WAITING "))
    });
    let crashed = tokio::time::timeout(Duration::from_secs(60), crashed)
        .await
        .expect("the child starts waiting")
        .unwrap()
        .expect("the child reports its owner");
    assert!(queue_becomes(&raw, &lock, &[&crashed]).await);

    // A live waiter of default settings (300 s wait) queues behind it.
    let client = client(&server).await;
    let fair = client.fair_lock(name);
    let (live, taker) = spawn_as(&fair, |lock| async move {
        lock.lock().await.unwrap().unlock().await.unwrap();
        now_ms()
    })
    .await;
    assert!(queue_becomes(&raw, &lock, &[&crashed, &live]).await);

    // SIGKILL while queued; then the holder releases (to the dead head's channel).
    let crashed_timeout = score(&raw, &lock, &crashed)
        .await
        .expect("the queued waiter has its timeout") as i64;
    drop(child);
    holder.unlock().await.unwrap();
    let released = Instant::now();
    let acquired_ms = tokio::time::timeout(Duration::from_secs(30), taker)
        .await
        .expect("the queue is not blocked for good by a dead waiter")
        .unwrap();
    assert!(
        released.elapsed() < Duration::from_secs(15),
        "served about the dead waiter's 4 s wait after its turn, took {:?}",
        released.elapsed()
    );
    assert!(
        acquired_ms + 5 >= crashed_timeout,
        "the dead waiter kept its place until its timeout ({} ms early)",
        crashed_timeout - acquired_ms
    );
    assert_eq!(score(&raw, &lock, &crashed).await, None, "purged");
    assert!(queue(&raw, &lock).await.is_empty());
    client.shutdown().await.unwrap();
    holder_client.shutdown().await.unwrap();
}

#[test]
fn fair_types_move_between_tasks() {
    fn send_sync_static<T: Send + Sync + 'static>() {}
    send_sync_static::<redbaton::FairLock>();
    send_sync_static::<redbaton::FairGuard>();
}
