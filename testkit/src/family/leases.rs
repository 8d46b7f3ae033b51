//! Leases end (dead holders, fixed leases), the watchdog renews, `lost()` tells.

use super::*;

/// A client whose watchdog lease is `lease`.
async fn leased(url: String, lease: Duration) -> Client {
    Client::builder()
        .url(url)
        .watchdog_lease(lease)
        .connect()
        .await
        .unwrap()
}

/// Invariant 7 of docs/DESIGN.md (leases end): a holder whose process dies (its runtime is dropped:
/// no unlock, no shutdown, no renewal) holds the lock for one watchdog lease (1 s here), then the
/// rival gets it.
pub async fn dead_holders_lease_ends<K: Family>() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let url = server.url();
    let kind = K::KIND;
    let key = tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let key = runtime.block_on(async {
            let dead = leased(url, Duration::from_secs(1)).await;
            let lock = K::make(&dead, NAME);
            std::mem::forget(lock.lock().await.unwrap());
            lock.key()
        });
        drop(runtime); // every task of the holder, its watchdog included, stops here
        key
    })
    .await
    .unwrap();
    let died = Instant::now();
    assert!(exists(&raw, &key).await, "{kind}: the dead holder's hold");
    let other = client(&server).await;
    let rival = K::rival(&other, NAME);
    let got = rival
        .try_lock_for(Duration::from_secs(6))
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{kind}: the dead holder's lease never ended"));
    let took = died.elapsed();
    assert!(
        took < Duration::from_secs(4),
        "{kind}: the rival got it {took:?} after the holder died (lease 1 s)"
    );
    got.unlock().await.unwrap();
    other.shutdown().await.unwrap();
}

/// Invariants 7 and 8 of docs/DESIGN.md with a fixed lease: it is never renewed, the rival gets the
/// lock after it, the guard says it is lost (by its own clock and Redis's), and its unlock is
/// `NotHeld` without touching the rival's hold.
pub async fn fixed_lease_ends_and_the_guard_knows<K: Family>() {
    let server = RedisServer::start();
    let a = client(&server).await;
    let b = client(&server).await;
    let kind = K::KIND;
    let lock = K::make(&a, NAME);
    let started = Instant::now();
    let held = lock
        .lock_with_lease(Duration::from_millis(500))
        .await
        .unwrap();
    let rival = K::rival(&b, NAME);
    let got = rival
        .try_lock_for(Duration::from_secs(6))
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{kind}: the fixed lease was renewed or never set"));
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(3000),
        "{kind}: the 500 ms lease ended after {took:?}"
    );
    tokio::time::timeout(Duration::from_secs(1), held.lost())
        .await
        .unwrap_or_else(|_| panic!("{kind}: lost() after the lease"));
    assert!(held.is_lost());
    let stale = held.unlock().await;
    assert!(
        matches!(stale, Err(Error::NotHeld { .. })),
        "{kind}: a stale unlock: {}",
        describe(&stale)
    );
    assert!(
        rival.is_locked().await.unwrap(),
        "{kind}: the stale unlock left the rival's hold alone"
    );
    got.unlock().await.unwrap();
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// Invariants 7 and 8 of docs/DESIGN.md with the watchdog: a hold outlives two watchdog leases with
/// its guard not lost, the rival excluded and the key's expiry within one lease; after the unlock
/// nothing keeps it.
pub async fn watchdog_renews<K: Family>() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let lease = RENEWED_LEASE;
    let a = leased(server.url(), lease).await;
    let b = client(&server).await;
    let kind = K::KIND;
    let lock = K::make(&a, NAME);
    let held = lock.lock().await.unwrap();
    // Unrenewed, the key would be gone after one lease.
    tokio::time::sleep(lease * 2).await;
    assert!(!held.is_lost(), "{kind}: lost although renewed");
    let rival = K::rival(&b, NAME);
    assert!(
        rival.try_lock().await.unwrap().is_none(),
        "{kind}: the lease ran out: the watchdog did not renew it"
    );
    let pttl: i64 = raw.pttl(&lock.key()).await.unwrap();
    assert!(
        pttl > 0 && pttl <= lease.as_millis() as i64,
        "{kind}: the key expires within one lease: pttl {pttl}"
    );
    held.unlock().await.unwrap();
    let got = rival.try_lock().await.unwrap();
    assert!(got.is_some(), "{kind}: free after the unlock");
    got.unwrap().unlock().await.unwrap();
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// Invariant 8 of docs/DESIGN.md (lost means told). `lost()` stays pending while the lock is held,
/// and fires (within a few renewal periods) when another client force-unlocks it and when its key
/// is deleted underneath. A lost guard's unlock is `NotHeld` and leaves a newer hold of the same
/// owner alone.
pub async fn lost_fires<K: Family>() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let lease = RENEWED_LEASE;
    let a = leased(server.url(), lease).await;
    let b = client(&server).await;
    let kind = K::KIND;
    let lock = K::make(&a, NAME);

    let held = lock.lock().await.unwrap();
    assert!(
        tokio::time::timeout(lease, held.lost()).await.is_err(),
        "{kind}: lost() fired while held"
    );
    assert!(
        K::make(&b, NAME).force_unlock().await.unwrap(),
        "{kind}: force_unlock found the hold"
    );
    // The next renewal (every third of the lease) finds it gone; at the latest the lease
    // runs out by the local clock.
    tokio::time::timeout(lease * 2, held.lost())
        .await
        .unwrap_or_else(|_| panic!("{kind}: lost() after force_unlock"));
    assert!(held.is_lost());
    // The same owner takes it anew.
    let owned = lock.with_owner(held.owner());
    let again = owned.lock().await.unwrap();
    let stale = held.unlock().await;
    assert!(
        matches!(stale, Err(Error::NotHeld { .. })),
        "{kind}: a lost guard's unlock: {}",
        describe(&stale)
    );
    assert_eq!(
        owned.hold_count().await.unwrap(),
        1,
        "{kind}: the newer hold survives the stale unlock"
    );

    // Deleted underneath: the watchdog's renewal finds it gone.
    let _: i64 = raw.del(&lock.key()).await.unwrap();
    tokio::time::timeout(lease * 2, again.lost())
        .await
        .unwrap_or_else(|_| panic!("{kind}: lost() after the key was deleted"));
    assert!(matches!(again.unlock().await, Err(Error::NotHeld { .. })));
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// Invariant 8 of docs/DESIGN.md, soon: with the default settings (a 30 s watchdog lease, renewed
/// every 10 s), a holder is told that another client force-unlocked its lock within about the lease
/// check interval (500 ms), not at its next renewal.
pub async fn force_unlock_is_felt_within_a_second<K: Family>() {
    let server = RedisServer::start();
    let a = Client::connect(&server.url()).await.unwrap();
    let b = client(&server).await;
    let kind = K::KIND;
    let held = K::make(&a, NAME).lock().await.unwrap();
    assert!(
        K::make(&b, NAME).force_unlock().await.unwrap(),
        "{kind}: force_unlock found the hold"
    );
    let forced = Instant::now();
    // Generous for a loaded machine: the renewal, the old way to learn it, is 10 s away.
    tokio::time::timeout(Duration::from_secs(3), held.lost())
        .await
        .unwrap_or_else(|_| panic!("{kind}: not told of the force-unlock within 3 s"));
    eprintln!(
        "{kind}: told of a force-unlock after {:?}",
        forced.elapsed()
    );
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// Invariant 11 of docs/DESIGN.md on a healthy connection: an acquire given up after its call bound
/// (four command timeouts) while the server stalls still runs when it answers; the hold it took is
/// settled (trimmed back to what the client accounts for: none), so the lock is free for
/// another client soon after the stall, not for a whole lease.
pub async fn a_stall_past_the_call_bound_leaves_nothing_held<K: Family>() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let timeout = Duration::from_millis(300);
    let a = Client::builder()
        .url(server.url())
        .command_timeout(timeout)
        .connect()
        .await
        .unwrap();
    let b = client(&server).await;
    let kind = K::KIND;
    // Loads the scripts and warms the connection.
    drop(K::make(&a, NAME).try_lock().await.unwrap());
    let pause = timeout * 4 + Duration::from_millis(1000);
    let _: fred::types::Value = raw
        .custom(
            fred::types::CustomCommand::new_static("CLIENT", None, false),
            vec![
                "PAUSE".to_owned(),
                pause.as_millis().to_string(),
                "WRITE".to_owned(),
            ],
        )
        .await
        .unwrap();
    let paused_at = Instant::now();
    let outcome = K::make(&a, NAME).try_lock().await;
    assert!(
        outcome.is_err(),
        "{kind}: given up during the stall: {}",
        describe(&outcome)
    );
    // The stall ends; the late acquire runs and is settled. Another client then gets it
    // within a few seconds, not after the 30 s lease.
    tokio::time::sleep_until(paused_at + pause).await;
    let taken = K::rival(&b, NAME)
        .try_lock_for(Duration::from_secs(10))
        .await
        .unwrap();
    assert!(
        taken.is_some(),
        "{kind}: the late acquire's hold was left behind"
    );
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}
