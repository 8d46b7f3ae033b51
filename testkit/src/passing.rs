//! Helpers of the tests of a release handed to a parked task of the same client: the baton
//! pass (tests/baton.rs) and the hand-off in memory (tests/cohort.rs).

use std::collections::HashMap;
use std::time::Duration;

use fred::interfaces::HashesInterface;
use redbaton::{Client, Lock};

use super::{command_calls, eventually, RedisServer};

/// How long a waiter may take to park, or to be served.
const BOUND: Duration = Duration::from_secs(10);

/// A client of `server` that hands a lock on at most `passes` times in a row.
pub async fn client(server: &RedisServer, passes: u32) -> Client {
    Client::builder()
        .url(server.url())
        .baton_passes(passes)
        .connect()
        .await
        .unwrap()
}

/// How many times the server has run command `name` (inside scripts too).
pub async fn calls(raw: &fred::clients::Client, name: &str) -> u64 {
    command_calls(raw).await.get(name).copied().unwrap_or(0)
}

/// The lock's hash: owner field → count.
pub async fn fields(raw: &fred::clients::Client, key: &str) -> HashMap<String, i64> {
    raw.hgetall(key).await.unwrap()
}

/// Waits (bounded) until `n` tasks are parked on `lock` where a release can hand it to them.
pub async fn parked(lock: &Lock, n: usize) {
    assert!(
        eventually(BOUND, || async { lock.passable_waiters() == n }).await,
        "{n} waiter(s) never parked (now {})",
        lock.passable_waiters()
    );
}

/// A waiter's task, joined within the bound.
pub async fn joined<T>(task: tokio::task::JoinHandle<T>) -> T {
    tokio::time::timeout(BOUND, task)
        .await
        .expect("the waiter was served in time")
        .unwrap()
}
