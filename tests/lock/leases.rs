//! Leases: wait deadlines, fixed leases that expire, the watchdog's renewals, and `lost()`.

use super::*;

#[tokio::test]
async fn try_lock_for_times_out_near_its_deadline() {
    let server = RedisServer::start();
    let a = client(&server).await;
    let b = client(&server).await;
    let _held = a.lock("deadline").lock().await.unwrap();
    let start = Instant::now();
    let got = b
        .lock("deadline")
        .try_lock_for(Duration::from_millis(700))
        .await
        .unwrap();
    let took = start.elapsed();
    assert!(got.is_none());
    // Not before the deadline; after it, only as late as a loaded machine makes it (the
    // holder's 30 s lease is not waited out).
    assert!(
        took >= Duration::from_millis(700) && took < Duration::from_secs(4),
        "took {took:?}"
    );
    // Zero wait is one attempt; Duration::MAX does not overflow.
    assert!(b
        .lock("deadline")
        .try_lock_for(Duration::ZERO)
        .await
        .unwrap()
        .is_none());
    let lock = b.lock("deadline");
    let forever =
        tokio::spawn(async move { lock.try_lock_for(Duration::MAX).await.map(|g| g.is_some()) });
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(_held);
    assert!(tokio::time::timeout(Duration::from_secs(10), forever)
        .await
        .unwrap()
        .unwrap()
        .unwrap());
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test]
async fn fixed_lease_expires_and_frees_the_lock() {
    let server = RedisServer::start();
    let a = client(&server).await;
    let b = client(&server).await;
    let guard = a
        .lock("lease")
        .lock_with_lease(Duration::from_millis(500))
        .await
        .unwrap();
    let ttl = a.lock("lease").remaining_ttl().await.unwrap().unwrap();
    assert!(ttl <= Duration::from_millis(500));
    let start = Instant::now();
    let got = b
        .lock("lease")
        .try_lock_for(Duration::from_secs(5))
        .await
        .unwrap()
        .expect("free after the lease");
    let took = start.elapsed();
    // About the 500 ms lease (the waiter's timer follows the PTTL); generously bounded.
    assert!(took < Duration::from_secs(4), "took {took:?}");
    // The old guard is lost by its own clock and must not release b's hold.
    assert!(guard.is_lost());
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .unwrap();
    assert!(matches!(guard.unlock().await, Err(Error::NotHeld { .. })));
    assert!(b.lock("lease").is_locked().await.unwrap());
    got.unlock().await.unwrap();
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test]
async fn stopped_renewal_lets_the_lease_expire() {
    // A holder whose runtime dies (no unlock, no shutdown, no renewal) loses the lock after
    // its lease: the crash case in-process.
    let server = RedisServer::start();
    let raw = server.raw().await;
    let url = server.url();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let holder = Client::builder()
                .url(url)
                .watchdog_lease(Duration::from_millis(600))
                .connect()
                .await
                .unwrap();
            std::mem::forget(holder.lock("expire").lock().await.unwrap());
        });
        drop(rt); // every task of the holder, its watchdog included, stops here
    })
    .join()
    .unwrap();
    let exists: i64 = raw.exists("expire").await.unwrap();
    assert_eq!(exists, 1);
    // Gone after about its 600 ms lease: generously bounded, far below the 30 s default.
    assert!(
        eventually(Duration::from_secs(5), || async {
            let n: i64 = raw.exists("expire").await.unwrap();
            n == 0
        })
        .await,
        "the lease of a dead holder expires"
    );
}

#[tokio::test]
async fn watchdog_keeps_the_lock_past_several_leases() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let lease = RENEWED_LEASE;
    let a = short_lease_client(&server, lease).await;
    let b = client(&server).await;
    let guard = a.lock("renewed").lock().await.unwrap();
    // Unrenewed, it would be gone after one lease.
    tokio::time::sleep(lease * 2).await;
    assert!(!guard.is_lost());
    assert!(b.lock("renewed").try_lock().await.unwrap().is_none());
    let pttl: i64 = raw.pttl("renewed").await.unwrap();
    assert!(pttl > 0 && pttl <= lease.as_millis() as i64, "pttl {pttl}");
    let owner = guard.owner().to_string();
    guard.unlock().await.unwrap();
    // After the release the watchdog forgets it: the same field, written back by hand, is
    // never renewed.
    support::assert_never_renewed(&raw, "renewed", &owner, lease).await;
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test]
async fn lost_fires_after_force_unlock_by_another_client() {
    let server = RedisServer::start();
    let lease = RENEWED_LEASE;
    let a = short_lease_client(&server, lease).await;
    let b = client(&server).await;
    let guard = a.lock("forced").lock().await.unwrap();
    assert!(!guard.is_lost());
    let forced_at = std::time::Instant::now();
    assert!(b.lock("forced").force_unlock().await.unwrap());
    assert!(
        !b.lock("forced").force_unlock().await.unwrap(),
        "already free"
    );
    // Told at the next renewal (every lease / 3); generously bounded, since a
    // guard that is never told would wait for ever.
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("lost() resolves after force_unlock");
    assert!(guard.is_lost());
    // Lost when the renewal's word came, well before its validity would have ended.
    let told = guard
        .lost_at()
        .expect("a lost guard gives its loss instant");
    assert!(
        told > forced_at && told <= std::time::Instant::now(),
        "told {:?} after the force-unlock",
        told.saturating_duration_since(forced_at)
    );
    // A lost guard sends nothing: a new hold of the same owner survives its unlock.
    let again = a
        .lock("forced")
        .with_owner(guard.owner())
        .lock()
        .await
        .unwrap();
    assert_eq!(
        guard.lost_at(),
        Some(told),
        "a fresh hold of the same owner does not move the old guard's loss instant"
    );
    assert_eq!(again.lost_at(), None);
    assert!(matches!(guard.unlock().await, Err(Error::NotHeld { .. })));
    assert_eq!(
        a.lock("forced")
            .with_owner(again.owner())
            .hold_count()
            .await
            .unwrap(),
        1
    );
    again.unlock().await.unwrap();
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// A hold removed behind its holder's back is felt within `lease_check_interval`, not at the
/// next renewal (here every 20 s), even with no task of the holder's client waiting on the
/// lock (no unlock message reaches it) — issue 39 item 2.
#[tokio::test]
async fn a_force_unlock_is_felt_within_the_lease_check_interval() {
    let server = RedisServer::start();
    let holder = Client::builder()
        .url(server.url())
        .watchdog_lease(Duration::from_secs(60))
        .lease_check_interval(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let other = client(&server).await;
    let guard = holder.lock("checked").lock().await.unwrap();
    // Past the first check: the next renewal is 20 s away.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!guard.is_lost());
    let forced = Instant::now();
    assert!(other.lock("checked").force_unlock().await.unwrap());
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("told within the check interval, not at the next renewal (20 s)");
    eprintln!("told {:?} after the force-unlock", forced.elapsed());
    holder.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

/// Connecting with a command timeout not well under a third of the watchdog lease warns:
/// one stalled renewal could then cost the lease (issue 39 item 3).
#[tokio::test]
async fn a_command_timeout_near_a_third_of_the_lease_is_warned_about() {
    let server = RedisServer::start();
    // This test's runtime is current-thread: connecting runs on this thread, under it.
    let (captured, _default) = crate::captured::Captured::warnings();
    let text = || captured.text();
    let fine = Client::builder()
        .url(server.url())
        .watchdog_lease(Duration::from_secs(30))
        .command_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    assert!(!text().contains("command timeout"), "{}", text());
    let risky = Client::builder()
        .url(server.url())
        .watchdog_lease(Duration::from_secs(6))
        .command_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    assert!(
        text().contains("WARN") && text().contains("command timeout is not well under"),
        "{}",
        text()
    );
    fine.shutdown().await.unwrap();
    risky.shutdown().await.unwrap();
}

/// What the `Client` docs promise for a client dropped without `shutdown()` while the runtime
/// runs on: its dropped guard's release, a background task, still frees the lock at once —
/// not after the lease (issue 39 item 4; only a runtime that ends first leaves it held).
#[tokio::test]
async fn a_client_dropped_with_its_guard_frees_the_lock_while_the_runtime_runs() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server).await;
    let guard = client.lock("dropped").lock().await.unwrap();
    drop(guard);
    drop(client);
    assert!(
        eventually(Duration::from_secs(5), || async {
            raw.exists::<i64, _>("dropped").await.unwrap() == 0
        })
        .await,
        "the lock is still held after the client and its guard were dropped"
    );
}
