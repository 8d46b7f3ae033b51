//! The wire layout, keys of other types, force-unlock per half, and the Redisson peer.

use super::*;

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

// ---- Interleavings with a Redisson peer (its own scripts, from docs/WIRE.md) ----

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
