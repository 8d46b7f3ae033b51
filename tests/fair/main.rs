//! The fair lock (Redisson's `RFairLock`) against real redis-server processes: FIFO order
//! across processes, waiters that give up (timeout, cancellation, error) leaving the queue at
//! once, a crashed waiter purged after its wait, interplay with a "Redisson peer" running
//! Lua written from docs/WIRE.md ("Fair lock") (both directions), exclusion with the plain lock,
//! and the wire layout.

use testkit as support;

use testkit::redisson_peer;

mod processes;
mod waiters;
mod wire;

use std::future::Future;
use std::io::BufRead;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fred::prelude::*;
use redbaton::{Client, Error, FairLock};
use redisson_peer::FairPeer;
use support::child::{after_tag, child_arg, spawn_child, test_name, ChildProcess};
use support::{eventually, numsub, RedisServer, RENEWED_LEASE};
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
