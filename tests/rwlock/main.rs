//! The read/write lock (Redisson's `RReadWriteLock`) against real redis-server: the wire
//! layout, many readers or one writer, wake-ups (the last read unlock wakes a writer, a write
//! unlock wakes every reader), reentry, the downgrade, no upgrade, reader timeout keys and the
//! expiry they drive, dead holders, force-unlock per half, wrong types, renewal, shutdown,
//! cancellation, a contention run checked by history, a cluster, and interleavings with a
//! "Redisson peer" (testkit/src/redisson_peer.rs: Redisson's scripts restated from the fact
//! sheet, driven by raw commands).

use testkit as support;
use testkit::redisson_peer;

mod cancellation;
mod cluster;
mod history;
mod leases;
mod sharing;
mod wire;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::clients::SubscriberClient;
use fred::prelude::*;
use fred::types::Message;
use parking_lot::Mutex;
use redbaton::{Client, Error, Guard, ReadLock, ReadWriteLock, WriteLock};
use redisson_peer::{timeout_key, RedissonPeer};
use support::{eventually, numsub, RedisServer, RENEWED_LEASE};
use tokio::sync::{broadcast, Barrier};

async fn client(server: &RedisServer) -> Client {
    Client::connect(&server.url()).await.unwrap()
}

async fn short_lease_client(server: &RedisServer, lease: Duration) -> Client {
    Client::builder()
        .url(server.url())
        .watchdog_lease(lease)
        .connect()
        .await
        .unwrap()
}

/// A raw subscriber on `channel`, confirmed (a PING came back after the SUBSCRIBE).
async fn subscribe(url: &str, channel: &str) -> (SubscriberClient, broadcast::Receiver<Message>) {
    let subscriber = Builder::from_config(Config::from_url(url).unwrap())
        .build_subscriber_client()
        .unwrap();
    subscriber.init().await.unwrap();
    let messages = subscriber.message_rx();
    subscriber.subscribe(channel).await.unwrap();
    let _: Value = subscriber.ping(None).await.unwrap();
    (subscriber, messages)
}

async fn next_message(messages: &mut broadcast::Receiver<Message>) -> String {
    let message = tokio::time::timeout(Duration::from_secs(5), messages.recv())
        .await
        .expect("a message within 5 s")
        .unwrap();
    message.value.as_string().unwrap()
}

async fn fields(raw: &fred::clients::Client, key: &str) -> HashMap<String, String> {
    raw.hgetall(key).await.unwrap()
}

async fn exists(raw: &fred::clients::Client, key: &str) -> bool {
    let n: i64 = raw.exists(key).await.unwrap();
    n == 1
}

async fn pttl(raw: &fred::clients::Client, key: &str) -> i64 {
    raw.pttl(key).await.unwrap()
}

/// Keys matching `pattern` (KEYS: fine on a test server).
async fn keys(raw: &fred::clients::Client, pattern: &str) -> Vec<String> {
    raw.custom(
        fred::types::CustomCommand::new_static("KEYS", None, false),
        vec![pattern],
    )
    .await
    .unwrap()
}

/// A reader task: takes a read hold, notes when, waits at `barrier` holding it (so a reader
/// gets in only if it was woken itself, never by another reader's release), then releases.
fn spawn_reader(rw: ReadWriteLock, barrier: Arc<Barrier>) -> tokio::task::JoinHandle<Instant> {
    tokio::spawn(async move {
        let guard = rw.read().lock().await.unwrap();
        let at = Instant::now();
        barrier.wait().await;
        guard.unlock().await.unwrap();
        at
    })
}
