//! Scenario 8: leases and waiters' fallback timers follow the monotonic clock.

use super::*;

/// Scenario 8: lease bookkeeping runs on the monotonic (tokio) clock, not on wall time and
/// not on Redis's clock: pausing and advancing tokio's clock past a fixed lease makes the
/// guard lost at once, while Redis still holds the key for almost the whole lease.
#[tokio::test]
async fn lease_bookkeeping_follows_the_monotonic_clock() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = Client::connect(&server.url()).await.unwrap();
    let lease = Duration::from_secs(60);
    let lock = client.lock("clock");
    let guard = lock.lock_with_lease(lease).await.unwrap();
    let wall = std::time::SystemTime::now();

    tokio::time::pause();
    assert!(!guard.is_lost());
    tokio::time::advance(lease - Duration::from_secs(1)).await;
    assert!(
        !guard.is_lost(),
        "one second of the lease left by the monotonic clock"
    );
    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(guard.is_lost(), "the lease ran out by the monotonic clock");
    assert!(
        tokio::time::timeout(Duration::ZERO, guard.lost())
            .await
            .is_ok(),
        "lost() resolves at once"
    );
    tokio::time::resume();

    // Neither the wall clock nor Redis's clock moved: the verdict came from tokio's Instant.
    assert!(wall.elapsed().unwrap() < Duration::from_secs(30));
    let pttl: i64 = raw.pttl("clock").await.unwrap();
    assert!(pttl > 30_000, "Redis still holds the key: {pttl} ms");
    assert_eq!(
        guard.unlock().await,
        Err(Error::NotHeld {
            name: "clock".to_owned()
        }),
        "a lost hold sends no unlock"
    );
    let _: i64 = raw.del("clock").await.unwrap();
    client.shutdown().await.unwrap();
}

/// Scenario 8a: the validity leaves room for clocks that run at different rates. Redis
/// expires the key by its own clock; one running 1 % fast ends a 60 s lease 600 ms early by
/// ours. So a hold is known valid until its send time plus the lease *less* Redlock's drift
/// allowance (1 % + 2 ms), and no longer: 500 ms before the lease's end by the local clock the
/// guard is already lost, and `lost_at` is that end less the allowance.
#[tokio::test]
async fn validity_leaves_a_margin_for_clock_drift() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    let lease = Duration::from_secs(60);
    let drift = lease / 100 + Duration::from_millis(2);
    let before = tokio::time::Instant::now();
    let guard = client.lock("drift").lock_with_lease(lease).await.unwrap();
    let after = tokio::time::Instant::now();

    tokio::time::pause();
    tokio::time::advance(lease - drift - (after - before) - Duration::from_millis(50)).await;
    assert!(!guard.is_lost(), "valid until the lease less the allowance");
    // Past the latest the allowance can end (the send was at most `after`), and still ~600 ms
    // before the lease's end by the local clock.
    tokio::time::advance(after - before + Duration::from_millis(51)).await;
    let left = (before + lease).saturating_duration_since(tokio::time::Instant::now());
    assert!(
        left > Duration::from_millis(100),
        "the acquire took {:?}",
        after - before
    );
    assert!(
        guard.is_lost(),
        "still believed held {left:?} before the lease's end by the local clock"
    );
    let lost_at = guard.lost_at().expect("lost");
    assert!(
        lost_at >= (before + lease - drift).into_std()
            && lost_at <= (after + lease - drift).into_std(),
        "lost at the send time plus the lease less the allowance"
    );
    tokio::time::resume();
    drop(guard);
    client.shutdown().await.unwrap();
}

/// Scenario 8b: a waiter's fallback timer is the monotonic clock too: advancing tokio's
/// clock past the holder's PTTL makes the waiter re-check although no message came and
/// Redis's clock barely moved.
#[tokio::test]
async fn waiter_fallback_timer_follows_the_monotonic_clock() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let holder = Client::connect(&server.url()).await.unwrap();
    let waiters = Client::connect(&server.url()).await.unwrap();
    let name = "clock-waiter";
    // Held by a hold the waiter will never be told about (written by hand, no PUBLISH).
    let _: () = raw
        .hset(name, ("00000000-0000-4000-8000-000000000000:1", 1))
        .await
        .unwrap();
    let _: () = raw.pexpire(name, 60_000, None).await.unwrap();
    let waiter = {
        let lock = waiters.lock(name);
        tokio::spawn(async move { lock.try_lock_for(Duration::from_secs(300)).await })
    };
    let channel = holder.lock(name).channel().to_owned();
    assert!(
        eventually(Duration::from_secs(5), || async {
            numsub(&raw, &channel).await == 1
        })
        .await
    );
    // Its re-check after subscribing has reached the server (nothing changes for 300 ms).
    let before = support::settled_calls(
        &raw,
        "evalsha",
        Duration::from_millis(300),
        Duration::from_secs(10),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle = command_calls(&raw)
        .await
        .get("evalsha")
        .copied()
        .unwrap_or(0);
    assert_eq!(before, idle, "a parked waiter sends nothing");

    // Free the lock silently, then move the monotonic clock past the PTTL.
    let _: i64 = raw.del(name).await.unwrap();
    tokio::time::pause();
    tokio::time::advance(Duration::from_secs(61)).await;
    tokio::time::resume();
    let guard = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter re-checked on its monotonic timer")
        .unwrap()
        .unwrap()
        .expect("and acquired");
    guard.unlock().await.unwrap();
    holder.shutdown().await.unwrap();
    waiters.shutdown().await.unwrap();
}
