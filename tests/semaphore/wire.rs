//! The wire layout, refused input and keys, the Redisson peer, and a cluster.

use super::*;

#[tokio::test]
async fn wire_layout_and_messages_match_redisson() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server.url()).await;
    let sem = client.semaphore("slots");
    assert_eq!(sem.key(), "slots");
    assert_eq!(sem.channel(), "redisson_sc:{slots}");
    assert_eq!(client.semaphore("{a}:b").channel(), "redisson_sc:{a}:b");
    let (_subscriber, mut messages) = subscribe(&server.url(), "redisson_sc:{slots}").await;

    assert_eq!(sem.available_permits().await.unwrap(), 0, "absent: 0");
    assert!(sem.try_set_permits(3).await.unwrap());
    let kind: String = raw.r#type("slots").await.unwrap();
    assert_eq!(kind, "string", "a plain string counter");
    assert_eq!(get(&raw, "slots").await.as_deref(), Some("3"));
    assert!(!sem.try_set_permits(5).await.unwrap(), "only once");
    assert_eq!(get(&raw, "slots").await.as_deref(), Some("3"));

    assert!(kept(sem.try_acquire_many(2).await.unwrap()));
    assert_eq!(get(&raw, "slots").await.as_deref(), Some("1"));
    assert!(!kept(sem.try_acquire_many(2).await.unwrap()), "one left");
    assert_eq!(sem.available_permits().await.unwrap(), 1);
    sem.release(2).await.unwrap();
    assert_eq!(get(&raw, "slots").await.as_deref(), Some("3"));
    sem.add_permits(4).await.unwrap();
    assert_eq!(get(&raw, "slots").await.as_deref(), Some("7"));
    sem.add_permits(-10).await.unwrap();
    assert_eq!(sem.available_permits().await.unwrap(), -3);
    sem.release(1).await.unwrap();
    assert_eq!(get(&raw, "slots").await.as_deref(), Some("-2"));
    sem.add_permits(3).await.unwrap();
    assert_eq!(get(&raw, "slots").await.as_deref(), Some("1"));

    // Set: the count; release and add: the new count; acquires publish nothing, and neither
    // does a change that leaves no positive count (-3, -2).
    let seen = drain(&mut messages, Duration::from_millis(500)).await;
    assert_eq!(seen, ["3", "3", "7", "1"]);

    // addPermits clears an expiry, as Redisson's SET does; release keeps it.
    let _: () = raw.pexpire("slots", 60_000, None).await.unwrap();
    sem.release(1).await.unwrap();
    let pttl: i64 = raw.pttl("slots").await.unwrap();
    assert!(pttl > 0, "release keeps the expiry");
    sem.add_permits(1).await.unwrap();
    let pttl: i64 = raw.pttl("slots").await.unwrap();
    assert_eq!(pttl, -1, "add_permits clears it");
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_input_is_refused_with_typed_errors() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server.url()).await;
    let sem = client.semaphore("input");
    let too_many = MAX_PERMITS + 1;
    let invalid = |r: Result<(), Error>| matches!(r, Err(Error::InvalidArgument(_)));
    assert!(invalid(sem.acquire_many(too_many).await.map(drop)));
    assert!(invalid(sem.try_acquire_many(too_many).await.map(drop)));
    assert!(invalid(
        sem.try_acquire_many_for(too_many, Duration::from_secs(1))
            .await
            .map(drop)
    ));
    assert!(invalid(sem.release(too_many).await));
    assert!(invalid(sem.try_set_permits(too_many).await.map(drop)));
    assert!(invalid(sem.add_permits(i64::MAX).await));
    assert!(invalid(sem.add_permits(-i64::from(too_many)).await));
    assert!(invalid(sem.with_recheck_interval(Duration::ZERO).map(drop)));
    assert!(invalid(sem.with_recheck_interval(Duration::MAX).map(drop)));
    assert!(invalid(client.semaphore("").try_acquire().await.map(drop)));
    assert!(invalid(
        client.semaphore("").available_permits().await.map(drop)
    ));

    // Zero permits, as in Redisson: taken at once and released as a no-op, with no call.
    let before = command_calls(&raw).await;
    assert!(kept(sem.try_acquire_many(0).await.unwrap()));
    assert!(sem
        .try_acquire_many_for(0, Duration::from_secs(1))
        .await
        .unwrap()
        .is_some());
    drop(sem.acquire_many(0).await.unwrap());
    sem.release(0).await.unwrap();
    sem.add_permits(0).await.unwrap();
    let after = command_calls(&raw).await;
    assert_eq!(
        before.get("evalsha"),
        after.get("evalsha"),
        "zero permits send nothing"
    );
    let exists: i64 = raw.exists("input").await.unwrap();
    assert_eq!(exists, 0);
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_count_a_redisson_peer_could_not_read_is_refused() {
    // Redisson reads the counter as a Java int: no call may take it out of that range.
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server.url()).await;
    let sem = client.semaphore("range");
    let (_subscriber, mut messages) = subscribe(&server.url(), "redisson_sc:{range}").await;
    let max = i64::from(MAX_PERMITS);
    let refused = |r: Result<(), Error>| {
        matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("2147483647")) || {
            eprintln!("not refused: {r:?}");
            false
        }
    };
    sem.add_permits(max).await.unwrap();
    assert!(refused(sem.add_permits(max).await), "add past the top");
    assert!(refused(sem.add_permits(1).await), "add past the top");
    assert!(refused(sem.release(1).await), "release past the top");
    assert_eq!(
        get(&raw, "range").await.as_deref(),
        Some("2147483647"),
        "unchanged"
    );

    // Down to Java's smallest int, and no further.
    sem.add_permits(-max).await.unwrap();
    sem.add_permits(-max).await.unwrap();
    sem.add_permits(-1).await.unwrap();
    assert_eq!(sem.available_permits().await.unwrap(), i64::from(i32::MIN));
    assert!(refused(sem.add_permits(-1).await), "add past the bottom");
    assert_eq!(
        get(&raw, "range").await.as_deref(),
        Some("-2147483648"),
        "unchanged"
    );
    sem.release(MAX_PERMITS).await.unwrap();
    assert_eq!(sem.available_permits().await.unwrap(), -1);
    // Only the first add announced a positive count; the refused calls announced nothing.
    let seen = drain(&mut messages, Duration::from_millis(500)).await;
    assert_eq!(seen, ["2147483647"]);
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_key_of_another_type_is_refused_and_left_alone() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server.url()).await;
    let _: () = raw.hset("hash", ("field", "1")).await.unwrap();
    let _: () = raw.set("text", "many", None, None, false).await.unwrap();
    for key in ["hash", "text"] {
        let sem = client.semaphore(key);
        let wrong = |r: Result<(), Error>| matches!(r, Err(Error::WrongType { .. }));
        assert!(
            wrong(sem.try_acquire().await.map(drop)),
            "{key}: try_acquire"
        );
        assert!(
            wrong(
                sem.try_acquire_for(Duration::from_millis(300))
                    .await
                    .map(drop)
            ),
            "{key}: try_acquire_for"
        );
        assert!(wrong(sem.release(1).await), "{key}: release");
        assert!(wrong(sem.add_permits(1).await), "{key}: add_permits");
        assert!(
            wrong(sem.try_set_permits(1).await.map(drop)),
            "{key}: try_set_permits"
        );
        assert!(
            wrong(sem.available_permits().await.map(drop)),
            "{key}: available"
        );
    }
    let fields: std::collections::HashMap<String, String> = raw.hgetall("hash").await.unwrap();
    assert_eq!(fields.len(), 1);
    assert_eq!(fields["field"], "1");
    assert_eq!(get(&raw, "text").await.as_deref(), Some("many"));
    client.shutdown().await.unwrap();
}

/// A Redisson `RSemaphore` peer, written for these tests from the protocol's steps
/// (docs/WIRE.md, "Semaphore"): `tryAcquire(p)` and `release(p)` as a Java client runs them.
const PEER_TRY_ACQUIRE: &str = r#"
local free = redis.call('get', KEYS[1])
if free ~= false and tonumber(free) >= tonumber(ARGV[1]) then
    redis.call('decrby', KEYS[1], ARGV[1])
    return 1
end
return 0
"#;
const PEER_RELEASE: &str = r#"
local now = redis.call('incrby', KEYS[1], ARGV[1])
redis.call(ARGV[2], KEYS[2], now)
"#;

async fn peer_try_acquire(raw: &fred::clients::Client, sem: &Semaphore, permits: u32) -> bool {
    let got: i64 = raw
        .eval(PEER_TRY_ACQUIRE, vec![sem.key()], vec![permits.to_string()])
        .await
        .unwrap();
    got == 1
}

async fn peer_release(raw: &fred::clients::Client, sem: &Semaphore, permits: i64) {
    let _: Value = raw
        .eval(
            PEER_RELEASE,
            vec![sem.key(), sem.channel()],
            vec![permits.to_string(), "PUBLISH".to_owned()],
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn a_redisson_peer_shares_the_permits_both_ways() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server.url()).await;
    let sem = client
        .semaphore("shared")
        .with_recheck_interval(NO_RECHECK)
        .unwrap();
    sem.try_set_permits(2).await.unwrap();

    // The peer takes both; we wait, and the peer's release (its message: the new count)
    // wakes us at once.
    assert!(peer_try_acquire(&raw, &sem, 2).await);
    assert!(!kept(sem.try_acquire().await.unwrap()));
    let before = support::script_calls(&raw).await;
    let waiter = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.acquire().await.map(SemaphorePermit::forget) })
    };
    support::parked_fresh(&raw, sem.channel(), before).await;
    peer_release(&raw, &sem, 1).await;
    tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("the peer's release wakes us")
        .unwrap()
        .unwrap();

    // We hold one, the peer one: the peer is refused until we release, then gets it.
    assert!(!peer_try_acquire(&raw, &sem, 1).await);
    sem.release(1).await.unwrap();
    assert!(peer_try_acquire(&raw, &sem, 1).await);

    // Redisson publishes counts that are not positive; they wake nobody and break nothing.
    sem.add_permits(-2).await.unwrap();
    peer_release(&raw, &sem, 1).await; // publishes "-1"
    peer_release(&raw, &sem, 1).await; // publishes "0"
                                       // The first waiter's subscription is gone, so this one is a fresh waiter too.
    let unsubscribed = eventually(Duration::from_secs(20), || async {
        numsub(&raw, sem.channel()).await == 0
    })
    .await;
    assert!(unsubscribed, "the first waiter's subscription ended");
    let before = support::script_calls(&raw).await;
    let waiter = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.acquire_many(2).await.map(SemaphorePermit::forget) })
    };
    support::parked_fresh(&raw, sem.channel(), before).await;
    peer_release(&raw, &sem, 2).await; // publishes "2"
    tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("woken by the positive count")
        .unwrap()
        .unwrap();
    assert_eq!(sem.available_permits().await.unwrap(), 0);
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphores_work_on_a_cluster() {
    let cluster = support::cluster::RedisCluster::start(3, 0);
    let a = client(&cluster.url()).await;
    let b = client(&cluster.url()).await;
    let mut nodes = Vec::new();
    for node in &cluster.nodes {
        nodes.push(node.raw().await);
    }
    // The node serving `name`'s slot, where its scripts run.
    let serving = |name: &str| {
        let port = cluster.primary_for_slot(fred::util::redis_keyslot(name.as_bytes()));
        let at = cluster.nodes.iter().position(|n| n.port == port).unwrap();
        nodes[at].clone()
    };
    for name in ["pool-a", "pool-b", "{tag}:pool"] {
        let scripts_on = serving(name);
        let sem = a.semaphore(name);
        assert!(sem.try_set_permits(1).await.unwrap());
        assert!(kept(sem.try_acquire().await.unwrap()));
        let waiter = b.semaphore(name).with_recheck_interval(NO_RECHECK).unwrap();
        let before = support::script_calls(&scripts_on).await;
        let task = tokio::spawn(async move { waiter.acquire().await.map(SemaphorePermit::forget) });
        // Parked (subscribed, and its attempt after subscribing found nothing) before the
        // release: only the message can wake it.
        support::parked_fresh_across(&nodes, &scripts_on, sem.channel(), before).await;
        sem.release(1).await.unwrap();
        tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("woken by the release message")
            .unwrap()
            .unwrap();
        assert_eq!(sem.available_permits().await.unwrap(), 0);

        // The leased semaphore of the same name shares the counter (now 0); its three keys
        // share the name's slot, and its waiters wake too.
        let leased = a.leased_semaphore(name);
        leased.add_permits(1).await.unwrap();
        let held = leased.acquire().await.unwrap();
        let waiter = b
            .leased_semaphore(name)
            .with_recheck_interval(NO_RECHECK)
            .unwrap();
        let before = support::script_calls(&scripts_on).await;
        let task = tokio::spawn(async move { waiter.acquire().await });
        support::parked_fresh_across(&nodes, &scripts_on, leased.channel(), before).await;
        held.release().await.unwrap();
        let permit = tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("woken by the release message")
            .unwrap()
            .unwrap();
        assert!(!permit.is_lost());
        permit.release().await.unwrap();
    }
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}
