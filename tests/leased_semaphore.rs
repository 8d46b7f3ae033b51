//! The leased semaphore (Redisson's `RPermitExpirableSemaphore`) against a real redis-server:
//! wire layout, leases that end, the watchdog, lost permits, at most N holders under
//! contention, cancellation, bad input, and a Redisson peer in both directions.

mod support;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fred::clients::SubscriberClient;
use fred::prelude::*;
use fred::types::Message;
use redbaton::{Client, Error, LeasedSemaphore, PermitId, MAX_PERMITS_AT_ONCE};
use support::proxy::{Mode, Proxy};
use support::{eventually, numsub, settled_calls, RedisServer, RENEWED_LEASE};

/// A recheck timer that never fires within a test: a waiter that gets a permit sooner was
/// woken by a message (or by a lease it was told about).
const NO_RECHECK: Duration = Duration::from_secs(120);

/// Redisson's score for a permit without a lease.
const SENTINEL: i64 = 922_337_203_685_477;

async fn client(url: &str) -> Client {
    Client::connect(url).await.unwrap()
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

async fn subscribe(
    url: &str,
    channel: &str,
) -> (SubscriberClient, tokio::sync::broadcast::Receiver<Message>) {
    let subscriber = Builder::from_config(Config::from_url(url).unwrap())
        .build_subscriber_client()
        .unwrap();
    subscriber.init().await.unwrap();
    let messages = subscriber.message_rx();
    subscriber.subscribe(channel).await.unwrap();
    let _: Value = subscriber.ping(None).await.unwrap();
    (subscriber, messages)
}

async fn drain(
    messages: &mut tokio::sync::broadcast::Receiver<Message>,
    quiet: Duration,
) -> Vec<String> {
    let mut seen = Vec::new();
    while let Ok(Ok(message)) = tokio::time::timeout(quiet, messages.recv()).await {
        seen.push(message.value.as_string().unwrap());
    }
    seen
}

#[tokio::test]
async fn wire_layout_and_messages_match_redisson() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server.url()).await;
    let sem = client.leased_semaphore("gpu");
    assert_eq!(sem.key(), "gpu");
    assert_eq!(sem.timeout_key(), "{gpu}:timeout");
    assert_eq!(sem.channel(), "redisson_sc:{gpu}");
    let tagged = client.leased_semaphore("{a}:b");
    assert_eq!(tagged.timeout_key(), "{a}:b:timeout");
    assert_eq!(tagged.channel(), "redisson_sc:{a}:b");
    let (_subscriber, mut messages) = subscribe(&server.url(), "redisson_sc:{gpu}").await;

    assert!(
        sem.try_acquire().await.unwrap().is_none(),
        "not initialised"
    );
    assert!(sem.try_set_permits(2).await.unwrap());
    assert!(!sem.try_set_permits(9).await.unwrap());
    assert_eq!(get(&raw, "gpu").await.as_deref(), Some("2"));

    let before = server_ms(&raw).await;
    let watched = sem.acquire().await.unwrap();
    let fixed = sem
        .acquire_with_lease(Duration::from_secs(10))
        .await
        .unwrap();
    let after = server_ms(&raw).await;
    assert_eq!(get(&raw, "gpu").await.as_deref(), Some("0"), "free count");
    let kind: String = raw.r#type("{gpu}:timeout").await.unwrap();
    assert_eq!(kind, "zset");
    let mut permits = taken(&raw, "{gpu}:timeout").await;
    permits.sort_by_key(|(_, score)| *score);
    assert_eq!(permits.len(), 2);
    // Members are the ids' 16 raw bytes; scores the lease ends in epoch ms.
    assert_eq!(permits[0].0, fixed.id().as_bytes());
    assert_eq!(permits[1].0, watched.id().as_bytes());
    assert!(
        permits[0].1 >= before + 10_000 && permits[0].1 <= after + 10_000,
        "fixed lease end {} not in [{}, {}]",
        permits[0].1,
        before + 10_000,
        after + 10_000
    );
    assert!(
        permits[1].1 >= before + 30_000 && permits[1].1 <= after + 30_000,
        "watchdog lease end"
    );
    assert_eq!(sem.available_permits().await.unwrap(), 0);
    assert_eq!(sem.acquired_permits().await.unwrap(), 2);

    watched.release().await.unwrap();
    fixed.release().await.unwrap();
    assert_eq!(get(&raw, "gpu").await.as_deref(), Some("2"));
    let exists: i64 = raw.exists("{gpu}:timeout").await.unwrap();
    assert_eq!(exists, 0, "no permit taken");
    sem.add_permits(3).await.unwrap();
    sem.add_permits(-7).await.unwrap();
    assert_eq!(sem.available_permits().await.unwrap(), -2);
    sem.add_permits(4).await.unwrap();
    // Set: the count; releases: the new free count; add: the delta, when positive; an
    // acquire publishes nothing.
    let seen = drain(&mut messages, Duration::from_millis(500)).await;
    assert_eq!(seen, ["2", "1", "2", "3", "4"]);

    // An expiry on the counter is copied onto the permits' set by an acquire.
    let _: () = raw.pexpire("gpu", 60_000, None).await.unwrap();
    let permit = sem.acquire().await.unwrap();
    let pttl: i64 = raw.pttl("{gpu}:timeout").await.unwrap();
    assert!(pttl > 50_000 && pttl <= 60_000, "pttl {pttl}");
    permit.release().await.unwrap();
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holders_permit_comes_back_after_its_lease() {
    // A holder whose runtime dies (no release, no shutdown, no renewal): its permit comes
    // back once its 600 ms watchdog lease ends, and a parked waiter gets it without any
    // message (it parks until the first lease ends).
    let server = RedisServer::start();
    let raw = server.raw().await;
    let url = server.url();
    let setup = client(&url).await;
    setup
        .leased_semaphore("crash")
        .try_set_permits(1)
        .await
        .unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let holder = lease_client(&url, Duration::from_millis(600)).await;
            std::mem::forget(holder.leased_semaphore("crash").acquire().await.unwrap());
            std::mem::forget(holder);
        });
        drop(rt); // every task of the holder, its watchdog included, stops here
    })
    .join()
    .unwrap();
    let crashed_at = Instant::now();
    assert_eq!(get(&raw, "crash").await.as_deref(), Some("0"));
    let waiter = setup
        .leased_semaphore("crash")
        .with_recheck_interval(NO_RECHECK)
        .unwrap();
    let permit = tokio::time::timeout(Duration::from_secs(20), waiter.acquire())
        .await
        .expect("the crashed holder's permit came back")
        .unwrap();
    assert!(
        crashed_at.elapsed() < NO_RECHECK / 4,
        "the waiter looked again when the lease ended"
    );
    assert_eq!(waiter.acquired_permits().await.unwrap(), 1, "only ours");
    permit.release().await.unwrap();
    assert_eq!(waiter.available_permits().await.unwrap(), 1);
    setup.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_keeps_a_permit_past_several_leases() {
    let server = RedisServer::start();
    watchdog_keeps_a_permit(&server.url(), "renewed").await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_when_the_permit_is_gone() {
    let server = RedisServer::start();
    let holder = lease_client(&server.url(), Duration::from_millis(900)).await;
    let other = client(&server.url()).await;
    let sem = holder.leased_semaphore("gone");
    sem.try_set_permits(2).await.unwrap();

    // Released by its id elsewhere: the next renewal finds it gone.
    let permit = sem.acquire().await.unwrap();
    assert!(other
        .leased_semaphore("gone")
        .release_id(&permit.id())
        .await
        .unwrap());
    tokio::time::timeout(Duration::from_secs(10), permit.lost())
        .await
        .expect("lost() fires");
    assert!(permit.is_lost());
    assert!(matches!(permit.release().await, Err(Error::NotHeld { .. })));
    assert_eq!(
        sem.available_permits().await.unwrap(),
        2,
        "nothing released twice"
    );

    // A fixed lease that runs out.
    let permit = sem
        .acquire_with_lease(Duration::from_millis(300))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), permit.lost())
        .await
        .expect("lost() fires when the lease ends");
    assert!(permit.is_lost());
    assert!(matches!(permit.release().await, Err(Error::NotHeld { .. })));
    // The holder's deadline (from before it sent the acquire) comes before the server's
    // (from when the script ran): the permit is reclaimed a moment later, and only once.
    assert!(
        eventually(Duration::from_secs(10), || async {
            sem.available_permits().await.unwrap() == 2
        })
        .await,
        "reclaimed"
    );
    assert_eq!(sem.acquired_permits().await.unwrap(), 0);
    assert_eq!(sem.available_permits().await.unwrap(), 2, "reclaimed once");

    // A watchdog permit whose client cannot reach Redis any more: lost within its lease by
    // the local clock.
    let proxy = Proxy::start(server.port).await;
    let cut_off = lease_client(&proxy.url(), Duration::from_millis(900)).await;
    let permit = cut_off.leased_semaphore("gone").acquire().await.unwrap();
    proxy.set(Mode::Stalled);
    tokio::time::timeout(Duration::from_secs(10), permit.lost())
        .await
        .expect("lost() fires when renewal fails for a whole lease");
    assert!(
        eventually(Duration::from_secs(10), || async {
            sem.available_permits().await.unwrap() == 2
        })
        .await
    );
    std::mem::forget(permit);
    std::mem::forget(cut_off);
    holder.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_release_wakes_a_parked_waiter() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let a = client(&server.url()).await;
    let b = client(&server.url()).await;
    let sem = a.leased_semaphore("wake");
    sem.try_set_permits(1).await.unwrap();
    let held = sem.acquire().await.unwrap();
    let waiter = b
        .leased_semaphore("wake")
        .with_recheck_interval(NO_RECHECK)
        .unwrap();
    let task = tokio::spawn(async move { waiter.acquire().await });
    assert!(
        eventually(Duration::from_secs(10), || async {
            numsub(&raw, "redisson_sc:{wake}").await == 1
        })
        .await
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released_at = Instant::now();
    held.release().await.unwrap();
    let permit = tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .expect("woken by the release message")
        .unwrap()
        .unwrap();
    assert!(released_at.elapsed() < NO_RECHECK / 4);
    permit.release().await.unwrap();
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

const PERMITS: i64 = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_n_permits_are_held_at_any_instant() {
    let server = RedisServer::start();
    at_most_n_holders(&server.url(), "contended").await;
}

/// On a 3-primary cluster, permits of names in different slots are renewed by the watchdog
/// (its batches are per slot), and a contention run stays within N holders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_permits_are_renewed_and_stay_within_n() {
    let cluster = support::cluster::RedisCluster::start(3, 0);
    let url = cluster.url();
    let names = ["renewed-a", "renewed-b", "{tag}:renewed"];
    let slots: std::collections::HashSet<u16> = names
        .iter()
        .map(|name| fred::util::redis_keyslot(name.as_bytes()))
        .collect();
    assert!(slots.len() > 1, "the names share a slot: vacuous");
    futures::future::join_all(names.iter().map(|name| watchdog_keeps_a_permit(&url, name))).await;
    at_most_n_holders(&url, "{tag}:contended").await;
}

/// Twelve tasks on three clients take and release permits of `name` (N = 3) 20 times each,
/// in every acquire style; a history check proves no instant had more than N holders.
async fn at_most_n_holders(url: &str, name: &str) {
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(client(url).await);
    }
    clients[0]
        .leased_semaphore(name)
        .try_set_permits(PERMITS as u32)
        .await
        .unwrap();
    let history = Arc::new(Mutex::new(Vec::<(Instant, Instant)>::new()));
    let in_use = Arc::new(AtomicI64::new(0));
    let mut tasks = Vec::new();
    for client in &clients {
        for t in 0..4 {
            let sem = client.leased_semaphore(name);
            let (history, in_use) = (history.clone(), in_use.clone());
            tasks.push(tokio::spawn(async move {
                for round in 0..20 {
                    let permit = match (t + round) % 3 {
                        0 => loop {
                            let wait = Duration::from_millis(fastrand::u64(1..50));
                            if let Some(p) = sem.try_acquire_for(wait).await.unwrap() {
                                break p;
                            }
                        },
                        1 => sem
                            .acquire_with_lease(Duration::from_secs(60))
                            .await
                            .unwrap(),
                        _ => sem.acquire().await.unwrap(),
                    };
                    let from = Instant::now();
                    let now = in_use.fetch_add(1, Ordering::SeqCst) + 1;
                    assert!(now <= PERMITS, "{now} permits in use");
                    tokio::time::sleep(Duration::from_millis(fastrand::u64(0..4))).await;
                    in_use.fetch_sub(1, Ordering::SeqCst);
                    let to = Instant::now();
                    history.lock().unwrap().push((from, to));
                    permit.release().await.unwrap();
                }
            }));
        }
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(120), task)
            .await
            .expect("the contention run finishes")
            .unwrap();
    }
    // History check: every hold interval lies inside the permit's real hold, so overlaps
    // seen really happened.
    let history = std::mem::take(&mut *history.lock().unwrap());
    assert_eq!(history.len(), 3 * 4 * 20);
    let mut events: Vec<(Instant, i64)> = history
        .iter()
        .flat_map(|(from, to)| [(*from, 1), (*to, -1)])
        .collect();
    events.sort_by_key(|(at, delta)| (*at, *delta));
    let (mut held, mut most) = (0, 0);
    for (_, delta) in events {
        held += delta;
        assert!(held <= PERMITS, "{held} holders at once");
        most = most.max(held);
    }
    assert_eq!(most, PERMITS, "never every permit at once: vacuous");
    let sem = clients[0].leased_semaphore(name);
    assert_eq!(sem.available_permits().await.unwrap(), PERMITS);
    assert_eq!(sem.acquired_permits().await.unwrap(), 0);
    for client in clients {
        client.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_acquires_and_dropped_permits_leave_nothing_taken() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let proxy = Proxy::start(server.port).await;
    let slow = Client::builder()
        .url(proxy.url())
        .command_timeout(Duration::from_millis(1000))
        .connect()
        .await
        .unwrap();
    let sem = slow.leased_semaphore("slow");
    sem.try_set_permits(3).await.unwrap();

    // Round trips whose callers left: one timed out, one dropped.
    proxy.set(Mode::RepliesDelayed(Duration::from_millis(1300)));
    let timed_out = sem.try_acquire().await;
    assert!(matches!(timed_out, Err(Error::Timeout(_))), "{timed_out:?}");
    let dropped = tokio::time::timeout(Duration::from_millis(200), sem.acquire()).await;
    assert!(dropped.is_err());
    assert!(
        eventually(Duration::from_secs(10), || async {
            get(&raw, "slow").await.as_deref() == Some("1")
        })
        .await,
        "both acquires ran on the server"
    );
    proxy.set(Mode::Open);
    assert!(
        eventually(Duration::from_secs(20), || async {
            get(&raw, "slow").await.as_deref() == Some("3")
        })
        .await,
        "the abandoned acquires released their permits"
    );

    // A dropped permit is released in the background; so is one whose client shuts down.
    let fast = client(&server.url()).await;
    let sem = fast.leased_semaphore("slow");
    drop(sem.acquire().await.unwrap());
    let _kept = sem.acquire().await.unwrap();
    fast.shutdown().await.unwrap();
    assert!(
        eventually(Duration::from_secs(10), || async {
            get(&raw, "slow").await.as_deref() == Some("3")
        })
        .await
    );
    let left: i64 = raw.zcard("{slow}:timeout").await.unwrap();
    assert_eq!(left, 0);
    slow.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_count_a_redisson_peer_could_not_read_is_refused() {
    // Redisson reads the counter as a Java int, and every taken permit comes back to it: no
    // call may let free and taken permits together leave that range.
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server.url()).await;
    let sem = client.leased_semaphore("range");
    let max = i64::from(redbaton::MAX_PERMITS);
    let refused = |r: Result<(), Error>| {
        matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("2147483647")) || {
            eprintln!("not refused: {r:?}");
            false
        }
    };
    assert!(sem.try_set_permits(1).await.unwrap());
    let permit = sem.try_acquire().await.unwrap().expect("one free");
    assert!(
        refused(sem.add_permits(max).await),
        "its release would take the count past the top"
    );
    assert_eq!(get(&raw, "range").await.as_deref(), Some("0"), "unchanged");
    sem.add_permits(max - 1).await.unwrap();
    permit.release().await.unwrap();
    assert_eq!(sem.available_permits().await.unwrap(), max);
    assert!(refused(sem.add_permits(1).await), "add past the top");

    sem.add_permits(-max).await.unwrap();
    sem.add_permits(-max).await.unwrap();
    sem.add_permits(-1).await.unwrap();
    assert!(refused(sem.add_permits(-1).await), "add past the bottom");
    assert_eq!(
        get(&raw, "range").await.as_deref(),
        Some("-2147483648"),
        "unchanged"
    );
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_input_and_keys_of_other_types_are_refused() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server.url()).await;
    let sem = client.leased_semaphore("input");
    let invalid = |r: Result<(), Error>| matches!(r, Err(Error::InvalidArgument(_)));
    assert!(invalid(
        sem.acquire_with_lease(Duration::ZERO).await.map(drop)
    ));
    assert!(invalid(
        sem.try_acquire_with_lease(Duration::ZERO, Duration::MAX)
            .await
            .map(drop)
    ));
    assert!(invalid(sem.try_set_permits(u32::MAX).await.map(drop)));
    assert!(invalid(sem.add_permits(i64::MIN).await));
    assert!(invalid(sem.with_recheck_interval(Duration::ZERO).map(drop)));
    assert!(invalid(
        client.leased_semaphore("").try_acquire().await.map(drop)
    ));
    assert!(invalid("not-hex".parse::<PermitId>().map(drop)));
    assert!(!sem
        .release_id(&PermitId::from_bytes([7; 16]))
        .await
        .unwrap());

    // A counter or a permit set of another type: refused, and left as it was.
    let _: () = raw.hset("hash", ("f", "1")).await.unwrap();
    let _: () = raw.set("zfree", "2", None, None, false).await.unwrap();
    let _: () = raw
        .set("{zfree}:timeout", "x", None, None, false)
        .await
        .unwrap();
    let _: () = raw.set("text", "lots", None, None, false).await.unwrap();
    for name in ["hash", "zfree", "text"] {
        let sem = client.leased_semaphore(name);
        let wrong = |r: Result<(), Error>| matches!(r, Err(Error::WrongType { .. }));
        assert!(
            wrong(sem.try_acquire().await.map(drop)),
            "{name}: try_acquire"
        );
        assert!(
            wrong(sem.available_permits().await.map(drop)),
            "{name}: available"
        );
        assert!(
            wrong(
                sem.release_id(&PermitId::from_bytes([1; 16]))
                    .await
                    .map(drop)
            ),
            "{name}: release_id"
        );
    }
    for name in ["hash", "text"] {
        let sem = client.leased_semaphore(name);
        let wrong = |r: Result<(), Error>| matches!(r, Err(Error::WrongType { .. }));
        assert!(wrong(sem.try_set_permits(1).await.map(drop)), "{name}");
        assert!(wrong(sem.add_permits(1).await), "{name}");
    }
    let fields: std::collections::HashMap<String, String> = raw.hgetall("hash").await.unwrap();
    assert_eq!(fields.len(), 1);
    assert_eq!(get(&raw, "zfree").await.as_deref(), Some("2"));
    assert_eq!(get(&raw, "{zfree}:timeout").await.as_deref(), Some("x"));
    assert_eq!(get(&raw, "text").await.as_deref(), Some("lots"));
    client.shutdown().await.unwrap();
}

/// A Redisson `RPermitExpirableSemaphore` peer, written for these tests from the protocol's
/// steps (REDISSON.md §4.8), with a Java client's own clock as "now".
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redisson_peer_shares_permits_both_ways_with_binary_ids() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server.url()).await;
    let sem = client
        .leased_semaphore("shared")
        .with_recheck_interval(NO_RECHECK)
        .unwrap();
    sem.try_set_permits(2).await.unwrap();
    // Ids that are not UTF-8 (0xff, 0x80, a lone continuation byte) and contain NULs.
    let java_a: [u8; 16] = [
        0, 0xff, 0x80, 0xc3, 0, 1, 2, 3, 0xfe, 0xbf, 0, 0, 9, 8, 7, 6,
    ];
    let java_b: [u8; 16] = [0xff; 16];

    // The peer takes both permits (one without a lease, one with); we are refused and park.
    let reply = peer_acquire(&raw, &sem, &[java_a, java_b], None).await;
    assert_eq!(reply.as_str().as_deref(), Some("OK"));
    assert_eq!(sem.acquired_permits().await.unwrap(), 2);
    assert!(sem.try_acquire().await.unwrap().is_none());
    let waiter = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.acquire().await })
    };
    assert!(
        eventually(Duration::from_secs(10), || async {
            numsub(&raw, "redisson_sc:{shared}").await == 1
        })
        .await
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The peer's release (publishing the new free count) wakes us at once.
    let released_at = Instant::now();
    assert_eq!(peer_release(&raw, &sem, &java_a).await, 1);
    let ours = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("woken by the peer's release")
        .unwrap()
        .unwrap();
    assert!(released_at.elapsed() < NO_RECHECK / 4);

    // We release the peer's other permit by its binary id.
    let java_b_id = PermitId::from_bytes(java_b);
    assert_eq!(java_b_id.to_string(), "ff".repeat(16));
    assert!(sem.release_id(&java_b_id).await.unwrap());
    assert!(!sem.release_id(&java_b_id).await.unwrap(), "only once");

    // The other way: we hold one, take the other; the peer is refused and told when our
    // first lease ends (the server's clock plus our 30 s watchdog lease).
    let second = sem.acquire().await.unwrap();
    let reply = peer_acquire(&raw, &sem, &[java_a], Some(Duration::from_secs(5))).await;
    let text = reply.as_str().unwrap().to_string();
    let earliest: i64 = text
        .strip_prefix(':')
        .unwrap_or_else(|| panic!("refused with the earliest lease end, got {text:?}"))
        .parse::<f64>()
        .unwrap() as i64;
    let server_now = server_ms(&raw).await;
    assert!(
        earliest > server_now + 20_000 && earliest <= server_now + 30_000,
        "{earliest} vs {server_now}"
    );
    // The peer releases our permit by the id we show; our permit learns it is lost.
    assert_eq!(peer_release(&raw, &sem, ours.id().as_bytes()).await, 1);
    let reply = peer_acquire(&raw, &sem, &[java_a], Some(Duration::from_millis(300))).await;
    assert_eq!(reply.as_str().as_deref(), Some("OK"), "the peer got it");
    assert!(matches!(ours.release().await, Err(Error::NotHeld { .. })));

    // The peer's permit with a 300 ms lease ends; our acquire reclaims it.
    second.release().await.unwrap();
    let a = sem
        .try_acquire()
        .await
        .unwrap()
        .expect("our released permit");
    let b = tokio::time::timeout(Duration::from_secs(20), sem.acquire())
        .await
        .expect("the peer's permit is reclaimed when its lease ends")
        .unwrap();
    assert_eq!(sem.acquired_permits().await.unwrap(), 2);
    // And the peer reclaims ours when their fixed lease ends (by its own clock).
    a.release().await.unwrap();
    b.release().await.unwrap();
    let short = sem
        .acquire_with_lease(Duration::from_millis(200))
        .await
        .unwrap();
    let also = sem.acquire().await.unwrap();
    assert!(
        eventually(Duration::from_secs(10), || async {
            let reply = peer_acquire(&raw, &sem, &[java_b], Some(Duration::from_secs(5))).await;
            reply.as_str().as_deref() == Some("OK")
        })
        .await,
        "the peer reclaims our permit once its lease ends"
    );
    assert!(short.is_lost());
    assert_eq!(peer_release(&raw, &sem, &java_b).await, 1);
    also.release().await.unwrap();
    assert_eq!(sem.available_permits().await.unwrap(), 2);
    let left: i64 = raw.zcard("{shared}:timeout").await.unwrap();
    assert_eq!(left, 0);
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn update_lease_time_sets_a_held_permits_lease_as_redisson_does() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server.url()).await;
    let sem = client.leased_semaphore("leases");
    sem.try_set_permits(3).await.unwrap();
    let lease_end = |id: [u8; 16]| {
        let raw = raw.clone();
        let key = sem.timeout_key().to_owned();
        async move {
            taken(&raw, &key)
                .await
                .into_iter()
                .find(|(member, _)| member[..] == id[..])
                .map(|(_, score)| score)
        }
    };

    // Our own permit, lengthened: the score is the server's now + the new lease.
    let ours = sem
        .acquire_with_lease(Duration::from_secs(60))
        .await
        .unwrap();
    let before = server_ms(&raw).await;
    let lease = Duration::from_secs(600);
    assert!(sem.update_lease_time(&ours.id(), lease).await.unwrap());
    let end = lease_end(*ours.id().as_bytes()).await.expect("still taken");
    let after = server_ms(&raw).await;
    assert!(
        (before + 600_000..=after + 600_000).contains(&end),
        "lease end {end} is not 600 s after {before}..{after}"
    );

    // A Java peer's permit without a lease, given one of 1 s: it comes back by itself.
    let peer_id = [7u8; 16];
    assert_eq!(
        peer_acquire(&raw, &sem, &[peer_id], None)
            .await
            .as_str()
            .as_deref(),
        Some("OK")
    );
    assert_eq!(lease_end(peer_id).await, Some(SENTINEL));
    let id = PermitId::from_bytes(peer_id);
    assert!(sem
        .update_lease_time(&id, Duration::from_secs(1))
        .await
        .unwrap());
    assert!(
        eventually(Duration::from_secs(20), || async {
            sem.acquired_permits().await.unwrap() == 1
        })
        .await,
        "the shortened lease ended and the permit was reclaimed"
    );
    // Ended and reclaimed: never revived.
    assert!(!sem
        .update_lease_time(&id, Duration::from_secs(60))
        .await
        .unwrap());
    assert_eq!(lease_end(peer_id).await, None);
    assert_eq!(sem.available_permits().await.unwrap(), 2);

    // Released, or never taken: false.
    let released = ours.id();
    ours.release().await.unwrap();
    assert!(!sem
        .update_lease_time(&released, Duration::from_secs(60))
        .await
        .unwrap());
    assert!(!sem
        .update_lease_time(&PermitId::from_bytes([9; 16]), Duration::from_secs(60))
        .await
        .unwrap());

    // Bad input: a typed error, nothing sent.
    for lease in [Duration::ZERO, Duration::MAX] {
        let refused = sem.update_lease_time(&released, lease).await;
        assert!(
            matches!(refused, Err(Error::InvalidArgument(_))),
            "{lease:?}: {refused:?}"
        );
    }
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_permits_are_taken_together_as_redisson_takes_them() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = lease_client(&server.url(), Duration::from_secs(3)).await;
    let sem = client.leased_semaphore("batch");
    sem.try_set_permits(5).await.unwrap();

    // Three at once: three ids, one score (the same lease), the counter down by three.
    let three = sem.acquire_many(3).await.unwrap();
    let ids = three.ids();
    assert_eq!((ids.len(), three.permits()), (3, 3));
    assert_eq!(three.id(), ids[0]);
    assert!(ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2]);
    assert_eq!(get(&raw, "batch").await.as_deref(), Some("2"));
    let members = taken(&raw, sem.timeout_key()).await;
    assert_eq!(members.len(), 3);
    for id in &ids {
        assert!(
            members
                .iter()
                .any(|(member, _)| member[..] == id.as_bytes()[..]),
            "{id} is a member, as 16 raw bytes"
        );
    }
    assert!(members.iter().all(|(_, score)| *score == members[0].1));

    // All or none: three are not free, nothing is taken.
    assert!(sem
        .try_acquire_many(3, Duration::ZERO)
        .await
        .unwrap()
        .is_none());
    assert_eq!(get(&raw, "batch").await.as_deref(), Some("2"));
    assert_eq!(taken(&raw, sem.timeout_key()).await.len(), 3);

    // A Java peer takes the last two, several at once too; a waiter for two waits, and gets
    // two when the three are given back.
    let peer_ids = [[1u8; 16], [2u8; 16]];
    let reply = peer_acquire(&raw, &sem, &peer_ids, Some(Duration::from_secs(600))).await;
    assert_eq!(reply.as_str().as_deref(), Some("OK"));
    let waiter = {
        let sem = sem.with_recheck_interval(NO_RECHECK).unwrap();
        tokio::spawn(async move { sem.try_acquire_many(2, Duration::from_secs(60)).await })
    };
    assert!(
        eventually(Duration::from_secs(10), || async {
            numsub(&raw, "redisson_sc:{batch}").await == 1
        })
        .await
    );
    three.release().await.unwrap();
    let two = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("woken by the release")
        .unwrap()
        .unwrap()
        .expect("two permits");
    assert_eq!(two.permits(), 2);
    assert_eq!(get(&raw, "batch").await.as_deref(), Some("1"));
    assert_eq!(peer_release(&raw, &sem, &peer_ids[0]).await, 1);
    assert_eq!(sem.available_permits().await.unwrap(), 2);

    // The watchdog renews them together, past several leases.
    let renewed = server_ms(&raw).await + 5_000;
    assert!(
        eventually(Duration::from_secs(30), || async {
            let members = taken(&raw, sem.timeout_key()).await;
            two.ids().iter().all(|id| {
                members
                    .iter()
                    .any(|(m, score)| m[..] == id.as_bytes()[..] && *score > renewed)
            })
        })
        .await,
        "both permits renewed past {renewed}"
    );
    assert!(!two.is_lost());

    // One of them released by its id: the hold is lost, and the other one comes back when
    // its lease ends.
    assert!(sem.release_id(&two.ids()[1]).await.unwrap());
    tokio::time::timeout(Duration::from_secs(30), two.lost())
        .await
        .expect("the pair is lost once one of them is gone");
    assert!(
        eventually(Duration::from_secs(30), || async {
            sem.acquired_permits().await.unwrap() == 1
        })
        .await,
        "only the peer's second permit is left taken"
    );
    assert_eq!(sem.available_permits().await.unwrap(), 4);
    assert!(matches!(two.release().await, Err(Error::NotHeld { .. })));

    // A fixed lease for several: back when it ends.
    let leased = sem
        .try_acquire_many_with_lease(4, Duration::ZERO, Duration::from_secs(1))
        .await
        .unwrap()
        .expect("four free");
    assert_eq!(sem.acquired_permits().await.unwrap(), 5);
    assert!(
        eventually(Duration::from_secs(30), || async {
            sem.available_permits().await.unwrap() == 4
        })
        .await,
        "the four came back with their lease"
    );
    drop(leased);

    // Bad input: typed errors, nothing sent.
    for n in [0, MAX_PERMITS_AT_ONCE + 1] {
        let refused = sem.try_acquire_many(n, Duration::ZERO).await;
        assert!(
            matches!(refused, Err(Error::InvalidArgument(_))),
            "{n}: {refused:?}"
        );
        let refused = sem.acquire_many(n).await;
        assert!(
            matches!(refused, Err(Error::InvalidArgument(_))),
            "{n}: {refused:?}"
        );
    }
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_released_permit_passes_a_larger_waiter_to_a_smaller_one() {
    // Two permits, held one by one. A waiter for two parks first, a waiter for one after
    // it, both in one process: a release ("1") wakes the first, which cannot use it and
    // passes the wake-up on; the second takes the permit at once, not at its recheck.
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server.url()).await;
    let sem = client
        .leased_semaphore("behind")
        .with_recheck_interval(NO_RECHECK)
        .unwrap();
    sem.try_set_permits(2).await.unwrap();
    let first = sem.acquire().await.unwrap();
    let _second = sem.acquire().await.unwrap();
    let quiet = Duration::from_millis(500);
    let big = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.acquire_many(2).await })
    };
    assert!(
        eventually(Duration::from_secs(10), || async {
            numsub(&raw, "redisson_sc:{behind}").await == 1
        })
        .await
    );
    settled_calls(&raw, "evalsha", quiet, Duration::from_secs(30)).await;
    let small = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.acquire().await })
    };
    settled_calls(&raw, "evalsha", quiet, Duration::from_secs(30)).await;
    first.release().await.unwrap();
    let permit = tokio::time::timeout(Duration::from_secs(20), small)
        .await
        .expect("the smaller waiter got the permit by the passed wake-up")
        .unwrap()
        .unwrap();
    assert_eq!(permit.permits(), 1);
    assert!(!big.is_finished());
    big.abort();
    client.shutdown().await.unwrap();
}
