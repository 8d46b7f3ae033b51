//! Holes found by review and an adversarial hunt, each pinned by a test that failed before
//! its fix: leases that a re-entry or a partial unlock shortened, acquires and releases whose
//! reply came too late, a stale hold merged with a fresh one, a shutdown that released
//! another client's holds of a shared owner, two names on one channel, a shutdown racing an
//! acquire in flight, waiters that slept through a broken subscriber.

use testkit as support;

use std::time::Duration;

use fred::prelude::*;
use redbaton::{Client, Error, PubSubMode};
use support::proxy::{Mode, Proxy};
use support::{command, eventually, RedisServer};
use tokio::time::Instant;

async fn client(server: &RedisServer) -> Client {
    Client::connect(&server.url()).await.unwrap()
}

async fn leased_client(url: String, lease: Duration) -> Client {
    Client::builder()
        .url(url)
        .watchdog_lease(lease)
        .connect()
        .await
        .unwrap()
}

/// Asserts that another client cannot take `name` now.
async fn excluded(other: &Client, name: &str, what: &str) {
    assert!(
        other.lock(name).try_lock().await.unwrap().is_none(),
        "{what}: another client got in"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shorter_fixed_lease_inside_a_watchdog_hold_does_not_shorten_it() {
    let server = RedisServer::start();
    let holder = leased_client(server.url(), Duration::from_secs(3)).await;
    let other = client(&server).await;
    let lock = holder.lock("outer-watchdog");
    let outer = lock.lock().await.unwrap();
    let inner = outer
        .run(|| lock.lock_with_lease(Duration::from_millis(200)))
        .await
        .unwrap()
        .unwrap();
    let owned = lock.with_owner(outer.owner());
    tokio::time::sleep(Duration::from_millis(700)).await;
    excluded(&other, "outer-watchdog", "after the inner lease ended").await;
    assert!(!outer.is_lost());
    assert!(inner.is_lost(), "the inner guard's own lease ran out");
    // Partial unlock of the inner hold: the outer one goes on, renewed.
    inner.unlock().await.unwrap();
    assert_eq!(owned.hold_count().await.unwrap(), 1);
    tokio::time::sleep(Duration::from_millis(3500)).await;
    excluded(&other, "outer-watchdog", "past a whole lease").await;
    assert!(!outer.is_lost());
    outer.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());
    holder.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watchdog_hold_inside_a_fixed_lease_does_not_shorten_it() {
    // The watchdog lease (500 ms) is shorter than the outer fixed lease (3 s): neither the
    // re-entry, nor its renewals, nor its unlock may bring the key's expiry below 3 s.
    let server = RedisServer::start();
    let holder = leased_client(server.url(), Duration::from_millis(500)).await;
    let other = client(&server).await;
    let lock = holder.lock("outer-fixed");
    let outer = lock.lock_with_lease(Duration::from_secs(3)).await.unwrap();
    // In the outer hold's scope: the same owner, with the watchdog lease.
    let inner = outer.run(|| lock.lock()).await.unwrap().unwrap();
    // Long enough for several renewals (every ~167 ms) of the inner watchdog hold.
    tokio::time::sleep(Duration::from_millis(800)).await;
    inner.unlock().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    excluded(&other, "outer-fixed", "1.8 s into a 3 s lease").await;
    assert!(!outer.is_lost());
    let ttl = lock.remaining_ttl().await.unwrap().expect("held");
    assert!(
        ttl > Duration::from_millis(500),
        "expiry kept for the outer lease: {ttl:?}"
    );
    outer.unlock().await.unwrap();
    holder.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shorter_fixed_lease_inside_a_fixed_lease_does_not_shorten_it() {
    let server = RedisServer::start();
    let holder = client(&server).await;
    let other = client(&server).await;
    let lock = holder.lock("fixed-fixed");
    let outer = lock.lock_with_lease(Duration::from_secs(3)).await.unwrap();
    let inner = outer
        .run(|| lock.lock_with_lease(Duration::from_millis(200)))
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    excluded(&other, "fixed-fixed", "after the inner lease ended").await;
    assert!(!outer.is_lost());
    inner.unlock().await.unwrap();
    excluded(&other, "fixed-fixed", "after the inner unlock").await;
    assert_eq!(
        lock.with_owner(outer.owner()).hold_count().await.unwrap(),
        1
    );
    outer.unlock().await.unwrap();
    holder.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_attempt_that_times_out_leaves_no_hold() {
    // The acquire is stuck behind a paused server past the command timeout: the caller gets
    // the timeout, and once the server runs the script, the hold it took is released.
    let server = RedisServer::start();
    let raw = server.raw().await;
    let worker = Client::builder()
        .url(server.url())
        .command_timeout(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    command(
        &raw,
        "CLIENT",
        vec!["PAUSE".into(), "1200".into(), "ALL".into()],
    )
    .await;
    let outcome = worker.lock("late").try_lock().await;
    assert!(matches!(outcome, Err(Error::Timeout(_))), "{outcome:?}");
    // The script runs when the pause ends; the hold must not outlive it.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(
        eventually(Duration::from_secs(3), || async {
            raw.exists::<i64, _>("late").await.unwrap() == 0
        })
        .await,
        "the late acquire's hold was released"
    );
    worker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn re_checks_that_time_out_while_waiting_never_add_counts() {
    // A waiter re-checks while the server is paused: every re-check times out. Once the
    // server is back and the lock free, the waiter holds it with a count of exactly 1, and
    // one unlock frees it.
    let server = RedisServer::start();
    let raw = server.raw().await;
    let holder = client(&server).await;
    let worker = Client::builder()
        .url(server.url())
        .command_timeout(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let held = holder
        .lock("stall")
        .lock_with_lease(Duration::from_millis(600))
        .await
        .unwrap();
    let waiter = {
        let lock = worker.lock("stall");
        tokio::spawn(async move {
            let guard = lock
                .try_lock_for(Duration::from_secs(20))
                .await
                .unwrap()
                .unwrap();
            let count = lock.with_owner(guard.owner()).hold_count().await.unwrap();
            guard.unlock().await.unwrap();
            count
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The waiter's timer (the holder's 600 ms lease) fires during the pause.
    command(
        &raw,
        "CLIENT",
        vec!["PAUSE".into(), "1500".into(), "ALL".into()],
    )
    .await;
    let count = tokio::time::timeout(Duration::from_secs(15), waiter)
        .await
        .expect("the waiter got the lock")
        .unwrap();
    assert_eq!(count, 1, "re-checks of unknown outcome added counts");
    assert!(
        eventually(Duration::from_secs(3), || async {
            raw.exists::<i64, _>("stall").await.unwrap() == 0
        })
        .await,
        "one unlock freed it"
    );
    drop(held);
    holder.shutdown().await.unwrap();
    worker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_cannot_be_sent_in_time_is_finished_later() {
    // The connection is down when the guard is released: unlock reports it, and the release
    // goes out once the connection is back — not left to the 30 s lease.
    let server = RedisServer::start();
    let raw = server.raw().await;
    let proxy = Proxy::start(server.port).await;
    let holder = Client::builder()
        .url(proxy.url())
        .command_timeout(Duration::from_millis(300))
        .reconnect_max_delay(Duration::from_millis(100))
        .connect()
        .await
        .unwrap();
    let guard = holder.lock("late-release").lock().await.unwrap();
    proxy.set(Mode::Cut);
    let outcome = guard.unlock().await;
    assert!(
        matches!(outcome, Err(Error::Timeout(_)) | Err(Error::Connection(_))),
        "{outcome:?}"
    );
    assert_eq!(raw.exists::<i64, _>("late-release").await.unwrap(), 1);
    proxy.set(Mode::Open);
    let reopened = Instant::now();
    assert!(
        eventually(Duration::from_secs(5), || async {
            raw.exists::<i64, _>("late-release").await.unwrap() == 0
        })
        .await,
        "released once the connection was back"
    );
    assert!(reopened.elapsed() < Duration::from_secs(5));
    holder.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_hold_is_never_merged_with_a_stale_one() {
    // The lock is force-unlocked and taken again by the same owner before the watchdog
    // noticed: the old guard is lost, and its unlock must not release the new hold.
    let server = RedisServer::start();
    let holder = client(&server).await;
    let breaker = client(&server).await;
    let third = client(&server).await;
    let lock = holder.lock("stale");
    let old = lock.lock().await.unwrap();
    assert!(breaker.lock("stale").force_unlock().await.unwrap());
    let owned = lock.with_owner(old.owner());
    let new = owned.lock().await.unwrap();
    assert_eq!(owned.hold_count().await.unwrap(), 1, "a fresh hold");
    assert!(old.is_lost(), "the old hold is over");
    assert!(!new.is_lost());
    assert!(matches!(old.unlock().await, Err(Error::NotHeld { .. })));
    excluded(&third, "stale", "after the stale guard's unlock").await;
    assert_eq!(owned.hold_count().await.unwrap(), 1);
    new.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());
    for c in [holder, breaker, third] {
        c.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_only_the_clients_own_holds_of_a_shared_owner() {
    let server = RedisServer::start();
    let first = client(&server).await;
    let second = client(&server).await;
    let third = client(&server).await;
    let lock = first.lock("shared-owner");
    let guard = lock.lock().await.unwrap();
    let borrowed = second.lock("shared-owner").with_owner(guard.owner());
    let nested = borrowed.lock().await.unwrap();
    let owned = lock.with_owner(guard.owner());
    assert_eq!(owned.hold_count().await.unwrap(), 2);
    std::mem::forget(nested);
    second.shutdown().await.unwrap();
    assert_eq!(
        owned.hold_count().await.unwrap(),
        1,
        "only the second client's hold went"
    );
    assert!(!guard.is_lost());
    excluded(&third, "shared-owner", "after the second client shut down").await;
    guard.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());
    first.shutdown().await.unwrap();
    third.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_sharing_a_channel_wake_their_own_waiters() {
    // `x` and `{x}` both use `redisson_lock__channel:{x}`. The `{x}` waiter parks first; the
    // release of `x` must reach the `x` waiter, not be swallowed by the `{x}` one.
    let server = RedisServer::start();
    let holder = client(&server).await;
    let waiters = client(&server).await;
    assert_eq!(holder.lock("x").channel(), holder.lock("{x}").channel());
    let x = holder.lock("x").lock().await.unwrap();
    let braced = holder.lock("{x}").lock().await.unwrap();
    let braced_waiter = support::spawn_waiter(waiters.lock("{x}"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let x_waiter = support::spawn_waiter(waiters.lock("x"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    x.unlock().await.unwrap();
    let woke = tokio::time::timeout(Duration::from_secs(10), x_waiter)
        .await
        .expect("the x waiter was woken by its release, not by the 30 s lease")
        .unwrap();
    assert!(woke.duration_since(released) < Duration::from_secs(3));
    braced.unlock().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), braced_waiter)
        .await
        .unwrap()
        .unwrap();
    holder.shutdown().await.unwrap();
    waiters.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_during_an_acquire_in_flight_leaves_no_hold() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let proxy = Proxy::start(server.port).await;
    let client = Client::connect(&proxy.url()).await.unwrap();
    proxy.set(Mode::RepliesDelayed(Duration::from_millis(500)));
    let attempt = {
        let lock = client.lock("in-flight");
        tokio::spawn(async move { lock.try_lock().await.map(|g| g.is_some()) })
    };
    assert!(
        eventually(Duration::from_secs(2), || async {
            raw.exists::<i64, _>("in-flight").await.unwrap() == 1
        })
        .await,
        "the acquire ran"
    );
    client.shutdown().await.unwrap();
    assert_eq!(
        raw.exists::<i64, _>("in-flight").await.unwrap(),
        0,
        "shutdown left the in-flight acquire's hold behind"
    );
    let outcome = attempt.await.unwrap();
    assert!(matches!(outcome, Err(Error::ShutDown)), "{outcome:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_fail_with_auth_when_the_server_refuses_their_subscription() {
    if !support::servers::supports(support::servers::Feature::ShardedPubSub, None) {
        return;
    }
    // An ACL change kills the subscriber's subscription and refuses its resubscription
    // (sharded pub/sub, whose SSUBSCRIBE reports errors). Waiters must not sleep through it
    // until the 30 s lease ends, nor poll in silence: the parked waiter and a new one both
    // fail promptly with Error::Auth (the refusal is a configuration error, not a blip).
    let server = RedisServer::start();
    let raw = server.raw().await;
    let channel = "redisson_lock__channel:{acl}";
    command(
        &raw,
        "ACL",
        [
            "SETUSER",
            "waiter",
            "on",
            ">pw",
            "~*",
            "+@all",
            &format!("&{channel}"),
        ]
        .map(String::from)
        .to_vec(),
    )
    .await;
    let holder = client(&server).await;
    let waiters = Client::builder()
        .url(format!("redis://waiter:pw@127.0.0.1:{}", server.port))
        .pubsub(PubSubMode::Sharded)
        .connect()
        .await
        .unwrap();
    let spawn_waiter = |lock: redbaton::Lock| {
        tokio::spawn(async move {
            let outcome = lock.lock().await.map(drop);
            (outcome, Instant::now())
        })
    };
    let guard = holder.lock("acl").lock().await.unwrap();
    let first = spawn_waiter(waiters.lock("acl"));
    // Parked on a confirmed subscription before the ACL changes.
    assert!(
        eventually(Duration::from_secs(10), || async {
            support::shard_numsub(&raw, channel).await == 1
        })
        .await,
        "the first waiter never subscribed"
    );
    command(
        &raw,
        "ACL",
        ["SETUSER", "waiter", "resetchannels"]
            .map(String::from)
            .to_vec(),
    )
    .await;
    let changed = Instant::now();
    let second = spawn_waiter(waiters.lock("acl"));
    for waiter in [first, second] {
        let (outcome, at) = tokio::time::timeout(Duration::from_secs(15), waiter)
            .await
            .expect("a waiter slept through the refused subscription")
            .unwrap();
        assert!(matches!(outcome, Err(Error::Auth(_))), "{outcome:?}");
        assert!(
            at.duration_since(changed) < Duration::from_secs(10),
            "the refusal took {:?} to reach the waiter",
            at.duration_since(changed)
        );
    }
    // The holder was never disturbed.
    assert!(holder.lock("acl").is_locked().await.unwrap());
    guard.unlock().await.unwrap();
    holder.shutdown().await.unwrap();
    waiters.shutdown().await.unwrap();
}
