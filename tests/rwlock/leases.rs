//! Leases: the expiry readers' timeout keys drive, ended write leases, dead holders, renewal.

use super::*;

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
