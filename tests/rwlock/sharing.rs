//! Many readers or one writer: wake-ups, reentry, a writer that reads, no upgrade.

use super::*;

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
