//! Bad input: odd and oversized names, out-of-range leases and waits, keys that are not
//! locks, second releases, use after shutdown, owner ids. Each refusal is a typed
//! [`redbaton::Error`] with a clear message, and leaves Redis exactly as it was.

use testkit as support;

use std::collections::BTreeMap;
use std::time::Duration;

use fred::prelude::*;
use fred::types::CustomCommand;
use redbaton::{Client, Error, Owner, MAX_LEASE, MAX_NAME_LEN};
use support::{command_calls, RedisServer};
use tokio::time::Instant;

/// Every key with its serialized value and whether it has a TTL: equal snapshots mean
/// nothing changed.
async fn snapshot(raw: &fred::clients::Client) -> BTreeMap<Vec<u8>, (Vec<u8>, bool)> {
    let keys: Vec<Value> = raw
        .custom(CustomCommand::new_static("KEYS", None, false), vec!["*"])
        .await
        .unwrap();
    let mut out = BTreeMap::new();
    for key in keys {
        let key = key.as_bytes().unwrap().to_vec();
        let dump: Value = raw
            .custom(
                CustomCommand::new_static("DUMP", None, false),
                vec![Value::from(key.as_slice())],
            )
            .await
            .unwrap();
        let pttl: i64 = raw.pttl(key.as_slice()).await.unwrap();
        out.insert(
            key,
            (dump.as_bytes().unwrap_or_default().to_vec(), pttl >= 0),
        );
    }
    out
}

/// Commands sent so far, by name.
async fn calls(raw: &fred::clients::Client) -> u64 {
    let stats = command_calls(raw).await;
    stats
        .iter()
        .filter(|(name, _)| !name.starts_with("info") && !name.starts_with("keys"))
        .filter(|(name, _)| !name.starts_with("dump") && !name.starts_with("pttl"))
        .map(|(_, n)| n)
        .sum()
}

fn invalid(result: redbaton::Result<impl std::fmt::Debug>, needle: &str) {
    match result {
        Err(Error::InvalidArgument(message)) => {
            assert!(
                message.contains(needle),
                "message {message:?} should mention {needle:?}"
            );
        }
        other => panic!("expected InvalidArgument({needle}), got {other:?}"),
    }
}

#[tokio::test]
async fn empty_and_oversized_names_are_refused_before_anything_is_sent() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = Client::connect(&server.url()).await.unwrap();
    let before = snapshot(&raw).await;
    let sent = calls(&raw).await;
    let oversized = "x".repeat(MAX_NAME_LEN + 1);
    for (name, needle) in [("", "empty"), (oversized.as_str(), "limit")] {
        let lock = client.lock(name);
        invalid(lock.lock().await, needle);
        invalid(lock.try_lock().await, needle);
        invalid(lock.try_lock_for(Duration::from_secs(1)).await, needle);
        invalid(lock.lock_with_lease(Duration::from_secs(1)).await, needle);
        invalid(
            lock.try_lock_with_lease(Duration::from_secs(1), Duration::from_secs(1))
                .await,
            needle,
        );
        invalid(lock.hold_count().await, needle);
        invalid(lock.is_locked().await, needle);
        invalid(lock.is_held_in_scope().await, needle);
        invalid(lock.remaining_ttl().await, needle);
        invalid(lock.force_unlock().await, needle);
    }
    let message = client.lock("").lock().await.unwrap_err().to_string();
    assert_eq!(message, "invalid argument: lock name is empty");
    assert_eq!(sent, calls(&raw).await, "nothing was sent to Redis");
    assert_eq!(before, snapshot(&raw).await);
    client.shutdown().await.unwrap();
}

/// Names with spaces, braces, quotes, newlines, NUL bytes, non-ASCII and the maximum length
/// all work: lock, exclusion, wake-up on their channel, release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_names_lock_wake_and_release() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = Client::connect(&server.url()).await.unwrap();
    let other = Client::connect(&server.url()).await.unwrap();
    let longest = "n".repeat(MAX_NAME_LEN);
    let names = [
        "with space",
        "{braces}",
        "}{",
        "a{b}c",
        "{",
        "quo\"te's`",
        "new\nline\r\n",
        "nul\0byte",
        "ünïcødé 🔒",
        "*?[glob]",
        longest.as_str(),
    ];
    for name in names {
        let shown = &name[..name.len().min(20)];
        let lock = client.lock(name);
        let guard = lock.lock().await.unwrap();
        let owner = guard.owner().to_string();
        let held: bool = raw.hexists(name.as_bytes(), owner.as_str()).await.unwrap();
        assert!(held, "{shown:?}: the hash is at the exact name");
        support::assert_release_wakes(guard, other.lock(name), &format!("{shown:?}")).await;
        let exists: i64 = raw.exists(name.as_bytes()).await.unwrap();
        assert_eq!(exists, 0, "{shown:?}");
    }
    client.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

#[tokio::test]
async fn leases_out_of_range_are_refused_and_the_extremes_work() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = Client::connect(&server.url()).await.unwrap();
    let lock = client.lock("lease");
    let before = snapshot(&raw).await;
    let sent = calls(&raw).await;
    invalid(
        lock.lock_with_lease(Duration::ZERO).await,
        "shorter than 10ms",
    );
    invalid(
        lock.lock_with_lease(redbaton::MIN_LEASE - Duration::from_micros(1))
            .await,
        "shorter than 10ms",
    );
    invalid(
        lock.lock_with_lease(MAX_LEASE + Duration::from_millis(1))
            .await,
        "longer than Redis accepts",
    );
    invalid(
        lock.lock_with_lease(Duration::MAX).await,
        "longer than Redis accepts",
    );
    invalid(
        lock.try_lock_with_lease(Duration::ZERO, Duration::ZERO)
            .await,
        "shorter than 10ms",
    );
    invalid(
        lock.try_lock_with_lease(Duration::MAX, Duration::MAX).await,
        "longer than Redis accepts",
    );
    assert_eq!(sent, calls(&raw).await, "nothing was sent to Redis");
    assert_eq!(before, snapshot(&raw).await);

    // The extremes that are accepted work.
    let guard = lock.lock_with_lease(MAX_LEASE).await.unwrap();
    let pttl: i64 = raw.pttl("lease").await.unwrap();
    assert!(pttl > i64::MAX / 4, "{pttl}");
    assert!(!guard.is_lost());
    guard.unlock().await.unwrap();
    let guard = lock.lock_with_lease(redbaton::MIN_LEASE).await.unwrap();
    tokio::time::sleep(redbaton::MIN_LEASE * 3).await;
    assert!(guard.is_lost());
    assert!(
        !lock.is_locked().await.unwrap(),
        "the shortest lease expired"
    );
    drop(guard);

    // Watchdog lease and timeouts are checked when connecting.
    for (lease, timeout) in [
        (Duration::ZERO, Duration::from_secs(1)),
        (Duration::from_millis(99), Duration::from_secs(1)),
        (Duration::MAX, Duration::from_secs(1)),
        (Duration::from_secs(1), Duration::ZERO),
        (Duration::from_secs(1), Duration::MAX),
    ] {
        let result = Client::builder()
            .url(server.url())
            .watchdog_lease(lease)
            .command_timeout(timeout)
            .connect()
            .await;
        assert!(
            matches!(result, Err(Error::InvalidArgument(_))),
            "lease {lease:?} timeout {timeout:?}: {result:?}"
        );
    }
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_and_endless_waits() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = Client::connect(&server.url()).await.unwrap();
    let other = Client::connect(&server.url()).await.unwrap();
    let held = other.lock("wait").lock().await.unwrap();
    let lock = client.lock("wait");

    let evalsha = |stats: std::collections::HashMap<String, u64>| stats.get("evalsha").copied();
    let before = evalsha(command_calls(&raw).await);
    let start = Instant::now();
    assert!(lock.try_lock_for(Duration::ZERO).await.unwrap().is_none());
    assert!(lock
        .try_lock_with_lease(Duration::ZERO, Duration::from_secs(5))
        .await
        .unwrap()
        .is_none());
    // No waiting (the holder's lease is 30 s); generous for a loaded machine.
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    let after = evalsha(command_calls(&raw).await);
    assert_eq!(
        after.unwrap_or(0) - before.unwrap_or(0),
        2,
        "a zero wait is exactly one attempt"
    );

    // Duration::MAX waits without a deadline (and without overflowing one).
    let endless = {
        let lock = lock.clone();
        tokio::spawn(async move {
            let guard = lock.try_lock_for(Duration::MAX).await.unwrap();
            guard.expect("acquired").unlock().await
        })
    };
    let endless_fixed = {
        let lock = lock.clone();
        tokio::spawn(async move {
            let guard = lock
                .try_lock_with_lease(Duration::MAX, Duration::from_secs(5))
                .await
                .unwrap();
            guard.expect("acquired").unlock().await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!endless.is_finished() && !endless_fixed.is_finished());
    held.unlock().await.unwrap();
    // Each waiter releases in its own task, so they hand the lock to each other.
    for task in [endless, endless_fixed] {
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("an endless wait ends when the lock is free")
            .unwrap()
            .unwrap();
    }
    client.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

fn wrong_type(result: redbaton::Result<impl std::fmt::Debug>, name: &str) -> String {
    match result {
        Err(err @ Error::WrongType { .. }) => {
            let Error::WrongType { name: got, .. } = &err else {
                unreachable!()
            };
            assert_eq!(got, name);
            let message = err.to_string();
            assert!(
                message.contains(name) && message.contains("not a lock"),
                "{message}"
            );
            message
        }
        other => panic!("expected WrongType for {name}, got {other:?}"),
    }
}

/// A key holding a string, a list, or a hash without a TTL is not a lock: every operation
/// says so with `Error::WrongType`, and the key is left exactly as it was.
#[tokio::test]
async fn keys_that_are_not_locks_give_wrong_type_and_stay_untouched() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = Client::connect(&server.url()).await.unwrap();
    let _: () = raw
        .set("a-string", "payload", None, None, false)
        .await
        .unwrap();
    let _: () = raw
        .set(
            "a-string-ttl",
            "payload",
            Some(Expiration::EX(600)),
            None,
            false,
        )
        .await
        .unwrap();
    let _: i64 = raw.rpush("a-list", vec!["x", "y"]).await.unwrap();
    let _: () = raw.hset("a-hash", ("field", "value")).await.unwrap();
    let before = snapshot(&raw).await;

    for name in ["a-string", "a-string-ttl", "a-list", "a-hash"] {
        let lock = client.lock(name);
        let within = Duration::from_secs(5);
        let message = wrong_type(
            tokio::time::timeout(within, lock.lock())
                .await
                .expect("no hang"),
            name,
        );
        println!("{message}");
        wrong_type(lock.try_lock().await, name);
        wrong_type(
            tokio::time::timeout(within, lock.try_lock_for(Duration::from_secs(2)))
                .await
                .expect("no hang"),
            name,
        );
        wrong_type(lock.lock_with_lease(Duration::from_secs(5)).await, name);
        wrong_type(lock.force_unlock().await, name);
        if name != "a-hash" {
            // Without an owner nothing is read: ask as one.
            let owned = lock.with_owner(format!("{}:1", client.id()).parse().unwrap());
            wrong_type(owned.hold_count().await, name);
            wrong_type(owned.is_held_in_scope().await, name);
        }
        if name != "a-string-ttl" {
            wrong_type(lock.remaining_ttl().await, name);
        }
    }
    assert_eq!(before, snapshot(&raw).await, "nothing changed in Redis");
    client.shutdown().await.unwrap();
}

/// A hash with a TTL that is not ours cannot be told from another owner's lock: it is
/// treated as held (and left alone) until it expires.
#[tokio::test]
async fn a_foreign_hash_with_a_ttl_counts_as_held() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = Client::connect(&server.url()).await.unwrap();
    let _: () = raw.hset("foreign", ("field", "value")).await.unwrap();
    let _: () = raw.pexpire("foreign", 600_000, None).await.unwrap();
    let before = snapshot(&raw).await;
    let lock = client.lock("foreign");
    assert!(lock.try_lock().await.unwrap().is_none());
    assert!(lock
        .try_lock_for(Duration::from_millis(200))
        .await
        .unwrap()
        .is_none());
    assert_eq!(lock.hold_count().await.unwrap(), 0);
    assert!(lock.is_locked().await.unwrap());
    assert_eq!(before, snapshot(&raw).await, "nothing changed in Redis");
    client.shutdown().await.unwrap();
}

/// The second-release paths a guard allows: after a force-unlock, after expiry, and after
/// expiry when the same owner has taken the lock again (the stale guard must not release
/// the newer hold).
#[tokio::test]
async fn releasing_a_hold_that_is_gone_is_not_held_and_changes_nothing() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = Client::connect(&server.url()).await.unwrap();
    let other = Client::connect(&server.url()).await.unwrap();
    let not_held = |name: &str| {
        Err(Error::NotHeld {
            name: name.to_owned(),
        })
    };

    // After force_unlock, with another client holding it anew.
    let lock = client.lock("twice");
    let guard = lock.lock().await.unwrap();
    assert!(other.lock("twice").force_unlock().await.unwrap());
    let taken = other.lock("twice").try_lock().await.unwrap().unwrap();
    let before = snapshot(&raw).await;
    let err = guard.unlock().await;
    assert_eq!(err, not_held("twice"));
    assert_eq!(
        err.unwrap_err().to_string(),
        "lock \"twice\" is not held by this owner (expired, force-unlocked or never taken)"
    );
    assert_eq!(
        before,
        snapshot(&raw).await,
        "the other client's hold is intact"
    );
    taken.unlock().await.unwrap();

    // After expiry, with another client holding it anew.
    let guard = lock
        .lock_with_lease(Duration::from_millis(200))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let taken = other.lock("twice").try_lock().await.unwrap().unwrap();
    let before = snapshot(&raw).await;
    assert_eq!(guard.unlock().await, not_held("twice"));
    assert_eq!(before, snapshot(&raw).await);
    taken.unlock().await.unwrap();

    // After expiry, with the same owner holding it anew (taken in the stale hold's scope).
    let stale = lock
        .lock_with_lease(Duration::from_millis(200))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let fresh = stale.run(|| lock.lock()).await;
    assert!(matches!(fresh, Err(Error::LeaseLost { .. })), "{fresh:?}");
    let fresh = lock.with_owner(stale.owner()).lock().await.unwrap();
    assert_eq!(stale.owner(), fresh.owner());
    let owned = lock.with_owner(fresh.owner());
    let before = snapshot(&raw).await;
    assert_eq!(stale.unlock().await, not_held("twice"));
    assert_eq!(before, snapshot(&raw).await, "the newer hold is untouched");
    assert_eq!(owned.hold_count().await.unwrap(), 1);
    fresh.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());

    // A dropped stale guard is just as harmless.
    let stale = lock
        .lock_with_lease(Duration::from_millis(200))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let fresh = lock.with_owner(stale.owner()).lock().await.unwrap();
    drop(stale);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        lock.with_owner(fresh.owner()).hold_count().await.unwrap(),
        1
    );
    fresh.unlock().await.unwrap();

    client.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

#[tokio::test]
async fn guards_and_locks_after_shutdown_say_shut_down() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = Client::connect(&server.url()).await.unwrap();
    let lock = client.lock("after-shutdown");
    let first = lock.lock().await.unwrap();
    let second = first.reenter().await.unwrap();
    client.shutdown().await.unwrap();
    let before = snapshot(&raw).await;
    assert!(before.is_empty(), "shutdown released the lock");
    assert!(first.is_lost());
    assert_eq!(first.unlock().await, Err(Error::ShutDown));
    drop(second);
    assert_eq!(lock.lock().await.unwrap_err(), Error::ShutDown);
    assert_eq!(lock.try_lock().await.unwrap_err(), Error::ShutDown);
    assert_eq!(lock.hold_count().await.unwrap_err(), Error::ShutDown);
    assert_eq!(lock.force_unlock().await.unwrap_err(), Error::ShutDown);
    assert_eq!(
        client
            .lock("new")
            .is_locked()
            .await
            .unwrap_err()
            .to_string(),
        "the client was shut down"
    );
    client.shutdown().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        before,
        snapshot(&raw).await,
        "nothing was sent after shutdown"
    );
}

#[tokio::test]
async fn owner_ids_are_random_uuid_v4() {
    let server = RedisServer::start();
    let mut ids = std::collections::HashSet::new();
    for _ in 0..4 {
        let client = Client::connect(&server.url()).await.unwrap();
        let id = uuid::Uuid::parse_str(client.id()).expect("a UUID");
        assert_eq!(id.get_version(), Some(uuid::Version::Random));
        assert_eq!(id.get_variant(), uuid::Variant::RFC4122);
        assert!(ids.insert(id), "distinct per client");
        let guard = client.lock("ids").lock().await.unwrap();
        assert_eq!(guard.owner().client_id(), client.id());
        guard.unlock().await.unwrap();
        client.shutdown().await.unwrap();
    }
    for bad in [
        "",
        "no-colon",
        "uuid:",
        ":7",
        "uuid:-1",
        "uuid:x",
        "has space:1",
    ] {
        assert!(
            matches!(bad.parse::<Owner>(), Err(Error::InvalidArgument(_))),
            "{bad:?}"
        );
    }
}

/// Under a key prefix, every kind still names its lock as the caller did — in `name()` and in
/// the errors of a release that finds its hold gone — however the kind derives its keys from
/// the name (a leased semaphore's engine key is `{<prefix><name>}:timeout`).
#[tokio::test]
async fn every_kind_names_its_lock_as_given_under_a_key_prefix() {
    let server = RedisServer::start();
    let client = Client::builder()
        .url(server.url())
        .key_prefix("app:")
        .connect()
        .await
        .unwrap();
    let not_held = |name: &str| {
        Err(Error::NotHeld {
            name: name.to_owned(),
        })
    };

    let lock = client.lock("orders");
    assert_eq!((lock.name(), lock.key()), ("orders", "app:orders"));
    let guard = lock.lock().await.unwrap();
    assert!(lock.force_unlock().await.unwrap());
    assert_eq!(guard.unlock().await, not_held("orders"));

    let fair = client.fair_lock("queue");
    assert_eq!((fair.name(), fair.key()), ("queue", "app:queue"));
    let guard = fair.lock().await.unwrap();
    assert!(fair.force_unlock().await.unwrap());
    assert_eq!(guard.unlock().await, not_held("queue"));

    let fenced = client.fenced_lock("ledger");
    let guard = fenced.lock().await.unwrap();
    assert!(fenced.force_unlock().await.unwrap());
    assert_eq!(guard.unlock().await, not_held("ledger"));

    let rw = client.read_write_lock("{cfg}:rw");
    assert_eq!((rw.name(), rw.key()), ("{cfg}:rw", "app:{cfg}:rw"));
    let read = rw.read().lock().await.unwrap();
    assert!(rw.read().force_unlock().await.unwrap());
    assert_eq!(read.unlock().await, not_held("{cfg}:rw"));

    let sem = client.semaphore("slots");
    assert_eq!((sem.name(), sem.key()), ("slots", "app:slots"));

    let leased = client.leased_semaphore("gpu");
    assert_eq!(leased.name(), "gpu");
    assert_eq!(leased.timeout_key(), "{app:gpu}:timeout");
    assert!(leased.try_set_permits(1).await.unwrap());
    let permit = leased
        .acquire_with_lease(Duration::from_millis(100))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(permit.release().await, not_held("gpu"));
    client.shutdown().await.unwrap();
}
