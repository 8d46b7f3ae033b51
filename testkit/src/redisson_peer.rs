//! A stand-in for a Java service using Redisson's `RReadWriteLock` or `RFairLock`, for
//! interop tests.
//!
//! Its Lua is written for these tests from Redisson's steps in docs/WIRE.md ("Read/write lock":
//! read acquire, read unlock, write acquire, write unlock) — not redbaton's scripts — and takes
//! Redisson's KEYS and ARGV, with Redisson's replies: `nil` when acquired or released, the
//! lock's PTTL when an acquire is refused, 0/1 from an unlock (0: still held, 1: released),
//! `nil` from an unlock by a non-holder. The unlock latch (docs/WIRE.md, "Redisson's unlock latch")
//! is included: each unlock gets a fresh request id, and the peer deletes the latch after the
//! reply, as Redisson does. The peer acts as one Redisson client: its own UUID, and a "thread id"
//! per call.
//!
//! [`FairPeer`] does the same for the fair lock from docs/WIRE.md ("Fair lock": waiting and
//! non-queuing acquire, unlock, `acquireFailed`), with the peer's own clock for the timeout scores.
//!
//! It is driven by raw fred calls (`EVAL`), so nothing of redbaton is involved.
#![allow(dead_code)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fred::prelude::*;
use fred::types::Value;

/// Read acquire — docs/WIRE.md, "Read/write lock", Redisson's read acquire.
/// KEYS = [name, timeoutPrefix]; ARGV = [leaseMs, lockName, lockName:write].
const READ_LOCK: &str = r#"
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call('hset', KEYS[1], 'mode', 'read')
  redis.call('hset', KEYS[1], ARGV[2], 1)
  redis.call('set', KEYS[2] .. ':1', 1)
  redis.call('pexpire', KEYS[2] .. ':1', ARGV[1])
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
if mode == 'read' or (mode == 'write' and redis.call('hexists', KEYS[1], ARGV[3]) == 1) then
  local n = redis.call('hincrby', KEYS[1], ARGV[2], 1)
  local k = KEYS[2] .. ':' .. n
  redis.call('set', k, 1)
  redis.call('pexpire', k, ARGV[1])
  local left = redis.call('pttl', KEYS[1])
  redis.call('pexpire', KEYS[1], math.max(left, tonumber(ARGV[1])))
  return nil
end
return redis.call('pttl', KEYS[1])
"#;

/// Read unlock — docs/WIRE.md, "Read/write lock", Redisson's read unlock, with the latch.
/// KEYS = [name, channel, timeoutPrefix, keyPrefix, latch];
/// ARGV = ["0", lockName, publishCmd, latchTimeout].
const READ_UNLOCK: &str = r#"
local seen = redis.call('get', KEYS[5])
if seen ~= false then
  return tonumber(seen)
end
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call(ARGV[3], KEYS[2], ARGV[1])
  redis.call('set', KEYS[5], 1, 'px', ARGV[4])
  return nil
end
if redis.call('hexists', KEYS[1], ARGV[2]) == 0 then
  return nil
end
local n = redis.call('hincrby', KEYS[1], ARGV[2], -1)
if n == 0 then
  redis.call('hdel', KEYS[1], ARGV[2])
end
redis.call('del', KEYS[3] .. ':' .. (n + 1))
if redis.call('hlen', KEYS[1]) > 1 then
  local best = -3
  for _, field in ipairs(redis.call('hkeys', KEYS[1])) do
    local c = tonumber(redis.call('hget', KEYS[1], field))
    if type(c) == 'number' then
      for i = c, 1, -1 do
        local t = redis.call('pttl', KEYS[4] .. ':' .. field .. ':rwlock_timeout:' .. i)
        best = math.max(t, best)
      end
    end
  end
  if best > 0 then
    redis.call('pexpire', KEYS[1], best)
    redis.call('set', KEYS[5], 0, 'px', ARGV[4])
    return 0
  end
  if mode == 'write' then
    redis.call('set', KEYS[5], 0, 'px', ARGV[4])
    return 0
  end
end
redis.call('del', KEYS[1])
redis.call(ARGV[3], KEYS[2], ARGV[1])
redis.call('set', KEYS[5], 1, 'px', ARGV[4])
return 1
"#;

/// Write acquire — docs/WIRE.md, "Read/write lock", Redisson's write acquire.
/// KEYS = [name]; ARGV = [leaseMs, lockName:write].
const WRITE_LOCK: &str = r#"
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call('hset', KEYS[1], 'mode', 'write')
  redis.call('hset', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
if mode == 'write' and redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  local left = redis.call('pttl', KEYS[1])
  redis.call('pexpire', KEYS[1], left + tonumber(ARGV[1]))
  return nil
end
return redis.call('pttl', KEYS[1])
"#;

/// Write unlock — docs/WIRE.md, "Read/write lock", Redisson's write unlock, with the latch.
/// KEYS = [name, channel, latch];
/// ARGV = ["1", internalLease, lockName:write, publishCmd, latchTimeout].
const WRITE_UNLOCK: &str = r#"
local seen = redis.call('get', KEYS[3])
if seen ~= false then
  return tonumber(seen)
end
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call(ARGV[4], KEYS[2], ARGV[1])
  redis.call('set', KEYS[3], 1, 'px', ARGV[5])
  return nil
end
if mode == 'write' then
  if redis.call('hexists', KEYS[1], ARGV[3]) == 0 then
    return nil
  end
  local n = redis.call('hincrby', KEYS[1], ARGV[3], -1)
  if n > 0 then
    redis.call('pexpire', KEYS[1], ARGV[2])
    redis.call('set', KEYS[3], 0, 'px', ARGV[5])
    return 0
  end
  redis.call('hdel', KEYS[1], ARGV[3])
  if redis.call('hlen', KEYS[1]) == 1 then
    redis.call('del', KEYS[1])
    redis.call(ARGV[4], KEYS[2], ARGV[1])
  else
    redis.call('hset', KEYS[1], 'mode', 'read')
  end
  redis.call('set', KEYS[3], 1, 'px', ARGV[5])
  return 1
end
return nil
"#;

/// Redisson's internal lock lease (the watchdog timeout), sent by the write unlock.
const INTERNAL_LEASE_MS: i64 = 30_000;
/// The latch's lifetime (Redisson's default is about 16–20 s).
const LATCH_MS: i64 = 16_000;

/// One Redisson client: a UUID and a connection.
pub struct RedissonPeer {
    pub redis: Client,
    pub uuid: String,
    /// `PUBLISH`, or `SPUBLISH` for a sharded-pub/sub cluster.
    pub publish: &'static str,
}

/// `prefix:{name}`, or `prefix:name` when the name has a `{` (Redisson's prefixName).
pub fn prefix_name(prefix: &str, name: &str) -> String {
    if name.contains('{') {
        format!("{prefix}:{name}")
    } else {
        format!("{prefix}:{{{name}}}")
    }
}

/// `{name}:suffix`, or `name:suffix` when the name has a `{` (Redisson's suffixName).
pub fn suffix_name(name: &str, suffix: &str) -> String {
    if name.contains('{') {
        format!("{name}:{suffix}")
    } else {
        format!("{{{name}}}:{suffix}")
    }
}

/// The read/write lock's channel.
pub fn channel(name: &str) -> String {
    prefix_name("redisson_rwlock", name)
}

/// The timeout key of `lock_name`'s i-th read hold.
pub fn timeout_key(name: &str, lock_name: &str, i: u32) -> String {
    format!("{}:rwlock_timeout:{i}", suffix_name(name, lock_name))
}

fn as_reply(value: Value) -> Option<i64> {
    match value {
        Value::Null => None,
        other => Some(other.as_i64().expect("an integer or nil reply")),
    }
}

impl RedissonPeer {
    /// A peer with a fresh random UUID on `redis`.
    pub fn new(redis: Client) -> Self {
        RedissonPeer {
            redis,
            uuid: uuid::Uuid::new_v4().to_string(),
            publish: "PUBLISH",
        }
    }

    /// The hash field of `thread` (Redisson's `getLockName`).
    pub fn lock_name(&self, thread: u64) -> String {
        format!("{}:{thread}", self.uuid)
    }

    async fn eval(&self, script: &str, keys: Vec<String>, args: Vec<Value>) -> Value {
        self.redis
            .eval::<Value, _, _, _>(script, keys, args)
            .await
            .unwrap_or_else(|e| panic!("peer script: {e}"))
    }

    fn latch(&self, name: &str) -> String {
        let request_id = uuid::Uuid::new_v4().simple().to_string();
        format!(
            "{}:{request_id}",
            prefix_name("redisson_unlock_latch", name)
        )
    }

    /// `tryLockInnerAsync` of the read half: `None` when acquired, else the PTTL.
    pub async fn read_lock(&self, name: &str, thread: u64, lease_ms: i64) -> Option<i64> {
        let lock_name = self.lock_name(thread);
        let prefix = format!("{}:rwlock_timeout", suffix_name(name, &lock_name));
        let reply = self
            .eval(
                READ_LOCK,
                vec![name.to_owned(), prefix],
                vec![
                    lease_ms.into(),
                    lock_name.clone().into(),
                    format!("{lock_name}:write").into(),
                ],
            )
            .await;
        as_reply(reply)
    }

    /// The read half's unlock: `Some(1)` released (deleted), `Some(0)` still held by
    /// others, `None` when this thread did not hold it (Redisson throws then).
    pub async fn read_unlock(&self, name: &str, thread: u64) -> Option<i64> {
        let lock_name = self.lock_name(thread);
        let prefix = format!("{}:rwlock_timeout", suffix_name(name, &lock_name));
        // The part before ":<lockName>" of the timeout keys.
        let key_prefix = suffix_name(name, &lock_name)
            .strip_suffix(&format!(":{lock_name}"))
            .unwrap()
            .to_owned();
        let latch = self.latch(name);
        let reply = self
            .eval(
                READ_UNLOCK,
                vec![
                    name.to_owned(),
                    channel(name),
                    prefix,
                    key_prefix,
                    latch.clone(),
                ],
                vec![
                    "0".into(),
                    lock_name.into(),
                    self.publish.into(),
                    LATCH_MS.into(),
                ],
            )
            .await;
        let _: i64 = self.redis.del(latch).await.unwrap();
        as_reply(reply)
    }

    /// `tryLockInnerAsync` of the write half: `None` when acquired, else the PTTL.
    pub async fn write_lock(&self, name: &str, thread: u64, lease_ms: i64) -> Option<i64> {
        let field = format!("{}:write", self.lock_name(thread));
        let reply = self
            .eval(
                WRITE_LOCK,
                vec![name.to_owned()],
                vec![lease_ms.into(), field.into()],
            )
            .await;
        as_reply(reply)
    }

    /// The write half's unlock: `Some(1)` released (deleted or downgraded), `Some(0)` still
    /// held (reentry), `None` when this thread did not hold it.
    pub async fn write_unlock(&self, name: &str, thread: u64) -> Option<i64> {
        let field = format!("{}:write", self.lock_name(thread));
        let latch = self.latch(name);
        let reply = self
            .eval(
                WRITE_UNLOCK,
                vec![name.to_owned(), channel(name), latch.clone()],
                vec![
                    "1".into(),
                    INTERNAL_LEASE_MS.into(),
                    field.into(),
                    self.publish.into(),
                    LATCH_MS.into(),
                ],
            )
            .await;
        let _: i64 = self.redis.del(latch).await.unwrap();
        as_reply(reply)
    }
}

// ---------------------------------------------------------------------------------------
// The fair lock (`RFairLock`), from docs/WIRE.md ("Fair lock"): the RLock hash, the queue list
// `redisson_lock_queue:{name}`, the timeout zset `redisson_lock_timeout:{name}` (epoch-ms
// scores by this peer's clock), the waiting and non-queuing acquires with their different
// ARGV orders (nil = acquired), the unlock publishing "0" on the head's own channel
// `redisson_lock__channel:{name}:<head>`, and `acquireFailed`.

/// Drops heads whose timeout passed (the first step of every fair-lock script, spliced in
/// at `PURGE`; `KQ`/`KZ` are the queue and the timeouts, `NOW` the caller's clock).
const PURGE: &str = r#"
while true do
    local first = redis.call('lindex', KQ, 0)
    if first == false then break end
    local t = redis.call('zscore', KZ, first)
    if t == false or tonumber(t) > NOW then break end
    redis.call('zrem', KZ, first)
    redis.call('lpop', KQ)
end
"#;

/// Acquire, waiting variant. KEYS = [name, queue, timeouts];
/// ARGV = [leaseMs, lockName, waitMs, nowMs]. nil = acquired, else a TTL.
const ACQUIRE_BODY: &str = r#"
PURGE
if redis.call('exists', KEYS[1]) == 0
    and (redis.call('exists', KEYS[2]) == 0 or redis.call('lindex', KEYS[2], 0) == ARGV[2]) then
    redis.call('lpop', KEYS[2])
    redis.call('zrem', KEYS[3], ARGV[2])
    local members = redis.call('zrange', KEYS[3], 0, -1)
    for _, m in ipairs(members) do
        redis.call('zincrby', KEYS[3], -tonumber(ARGV[3]), m)
    end
    redis.call('hset', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return nil
end
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return nil
end
if redis.call('zscore', KEYS[3], ARGV[2]) ~= false then
    return math.max(0, redis.call('pttl', KEYS[1]))
end
local last = redis.call('lindex', KEYS[2], -1)
local ttl
if last ~= false and last ~= ARGV[2] and redis.call('zscore', KEYS[3], last) ~= false then
    ttl = tonumber(redis.call('zscore', KEYS[3], last)) - NOW
else
    ttl = redis.call('pttl', KEYS[1])
end
local timeout = ttl + tonumber(ARGV[3]) + NOW
if redis.call('zadd', KEYS[3], timeout, ARGV[2]) == 1 then
    redis.call('rpush', KEYS[2], ARGV[2])
end
return ttl
"#;

/// Acquire, non-queuing variant. KEYS = [name, queue, timeouts];
/// ARGV = [leaseMs, lockName, nowMs, waitMs] (Redisson's other order). nil = acquired, 1 not.
const TRY_BODY: &str = r#"
PURGE
if redis.call('exists', KEYS[1]) == 0
    and (redis.call('exists', KEYS[2]) == 0 or redis.call('lindex', KEYS[2], 0) == ARGV[2]) then
    redis.call('lpop', KEYS[2])
    redis.call('zrem', KEYS[3], ARGV[2])
    local members = redis.call('zrange', KEYS[3], 0, -1)
    for _, m in ipairs(members) do
        redis.call('zincrby', KEYS[3], -tonumber(ARGV[4]), m)
    end
    redis.call('hset', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return nil
end
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return nil
end
return 1
"#;

/// Unlock. KEYS = [name, queue, timeouts, channel, latch];
/// ARGV = ["0", internalLease, lockName, nowMs, publishCmd, latchTimeout]. nil = not held.
const UNLOCK_BODY: &str = r#"
local done = redis.call('get', KEYS[5])
if done ~= false then return tonumber(done) end
PURGE
if redis.call('exists', KEYS[1]) == 0 then
    local head = redis.call('lindex', KEYS[2], 0)
    if head ~= false then redis.call(ARGV[5], KEYS[4] .. ':' .. head, ARGV[1]) end
    redis.call('set', KEYS[5], 1, 'px', ARGV[6])
    return 1
end
if redis.call('hexists', KEYS[1], ARGV[3]) == 0 then return nil end
local count = redis.call('hincrby', KEYS[1], ARGV[3], -1)
if count > 0 then
    redis.call('pexpire', KEYS[1], ARGV[2])
    redis.call('set', KEYS[5], 0, 'px', ARGV[6])
    return 0
end
redis.call('del', KEYS[1])
redis.call('set', KEYS[5], 1, 'px', ARGV[6])
local head = redis.call('lindex', KEYS[2], 0)
if head ~= false then redis.call(ARGV[5], KEYS[4] .. ':' .. head, ARGV[1]) end
return 1
"#;

/// acquireFailed. KEYS = [queue, timeouts]; ARGV = [lockName, waitMs].
const ACQUIRE_FAILED: &str = r#"
local queue = redis.call('lrange', KEYS[1], 0, -1)
local i = 1
while i <= #queue and queue[i] ~= ARGV[1] do i = i + 1 end
for j = i + 1, #queue do
    redis.call('zincrby', KEYS[2], -tonumber(ARGV[2]), queue[j])
end
redis.call('zrem', KEYS[2], ARGV[1])
redis.call('lrem', KEYS[1], 0, ARGV[1])
return nil
"#;

fn with_purge(body: &str, now_arg: &str) -> String {
    let purge = PURGE
        .replace("KQ", "KEYS[2]")
        .replace("KZ", "KEYS[3]")
        .replace("NOW", "NOW_MS");
    let body = body.replace("NOW", "NOW_MS").replace("PURGE", &purge);
    format!("local NOW_MS = tonumber(ARGV[{now_arg}])\n{body}")
}

fn fair_now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// One Java client (one uuid) on one fair lock.
pub struct FairPeer {
    raw: fred::clients::Client,
    url: String,
    pub name: String,
    pub uuid: String,
}

impl FairPeer {
    pub async fn new(url: &str, name: &str) -> FairPeer {
        let raw = fred::clients::Client::new(Config::from_url(url).unwrap(), None, None, None);
        raw.init().await.unwrap();
        FairPeer {
            raw,
            url: url.to_owned(),
            name: name.to_owned(),
            uuid: uuid::Uuid::new_v4().to_string(),
        }
    }

    /// The lock name (hash field) of `thread`: `<uuid>:<thread>`.
    pub fn lock_name(&self, thread: u64) -> String {
        format!("{}:{thread}", self.uuid)
    }

    /// The queue list (`redisson_lock_queue:{name}`).
    pub fn queue_key(&self) -> String {
        prefix_name("redisson_lock_queue", &self.name)
    }

    /// The timeout zset (`redisson_lock_timeout:{name}`).
    pub fn timeout_key(&self) -> String {
        prefix_name("redisson_lock_timeout", &self.name)
    }

    /// The plain lock's channel: each waiter's channel is this plus `:<lock name>`.
    pub fn channel_prefix(&self) -> String {
        prefix_name("redisson_lock__channel", &self.name)
    }

    /// The channel `thread` waits on.
    pub fn channel(&self, thread: u64) -> String {
        format!("{}:{}", self.channel_prefix(), self.lock_name(thread))
    }

    async fn eval(&self, script: String, keys: Vec<String>, args: Vec<Value>) -> Value {
        self.raw
            .eval::<Value, _, _, _>(script, keys, args)
            .await
            .unwrap_or_else(|e| panic!("peer script failed: {e}"))
    }

    fn keys(&self) -> Vec<String> {
        vec![self.name.clone(), self.queue_key(), self.timeout_key()]
    }

    /// `tryLockInnerAsync` with a wait: `None` when acquired, else the TTL Redisson replies.
    pub async fn try_lock(&self, thread: u64, lease_ms: i64, wait_ms: i64) -> Option<i64> {
        let args = vec![
            Value::from(lease_ms),
            Value::from(self.lock_name(thread)),
            Value::from(wait_ms),
            Value::from(fair_now_ms()),
        ];
        match self
            .eval(with_purge(ACQUIRE_BODY, "4"), self.keys(), args)
            .await
        {
            Value::Null => None,
            other => Some(other.as_i64().expect("a TTL")),
        }
    }

    /// `tryLock()` (never queues): whether it acquired.
    pub async fn try_lock_no_queue(&self, thread: u64, lease_ms: i64) -> bool {
        let args = vec![
            Value::from(lease_ms),
            Value::from(self.lock_name(thread)),
            Value::from(fair_now_ms()),
            Value::from(300_000),
        ];
        matches!(
            self.eval(with_purge(TRY_BODY, "3"), self.keys(), args)
                .await,
            Value::Null
        )
    }

    /// `unlock`: `None` (not held by `thread`), `Some(0)` (still held), `Some(1)` (released).
    pub async fn unlock(&self, thread: u64) -> Option<i64> {
        let latch = format!(
            "{}:{}",
            prefix_name("redisson_unlock_latch", &self.name),
            uuid::Uuid::new_v4().simple()
        );
        let mut keys = self.keys();
        keys.push(self.channel_prefix());
        keys.push(latch.clone());
        let args = vec![
            Value::from("0"),
            Value::from(30_000),
            Value::from(self.lock_name(thread)),
            Value::from(fair_now_ms()),
            Value::from("PUBLISH"),
            Value::from(16_000),
        ];
        let reply = self.eval(with_purge(UNLOCK_BODY, "4"), keys, args).await;
        let _: i64 = self.raw.del(latch).await.unwrap();
        reply.as_i64()
    }

    /// `acquireFailed` with the wait `thread` queued with.
    pub async fn acquire_failed(&self, thread: u64, wait_ms: i64) {
        let keys = vec![self.queue_key(), self.timeout_key()];
        let args = vec![Value::from(self.lock_name(thread)), Value::from(wait_ms)];
        self.eval(ACQUIRE_FAILED.to_owned(), keys, args).await;
    }

    /// A subscription to `thread`'s channel, confirmed (a PING came back after it).
    pub async fn subscribe(&self, thread: u64) -> PeerInbox {
        let subscriber = Builder::from_config(Config::from_url(&self.url).unwrap())
            .build_subscriber_client()
            .unwrap();
        subscriber.init().await.unwrap();
        let rx = subscriber.message_rx();
        subscriber.subscribe(self.channel(thread)).await.unwrap();
        let _: Value = subscriber.ping(None).await.unwrap();
        PeerInbox { subscriber, rx }
    }
}

/// Messages on one peer thread's channel.
pub struct PeerInbox {
    subscriber: fred::clients::SubscriberClient,
    rx: tokio::sync::broadcast::Receiver<fred::types::Message>,
}

impl PeerInbox {
    /// The next message's text, or `None` if none came within `timeout`.
    pub async fn next(&mut self, timeout: Duration) -> Option<String> {
        match tokio::time::timeout(timeout, self.rx.recv()).await {
            Ok(Ok(message)) => message.value.as_string(),
            _ => None,
        }
    }
}
