//! `Lock::state`: owners with counts, remaining lease, subscribers on the channel (classic and
//! sharded pub/sub), and refusal of keys that are not locks.

mod support;

use std::time::Duration;

use fred::prelude::*;
use redbaton::{Client, Error, PubSubMode};
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
    assert_eq!(state.owners, vec![(g1.owner().to_string(), 2)]);
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
    owners_counts_ttl_and_waiters(PubSubMode::Sharded).await;
}

#[tokio::test]
async fn state_refuses_keys_that_are_not_locks() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server, PubSubMode::Classic).await;
    let () = raw.set("text", "v", None, None, false).await.unwrap();
    let () = raw.hset("plain-hash", ("f", 1)).await.unwrap();
    for key in ["text", "plain-hash"] {
        let err = client.lock(key).state().await.unwrap_err();
        assert!(matches!(err, Error::WrongType { .. }), "{key}: {err:?}");
    }
    let err = client.lock("").state().await.unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    client.shutdown().await.unwrap();
    assert_eq!(client.lock("x").state().await.unwrap_err(), Error::ShutDown);
}
