//! The leased semaphore (Redisson's `RPermitExpirableSemaphore`) against a real redis-server:
//! wire layout, leases that end, the watchdog, lost permits, at most N holders under
//! contention, cancellation, bad input, and a Redisson peer in both directions.

use testkit as support;

mod leases;
mod permits;
mod wire;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fred::clients::SubscriberClient;
use fred::prelude::*;
use fred::types::Message;
use redbaton::{Client, Error, LeasedSemaphore, PermitId, MAX_PERMITS_AT_ONCE};
use support::proxy::{Mode, Proxy};
use support::{eventually, max_held, numsub, settled_calls, RedisServer, RENEWED_LEASE};

/// A recheck timer that never fires within a test: a waiter that gets a permit sooner was
/// woken by a message (or by a lease it was told about).
const NO_RECHECK: Duration = Duration::from_secs(120);

/// Redisson's score for a permit without a lease.
const SENTINEL: i64 = 922_337_203_685_477;

async fn client(url: &str) -> Client {
    Client::connect(url).await.unwrap()
}

/// A client whose watchdog sends nothing between renewals (every 10 s): the tests that count
/// the scripts a waiter sends would count the holds' checks too.
async fn quiet_client(url: &str) -> Client {
    Client::builder()
        .url(url)
        .lease_check_interval(Duration::from_secs(3600))
        .connect()
        .await
        .unwrap()
}

async fn lease_client(url: &str, lease: Duration) -> Client {
    Client::builder()
        .url(url)
        .watchdog_lease(lease)
        .connect()
        .await
        .unwrap()
}

async fn get(raw: &fred::clients::Client, key: &str) -> Option<String> {
    raw.get(key).await.unwrap()
}

/// The server's clock in epoch ms.
async fn server_ms(raw: &fred::clients::Client) -> i64 {
    let time: Vec<String> = raw
        .custom(
            fred::types::CustomCommand::new_static("TIME", None, false),
            Vec::<String>::new(),
        )
        .await
        .unwrap();
    time[0].parse::<i64>().unwrap() * 1000 + time[1].parse::<i64>().unwrap() / 1000
}

/// The local wall clock in epoch ms: what a Java client sends as "now".
fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// The taken permits: (raw id bytes, score).
async fn taken(raw: &fred::clients::Client, key: &str) -> Vec<(Vec<u8>, i64)> {
    let reply: Vec<Value> = raw
        .zrange(key, 0, -1, None, false, None, true)
        .await
        .unwrap();
    reply
        .chunks(2)
        .map(|pair| {
            let score = pair[1].as_string().unwrap();
            (
                pair[0].as_bytes().unwrap().to_vec(),
                score.parse::<f64>().unwrap() as i64,
            )
        })
        .collect()
}

/// Holds one permit of `name` for two watchdog leases and checks, all along, that no other
/// client sees it as free.
async fn watchdog_keeps_a_permit(url: &str, name: &str) {
    let holder = lease_client(url, RENEWED_LEASE).await;
    let other = client(url).await;
    let sem = holder.leased_semaphore(name);
    sem.try_set_permits(1).await.unwrap();
    let permit = sem.acquire().await.unwrap();
    let start = Instant::now();
    while start.elapsed() < RENEWED_LEASE * 2 {
        // available_permits reclaims every permit whose lease ended: this one never has.
        let watcher = other.leased_semaphore(name);
        assert_eq!(watcher.available_permits().await.unwrap(), 0);
        assert!(watcher.try_acquire().await.unwrap().is_none());
        assert!(!permit.is_lost());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    permit.release().await.unwrap();
    assert_eq!(sem.available_permits().await.unwrap(), 1);
    holder.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

/// A Redisson `RPermitExpirableSemaphore` peer, written for these tests from the protocol's
/// steps (docs/WIRE.md, "Leased semaphore"), with a Java client's own clock as "now".
///
/// `tryAcquire(n, lease)`: KEYS = [N, T, C], ARGV = [n, expiry, now, sentinel, publishCmd,
/// id_1 … id_n]; replies "OK", ":<earliest lease end>" or nil.
const PEER_ACQUIRE: &str = r#"
local n = tonumber(ARGV[1])
local now = tonumber(ARGV[3])
local stale = redis.call('zrangebyscore', KEYS[2], 0, now, 'limit', 0, n)
if #stale > 0 then
    redis.call('zrem', KEYS[2], unpack(stale))
    local free = redis.call('incrby', KEYS[1], #stale)
    if free > 0 then
        redis.call(ARGV[5], KEYS[3], free)
    end
end
local free = redis.call('get', KEYS[1])
if free ~= false and tonumber(free) >= n then
    redis.call('decrby', KEYS[1], n)
    for i = 6, #ARGV do
        redis.call('zadd', KEYS[2], ARGV[2], ARGV[i])
    end
    local ttl = redis.call('pttl', KEYS[1])
    if ttl > 0 then
        redis.call('pexpire', KEYS[2], ttl)
    end
    return 'OK'
end
local head = redis.call('zrange', KEYS[2], 0, 0, 'withscores')
if head[2] ~= nil and head[2] ~= ARGV[4] then
    return ':' .. head[2]
end
return nil
"#;

/// `release(id)`: KEYS = [N, C, T], ARGV = [id, 1, now, publishCmd]; replies 1 (released), 0.
const PEER_RELEASE: &str = r#"
local score = redis.call('zscore', KEYS[3], ARGV[1])
if redis.call('zrem', KEYS[3], ARGV[1]) ~= 1 then
    return 0
end
local free = redis.call('incrby', KEYS[1], ARGV[2])
redis.call(ARGV[4], KEYS[2], free)
if tonumber(score) <= tonumber(ARGV[3]) then
    return 0
end
return 1
"#;

/// The peer's `tryAcquire(ids.len(), lease)`; `lease` None is no lease (the sentinel).
async fn peer_acquire(
    raw: &fred::clients::Client,
    sem: &LeasedSemaphore,
    ids: &[[u8; 16]],
    lease: Option<Duration>,
) -> Value {
    let now = wall_ms();
    let expiry = match lease {
        Some(lease) => now + lease.as_millis() as i64,
        None => SENTINEL,
    };
    let mut args: Vec<Value> = vec![
        Value::from(ids.len() as i64),
        Value::from(expiry),
        Value::from(now),
        Value::from(SENTINEL),
        Value::from("PUBLISH"),
    ];
    args.extend(ids.iter().map(|id| Value::from(&id[..])));
    raw.eval(
        PEER_ACQUIRE,
        vec![sem.key(), sem.timeout_key(), sem.channel()],
        args,
    )
    .await
    .unwrap()
}

async fn peer_release(raw: &fred::clients::Client, sem: &LeasedSemaphore, id: &[u8; 16]) -> i64 {
    raw.eval(
        PEER_RELEASE,
        vec![sem.key(), sem.channel(), sem.timeout_key()],
        vec![
            Value::from(&id[..]),
            Value::from(1),
            Value::from(wall_ms()),
            Value::from("PUBLISH"),
        ],
    )
    .await
    .unwrap()
}
