//! The read/write lock (Redisson's `RReadWriteLock`) against real redis-server: the wire
//! layout, many readers or one writer, wake-ups (the last read unlock wakes a writer, a write
//! unlock wakes every reader), reentry, the downgrade, no upgrade, reader timeout keys and the
//! expiry they drive, dead holders, force-unlock per half, wrong types, renewal, shutdown,
//! cancellation, a contention run checked by history, a cluster, and interleavings with a
//! "Redisson peer" (tests/support/redisson_peer.rs: Redisson's scripts restated from the fact
//! sheet, driven by raw commands).

#[path = "support/redisson_peer.rs"]
mod redisson_peer;
mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::clients::SubscriberClient;
use fred::prelude::*;
use fred::types::Message;
use parking_lot::Mutex;
use redbaton::{Client, Error, Guard, PubSubMode, ReadLock, ReadWriteLock, WriteLock};
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

/// The next release message (`0` or `1`), past news of a closer expiry (`-<ms>`: the other
/// reader's unlock may bring the expiry down by a few milliseconds).
async fn next_release(messages: &mut broadcast::Receiver<Message>) -> String {
    loop {
        let message = next_message(messages).await;
        if !message.starts_with('-') {
            return message;
        }
    }
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

#[tokio::test]
async fn wire_layout_matches_redisson() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server).await;
    let rw = client.read_write_lock("catalog");
    assert_eq!(rw.channel(), "redisson_rwlock:{catalog}");
    assert_eq!(rw.read().channel(), "redisson_rwlock:{catalog}");
    assert_eq!(
        client.read_write_lock("{shop}:catalog").channel(),
        "redisson_rwlock:{shop}:catalog"
    );

    // Two read holds of one owner: mode, the reader field with its count, a timeout key per
    // hold with the lease.
    let r1 = rw.read().lock().await.unwrap();
    let r2 = r1
        .run(|| async { rw.read().lock_with_lease(Duration::from_secs(20)).await })
        .await
        .unwrap()
        .unwrap();
    let owner = r1.owner().to_string();
    assert_eq!(owner, r2.owner().to_string());
    assert!(owner.starts_with(client.id()));
    let hash = fields(&raw, "catalog").await;
    assert_eq!(hash.len(), 2, "{hash:?}");
    assert_eq!(hash["mode"], "read");
    assert_eq!(hash[&owner], "2");
    let key1 = format!("{{catalog}}:{owner}:rwlock_timeout:1");
    let key2 = format!("{{catalog}}:{owner}:rwlock_timeout:2");
    assert_eq!(key1, timeout_key("catalog", &owner, 1));
    let t1 = pttl(&raw, &key1).await;
    let t2 = pttl(&raw, &key2).await;
    assert!(t1 > 25_000 && t1 <= 30_000, "watchdog lease: {t1}");
    assert!(t2 > 15_000 && t2 <= 20_000, "fixed lease: {t2}");
    let value: String = raw.get(&key1).await.unwrap();
    assert_eq!(value, "1");
    let ttl = pttl(&raw, "catalog").await;
    assert!(ttl > 25_000 && ttl <= 30_000, "the longest lease: {ttl}");
    r2.unlock().await.unwrap();
    assert!(
        !exists(&raw, &key2).await,
        "the hold's timeout key goes with it"
    );
    assert!(exists(&raw, &key1).await);
    r1.unlock().await.unwrap();
    assert!(!exists(&raw, "catalog").await);
    assert!(keys(&raw, "*rwlock_timeout*").await.is_empty());

    // The writer: mode write, the field "<owner>:write".
    let (_sub, mut messages) = subscribe(&server.url(), "redisson_rwlock:{catalog}").await;
    let same: redbaton::Owner = owner.parse().unwrap();
    let w = rw.write().with_owner(same.clone()).lock().await.unwrap();
    assert_eq!(w.owner().to_string(), owner);
    let hash = fields(&raw, "catalog").await;
    assert_eq!(hash.len(), 2, "{hash:?}");
    assert_eq!(hash["mode"], "write");
    assert_eq!(hash[&format!("{owner}:write")], "1");
    let ttl = pttl(&raw, "catalog").await;
    assert!(ttl > 25_000 && ttl <= 30_000, "{ttl}");
    w.unlock().await.unwrap();
    assert!(!exists(&raw, "catalog").await);
    assert_eq!(
        next_message(&mut messages).await,
        "1",
        "write unlock says 1"
    );
    let r = rw.read().lock().await.unwrap();
    r.unlock().await.unwrap();
    assert_eq!(next_message(&mut messages).await, "0", "read unlock says 0");

    // A name with a hash tag: the timeout key is "<name>:<owner>:rwlock_timeout:<i>".
    let braced = client.read_write_lock("{shop}:catalog");
    let r = braced.read().with_owner(same).lock().await.unwrap();
    let key = format!("{{shop}}:catalog:{owner}:rwlock_timeout:1");
    assert_eq!(key, timeout_key("{shop}:catalog", &owner, 1));
    let t = pttl(&raw, &key).await;
    assert!(t > 25_000 && t <= 30_000, "{t}");
    r.unlock().await.unwrap();
    assert!(!exists(&raw, "{shop}:catalog").await);
    assert!(!exists(&raw, &key).await);
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_and_the_last_read_unlock_wakes_the_writer() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let a = client(&server).await;
    let b = client(&server).await;
    let c = client(&server).await;
    // Five readers at once: two clients, several tasks.
    let mut readers = Vec::new();
    for (i, client) in [&a, &a, &a, &b, &b].into_iter().enumerate() {
        let rw = client.read_write_lock("shared");
        let guard = tokio::spawn(async move { rw.read().lock().await.unwrap() })
            .await
            .unwrap();
        assert!(!guard.is_lost(), "reader {i}");
        readers.push(guard);
    }
    let hash = fields(&raw, "shared").await;
    assert_eq!(hash.len(), 6, "mode + five readers: {hash:?}");
    assert!(c
        .read_write_lock("shared")
        .read()
        .is_locked()
        .await
        .unwrap());
    assert!(!c
        .read_write_lock("shared")
        .write()
        .is_locked()
        .await
        .unwrap());
    assert!(c
        .read_write_lock("shared")
        .write()
        .try_lock()
        .await
        .unwrap()
        .is_none());

    let writer = {
        let rw = c.read_write_lock("shared");
        tokio::spawn(async move {
            let guard = rw.write().lock().await.unwrap();
            let at = Instant::now();
            guard.unlock().await.unwrap();
            at
        })
    };
    assert!(
        eventually(Duration::from_secs(5), || async {
            numsub(&raw, "redisson_rwlock:{shared}").await == 1
        })
        .await
    );
    let mut writer = writer;
    let last = readers.pop().unwrap();
    for guard in readers {
        guard.unlock().await.unwrap();
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut writer)
            .await
            .is_err(),
        "the writer waits while a reader remains"
    );
    let released = Instant::now();
    last.unlock().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), writer)
        .await
        .expect("the writer is woken")
        .unwrap();
    let delay = got.saturating_duration_since(released);
    assert!(
        delay < Duration::from_secs(3),
        "woken by the last read unlock, not by the 30 s lease: {delay:?}"
    );
    for client in [a, b, c] {
        client.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_unlock_wakes_every_waiting_reader() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let writer = client(&server).await;
    let b = client(&server).await;
    let c = client(&server).await;
    let guard = writer.read_write_lock("wake").write().lock().await.unwrap();
    let barrier = Arc::new(Barrier::new(6));
    let mut tasks = Vec::new();
    for client in [&b, &b, &b, &c, &c, &c] {
        tasks.push(spawn_reader(
            client.read_write_lock("wake"),
            barrier.clone(),
        ));
    }
    assert!(
        eventually(Duration::from_secs(5), || async {
            numsub(&raw, "redisson_rwlock:{wake}").await == 2
        })
        .await,
        "both processes subscribed"
    );
    // Let every reader park (a reader parked or still re-checking is woken either way).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    guard.unlock().await.unwrap();
    for task in tasks {
        let got = tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("every reader is woken by the write unlock (message 1)")
            .unwrap();
        let delay = got.saturating_duration_since(released);
        assert!(delay < Duration::from_secs(3), "{delay:?}");
    }
    for client in [writer, b, c] {
        client.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn reentry_on_both_sides() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server).await;
    let rw = client.read_write_lock("reenter");
    let (read, write) = (rw.read(), rw.write());
    let r1 = read.lock().await.unwrap();
    let r2 = r1
        .run(|| async { read.try_lock().await.unwrap().expect("a reader re-enters") })
        .await
        .unwrap();
    let r3 = r1.reenter().await.unwrap();
    let (owned_read, owned_write) = (read.with_owner(r1.owner()), write.with_owner(r1.owner()));
    assert_eq!(owned_read.hold_count().await.unwrap(), 3);
    assert!(owned_read.is_held_in_scope().await.unwrap());
    assert!(r1.run(|| read.is_held_in_scope()).await.unwrap().unwrap());
    assert_eq!(owned_write.hold_count().await.unwrap(), 0);
    r3.unlock().await.unwrap();
    r2.unlock().await.unwrap();
    assert_eq!(owned_read.hold_count().await.unwrap(), 1);
    r1.unlock().await.unwrap();
    assert_eq!(owned_read.hold_count().await.unwrap(), 0);
    assert!(!exists(&raw, "reenter").await);

    let w1 = write.lock().await.unwrap();
    let w2 = w1
        .run(|| async {
            write
                .try_lock()
                .await
                .unwrap()
                .expect("the writer re-enters")
        })
        .await
        .unwrap();
    let owned_write = write.with_owner(w1.owner());
    assert_eq!(owned_write.hold_count().await.unwrap(), 2);
    assert!(owned_write.is_held_in_scope().await.unwrap());
    let other = client.read_write_lock("reenter");
    let excluded = tokio::spawn(async move {
        (
            other.read().try_lock().await.unwrap().is_none(),
            other.write().try_lock().await.unwrap().is_none(),
        )
    })
    .await
    .unwrap();
    assert_eq!(excluded, (true, true), "other tasks neither read nor write");
    w2.unlock().await.unwrap();
    assert!(write.is_locked().await.unwrap());
    w1.unlock().await.unwrap();
    assert!(!write.is_locked().await.unwrap());
    assert!(!exists(&raw, "reenter").await);
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_writer_may_read_and_keeps_reading_after_its_write_unlock() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server).await;
    let rw = client.read_write_lock("downgrade");
    let (_sub, mut messages) = subscribe(&server.url(), rw.channel()).await;
    let w = rw.write().lock().await.unwrap();
    // In the write hold's scope: the same owner reads (the downgrade to come).
    let r = w
        .run(|| async { rw.read().lock().await })
        .await
        .unwrap()
        .unwrap();
    let owner = w.owner().to_string();
    assert!(
        rw.read().is_locked().await.unwrap(),
        "write mode with a read hold"
    );
    let hash = fields(&raw, "downgrade").await;
    assert_eq!(hash["mode"], "write");
    assert_eq!(hash[&owner], "1");
    // The writer re-enters its write hold while reading (no upgrade involved).
    let w2 = r
        .run(|| async { rw.write().try_lock().await.unwrap() })
        .await
        .unwrap()
        .expect("writer re-enters");
    w2.unlock().await.unwrap();

    w.unlock().await.unwrap();
    let hash = fields(&raw, "downgrade").await;
    assert_eq!(hash.len(), 2, "{hash:?}");
    assert_eq!(hash["mode"], "read", "downgraded");
    assert_eq!(hash[&owner], "1");
    let other = client.read_write_lock("downgrade");
    let (read_ok, write_refused) = tokio::spawn(async move {
        let read = other.read().try_lock().await.unwrap();
        let ok = read.is_some();
        if let Some(g) = read {
            g.unlock().await.unwrap();
        }
        (ok, other.write().try_lock().await.unwrap().is_none())
    })
    .await
    .unwrap();
    assert!(read_ok, "other readers get in after the downgrade");
    assert!(write_refused, "writers do not");
    r.unlock().await.unwrap();
    assert!(!exists(&raw, "downgrade").await);
    // The downgrade woke every waiter (readers may enter; Redisson publishes nothing there),
    // then the last read unlock freed the lock.
    assert_eq!(next_release(&mut messages).await, "1");
    assert_eq!(next_release(&mut messages).await, "0");
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_writers_own_read_unlock_never_shortens_its_write_lease() {
    // Redisson's read unlock sets the hash's expiry to the longest reader timeout key left,
    // in write mode too — which would cut the writer's lease down to its short read lease.
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server).await;
    let rw = client.read_write_lock("short-read");
    let w = rw.write().lock().await.unwrap();
    let read = || async { rw.read().lock_with_lease(Duration::from_secs(1)).await };
    let r1 = w.run(read).await.unwrap().unwrap();
    let r2 = w.run(read).await.unwrap().unwrap();
    r1.unlock().await.unwrap();
    let ttl = pttl(&raw, "short-read").await;
    assert!(ttl > 25_000, "the writer's lease stays: {ttl}");
    r2.unlock().await.unwrap();
    assert!(pttl(&raw, "short-read").await > 25_000);
    assert_eq!(fields(&raw, "short-read").await["mode"], "write");
    w.unlock().await.unwrap();
    assert!(!exists(&raw, "short-read").await);
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_reader_cannot_upgrade() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server).await;
    let rw = client.read_write_lock("upgrade");
    let r = rw.read().lock().await.unwrap();
    let start = Instant::now();
    // Inside the read hold's scope, the write half is the same owner: a wait could never end.
    let (waiting, trying, bounded) = r
        .run(|| async {
            let waiting = rw.write().lock().await.map(drop);
            let trying = rw.write().try_lock().await.map(|g| g.is_some());
            let bounded = rw.write().try_lock_for(Duration::from_secs(5)).await;
            (waiting, trying, bounded.map(drop))
        })
        .await
        .unwrap();
    assert!(matches!(waiting, Err(Error::WouldDeadlock { .. })));
    assert!(!trying.unwrap(), "a try cannot deadlock: it just fails");
    let err = bounded.unwrap_err();
    assert!(matches!(err, Error::WouldDeadlock { ref name, .. } if name == "upgrade"));
    assert!(err.to_string().contains("upgrade"), "{err}");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "refused at once, not after waiting"
    );
    assert_eq!(
        rw.read().with_owner(r.owner()).hold_count().await.unwrap(),
        1
    );
    assert_eq!(
        rw.write().with_owner(r.owner()).hold_count().await.unwrap(),
        0
    );
    let hash = fields(&raw, "upgrade").await;
    assert_eq!(hash.len(), 2, "nothing was written: {hash:?}");
    // Another owner's writer simply waits (no error: it does not hold a read hold).
    let other = rw.clone();
    let waited = tokio::spawn(async move {
        other
            .write()
            .try_lock_for(Duration::from_millis(200))
            .await
            .map(|g| g.is_none())
    })
    .await
    .unwrap();
    assert_eq!(waited, Ok(true));
    r.unlock().await.unwrap();
    let w = rw.write().try_lock().await.unwrap().expect("free now");
    w.unlock().await.unwrap();
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_read_unlock_brings_the_expiry_down_to_the_remaining_readers() {
    // Redisson's rule: the hash lives as long as the longest remaining reader's timeout key.
    let server = RedisServer::start();
    let raw = server.raw().await;
    let a = client(&server).await;
    let b = client(&server).await;
    let long = a
        .read_write_lock("ttl")
        .read()
        .lock_with_lease(Duration::from_secs(60))
        .await
        .unwrap();
    let short = b
        .read_write_lock("ttl")
        .read()
        .lock_with_lease(Duration::from_millis(1500))
        .await
        .unwrap();
    assert!(pttl(&raw, "ttl").await > 55_000);
    long.unlock().await.unwrap();
    let left = pttl(&raw, "ttl").await;
    assert!(
        left > 0 && left <= 1500,
        "down to the short reader's: {left}"
    );
    // A writer gets in once that lease ends.
    let start = Instant::now();
    let w = a
        .read_write_lock("ttl")
        .write()
        .try_lock_for(Duration::from_secs(10))
        .await
        .unwrap()
        .expect("free after the short lease");
    assert!(start.elapsed() < Duration::from_secs(4));
    assert!(short.is_lost());
    w.unlock().await.unwrap();
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// The hash's fields and expiry, for failure messages.
async fn describe(raw: &fred::clients::Client, key: &str) -> String {
    format!(
        "{:?}, pttl {}",
        fields(raw, key).await,
        pttl(raw, key).await
    )
}

/// A write hold with a 300 ms fixed lease, and a read hold (watchdog lease) of the same owner
/// taken in its scope.
async fn ending_write_with_a_read(rw: &ReadWriteLock) -> (Guard<WriteLock>, Guard<ReadLock>) {
    let w = rw
        .write()
        .lock_with_lease(Duration::from_millis(300))
        .await
        .unwrap();
    let r = w.run(|| async { rw.read().lock().await }).await;
    (w, r.unwrap().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_write_lease_leaves_no_writer_behind() {
    // Issue 22: the writer also reads (watchdog lease), and its fixed write lease ends. The
    // read hold keeps the hash — writer field included — alive. Once every guard is released,
    // another client must get in at once, not after the read hold's 30 s expiry.
    let server = RedisServer::start();
    let raw = server.raw().await;
    let a = client(&server).await;
    let b = client(&server).await;
    let rw = a.read_write_lock("ended-w");
    let (w, r) = ending_write_with_a_read(&rw).await;
    let writer_field = format!("{}:write", w.owner());
    assert!(eventually(Duration::from_secs(5), || async { w.is_lost() }).await);
    assert!(
        fields(&raw, "ended-w").await.contains_key(&writer_field),
        "the read hold keeps the ended write hold's field alive: {}",
        describe(&raw, "ended-w").await
    );
    assert!(matches!(w.unlock().await, Err(Error::NotHeld { .. })));
    r.unlock().await.unwrap();

    let start = Instant::now();
    let got = b
        .read_write_lock("ended-w")
        .write()
        .try_lock_for(Duration::from_secs(10))
        .await
        .unwrap();
    let Some(got) = got else {
        panic!(
            "another client's writer is still kept out after every guard was released: {}",
            describe(&raw, "ended-w").await
        );
    };
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    got.unlock().await.unwrap();
    assert!(!exists(&raw, "ended-w").await);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_write_lease_downgrades_to_its_owners_reads_and_wakes_readers() {
    // As above, but the read hold stays: the ended write hold's unlock leaves the lock in read
    // mode, held by the read hold alone, and a reader of another client waiting meanwhile is
    // woken and gets in.
    let server = RedisServer::start();
    let raw = server.raw().await;
    let a = client(&server).await;
    let b = client(&server).await;
    let rw = a.read_write_lock("ended-wr");
    let (w, r) = ending_write_with_a_read(&rw).await;
    let owner = r.owner().to_string();
    let reader = {
        let rw = b.read_write_lock("ended-wr");
        tokio::spawn(async move {
            let got = rw.read().try_lock_for(Duration::from_secs(20)).await;
            (got, Instant::now())
        })
    };
    assert!(
        eventually(Duration::from_secs(5), || async {
            numsub(&raw, "redisson_rwlock:{ended-wr}").await == 1
        })
        .await
    );
    assert!(eventually(Duration::from_secs(5), || async { w.is_lost() }).await);
    let released = Instant::now();
    assert!(matches!(w.unlock().await, Err(Error::NotHeld { .. })));
    let (got, at) = tokio::time::timeout(Duration::from_secs(10), reader)
        .await
        .unwrap_or_else(|_| panic!("the waiting reader is still kept out by the ended write hold"))
        .unwrap();
    let got = got.unwrap().expect("the reader got in");
    let delay = at.saturating_duration_since(released);
    assert!(delay < Duration::from_secs(5), "{delay:?}");
    let hash = fields(&raw, "ended-wr").await;
    assert_eq!(hash["mode"], "read", "{hash:?}");
    assert!(!hash.contains_key(&format!("{owner}:write")), "{hash:?}");
    assert_eq!(hash[&owner], "1", "the owner's read hold is untouched");
    got.unlock().await.unwrap();
    r.unlock().await.unwrap();
    assert!(!exists(&raw, "ended-wr").await);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_learns_that_a_read_unlock_shortened_the_lease() {
    // Issue 22: reader R1 (1.5 s fixed lease), reader R2 (watchdog); a writer of a third client
    // parks with the 30 s expiry R2 gave the hash. R2's unlock brings the expiry down to R1's
    // lease: the writer must get in once R1's lease ends — not before, and not at 30 s.
    let server = RedisServer::start();
    let raw = server.raw().await;
    let (a, b, c) = (
        client(&server).await,
        client(&server).await,
        client(&server).await,
    );
    let (_sub, mut messages) = subscribe(&server.url(), "redisson_rwlock:{last-lease}").await;
    let r1_sent = Instant::now();
    let r1 = a
        .read_write_lock("last-lease")
        .read()
        .lock_with_lease(Duration::from_millis(1500))
        .await
        .unwrap();
    let r1_ends = r1_sent + Duration::from_millis(1500);
    let r2 = b.read_write_lock("last-lease").read().lock().await.unwrap();
    assert!(pttl(&raw, "last-lease").await > 25_000);
    let writer = {
        let rw = c.read_write_lock("last-lease");
        tokio::spawn(async move {
            let got = rw.write().try_lock_for(Duration::from_secs(20)).await;
            (got, Instant::now())
        })
    };
    assert!(
        eventually(Duration::from_secs(5), || async {
            numsub(&raw, "redisson_rwlock:{last-lease}").await == 2
        })
        .await,
        "the writer's client subscribed"
    );
    // Let the writer park with the 30 s expiry (R2 unlocks ~500 ms in, as in the issue).
    tokio::time::sleep_until((r1_sent + Duration::from_millis(500)).into()).await;
    r2.unlock().await.unwrap();
    let left = pttl(&raw, "last-lease").await;
    assert!(left > 0 && left <= 1500, "down to R1's lease: {left}");

    let (got, at) = tokio::time::timeout(Duration::from_secs(25), writer)
        .await
        .unwrap()
        .unwrap();
    let got = got.unwrap();
    assert!(
        got.is_some(),
        "the writer did not get in within 20 s; R1's lease ended {:?} after it started waiting",
        r1_ends.saturating_duration_since(r1_sent)
    );
    assert!(
        at >= r1_ends,
        "the writer got in while R1 still held its lease"
    );
    let late = at.saturating_duration_since(r1_ends);
    assert!(
        late < Duration::from_secs(10),
        "got in {late:?} after R1's lease ended (the 30 s expiry, not R1's)"
    );
    // What the waiters were told: the lock's expiry in milliseconds, negated (a number
    // Redisson's waiters ignore).
    let message = next_message(&mut messages).await;
    let told: i64 = message.parse().unwrap();
    assert!((-1500..0).contains(&told), "{message}");
    assert!(r1.is_lost());
    got.unwrap().unlock().await.unwrap();
    drop(r1);
    for client in [a, b, c] {
        client.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn a_read_unlock_that_does_not_shorten_the_expiry_publishes_nothing() {
    // Read-heavy workloads must not wake waiters for nothing: only a release that brings the
    // expiry down says so.
    let server = RedisServer::start();
    let raw = server.raw().await;
    let (a, b) = (client(&server).await, client(&server).await);
    let (_sub, mut messages) = subscribe(&server.url(), "redisson_rwlock:{steady}").await;
    let long = a
        .read_write_lock("steady")
        .read()
        .lock_with_lease(Duration::from_secs(60))
        .await
        .unwrap();
    let short = b
        .read_write_lock("steady")
        .read()
        .lock_with_lease(Duration::from_secs(5))
        .await
        .unwrap();
    short.unlock().await.unwrap();
    assert!(pttl(&raw, "steady").await > 55_000);
    long.unlock().await.unwrap();
    assert!(!exists(&raw, "steady").await);
    assert_eq!(
        next_message(&mut messages).await,
        "0",
        "the first message is the last unlock's"
    );
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_owners_remaining_read_holds_keep_its_longest_lease() {
    // Timeout keys are per count, not per hold: releasing the short-lease hold deletes the
    // key of the highest count — the long lease's — and would leave the short key, cutting
    // the remaining long hold short while its guard still counts on its 20 s. The release
    // keeps the longest lease on the remaining keys.
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server).await;
    let other = self::client(&server).await;
    let rw = client.read_write_lock("keep");
    let short = rw
        .read()
        .lock_with_lease(Duration::from_millis(800))
        .await
        .unwrap();
    let long = short
        .run(|| async { rw.read().lock_with_lease(Duration::from_secs(20)).await })
        .await
        .unwrap()
        .unwrap();
    let owner = short.owner().to_string();
    short.unlock().await.unwrap();
    let key1 = timeout_key("keep", &owner, 1);
    assert!(pttl(&raw, &key1).await > 15_000);
    assert!(!exists(&raw, &timeout_key("keep", &owner, 2)).await);
    assert!(pttl(&raw, "keep").await > 15_000);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(!long.is_lost());
    assert!(
        other
            .read_write_lock("keep")
            .write()
            .try_lock()
            .await
            .unwrap()
            .is_none(),
        "the remaining read hold still excludes writers"
    );
    long.unlock().await.unwrap();
    assert!(!exists(&raw, "keep").await);
    client.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

/// Runs `f` with a client whose runtime then dies: no unlock, no shutdown, no renewal.
fn dead_client<F, Fut>(url: String, f: F)
where
    F: FnOnce(Client) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let holder = Client::builder()
                .url(url)
                .watchdog_lease(Duration::from_millis(600))
                .connect()
                .await
                .unwrap();
            f(holder).await;
        });
        drop(rt);
    })
    .join()
    .unwrap();
}

#[tokio::test]
async fn dead_readers_and_writers_expire_with_their_lease() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server).await;

    // A dead reader: a writer gets in after its lease.
    dead_client(server.url(), |c| async move {
        std::mem::forget(c.read_write_lock("dead-r").read().lock().await.unwrap());
    });
    assert!(exists(&raw, "dead-r").await);
    let start = Instant::now();
    let w = client
        .read_write_lock("dead-r")
        .write()
        .try_lock_for(Duration::from_secs(10))
        .await
        .unwrap()
        .expect("free after the dead reader's lease");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    w.unlock().await.unwrap();

    // A dead writer: readers get in after its lease.
    dead_client(server.url(), |c| async move {
        std::mem::forget(c.read_write_lock("dead-w").write().lock().await.unwrap());
    });
    let start = Instant::now();
    let r = client
        .read_write_lock("dead-w")
        .read()
        .try_lock_for(Duration::from_secs(10))
        .await
        .unwrap()
        .expect("free after the dead writer's lease");
    assert!(start.elapsed() < Duration::from_secs(3));
    r.unlock().await.unwrap();

    // A dead reader beside a live one: the live reader keeps the hash alive past the dead
    // one's lease, but the dead reader's expired timeout key no longer counts — the live
    // reader's unlock frees the lock (and its message wakes a waiting writer).
    let live = client
        .read_write_lock("zombie")
        .read()
        .lock()
        .await
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    dead_client(server.url(), move |c| async move {
        let g = c.read_write_lock("zombie").read().lock().await.unwrap();
        tx.send(g.owner().to_string()).unwrap();
        std::mem::forget(g);
    });
    let dead_owner = rx.recv().unwrap();
    let dead_key = timeout_key("zombie", &dead_owner, 1);
    assert!(
        eventually(Duration::from_secs(5), || async {
            !exists(&raw, &dead_key).await
        })
        .await
    );
    assert!(fields(&raw, "zombie").await.contains_key(&dead_owner));
    let writer_client = self::client(&server).await;
    let writer = {
        let rw = writer_client.read_write_lock("zombie");
        tokio::spawn(async move {
            let g = rw.write().lock().await.unwrap();
            let at = Instant::now();
            g.unlock().await.unwrap();
            at
        })
    };
    assert!(
        eventually(Duration::from_secs(5), || async {
            numsub(&raw, "redisson_rwlock:{zombie}").await == 1
        })
        .await
    );
    let released = Instant::now();
    live.unlock().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), writer)
        .await
        .unwrap()
        .unwrap();
    assert!(got.saturating_duration_since(released) < Duration::from_secs(3));
    client.shutdown().await.unwrap();
    writer_client.shutdown().await.unwrap();
}

#[tokio::test]
async fn force_unlock_clears_only_its_own_mode() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    // Renewed often enough that the holders learn of the force-unlock soon.
    let holder = short_lease_client(&server, RENEWED_LEASE).await;
    let admin = client(&server).await;
    let rw = admin.read_write_lock("force");

    let r = holder.read_write_lock("force").read().lock().await.unwrap();
    assert!(
        !rw.write().force_unlock().await.unwrap(),
        "not in write mode"
    );
    assert!(exists(&raw, "force").await);
    assert!(rw.read().force_unlock().await.unwrap());
    assert!(!exists(&raw, "force").await);
    tokio::time::timeout(Duration::from_secs(5), r.lost())
        .await
        .expect("the reader learns it lost the lock");
    assert!(matches!(r.unlock().await, Err(Error::NotHeld { .. })));

    let w = holder
        .read_write_lock("force")
        .write()
        .lock()
        .await
        .unwrap();
    let (_sub, mut messages) = subscribe(&server.url(), rw.channel()).await;
    assert!(!rw.read().force_unlock().await.unwrap(), "not in read mode");
    assert!(exists(&raw, "force").await);
    assert!(rw.write().force_unlock().await.unwrap());
    assert_eq!(next_message(&mut messages).await, "1");
    assert!(!exists(&raw, "force").await);
    tokio::time::timeout(Duration::from_secs(5), w.lost())
        .await
        .expect("the writer learns it lost the lock");
    assert!(!rw.read().force_unlock().await.unwrap(), "nothing to clear");
    holder.shutdown().await.unwrap();
    admin.shutdown().await.unwrap();
}

#[tokio::test]
async fn keys_that_are_not_read_write_locks_are_never_touched() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server).await;

    // Another type: WRONGTYPE everywhere, the value untouched.
    let _: () = raw
        .set("text", "user data", None, None, false)
        .await
        .unwrap();
    let rw = client.read_write_lock("text");
    let wrong = |r: Result<_, Error>| matches!(r, Err(Error::WrongType { .. }));
    assert!(wrong(rw.read().lock().await.map(drop)));
    assert!(wrong(rw.read().try_lock().await.map(drop)));
    assert!(wrong(rw.write().lock().await.map(drop)));
    assert!(wrong(rw.write().try_lock().await.map(drop)));
    let someone: redbaton::Owner = format!("{}:1", client.id()).parse().unwrap();
    assert!(wrong(
        rw.read().with_owner(someone).hold_count().await.map(drop)
    ));
    assert!(wrong(rw.write().is_locked().await.map(drop)));
    assert!(wrong(rw.read().force_unlock().await.map(drop)));
    assert!(wrong(rw.write().force_unlock().await.map(drop)));
    let v: String = raw.get("text").await.unwrap();
    assert_eq!(v, "user data");

    // A hash without an expiry (user data that happens to have a "mode"): refused.
    let _: () = raw.hset("bare", ("mode", "read")).await.unwrap();
    let rw = client.read_write_lock("bare");
    assert!(wrong(rw.read().try_lock().await.map(drop)));
    assert!(wrong(rw.write().try_lock().await.map(drop)));
    assert!(wrong(rw.read().force_unlock().await.map(drop)));
    assert_eq!(fields(&raw, "bare").await.len(), 1);
    assert_eq!(pttl(&raw, "bare").await, -1);

    // A plain lock (RLock hash) on the same name: held for both halves, never written to.
    let plain = client.lock("plain").lock().await.unwrap();
    let before = fields(&raw, "plain").await;
    let rw = client.read_write_lock("plain");
    let other = rw.clone();
    let (read, write) = tokio::spawn(async move {
        (
            other.read().try_lock().await.unwrap().is_none(),
            other.write().try_lock().await.unwrap().is_none(),
        )
    })
    .await
    .unwrap();
    assert!(read && write);
    assert_eq!(fields(&raw, "plain").await, before);
    assert!(!rw.read().force_unlock().await.unwrap());
    assert!(!rw.write().force_unlock().await.unwrap());
    plain.unlock().await.unwrap();
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_renews_read_holds_and_their_timeout_keys() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let lease = RENEWED_LEASE;
    let holder = short_lease_client(&server, lease).await;
    let other = client(&server).await;
    let rw = holder.read_write_lock("renew");
    let r1 = rw.read().lock().await.unwrap();
    let r2 = r1.reenter().await.unwrap();
    let owner = r1.owner().to_string();
    let w = holder
        .read_write_lock("renew-w")
        .write()
        .lock()
        .await
        .unwrap();
    // Two leases: only renewal keeps them.
    tokio::time::sleep(lease * 2).await;
    assert!(!r1.is_lost() && !r2.is_lost() && !w.is_lost());
    let lease_ms = lease.as_millis() as i64;
    for i in [1, 2] {
        let t = pttl(&raw, &timeout_key("renew", &owner, i)).await;
        assert!(t > 0 && t <= lease_ms, "timeout key {i}: {t}");
    }
    let t = pttl(&raw, "renew").await;
    assert!(t > 0 && t <= lease_ms, "{t}");
    assert!(other
        .read_write_lock("renew")
        .write()
        .try_lock()
        .await
        .unwrap()
        .is_none());
    assert!(other
        .read_write_lock("renew-w")
        .read()
        .try_lock()
        .await
        .unwrap()
        .is_none());
    r2.unlock().await.unwrap();
    r1.unlock().await.unwrap();
    w.unlock().await.unwrap();
    assert!(!exists(&raw, "renew").await && !exists(&raw, "renew-w").await);
    holder.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_and_dropped_guards_release_read_and_write_holds() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server).await;
    let r1 = client.read_write_lock("s1").read().lock().await.unwrap();
    let r2 = client.read_write_lock("s1").read().lock().await.unwrap();
    let w = client.read_write_lock("s2").write().lock().await.unwrap();
    let s2 = client.read_write_lock("s2");
    let wr = w
        .run(|| async { s2.read().lock().await })
        .await
        .unwrap()
        .unwrap();
    let w3 = client.read_write_lock("s3").write().lock().await.unwrap();
    let w3b = w3.reenter().await.unwrap();
    client.shutdown().await.unwrap();
    for key in ["s1", "s2", "s3"] {
        assert!(!exists(&raw, key).await, "{key} released by shutdown");
    }
    assert!(keys(&raw, "*rwlock_timeout*").await.is_empty());
    for lost in [
        r1.is_lost(),
        r2.is_lost(),
        w.is_lost(),
        wr.is_lost(),
        w3.is_lost(),
    ] {
        assert!(lost);
    }
    drop((r1, r2, w, wr, w3, w3b));

    let client = self::client(&server).await;
    let rw = client.read_write_lock("dropped");
    drop(rw.read().lock().await.unwrap());
    assert!(
        eventually(Duration::from_secs(5), || async {
            !exists(&raw, "dropped").await
        })
        .await,
        "a dropped read guard is released"
    );
    drop(rw.write().lock().await.unwrap());
    assert!(
        eventually(Duration::from_secs(5), || async {
            !exists(&raw, "dropped").await
        })
        .await,
        "a dropped write guard is released"
    );
    assert!(keys(&raw, "*rwlock_timeout*").await.is_empty());
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waiters_leave_no_hold_and_no_subscription() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let holder = client(&server).await;
    let waiters = client(&server).await;
    let guard = holder
        .read_write_lock("cancel")
        .write()
        .lock()
        .await
        .unwrap();
    let rw = waiters.read_write_lock("cancel");
    let mut tasks = Vec::new();
    for i in 0..10 {
        let rw = rw.clone();
        tasks.push(tokio::spawn(async move {
            if i % 2 == 0 {
                rw.read().lock().await.map(drop)
            } else {
                rw.write().lock().await.map(drop)
            }
        }));
    }
    assert!(
        eventually(Duration::from_secs(5), || async {
            numsub(&raw, "redisson_rwlock:{cancel}").await == 1
        })
        .await
    );
    for t in &tasks {
        t.abort();
    }
    for t in tasks {
        assert!(t.await.unwrap_err().is_cancelled());
    }
    assert!(
        eventually(Duration::from_secs(5), || async {
            numsub(&raw, "redisson_rwlock:{cancel}").await == 0
        })
        .await
    );
    guard.unlock().await.unwrap();
    assert!(
        eventually(Duration::from_secs(5), || async {
            !exists(&raw, "cancel").await
        })
        .await
    );
    // Acquires cut short mid-flight: any hold they took is undone.
    for round in 0..20u64 {
        let mut tasks = Vec::new();
        for i in 0..8u64 {
            let rw = rw.clone();
            tasks.push(tokio::spawn(async move {
                let wait = Duration::from_micros(20 + (round * 37 + i * 53) % 400);
                if i % 3 == 0 {
                    let _ = tokio::time::timeout(wait, rw.write().lock()).await;
                } else {
                    let _ = tokio::time::timeout(wait, rw.read().lock()).await;
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    }
    assert!(
        eventually(Duration::from_secs(5), || async {
            !exists(&raw, "cancel").await && keys(&raw, "*rwlock_timeout*").await.is_empty()
        })
        .await,
        "a cancelled acquire left a hold behind"
    );
    holder.shutdown().await.unwrap();
    waiters.shutdown().await.unwrap();
}

#[derive(Clone, Debug)]
struct Section {
    name: usize,
    /// The task that held it (its own read and write holds may overlap).
    task: u64,
    write: bool,
    start: Instant,
    end: Instant,
}

const NAMES: [&str; 2] = ["contend", "{contend}:b"];

/// A writer's critical section: a non-atomic read-sleep-write increment.
async fn write_section(client: &Client, name: usize, hold: Duration) {
    let counter = format!("counter:{}", NAMES[name]);
    let value: Option<i64> = client.redis().get(&counter).await.unwrap();
    tokio::time::sleep(hold).await;
    let _: () = client
        .redis()
        .set(&counter, value.unwrap_or(0) + 1, None, None, false)
        .await
        .unwrap();
}

async fn contender(client: Client, task: u64, log: Arc<Mutex<Vec<Section>>>) -> (u64, u64) {
    let mut rng = fastrand::Rng::with_seed(task * 7919 + 1);
    let (mut writes, mut misses) = (0, 0);
    for _ in 0..40 {
        let name = rng.usize(0..NAMES.len());
        let rw = client.read_write_lock(NAMES[name]);
        let hold = Duration::from_micros(rng.u64(200..3000));
        let record = |write, start| {
            log.lock().push(Section {
                name,
                task,
                write,
                start,
                end: Instant::now(),
            })
        };
        match rng.u8(0..10) {
            // Readers, most of the time: wait, bounded wait, reentrant.
            0..=2 => {
                let g = rw.read().lock().await.unwrap();
                let start = Instant::now();
                tokio::time::sleep(hold).await;
                record(false, start);
                g.unlock().await.unwrap();
            }
            3..=4 => {
                let wait = Duration::from_millis(rng.u64(0..200));
                match rw.read().try_lock_for(wait).await.unwrap() {
                    Some(g) => {
                        let start = Instant::now();
                        tokio::time::sleep(hold).await;
                        record(false, start);
                        g.unlock().await.unwrap();
                    }
                    None => misses += 1,
                }
            }
            5 => {
                let outer = rw.read().lock().await.unwrap();
                let start = Instant::now();
                let inner = outer.reenter().await.unwrap();
                tokio::time::sleep(hold).await;
                inner.unlock().await.unwrap();
                record(false, start);
                outer.unlock().await.unwrap();
            }
            // Writers: wait, bounded wait, and a writer that reads and downgrades.
            6..=7 => {
                let g = rw.write().lock().await.unwrap();
                let start = Instant::now();
                write_section(&client, name, hold).await;
                writes += 1;
                record(true, start);
                g.unlock().await.unwrap();
            }
            8 => {
                let wait = Duration::from_millis(rng.u64(0..200));
                match rw.write().try_lock_for(wait).await.unwrap() {
                    Some(g) => {
                        let start = Instant::now();
                        write_section(&client, name, hold).await;
                        writes += 1;
                        record(true, start);
                        g.unlock().await.unwrap();
                    }
                    None => misses += 1,
                }
            }
            _ => {
                let w = rw.write().lock().await.unwrap();
                let start = Instant::now();
                write_section(&client, name, hold).await;
                writes += 1;
                let r = w.run(|| async { rw.read().lock().await }).await;
                let r = r.unwrap().unwrap();
                let read_start = Instant::now();
                record(true, start);
                w.unlock().await.unwrap();
                tokio::time::sleep(hold).await;
                record(false, read_start);
                r.unlock().await.unwrap();
            }
        }
    }
    (writes, misses)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_history_has_no_writer_overlap_and_readers_do_share() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let log = Arc::new(Mutex::new(Vec::new()));
    let next_task = AtomicU64::new(0);
    let mut clients = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let client = client(&server).await;
        for _ in 0..6 {
            let task = next_task.fetch_add(1, Ordering::Relaxed);
            tasks.push(tokio::spawn(contender(client.clone(), task, log.clone())));
        }
        clients.push(client);
    }
    let mut writes = 0;
    for t in tasks {
        let (w, _misses) = tokio::time::timeout(Duration::from_secs(120), t)
            .await
            .expect("every task finishes")
            .unwrap();
        writes += w;
    }
    let log = log.lock().clone();
    let overlap = |a: &Section, b: &Section| a.start < b.end && b.start < a.end;
    let mut read_overlaps = 0;
    let mut write_sections = 0;
    for (i, a) in log.iter().enumerate() {
        write_sections += u64::from(a.write);
        for b in &log[i + 1..] {
            if a.name != b.name || a.task == b.task || !overlap(a, b) {
                continue;
            }
            assert!(
                !a.write && !b.write,
                "a writer overlapped another holder: {a:?} / {b:?}"
            );
            read_overlaps += 1;
        }
    }
    assert_eq!(write_sections, writes);
    assert!(writes > 0, "some writers got in");
    assert!(
        read_overlaps > 0,
        "readers of different tasks held at once at least once ({} sections)",
        log.len()
    );
    let mut counted = 0;
    for name in NAMES {
        let n: Option<u64> = raw.get(format!("counter:{name}")).await.unwrap();
        counted += n.unwrap_or(0);
    }
    assert_eq!(
        counted, writes,
        "the writers' non-atomic increments are exact"
    );
    for name in NAMES {
        assert!(!exists(&raw, name).await);
    }
    assert!(keys(&raw, "*rwlock_timeout*").await.is_empty());
    for client in clients {
        client.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_one_slot_per_name_and_wakeups_in_both_pubsub_modes() {
    use support::cluster::RedisCluster;
    let cluster = RedisCluster::start(3, 0);
    let slot = |key: &str| fred::util::redis_keyslot(key.as_bytes());
    let names = ["catalog:1", "{grp}:rw", "catalog:2"];
    for mode in [PubSubMode::Classic, PubSubMode::Sharded] {
        let connect = || Client::builder().url(cluster.url()).pubsub(mode).connect();
        // The default lease: a waiter's timer (the lock's PTTL) is far beyond the bounds
        // below, so only the message can wake it within them.
        let a = connect().await.unwrap();
        let b = connect().await.unwrap();
        for name in names {
            let what = format!("{mode:?} {name}");
            let r = a.read_write_lock(name).read().lock().await.unwrap();
            let r2 = r.reenter().await.unwrap();
            let owner = r.owner().to_string();
            for i in [1, 2] {
                let key = timeout_key(name, &owner, i);
                assert_eq!(slot(&key), slot(name), "{what}: {key}");
                let n: i64 = a.redis().exists(&key).await.unwrap();
                assert_eq!(n, 1, "{what}: {key}");
            }
            assert_eq!(
                slot(a.read_write_lock(name).channel()),
                slot(name),
                "{what}"
            );
            // A writer waits and is woken by the last read unlock.
            let writer = {
                let rw = b.read_write_lock(name);
                tokio::spawn(async move {
                    let g = rw.write().lock().await.unwrap();
                    let at = Instant::now();
                    (g, at)
                })
            };
            // Time for the writer to park (sooner, it would find the lock free: no wake-up).
            tokio::time::sleep(Duration::from_millis(1500)).await;
            r2.unlock().await.unwrap();
            let released = Instant::now();
            r.unlock().await.unwrap();
            let (w, at) = tokio::time::timeout(Duration::from_secs(10), writer)
                .await
                .unwrap_or_else(|_| panic!("{what}: writer not woken"))
                .unwrap();
            assert!(
                at.saturating_duration_since(released) < Duration::from_secs(3),
                "{what}: writer woken by the message"
            );
            // Readers wait and are all woken by the write unlock.
            let barrier = Arc::new(Barrier::new(3));
            let readers: Vec<_> = (0..3)
                .map(|_| spawn_reader(a.read_write_lock(name), barrier.clone()))
                .collect();
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let released = Instant::now();
            w.unlock().await.unwrap();
            for reader in readers {
                let at = tokio::time::timeout(Duration::from_secs(10), reader)
                    .await
                    .unwrap_or_else(|_| panic!("{what}: reader not woken"))
                    .unwrap();
                assert!(
                    at.saturating_duration_since(released) < Duration::from_secs(3),
                    "{what}: readers woken by the message"
                );
            }
            let n: i64 = a.redis().exists(name).await.unwrap();
            assert_eq!(n, 0, "{what}");
        }
        a.shutdown().await.unwrap();
        b.shutdown().await.unwrap();

        // Renewal across slots: read holds of every name, and their timeout keys, outlive two
        // short leases (one renewal script per slot).
        let renewer = Client::builder()
            .url(cluster.url())
            .pubsub(mode)
            .watchdog_lease(RENEWED_LEASE)
            .connect()
            .await
            .unwrap();
        let mut held = Vec::new();
        for name in names {
            let r = renewer.read_write_lock(name).read().lock().await.unwrap();
            let r2 = r.reenter().await.unwrap();
            held.push((name, r, r2));
        }
        tokio::time::sleep(RENEWED_LEASE * 2).await;
        for (name, r, r2) in held {
            let what = format!("{mode:?} {name}");
            assert!(!r.is_lost() && !r2.is_lost(), "{what}: renewed");
            let owner = r.owner().to_string();
            for i in [1, 2] {
                let n: i64 = renewer
                    .redis()
                    .exists(timeout_key(name, &owner, i))
                    .await
                    .unwrap();
                assert_eq!(n, 1, "{what}: timeout key {i} renewed");
            }
            r2.unlock().await.unwrap();
            r.unlock().await.unwrap();
        }
        renewer.shutdown().await.unwrap();
    }
}

// ---- Interleavings with a Redisson peer (its own scripts, from REDISSON.md §4.2) ----

/// A Java-style waiter of the peer: subscribes to the channel, tries, and retries on every
/// message or when the returned PTTL ends. Returns when it got the lock and the messages it saw.
async fn peer_waits(
    peer: Arc<RedissonPeer>,
    url: String,
    name: &'static str,
    thread: u64,
    write: bool,
    parked: tokio::sync::oneshot::Sender<()>,
) -> (Instant, Vec<String>) {
    let (_sub, mut messages) = subscribe(&url, &redisson_peer::channel(name)).await;
    let mut seen = Vec::new();
    let mut parked = Some(parked);
    loop {
        let refused = if write {
            peer.write_lock(name, thread, 30_000).await
        } else {
            peer.read_lock(name, thread, 30_000).await
        };
        let Some(pttl) = refused else {
            return (Instant::now(), seen);
        };
        if let Some(parked) = parked.take() {
            let _ = parked.send(());
        }
        let wait = Duration::from_millis(pttl.max(1) as u64);
        if let Ok(Ok(message)) = tokio::time::timeout(wait, messages.recv()).await {
            seen.push(message.value.as_string().unwrap());
        }
    }
}

#[tokio::test]
async fn peer_read_unlock_keeps_our_reader_and_ours_keeps_the_peers() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let peer = RedissonPeer::new(server.raw().await);
    let client = client(&server).await;
    let other = self::client(&server).await;
    let rw = client.read_write_lock("mixed");

    // Ours first, then the peer's: the peer's read unlock finds our timeout key and keeps
    // the hash (reply 0), with our field and a live expiry.
    let ours = rw.read().lock().await.unwrap();
    let owner = ours.owner().to_string();
    assert_eq!(
        peer.read_lock("mixed", 1, 30_000).await,
        None,
        "readers share"
    );
    assert_eq!(peer.read_unlock("mixed", 1).await, Some(0));
    let hash = fields(&raw, "mixed").await;
    assert_eq!(hash.get(&owner).map(String::as_str), Some("1"), "{hash:?}");
    assert!(pttl(&raw, "mixed").await > 25_000);
    assert!(other
        .read_write_lock("mixed")
        .write()
        .try_lock()
        .await
        .unwrap()
        .is_none());

    // The peer's first, then ours: our read unlock keeps the peer's hold the same way.
    assert_eq!(peer.read_lock("mixed", 2, 30_000).await, None);
    ours.unlock().await.unwrap();
    let hash = fields(&raw, "mixed").await;
    assert_eq!(hash.get(&peer.lock_name(2)).map(String::as_str), Some("1"));
    assert!(!hash.contains_key(&owner));
    assert!(pttl(&raw, "mixed").await > 25_000);
    assert_eq!(
        peer.read_unlock("mixed", 2).await,
        Some(1),
        "the peer frees it"
    );
    assert!(!exists(&raw, "mixed").await);

    // The hazard is real: without our timeout key, the peer's unlock deletes the hash under
    // our reader. (Shows the check above can fail.)
    let ours = rw
        .read()
        .with_owner(owner.parse().unwrap())
        .lock()
        .await
        .unwrap();
    assert_eq!(peer.read_lock("mixed", 3, 30_000).await, None);
    let _: i64 = raw.del(timeout_key("mixed", &owner, 1)).await.unwrap();
    assert_eq!(peer.read_unlock("mixed", 3).await, Some(1));
    assert!(!exists(&raw, "mixed").await);
    drop(ours);
    client.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_writer_blocks_our_readers_and_its_unlock_wakes_them_all() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let peer = RedissonPeer::new(server.raw().await);
    let client = client(&server).await;
    let rw = client.read_write_lock("peer-w");
    assert_eq!(peer.write_lock("peer-w", 1, 30_000).await, None);
    assert!(rw.read().try_lock().await.unwrap().is_none());
    assert!(rw.write().try_lock().await.unwrap().is_none());
    let barrier = Arc::new(Barrier::new(4));
    let readers: Vec<_> = (0..4)
        .map(|_| spawn_reader(rw.clone(), barrier.clone()))
        .collect();
    assert!(
        eventually(Duration::from_secs(5), || async {
            numsub(&raw, "redisson_rwlock:{peer-w}").await == 1
        })
        .await
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    assert_eq!(peer.write_unlock("peer-w", 1).await, Some(1));
    for reader in readers {
        let at = tokio::time::timeout(Duration::from_secs(10), reader)
            .await
            .expect("woken by the peer's message 1")
            .unwrap();
        assert!(at.saturating_duration_since(released) < Duration::from_secs(3));
    }
    assert!(!exists(&raw, "peer-w").await);
    // The peer's writer also reads and downgrades; we may then read but not write.
    assert_eq!(peer.write_lock("peer-w", 2, 30_000).await, None);
    assert_eq!(peer.read_lock("peer-w", 2, 30_000).await, None);
    assert_eq!(peer.write_unlock("peer-w", 2).await, Some(1));
    assert_eq!(fields(&raw, "peer-w").await["mode"], "read");
    assert!(rw.write().try_lock().await.unwrap().is_none());
    let r = rw
        .read()
        .try_lock()
        .await
        .unwrap()
        .expect("read after downgrade");
    r.unlock().await.unwrap();
    assert!(exists(&raw, "peer-w").await, "the peer still reads");
    assert_eq!(peer.read_unlock("peer-w", 2).await, Some(1));
    assert!(!exists(&raw, "peer-w").await);
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_writer_blocks_the_peer_and_our_unlocks_wake_its_waiters() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let peer = Arc::new(RedissonPeer::new(server.raw().await));
    let client = client(&server).await;
    let rw = client.read_write_lock("ours-w");
    let (_sub, mut messages) = subscribe(&server.url(), "redisson_rwlock:{ours-w}").await;

    // Our writer excludes the peer's reader and writer (each gets the PTTL).
    let w = rw.write().lock().await.unwrap();
    let refused = peer.read_lock("ours-w", 1, 30_000).await.expect("refused");
    assert!(refused > 25_000, "{refused}");
    assert!(peer.write_lock("ours-w", 1, 30_000).await.is_some());
    assert_eq!(peer.write_unlock("ours-w", 1).await, None, "not its hold");
    let (parked, is_parked) = tokio::sync::oneshot::channel();
    let waiter = tokio::spawn(peer_waits(
        peer.clone(),
        server.url(),
        "ours-w",
        1,
        false,
        parked,
    ));
    is_parked.await.unwrap();
    let released = Instant::now();
    w.unlock().await.unwrap();
    assert_eq!(next_message(&mut messages).await, "1");
    let (at, seen) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(at.saturating_duration_since(released) < Duration::from_secs(3));
    assert_eq!(seen, ["1"], "the peer was woken by our message");

    // The peer reads; we read too; the peer's writer (another thread) waits, and our last
    // read unlock after the peer's wakes it with "0".
    let r = rw.read().try_lock().await.unwrap().expect("readers share");
    assert_eq!(
        peer.read_unlock("ours-w", 1).await,
        Some(0),
        "we still read"
    );
    let (parked, is_parked) = tokio::sync::oneshot::channel();
    let writer = tokio::spawn(peer_waits(
        peer.clone(),
        server.url(),
        "ours-w",
        2,
        true,
        parked,
    ));
    is_parked.await.unwrap();
    let released = Instant::now();
    r.unlock().await.unwrap();
    assert_eq!(next_message(&mut messages).await, "0");
    let (at, seen) = tokio::time::timeout(Duration::from_secs(10), writer)
        .await
        .unwrap()
        .unwrap();
    assert!(at.saturating_duration_since(released) < Duration::from_secs(3));
    assert_eq!(seen, ["0"]);
    // Now the peer writes: we are excluded on both halves.
    assert!(rw.read().try_lock().await.unwrap().is_none());
    assert!(rw.write().try_lock().await.unwrap().is_none());
    assert_eq!(peer.write_unlock("ours-w", 2).await, Some(1));
    assert_eq!(next_message(&mut messages).await, "1");
    assert!(!exists(&raw, "ours-w").await);
    client.shutdown().await.unwrap();
}
