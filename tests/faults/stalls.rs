//! Scenarios 4-5: Redis stalled, the network stalled or cut.

use super::*;

/// Asserts that `lost_at` is within one renewal period of `fault_at + lease` (the last
/// successful renewal was sent within one period before the fault). The slack is larger on
/// the late side: a loaded machine runs timers and the test task late, never early.
fn assert_lost_in_window(fault_at: Instant, lost_at: Instant, lease: Duration) {
    let period = lease / 3;
    let early_slack = Duration::from_millis(400);
    let late_slack = Duration::from_secs(1);
    let after = lost_at.duration_since(fault_at);
    println!("lost() fired {after:?} after the fault (lease {lease:?}, period {period:?})");
    assert!(
        after + period + early_slack >= lease,
        "lost() fired early: {after:?} after the fault"
    );
    assert!(
        after <= lease + period + late_slack,
        "lost() fired {after:?} after the fault; the lease ({lease:?}) was gone by then"
    );
}

/// Scenario 4: Redis stalled (CLIENT PAUSE) past the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stalled_past_the_lease_fires_lost_and_times_out_in_flight_calls() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let lease = RENEWED_LEASE;
    let timeout = Duration::from_millis(300);
    let holder = client_with(&server.url(), lease, timeout).await;
    let name = "stalled";
    let lock = holder.lock(name);
    let guard = lock.lock().await.unwrap();
    // Let a few renewals pass.
    tokio::time::sleep(lease).await;
    assert!(!guard.is_lost());

    // Longer than lost() may take (see below), so it must fire during the stall.
    let pause = lease * 2 + Duration::from_secs(1);
    let _ = command(
        &raw,
        "CLIENT",
        vec!["PAUSE".into(), pause.as_millis().to_string(), "ALL".into()],
    )
    .await;
    let paused_at = Instant::now();

    // Operations in flight return a timeout error instead of hanging.
    // (Bounded well below the stall, generously above the 300 ms timeout.)
    let started = Instant::now();
    let err = lock.is_locked().await.unwrap_err();
    assert_eq!(err, Error::Timeout(timeout), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let started = Instant::now();
    let other = holder.lock("stalled-other");
    let result = tokio::spawn(async move { other.try_lock().await.map(|g| g.is_some()) })
        .await
        .unwrap();
    assert_eq!(result, Err(Error::Timeout(timeout)));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );

    tokio::time::timeout(lease * 2, guard.lost())
        .await
        .expect("lost() fires while Redis is stalled");
    assert_lost_in_window(paused_at, Instant::now(), lease);
    assert!(paused_at.elapsed() < pause, "it fired during the stall");

    // After the stall the lock becomes free for others within one lease.
    tokio::time::sleep_until(paused_at + pause).await;
    let other = client_with(&server.url(), lease, Duration::from_secs(2)).await;
    let start = Instant::now();
    let taken = other
        .lock(name)
        .try_lock_for(lease * 3)
        .await
        .unwrap()
        .expect("free after the lease");
    println!(
        "free for others {:?} after the stall ended",
        start.elapsed()
    );
    assert!(start.elapsed() <= lease * 2, "{:?}", start.elapsed());
    assert_eq!(
        guard.unlock().await,
        Err(Error::NotHeld {
            name: name.to_owned()
        })
    );
    taken.unlock().await.unwrap();
    other.shutdown().await.unwrap();
    holder.shutdown().await.unwrap();
}

/// Scenario 5a: the network between the holder and Redis stalls (proxy holds all bytes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_stall_fires_lost_and_frees_the_lock_after_the_lease() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let proxy = Proxy::start(server.port).await;
    let lease = RENEWED_LEASE;
    let timeout = Duration::from_millis(300);
    let holder = client_with(&proxy.url(), lease, timeout).await;
    let other = client_with(&server.url(), lease, Duration::from_secs(2)).await;
    let name = "net-stall";
    let lock = holder.lock(name);
    let guard = lock.lock().await.unwrap();
    let owner = guard.owner().to_string();
    tokio::time::sleep(lease).await;
    assert!(!guard.is_lost());
    assert_eq!(guard.lost_at(), None, "no loss instant while held");

    proxy.set(Mode::Stalled);
    let stalled_at = Instant::now();
    let started = Instant::now();
    assert_eq!(lock.is_locked().await, Err(Error::Timeout(timeout)));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );

    // Another client, not behind the proxy, waits and gets the lock once the lease ran out;
    // at that moment the holder's guard already says lost (its clock is read then, so the
    // verdict does not depend on when either task is scheduled).
    let guard = Arc::new(guard);
    let waiter = {
        let lock = other.lock(name);
        let holder_guard = guard.clone();
        tokio::spawn(async move {
            let guard = lock.lock().await.unwrap();
            (Instant::now(), holder_guard.is_lost(), guard)
        })
    };
    tokio::time::timeout(lease * 2, guard.lost())
        .await
        .expect("lost() fires during the stall");
    let lost_at = Instant::now();
    assert_lost_in_window(stalled_at, lost_at, lease);
    let (acquired_at, holder_lost, taken) = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the lock is free for others after the lease")
        .unwrap();
    let after = acquired_at.duration_since(stalled_at);
    println!(
        "other client acquired {after:?} after the stall began; lost() was seen {:?} after it",
        lost_at.duration_since(stalled_at)
    );
    assert!(after <= lease * 2, "{after:?}");
    assert!(
        holder_lost,
        "the holder was told before (or as) the other client took over"
    );
    // The instant the guard gives for its loss is the end of its validity: after the stall
    // began (a renewal sent before it was still valid), no later than when lost() was seen,
    // and before the other client could take the lock.
    let told = guard
        .lost_at()
        .expect("a lost guard gives its loss instant");
    assert!(
        told > stalled_at.into_std() && told <= lost_at.into_std(),
        "loss instant {:?} after the stall began, lost() seen {:?} after it",
        told.duration_since(stalled_at.into_std()),
        lost_at.duration_since(stalled_at)
    );
    assert!(
        told < acquired_at.into_std(),
        "the loss instant comes before the other client acquired ({:?} before)",
        acquired_at.into_std().saturating_duration_since(told)
    );
    assert!(!hexists(&raw, name, &owner).await);

    // The network comes back: the stalled renewals reach Redis late and change nothing.
    proxy.set(Mode::Open);
    // Once the holder's client answers again, what it sent before on that connection has
    // reached Redis (a loaded machine may take a while; its 300 ms command timeout is short).
    assert!(
        eventually(Duration::from_secs(10), || async {
            lock.is_locked().await.is_ok()
        })
        .await,
        "the holder's client answers again"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !hexists(&raw, name, &owner).await,
        "a late renewal revived nothing"
    );
    taken.unlock().await.unwrap();
    let again = lock.try_lock_for(Duration::from_secs(5)).await.unwrap();
    again
        .expect("the holder's client works again")
        .unlock()
        .await
        .unwrap();
    holder.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

/// Scenario 5b: the network between the holder and Redis is cut (connections reset).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_cut_fires_lost_errors_promptly_and_recovers() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port).await;
    let lease = RENEWED_LEASE;
    let timeout = Duration::from_millis(300);
    let holder = client_with(&proxy.url(), lease, timeout).await;
    let other = client_with(&server.url(), lease, Duration::from_secs(2)).await;
    let name = "net-cut";
    let lock = holder.lock(name);
    let guard = lock.lock().await.unwrap();
    tokio::time::sleep(lease).await;

    proxy.set(Mode::Cut);
    let cut_at = Instant::now();
    let started = Instant::now();
    let err = lock.is_locked().await.unwrap_err();
    assert!(
        matches!(err, Error::Timeout(_) | Error::Connection(_)),
        "a cut connection is a connection or timeout error: {err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );

    tokio::time::timeout(lease * 2, guard.lost())
        .await
        .expect("lost() fires while cut off");
    assert_lost_in_window(cut_at, Instant::now(), lease);
    let start = Instant::now();
    let taken = other
        .lock(name)
        .try_lock_for(Duration::from_secs(5))
        .await
        .unwrap()
        .expect("free for others after the lease");
    assert!(
        cut_at.elapsed() <= lease * 2,
        "{:?} after the cut, {:?} after trying",
        cut_at.elapsed(),
        start.elapsed()
    );

    proxy.set(Mode::Open);
    let reconnect = Instant::now();
    // The holder's client reconnects by itself. Until it has, a call waits for the connection
    // and may use up its 300 ms command timeout (a loaded machine takes that long), and a
    // timed-out first attempt ends try_lock_for with an error: wait for it first.
    assert!(
        eventually(Duration::from_secs(10), || async {
            lock.is_locked().await.is_ok()
        })
        .await,
        "the holder's client reconnects by itself"
    );
    println!(
        "holder's client answered again {:?} after the network came back",
        reconnect.elapsed()
    );
    let waiting = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.try_lock_for(Duration::from_secs(10)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    taken.unlock().await.unwrap();
    let again = waiting.await.unwrap().unwrap();
    println!(
        "holder's client reacquired {:?} after the network came back",
        reconnect.elapsed()
    );
    again
        .expect("the holder's client reconnects by itself")
        .unlock()
        .await
        .unwrap();
    holder.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

/// Invariant 18 (docs/DESIGN.md): an acquire whose validity ended before its reply came (the server
/// paused past the lease) is released and retried within the caller's wait, never handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_whose_lease_ended_before_its_reply_is_never_handed_out() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client_with(&server.url(), RENEWED_LEASE, Duration::from_secs(5)).await;
    let lock = client.lock("stalled-acquire");
    let lease = Duration::from_secs(1);
    let pause = Duration::from_millis(2500);
    let _ = command(
        &raw,
        "CLIENT",
        vec![
            "PAUSE".into(),
            pause.as_millis().to_string(),
            "WRITE".into(),
        ],
    )
    .await;
    let guard = lock
        .try_lock_with_lease(Duration::from_secs(15), lease)
        .await
        .unwrap()
        .expect("acquired once the server answers again");
    assert!(
        !guard.is_lost(),
        "handed out a guard lost {:?} ago",
        guard.lost_at().map(|at| at.elapsed())
    );
    let fields: std::collections::HashMap<String, i64> =
        raw.hgetall("stalled-acquire").await.unwrap();
    assert_eq!(
        fields.values().sum::<i64>(),
        1,
        "one hold, the one handed out: {fields:?}"
    );
    guard.unlock().await.unwrap();
    client.shutdown().await.unwrap();
}

/// A semaphore acquire given up after its call bound on a healthy connection still runs
/// when the server answers: the permits its late reply took are given back, not lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_acquire_past_its_bound_gives_the_permits_of_its_late_reply_back() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let timeout = Duration::from_millis(300);
    let client = client_with(&server.url(), RENEWED_LEASE, timeout).await;
    let semaphore = client.semaphore("stalled-permits");
    assert!(semaphore.try_set_permits(4).await.unwrap());
    // Past four command timeouts (the call's bound), short of the test's patience.
    let pause = timeout * 4 + Duration::from_millis(1500);
    let _ = command(
        &raw,
        "CLIENT",
        vec![
            "PAUSE".into(),
            pause.as_millis().to_string(),
            "WRITE".into(),
        ],
    )
    .await;
    let taken = futures::future::join_all((0..4).map(|_| semaphore.try_acquire())).await;
    for outcome in &taken {
        assert!(outcome.is_err(), "given up past its bound: {outcome:?}");
    }
    assert!(
        eventually(Duration::from_secs(10), || async {
            semaphore.available_permits().await.ok() == Some(4)
        })
        .await,
        "the late replies' permits were not given back: {:?} available",
        semaphore.available_permits().await
    );
    client.shutdown().await.unwrap();
}
