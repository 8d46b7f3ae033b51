//! The semaphore (Redisson's `RSemaphore`) against a real redis-server: wire layout and
//! messages, at most N holders under contention, wake-ups of exactly as many waiters as
//! permits appeared, cancellation, bad input, wrong types, a Redisson peer, a cluster.

mod support;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fred::clients::SubscriberClient;
use fred::prelude::*;
use fred::types::Message;
use redbaton::{Client, Error, Semaphore, SemaphorePermit, MAX_PERMITS};
use support::proxy::{Mode, Proxy};
use support::{command_calls, eventually, numsub, RedisServer};

async fn client(url: &str) -> Client {
    Client::connect(url).await.unwrap()
}

/// Permits one waiter's recheck timer would only give after this long: anything sooner is a
/// wake-up by message.
const NO_RECHECK: Duration = Duration::from_secs(120);

/// Whether permits were taken, kept taken (given back by a `release(n)` of the test, as a
/// Redisson user does).
fn kept(permit: Option<SemaphorePermit>) -> bool {
    permit.map(SemaphorePermit::forget).is_some()
}

async fn get(raw: &fred::clients::Client, key: &str) -> Option<String> {
    raw.get(key).await.unwrap()
}

async fn evalsha_calls(raw: &fred::clients::Client) -> u64 {
    command_calls(raw)
        .await
        .get("evalsha")
        .copied()
        .unwrap_or(0)
}

/// Waits until the server saw no EVALSHA for `quiet` (at least `min` in all): the waiters
/// made their attempts and parked.
async fn wait_quiet(raw: &fred::clients::Client, min: u64, quiet: Duration) -> u64 {
    let start = Instant::now();
    let mut last = evalsha_calls(raw).await;
    let mut since = Instant::now();
    loop {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "waiters never settled"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = evalsha_calls(raw).await;
        if now != last {
            last = now;
            since = Instant::now();
        } else if now >= min && since.elapsed() >= quiet {
            return now;
        }
    }
}

/// A raw subscriber on `channel`, confirmed.
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

/// Every message received within `quiet` of the last one.
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

    assert!(kept(sem.try_acquire(2).await.unwrap()));
    assert_eq!(get(&raw, "slots").await.as_deref(), Some("1"));
    assert!(!kept(sem.try_acquire(2).await.unwrap()), "one left");
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
async fn a_release_wakes_exactly_as_many_waiters_as_permits_appeared() {
    // Five waiters of one process park on an empty semaphore; release(2) must wake two of
    // them (not one, not all five), by message: their recheck timer is two minutes.
    let server = RedisServer::start();
    let raw = server.raw().await;
    let waiters = client(&server.url()).await;
    let releaser = client(&server.url()).await;
    let sem = waiters
        .semaphore("wake")
        .with_recheck_interval(NO_RECHECK)
        .unwrap();
    assert!(sem.try_set_permits(0).await.unwrap());
    let before = evalsha_calls(&raw).await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for i in 0..5 {
        let (sem, tx) = (sem.clone(), tx.clone());
        tasks.push(tokio::spawn(async move {
            sem.acquire(1).await.unwrap().forget();
            tx.send(i).unwrap();
        }));
    }
    assert!(
        eventually(Duration::from_secs(10), || async {
            numsub(&raw, "redisson_sc:{wake}").await == 1
        })
        .await
    );
    let parked = wait_quiet(&raw, before + 5, Duration::from_secs(1)).await;

    let released_at = Instant::now();
    releaser.semaphore("wake").release(2).await.unwrap();
    for _ in 0..2 {
        tokio::time::timeout(Duration::from_secs(20), rx.recv())
            .await
            .expect("two waiters are woken by the message")
            .unwrap();
    }
    assert!(released_at.elapsed() < NO_RECHECK / 4, "not by the timer");
    let after = wait_quiet(&raw, parked + 3, Duration::from_millis(700)).await;
    assert!(rx.try_recv().is_err(), "two permits, two holders");
    // The release, and one attempt by each of the two woken waiters: the other three were
    // not woken (a wake-all would add three attempts; a wake-one could not give two holders).
    assert_eq!(after - parked, 3, "EVALSHAs after release(2)");
    assert_eq!(sem.available_permits().await.unwrap(), 0);

    releaser.semaphore("wake").release(3).await.unwrap();
    for _ in 0..3 {
        tokio::time::timeout(Duration::from_secs(20), rx.recv())
            .await
            .expect("the other three are woken")
            .unwrap();
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(sem.available_permits().await.unwrap(), 0);
    waiters.shutdown().await.unwrap();
    releaser.shutdown().await.unwrap();
}

#[tokio::test]
async fn waiters_across_processes_are_woken_by_releases() {
    // A waiter of another client, and one of the same client, each woken promptly by the
    // release of another process; the recheck timer is two minutes.
    let server = RedisServer::start();
    let a = client(&server.url()).await;
    let b = client(&server.url()).await;
    let holder = a.semaphore("cross");
    holder.try_set_permits(2).await.unwrap();
    assert!(kept(holder.try_acquire(2).await.unwrap()));
    for waiter_client in [&b, &a] {
        let waiter = waiter_client
            .semaphore("cross")
            .with_recheck_interval(NO_RECHECK)
            .unwrap();
        assert!(!kept(waiter.try_acquire(1).await.unwrap()));
        let task =
            tokio::spawn(async move { waiter.acquire(1).await.map(SemaphorePermit::forget) });
        tokio::time::sleep(Duration::from_millis(200)).await;
        holder.release(1).await.unwrap();
        tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("woken by the release message")
            .unwrap()
            .unwrap();
    }
    assert_eq!(holder.available_permits().await.unwrap(), 0);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// A waiter asking for 2 permits parks first, then one asking for 1 (on the same client, or
/// on another), on an empty semaphore whose waiters recheck only every two minutes. A
/// `release(1)` must reach the waiter that can use it, by message, while the larger request
/// keeps waiting.
async fn a_released_permit_reaches_the_waiter_that_can_use_it(same_client: bool) {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let big_client = client(&server.url()).await;
    let other = match same_client {
        true => None,
        false => Some(client(&server.url()).await),
    };
    let small_client = other.as_ref().unwrap_or(&big_client);
    let sem = |c: &Client| {
        c.semaphore("behind")
            .with_recheck_interval(NO_RECHECK)
            .unwrap()
    };
    assert!(sem(&big_client).try_set_permits(0).await.unwrap());

    let before = evalsha_calls(&raw).await;
    let big = sem(&big_client);
    let big_task = tokio::spawn(async move { big.acquire(2).await.map(SemaphorePermit::forget) });
    // Parked before the smaller request comes: first in its process's line for a wake-up.
    let parked = wait_quiet(&raw, before + 1, Duration::from_millis(500)).await;
    let small = sem(small_client);
    let small_task =
        tokio::spawn(async move { small.acquire(1).await.map(SemaphorePermit::forget) });
    wait_quiet(&raw, parked + 1, Duration::from_millis(500)).await;
    let subscribers = if same_client { 1 } else { 2 };
    assert!(
        eventually(Duration::from_secs(10), || async {
            numsub(&raw, "redisson_sc:{behind}").await == subscribers
        })
        .await
    );

    let released_at = Instant::now();
    sem(&big_client).release(1).await.unwrap();
    tokio::time::timeout(Duration::from_secs(20), small_task)
        .await
        .expect("the released permit never reached the waiter asking for one")
        .unwrap()
        .unwrap();
    assert!(released_at.elapsed() < NO_RECHECK / 4, "not by the timer");
    assert!(
        !big_task.is_finished(),
        "one permit cannot serve a request for two"
    );
    assert_eq!(sem(&big_client).available_permits().await.unwrap(), 0);

    sem(&big_client).release(2).await.unwrap();
    tokio::time::timeout(Duration::from_secs(20), big_task)
        .await
        .expect("two permits wake the larger request")
        .unwrap()
        .unwrap();
    big_client.shutdown().await.unwrap();
    if let Some(other) = other {
        other.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn a_released_permit_passes_a_larger_waiter_of_the_same_client() {
    a_released_permit_reaches_the_waiter_that_can_use_it(true).await;
}

#[tokio::test]
async fn a_released_permit_passes_a_larger_waiter_of_another_client() {
    a_released_permit_reaches_the_waiter_that_can_use_it(false).await;
}

/// Checks a history of holds `(from, to, permits)` — `from` after the permits were surely
/// taken, `to` before they were given back, so any overlap seen really happened: the permits
/// held at any instant never exceed `limit`. Returns the most held at once.
fn max_held(history: &[(Instant, Instant, i64)], limit: i64) -> i64 {
    let mut events: Vec<(Instant, i64)> = Vec::new();
    for (from, to, permits) in history {
        assert!(from <= to);
        events.push((*from, *permits));
        events.push((*to, -permits));
    }
    // At one instant, releases before acquires: touching intervals do not overlap.
    events.sort_by_key(|(at, delta)| (*at, *delta));
    let (mut held, mut most) = (0, 0);
    for (at, delta) in events {
        held += delta;
        assert!(
            held <= limit,
            "{held} permits held at once at {at:?}; the limit is {limit}"
        );
        most = most.max(held);
    }
    most
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_n_permits_are_held_at_any_instant() {
    const PERMITS: i64 = 3;
    let server = RedisServer::start();
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(client(&server.url()).await);
    }
    clients[0]
        .semaphore("contended")
        .try_set_permits(PERMITS as u32)
        .await
        .unwrap();
    let history = Arc::new(Mutex::new(Vec::new()));
    let in_use = Arc::new(AtomicI64::new(0));
    let mut tasks = Vec::new();
    for (c, client) in clients.iter().enumerate() {
        for t in 0..4 {
            let sem = client.semaphore("contended");
            let (history, in_use) = (history.clone(), in_use.clone());
            tasks.push(tokio::spawn(async move {
                for round in 0..25 {
                    let permits = 1 + ((c + t + round) % 2) as u32;
                    if (t + round) % 3 == 0 {
                        while !kept(
                            sem.try_acquire_for(
                                permits,
                                Duration::from_millis(fastrand::u64(1..50)),
                            )
                            .await
                            .unwrap(),
                        ) {}
                    } else {
                        sem.acquire(permits).await.unwrap().forget();
                    }
                    let from = Instant::now();
                    let now =
                        in_use.fetch_add(i64::from(permits), Ordering::SeqCst) + i64::from(permits);
                    assert!(now <= PERMITS, "{now} permits in use");
                    tokio::time::sleep(Duration::from_millis(fastrand::u64(0..4))).await;
                    in_use.fetch_sub(i64::from(permits), Ordering::SeqCst);
                    let to = Instant::now();
                    history.lock().unwrap().push((from, to, i64::from(permits)));
                    sem.release(permits).await.unwrap();
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
    let history = std::mem::take(&mut *history.lock().unwrap());
    assert_eq!(history.len(), 3 * 4 * 25);
    let most = max_held(&history, PERMITS);
    assert_eq!(
        most, PERMITS,
        "the run never used every permit at once: vacuous"
    );
    let sem = clients[0].semaphore("contended");
    assert_eq!(sem.available_permits().await.unwrap(), PERMITS);
    for client in clients {
        client.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_and_timed_out_acquires_leave_no_permit_taken() {
    // Acquires cut short at random points (dropped while parked, while their round trip is
    // in flight, or after a timed-out wait) while permits come and go: once everything is
    // released, every permit is free again.
    const PERMITS: u32 = 2;
    let server = RedisServer::start();
    let a = client(&server.url()).await;
    let b = client(&server.url()).await;
    let sem = a.semaphore("cancel");
    sem.try_set_permits(PERMITS).await.unwrap();
    let mut tasks = Vec::new();
    for (i, client) in [&a, &b].into_iter().cycle().take(12).enumerate() {
        let sem = client.semaphore("cancel");
        tasks.push(tokio::spawn(async move {
            for _ in 0..30 {
                let permits = 1 + (i % 2) as u32;
                let cut = Duration::from_micros(fastrand::u64(0..20_000));
                let got = if i % 3 == 0 {
                    kept(sem.try_acquire_for(permits, cut).await.unwrap())
                } else {
                    let acquire = sem.acquire(permits);
                    match tokio::time::timeout(cut, acquire).await {
                        Ok(permit) => permit.unwrap().forget() == permits,
                        Err(_) => false,
                    }
                };
                if got {
                    tokio::time::sleep(Duration::from_micros(fastrand::u64(0..2000))).await;
                    sem.release(permits).await.unwrap();
                }
            }
        }));
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(120), task)
            .await
            .unwrap()
            .unwrap();
    }
    assert!(
        eventually(Duration::from_secs(20), || async {
            sem.available_permits().await.unwrap() == i64::from(PERMITS)
        })
        .await,
        "permits leaked: {} of {PERMITS} free",
        sem.available_permits().await.unwrap()
    );
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_whose_caller_left_gives_its_permits_back() {
    // The acquire script runs and takes the permits, but its reply is slow: one caller stops
    // waiting (command timeout), another is dropped. Both round trips are finished in the
    // background, and the permits they took are given back.
    let server = RedisServer::start();
    let raw = server.raw().await;
    let proxy = Proxy::start(server.port).await;
    let client = Client::builder()
        .url(proxy.url())
        .command_timeout(Duration::from_millis(1000))
        .connect()
        .await
        .unwrap();
    let sem = client.semaphore("slow");
    sem.try_set_permits(5).await.unwrap();
    proxy.set(Mode::RepliesDelayed(Duration::from_millis(1300)));

    let timed_out = sem.try_acquire(2).await;
    assert!(matches!(timed_out, Err(Error::Timeout(_))), "{timed_out:?}");
    let dropped = tokio::time::timeout(Duration::from_millis(200), sem.acquire(3)).await;
    assert!(dropped.is_err(), "cut short");
    // Both scripts ran: the server took all five permits.
    assert!(
        eventually(Duration::from_secs(10), || async {
            get(&raw, "slow").await.as_deref() == Some("0")
        })
        .await,
        "both acquires ran on the server"
    );
    proxy.set(Mode::Open);
    assert!(
        eventually(Duration::from_secs(20), || async {
            get(&raw, "slow").await.as_deref() == Some("5")
        })
        .await,
        "the permits taken by abandoned acquires came back: {:?}",
        get(&raw, "slow").await
    );
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
    assert!(invalid(sem.acquire(too_many).await.map(drop)));
    assert!(invalid(sem.try_acquire(too_many).await.map(drop)));
    assert!(invalid(
        sem.try_acquire_for(too_many, Duration::from_secs(1))
            .await
            .map(drop)
    ));
    assert!(invalid(sem.release(too_many).await));
    assert!(invalid(sem.try_set_permits(too_many).await.map(drop)));
    assert!(invalid(sem.add_permits(i64::MAX).await));
    assert!(invalid(sem.add_permits(-i64::from(too_many)).await));
    assert!(invalid(sem.with_recheck_interval(Duration::ZERO).map(drop)));
    assert!(invalid(sem.with_recheck_interval(Duration::MAX).map(drop)));
    assert!(invalid(client.semaphore("").try_acquire(1).await.map(drop)));
    assert!(invalid(
        client.semaphore("").available_permits().await.map(drop)
    ));

    // Zero permits, as in Redisson: taken at once and released as a no-op, with no call.
    let before = command_calls(&raw).await;
    assert!(kept(sem.try_acquire(0).await.unwrap()));
    assert!(sem
        .try_acquire_for(0, Duration::from_secs(1))
        .await
        .unwrap()
        .is_some());
    drop(sem.acquire(0).await.unwrap());
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
            wrong(sem.try_acquire(1).await.map(drop)),
            "{key}: try_acquire"
        );
        assert!(
            wrong(
                sem.try_acquire_for(1, Duration::from_millis(300))
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
/// (REDISSON.md §4.6): `tryAcquire(p)` and `release(p)` as a Java client runs them.
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
    assert!(!kept(sem.try_acquire(1).await.unwrap()));
    let waiter = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.acquire(1).await.map(SemaphorePermit::forget) })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
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
    let waiter = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.acquire(2).await.map(SemaphorePermit::forget) })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
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
    for name in ["pool-a", "pool-b", "{tag}:pool"] {
        let sem = a.semaphore(name);
        assert!(sem.try_set_permits(1).await.unwrap());
        assert!(kept(sem.try_acquire(1).await.unwrap()));
        let waiter = b.semaphore(name).with_recheck_interval(NO_RECHECK).unwrap();
        let task =
            tokio::spawn(async move { waiter.acquire(1).await.map(SemaphorePermit::forget) });
        tokio::time::sleep(Duration::from_millis(300)).await;
        sem.release(1).await.unwrap();
        tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("woken by the (sharded) release message")
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
        let task = tokio::spawn(async move { waiter.acquire().await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        held.release().await.unwrap();
        let permit = tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("woken by the (sharded) release message")
            .unwrap()
            .unwrap();
        assert!(!permit.is_lost());
        permit.release().await.unwrap();
    }
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// A job that takes permits the ordinary way — bound for as long as it runs — and then fails
/// before it gives them back, as code using `?` does.
async fn failing_job(sem: &Semaphore) -> redbaton::Result<()> {
    let _one = sem.acquire(1).await?;
    let _two = sem.try_acquire_for(2, Duration::from_secs(5)).await?;
    Err(Error::InvalidArgument("the job failed".to_owned()))
}

#[tokio::test]
async fn permits_taken_by_a_job_that_fails_come_back() {
    // The job's permits are given back when they go out of scope on its error path, as a
    // tokio permit is: none may leak.
    let server = RedisServer::start();
    let client = client(&server.url()).await;
    let sem = client.semaphore("jobs");
    sem.try_set_permits(6).await.unwrap();
    for _ in 0..2 {
        let job = tokio::time::timeout(Duration::from_secs(30), failing_job(&sem)).await;
        assert!(matches!(job, Ok(Err(Error::InvalidArgument(_)))), "{job:?}");
    }
    assert!(
        eventually(Duration::from_secs(20), || async {
            sem.available_permits().await.unwrap() == 6
        })
        .await,
        "permits leaked by failed jobs: {} of 6 free",
        sem.available_permits().await.unwrap()
    );
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_is_given_back_by_release_drop_or_cancel_and_kept_by_forget() {
    let server = RedisServer::start();
    let client = client(&server.url()).await;
    let sem = client.semaphore("guarded");
    sem.try_set_permits(5).await.unwrap();

    // release: back before it returns.
    let permit = sem.acquire(2).await.unwrap();
    assert_eq!(permit.permits(), 2);
    assert_eq!(permit.semaphore_name(), "guarded");
    assert_eq!(sem.available_permits().await.unwrap(), 3);
    permit.release().await.unwrap();
    assert_eq!(sem.available_permits().await.unwrap(), 5);

    // forget keeps them taken; a permit dropped after it comes back, the forgotten ones stay
    // out until a release(n) gives them back.
    assert_eq!(sem.acquire(2).await.unwrap().forget(), 2);
    drop(sem.try_acquire(1).await.unwrap().expect("3 free"));
    assert!(
        eventually(Duration::from_secs(20), || async {
            sem.available_permits().await.unwrap() == 3
        })
        .await,
        "the dropped permit came back, the forgotten ones did not: {} free",
        sem.available_permits().await.unwrap()
    );
    sem.release(2).await.unwrap();
    assert_eq!(sem.available_permits().await.unwrap(), 5);

    // A task holding permits is cancelled: they come back.
    let (held_tx, held_rx) = tokio::sync::oneshot::channel();
    let holder = {
        let sem = sem.clone();
        tokio::spawn(async move {
            let _permits = sem.acquire(4).await.unwrap();
            held_tx.send(()).unwrap();
            std::future::pending::<()>().await;
        })
    };
    held_rx.await.unwrap();
    assert_eq!(sem.available_permits().await.unwrap(), 1);
    holder.abort();
    assert!(
        eventually(Duration::from_secs(20), || async {
            sem.available_permits().await.unwrap() == 5
        })
        .await,
        "the cancelled task's permits came back: {} free",
        sem.available_permits().await.unwrap()
    );

    // release reports a refusal: the count would pass what a Redisson peer reads.
    let permit = sem.acquire(1).await.unwrap();
    sem.add_permits(i64::from(MAX_PERMITS) - 4).await.unwrap();
    let refused = permit.release().await;
    assert!(
        matches!(refused, Err(Error::InvalidArgument(_))),
        "{refused:?}"
    );
    assert_eq!(
        sem.available_permits().await.unwrap(),
        i64::from(MAX_PERMITS)
    );
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn drain_permits_takes_every_free_permit_as_redisson_does() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server.url()).await;
    let sem = client.semaphore("drained");
    let (_subscriber, mut messages) = subscribe(&server.url(), "redisson_sc:{drained}").await;

    // No count yet: 0, and none is created.
    assert_eq!(sem.drain_permits().await.unwrap(), 0);
    let exists: i64 = raw.exists("drained").await.unwrap();
    assert_eq!(exists, 0, "nothing created");

    sem.try_set_permits(5).await.unwrap();
    sem.acquire(2).await.unwrap().forget();
    let _: () = raw.pexpire("drained", 60_000, None).await.unwrap();
    assert_eq!(sem.drain_permits().await.unwrap(), 3);
    assert_eq!(get(&raw, "drained").await.as_deref(), Some("0"));
    let pttl: i64 = raw.pttl("drained").await.unwrap();
    assert_eq!(pttl, -1, "the SET clears the expiry, as Redisson's does");
    assert!(sem.try_acquire(1).await.unwrap().is_none(), "none left");

    // A negative count is raised to 0 and returned as it was.
    sem.add_permits(-3).await.unwrap();
    assert_eq!(sem.drain_permits().await.unwrap(), -3);
    assert_eq!(get(&raw, "drained").await.as_deref(), Some("0"));

    // Nothing published by a drain: only the set's "5".
    let seen = drain(&mut messages, Duration::from_millis(500)).await;
    assert_eq!(seen, ["5"]);

    // Another type, or a string that is not a count: refused, left alone.
    let _: () = raw.set("text", "many", None, None, false).await.unwrap();
    let refused = client.semaphore("text").drain_permits().await;
    assert!(
        matches!(refused, Err(Error::WrongType { .. })),
        "{refused:?}"
    );
    assert_eq!(get(&raw, "text").await.as_deref(), Some("many"));
    let _: () = raw.lpush("list", "x").await.unwrap();
    let refused = client.semaphore("list").drain_permits().await;
    assert!(
        matches!(refused, Err(Error::WrongType { .. })),
        "{refused:?}"
    );
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn shutdown_gives_back_the_permits_still_held() {
    // A permit still in scope when the client shuts down (the end of `main`, say): shutdown
    // gives its permits back, as it releases the locks still held; a forgotten one stays out.
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server.url()).await;
    let sem = client.semaphore("at-exit");
    sem.try_set_permits(5).await.unwrap();
    let held = sem.acquire(2).await.unwrap();
    sem.acquire(1).await.unwrap().forget();
    client.shutdown().await.unwrap();
    assert_eq!(
        get(&raw, "at-exit").await.as_deref(),
        Some("4"),
        "the held permits are back once shutdown returns; the forgotten one is not"
    );
    let late = held.release().await;
    assert!(matches!(late, Err(Error::ShutDown)), "{late:?}");
    assert_eq!(get(&raw, "at-exit").await.as_deref(), Some("4"));
}
