//! `Lock::state` and `ReadWriteLock::state`: owners with counts, a read/write lock's mode,
//! remaining lease, subscribers on the channel (classic and sharded pub/sub), and refusal of
//! keys that are not locks.

use testkit as support;

use std::time::Duration;

use fred::prelude::*;
use redbaton::{Client, Error, LockState, PubSubMode, ReadWriteMode};
use support::{eventually, RedisServer};

async fn client(server: &RedisServer, mode: PubSubMode) -> Client {
    Client::builder()
        .url(server.url())
        .pubsub(mode)
        .connect()
        .await
        .unwrap()
}

async fn owners_counts_ttl_and_waiters(mode: PubSubMode) {
    let server = RedisServer::start();
    let holder = client(&server, mode).await;
    let waiter = client(&server, mode).await;
    let lock = holder.lock("state");

    let free = lock.state().await.unwrap();
    assert!(!free.is_locked());
    assert_eq!(
        (free.ttl, free.subscribers, free.hold_count()),
        (None, 0, 0)
    );

    let g1 = lock.lock().await.unwrap();
    let g2 = g1.reenter().await.unwrap();
    let state = lock.state().await.unwrap();
    let holds: Vec<_> = state
        .owners
        .iter()
        .map(|h| (&h.owner, h.count, h.mode))
        .collect();
    assert_eq!(holds, vec![(&g1.owner().to_string(), 2, None)]);
    assert_eq!(state.mode, None);
    assert_eq!(state.hold_count(), 2);
    let ttl = state.ttl.unwrap();
    assert!(
        ttl > Duration::from_secs(25) && ttl <= Duration::from_secs(30),
        "{ttl:?}"
    );
    assert_eq!(state.subscribers, 0);

    // Two tasks of one process waiting share one subscription: one subscriber connection.
    let waiting: Vec<_> = (0..2)
        .map(|_| {
            let lock = waiter.lock("state");
            tokio::spawn(async move { lock.lock().await.unwrap().unlock().await.unwrap() })
        })
        .collect();
    let seen = eventually(Duration::from_secs(10), || async {
        lock.state().await.unwrap().subscribers == 1
    })
    .await;
    assert!(
        seen,
        "{mode:?}: the waiting process shows as one subscriber"
    );

    g2.unlock().await.unwrap();
    g1.unlock().await.unwrap();
    for task in waiting {
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("waiters get the lock")
            .unwrap();
    }
    holder.shutdown().await.unwrap();
    waiter.shutdown().await.unwrap();
}

#[tokio::test]
async fn state_classic() {
    owners_counts_ttl_and_waiters(PubSubMode::Classic).await;
}

#[tokio::test]
async fn state_sharded_counts_shard_subscribers() {
    if !support::servers::supports(support::servers::Feature::ShardedPubSub, None) {
        return;
    }
    owners_counts_ttl_and_waiters(PubSubMode::Sharded).await;
}

#[tokio::test]
async fn state_refuses_keys_that_are_not_locks() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server, PubSubMode::Classic).await;
    let () = raw.set("text", "v", None, None, false).await.unwrap();
    let () = raw.hset("plain-hash", ("f", 1)).await.unwrap();
    // A hash with an expiry, but a field no lock has.
    let () = raw.hset("odd-hash", ("f", 1)).await.unwrap();
    let () = raw.pexpire("odd-hash", 60_000, None).await.unwrap();
    for key in ["text", "plain-hash", "odd-hash"] {
        let err = client.lock(key).state().await.unwrap_err();
        assert!(matches!(err, Error::WrongType { .. }), "{key}: {err:?}");
    }
    let err = client.lock("").state().await.unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    client.shutdown().await.unwrap();
    assert_eq!(client.lock("x").state().await.unwrap_err(), Error::ShutDown);
}

/// The holds of `state` as (owner, count, half), to compare at once.
fn holds(state: &LockState) -> Vec<(String, u64, Option<ReadWriteMode>)> {
    state
        .owners
        .iter()
        .map(|h| (h.owner.clone(), h.count, h.mode))
        .collect()
}

/// A read/write lock's state names its mode and each hold's half; its `mode` field is not an
/// owner, whether read through the read/write lock or as a plain lock hash.
#[tokio::test]
async fn read_write_lock_state_has_its_mode_and_halves() {
    let server = RedisServer::start();
    let waiter = client(&server, PubSubMode::Classic).await;
    let client = client(&server, PubSubMode::Classic).await;
    let rw = client.read_write_lock("rw-state");

    let free = rw.state().await.unwrap();
    assert_eq!((free.mode, free.owners.len(), free.ttl), (None, 0, None));

    let r1 = rw.read().lock().await.unwrap();
    let r2 = rw.read().lock().await.unwrap();
    let again = r1.reenter().await.unwrap();
    let state = rw.state().await.unwrap();
    assert_eq!(state.mode, Some(ReadWriteMode::Read));
    let mut readers = vec![
        (r1.owner().to_string(), 2, Some(ReadWriteMode::Read)),
        (r2.owner().to_string(), 1, Some(ReadWriteMode::Read)),
    ];
    readers.sort();
    assert_eq!(holds(&state), readers);
    assert_eq!(state.hold_count(), 3);
    assert!(state.ttl.is_some());
    // Read as a plain lock hash, the same holds and mode.
    let as_lock = client.lock("rw-state").state().await.unwrap();
    assert_eq!((holds(&as_lock), as_lock.mode), (readers, state.mode));
    again.unlock().await.unwrap();
    r1.unlock().await.unwrap();
    r2.unlock().await.unwrap();

    // A writer that downgrades holds both halves: listed once for each, the read hold first
    // whatever the counts.
    let w = rw.write().lock().await.unwrap();
    let read = rw.read();
    let r = w.run(|| read.lock()).await.unwrap().unwrap();
    let r2 = r.reenter().await.unwrap();
    let state = rw.state().await.unwrap();
    assert_eq!(state.mode, Some(ReadWriteMode::Write));
    assert_eq!(
        holds(&state),
        vec![
            (w.owner().to_string(), 2, Some(ReadWriteMode::Read)),
            (w.owner().to_string(), 1, Some(ReadWriteMode::Write)),
        ]
    );
    r2.unlock().await.unwrap();

    // A waiter elsewhere shows on the read/write lock's channel, not on the plain lock's.
    let other = waiter.read_write_lock("rw-state");
    let waiting = tokio::spawn(async move { other.write().lock().await.unwrap().unlock().await });
    let seen = eventually(Duration::from_secs(10), || async {
        rw.state().await.unwrap().subscribers == 1
    })
    .await;
    assert!(seen, "the waiting process shows as one subscriber");
    assert_eq!(
        client.lock("rw-state").state().await.unwrap().subscribers,
        0
    );
    r.unlock().await.unwrap();
    w.unlock().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter gets the lock")
        .unwrap()
        .unwrap();
    client.shutdown().await.unwrap();
    waiter.shutdown().await.unwrap();
}

/// The owner fields of the peers that share redbaton's locks, each in its own format:
/// Redisson's `<client uuid>:<thread id>` and node-redisson's default `<client uuid>:<lock
/// uuid>`.
const PEER_FIELDS: [(&str, &str); 2] = [
    ("Redisson", "157ddcf5-0cc2-445d-bdea-98160a459bd5:42"),
    (
        "node-redisson",
        "0c5f3b0e-3a7d-4c1e-9a57-1b1d2f6a8e44:6f9c2d7a-48e1-4b0f-bc3e-5d8a9e1f2c37",
    ),
];

/// A lock held by a peer, whatever its owner format, is reported with the owner field as it
/// is, for every kind kept in a hash (a lock, which a fenced lock is; a fair lock, with a queue;
/// a read/write lock in either mode), and force-unlocked.
#[tokio::test]
async fn foreign_owners_are_reported_as_they_are() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server, PubSubMode::Classic).await;
    for (peer, field) in PEER_FIELDS {
        // A lock (or fenced lock) held twice, and a fair lock with that owner queued too.
        for name in ["foreign:lock", "foreign:fair"] {
            let () = raw.hset(name, (field, 2)).await.unwrap();
            let () = raw.pexpire(name, 60_000, None).await.unwrap();
            if name == "foreign:fair" {
                let queue = client.fair_lock(name).queue_key().to_owned();
                let _: i64 = raw.rpush(&queue, field).await.unwrap();
            }
            let state = client
                .lock(name)
                .state()
                .await
                .unwrap_or_else(|e| panic!("{peer} {name}: {e:?}"));
            assert_eq!(holds(&state), vec![(field.to_owned(), 2, None)], "{peer}");
            assert!(
                client.lock(name).force_unlock().await.unwrap(),
                "{peer} {name}"
            );
            let _: i64 = raw.del(client.fair_lock(name).queue_key()).await.unwrap();
        }
        // A read/write lock: a reader in read mode; a writer that also reads in write mode.
        let name = "foreign:rw";
        let () = raw
            .hset(name, [("mode", "read"), (field, "1")])
            .await
            .unwrap();
        let () = raw.pexpire(name, 60_000, None).await.unwrap();
        let rw = client.read_write_lock(name);
        let state = rw.state().await.unwrap_or_else(|e| panic!("{peer}: {e:?}"));
        assert_eq!(
            holds(&state),
            vec![(field.to_owned(), 1, Some(ReadWriteMode::Read))],
            "{peer}"
        );
        let writer = format!("{field}:write");
        let () = raw
            .hset(name, [("mode", "write"), (writer.as_str(), "1")])
            .await
            .unwrap();
        let state = rw.state().await.unwrap_or_else(|e| panic!("{peer}: {e:?}"));
        assert_eq!(state.mode, Some(ReadWriteMode::Write), "{peer}");
        assert_eq!(
            holds(&state),
            vec![
                (field.to_owned(), 1, Some(ReadWriteMode::Read)),
                (field.to_owned(), 1, Some(ReadWriteMode::Write)),
            ],
            "{peer}"
        );
        assert!(rw.write().force_unlock().await.unwrap(), "{peer}");
    }
    client.shutdown().await.unwrap();
}
