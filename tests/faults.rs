//! Fault injection against real redis-server processes (loopback only): a holder killed with
//! SIGKILL, the subscriber connection killed, Redis restarted, Redis stalled, the network
//! stalled or cut, cancellation storms, drops and shutdowns while holding, and the clock.
//!
//! Leases are short (1–3 s) so the suite stays fast; every bound is generous for a loaded
//! 2-core machine yet far below what the broken behaviour would take.

mod support;

use std::io::BufRead;
use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use parking_lot::Mutex;
use redbaton::{Client, Error};
use support::child::{after_tag, child_arg, spawn_child};
use support::proxy::{Mode, Proxy};
use support::{command, command_calls, eventually, numsub, RedisServer, RENEWED_LEASE};
use tokio::time::Instant;

async fn client_with(url: &str, lease: Duration, timeout: Duration) -> Client {
    Client::builder()
        .url(url)
        .watchdog_lease(lease)
        .command_timeout(timeout)
        .connect_timeout(Duration::from_secs(2))
        .reconnect_max_delay(Duration::from_millis(200))
        .connect()
        .await
        .unwrap()
}

/// Keys the server has expired since it started (`INFO stats`).
async fn expired_keys(raw: &fred::clients::Client) -> u64 {
    let info: String = raw.info(Some(fred::types::InfoKind::Stats)).await.unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix("expired_keys:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("INFO stats has expired_keys")
}

async fn hexists(raw: &fred::clients::Client, key: &str, field: &str) -> bool {
    raw.hexists(key, field).await.unwrap()
}

/// The child of `holder_killed_with_sigkill_frees_the_lock_within_the_lease`: takes the lock
/// with a 1 s watchdog lease, says so on stdout, and holds until killed.
async fn child_holder(arg: String) {
    let (url, name) = arg.split_once('|').unwrap();
    let client = client_with(url, Duration::from_secs(1), Duration::from_secs(1)).await;
    let guard = client.lock(name).lock().await.unwrap();
    println!("HELD {}", guard.owner());
    std::future::pending::<()>().await;
}

/// Scenario 1: a holder process killed with SIGKILL while others wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_killed_with_sigkill_frees_the_lock_within_the_lease() {
    if let Some(arg) = child_arg() {
        return child_holder(arg).await;
    }
    let server = RedisServer::start();
    let raw = server.raw().await;
    let name = "killed-holder";
    let lease = Duration::from_secs(1);
    let mut child = spawn_child(
        "holder_killed_with_sigkill_frees_the_lock_within_the_lease",
        &format!("{}|{name}", server.url()),
    );
    let stdout = child.0.stdout.take().unwrap();
    let owner = tokio::task::spawn_blocking(move || {
        let mut lines = std::io::BufReader::new(stdout).lines();
        lines.find_map(|line| after_tag(&line.ok()?, "HELD "))
    });
    let owner = tokio::time::timeout(Duration::from_secs(30), owner)
        .await
        .expect("the child takes the lock")
        .unwrap()
        .expect("the child reports its owner");
    assert!(hexists(&raw, name, &owner).await);

    // Waiters in three other clients.
    let mut waiters = Vec::new();
    let acquired = Arc::new(Mutex::new(Vec::new()));
    for _ in 0..3 {
        let client = client_with(&server.url(), lease, Duration::from_secs(2)).await;
        let acquired = acquired.clone();
        waiters.push(tokio::spawn(async move {
            let guard = client.lock(name).lock().await.unwrap();
            acquired.lock().push(Instant::now());
            guard.unlock().await.unwrap();
            client.shutdown().await.unwrap();
        }));
    }
    let channel = format!("redisson_lock__channel:{{{name}}}");
    assert!(
        eventually(Duration::from_secs(5), || async {
            numsub(&raw, &channel).await == 3
        })
        .await
    );
    // The child's watchdog keeps its 1 s lease alive past several leases.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(
        hexists(&raw, name, &owner).await,
        "the live child still holds"
    );
    assert!(
        acquired.lock().is_empty(),
        "nobody acquired from a live holder"
    );

    child.0.kill().unwrap();
    let killed_at = Instant::now();
    child.0.wait().unwrap();
    for waiter in waiters {
        tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("every waiter acquires in turn")
            .unwrap();
    }
    let times = acquired.lock().clone();
    assert_eq!(times.len(), 3);
    let first = times.iter().min().unwrap().duration_since(killed_at);
    println!("first waiter acquired {first:?} after SIGKILL (lease {lease:?})");
    assert!(
        first <= lease + Duration::from_secs(2),
        "a waiter acquires within lease + 2 s, took {first:?}"
    );
    assert!(
        !hexists(&raw, name, &owner).await,
        "the killed owner's field is gone"
    );
    let exists: i64 = raw.exists(name).await.unwrap();
    assert_eq!(exists, 0);
}

/// Scenario 2: the shared subscriber connection is killed while 50 tasks wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriber_killed_while_fifty_wait_then_wake_ups_are_prompt_again() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    // A long lease: a lost wake-up would cost a waiter the holder's whole PTTL (5 s).
    let lease = Duration::from_secs(5);
    let holder = client_with(&server.url(), lease, Duration::from_secs(2)).await;
    let waiters = client_with(&server.url(), lease, Duration::from_secs(2)).await;
    let name = "pubsub-killed";
    let lock = holder.lock(name);
    let held = lock.lock().await.unwrap();

    // Each waiter records (acquired, released); releases are what hand-offs start from.
    let sections = Arc::new(Mutex::new(Vec::<(Instant, Instant)>::new()));
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let lock = waiters.lock(name);
        let sections = sections.clone();
        tasks.push(tokio::spawn(async move {
            let guard = lock.lock().await.unwrap();
            let start = Instant::now();
            tokio::time::sleep(Duration::from_millis(30)).await;
            let end = Instant::now();
            guard.unlock().await.unwrap();
            sections.lock().push((start, end));
        }));
    }
    let channel = lock.channel().to_owned();
    assert!(
        eventually(Duration::from_secs(5), || async {
            numsub(&raw, &channel).await == 1
        })
        .await
    );
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Kill every pub/sub connection while all 50 wait, and wait for the resubscription.
    support::kill_pubsub_connections(&raw).await;
    assert!(
        eventually(Duration::from_secs(5), || async {
            numsub(&raw, &channel).await == 1
        })
        .await,
        "the hub resubscribes by itself"
    );
    let released_at = Instant::now();
    held.unlock().await.unwrap();

    // Kill it again in the middle of the hand-offs.
    assert!(
        eventually(Duration::from_secs(10), || async {
            sections.lock().len() >= 20
        })
        .await
    );
    support::kill_pubsub_connections(&raw).await;
    let killed_again = Instant::now();

    for task in tasks {
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("every waiter acquires in turn")
            .unwrap();
    }
    let mut sections = sections.lock().clone();
    sections.sort();
    assert_eq!(sections.len(), 50);
    for pair in sections.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "critical sections never overlap");
    }
    let first = sections[0].0.duration_since(released_at);
    // Hand-off gaps: previous release to next acquisition.
    let gaps: Vec<Duration> = sections
        .windows(2)
        .map(|p| p[1].0.duration_since(p[0].1))
        .collect();
    let worst = gaps.iter().max().unwrap();
    let after_second_kill: Vec<Duration> = sections
        .windows(2)
        .filter(|p| p[0].1 > killed_again + Duration::from_millis(300))
        .map(|p| p[1].0.duration_since(p[0].1))
        .collect();
    let worst_after = after_second_kill.iter().max().copied().unwrap_or_default();
    println!(
        "first hand-off after reconnect {first:?}, worst gap {worst:?}, \
         worst gap once resubscribed {worst_after:?} over {} hand-offs, lease {lease:?}",
        after_second_kill.len()
    );
    // A lost wake-up costs a waiter the PTTL it parked with (up to the 5 s lease); bounds
    // are generous for a loaded machine yet below that.
    assert!(
        first < Duration::from_secs(2),
        "wake-up after the reconnect took {first:?}"
    );
    assert!(
        *worst < Duration::from_millis(2500),
        "no hand-off waits for the lease ({lease:?}), worst {worst:?}"
    );
    assert!(
        worst_after < Duration::from_secs(1),
        "hand-offs are prompt again after the reconnect, worst {worst_after:?}"
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            numsub(&raw, &channel).await == 0
        })
        .await
    );
    holder.shutdown().await.unwrap();
    waiters.shutdown().await.unwrap();
}

/// Scenario 3: Redis restarted (empty, same port) while one client holds and others wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_loses_the_hold_and_waiters_acquire_without_manual_reconnect() {
    let mut server = RedisServer::start();
    let lease = Duration::from_secs(2);
    let holder = client_with(&server.url(), lease, Duration::from_secs(1)).await;
    let waiters = client_with(&server.url(), lease, Duration::from_secs(1)).await;
    let name = "restarted";
    let guard = holder.lock(name).lock().await.unwrap();

    let acquired = Arc::new(Mutex::new(Vec::<(Instant, Instant)>::new()));
    let mut tasks = Vec::new();
    for _ in 0..5 {
        let lock = waiters.lock(name);
        let acquired = acquired.clone();
        tasks.push(tokio::spawn(async move {
            let guard = lock.lock().await.unwrap();
            let start = Instant::now();
            tokio::time::sleep(Duration::from_millis(20)).await;
            acquired.lock().push((start, Instant::now()));
            guard.unlock().await.unwrap();
        }));
    }
    {
        let raw = server.raw().await;
        let channel = holder.lock(name).channel().to_owned();
        assert!(
            eventually(Duration::from_secs(5), || async {
                numsub(&raw, &channel).await == 1
            })
            .await
        );
        raw.quit().await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    tokio::task::block_in_place(|| server.restart());
    let restarted = Instant::now();

    tokio::time::timeout(lease + lease / 3 + Duration::from_secs(1), guard.lost())
        .await
        .expect("the holder's guard reports the lost lease");
    println!(
        "holder learned of the loss {:?} after the restart",
        restarted.elapsed()
    );
    assert!(guard.is_lost());
    assert_eq!(
        guard.unlock().await,
        Err(Error::NotHeld {
            name: name.to_owned()
        })
    );

    for task in tasks {
        tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("waiters acquire after the restart")
            .unwrap();
    }
    let mut sections = acquired.lock().clone();
    sections.sort();
    assert_eq!(sections.len(), 5);
    for pair in sections.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "critical sections never overlap");
    }
    println!(
        "all waiters done {:?} after the restart",
        sections.last().unwrap().1.duration_since(restarted)
    );

    // The script cache was empty: the scripts were loaded again (NOSCRIPT fallback).
    let raw = server.raw().await;
    let calls = command_calls(&raw).await;
    assert!(
        calls.get("script|load").copied().unwrap_or(0) >= 1,
        "{calls:?}"
    );
    // The holder's client needs no manual reconnect either.
    let again = holder
        .lock(name)
        .try_lock()
        .await
        .unwrap()
        .expect("free now");
    again.unlock().await.unwrap();
    holder.shutdown().await.unwrap();
    waiters.shutdown().await.unwrap();
}

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

/// Resident set size of this process in bytes.
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// The child of `cancellation_storms_leave_nothing_behind`: runs the storms in a process of
/// its own, so its memory figures are not mixed with other tests'.
async fn child_storms(url: String) {
    let raw = {
        let raw =
            fred::prelude::Builder::from_config(fred::prelude::Config::from_url(&url).unwrap())
                .build()
                .unwrap();
        raw.init().await.unwrap();
        raw
    };
    let lease = Duration::from_secs(2);
    let holder = client_with(&url, lease, Duration::from_secs(2)).await;
    let storm = client_with(&url, lease, Duration::from_secs(2)).await;
    let name = "storm";
    let hold = holder.lock(name);
    let channel = hold.channel().to_owned();
    let mut rss = Vec::new();
    let storms = 6;
    for round in 0..storms {
        let guard = hold.lock().await.unwrap();
        let holder_owner = guard.owner().to_string();
        let mut tasks = Vec::with_capacity(1000);
        for _ in 0..1000 {
            let lock = storm.lock(name);
            let patience = Duration::from_micros(fastrand::u64(0..60_000));
            tasks.push(tokio::spawn(async move {
                // Dropped at a random point: before, during or after the acquire round trip,
                // while parked, or just after a wake-up.
                match tokio::time::timeout(patience, lock.lock()).await {
                    Err(_cancelled) => Ok(()),
                    Ok(Ok(guard)) if fastrand::bool() => {
                        drop(guard);
                        Ok(())
                    }
                    Ok(Ok(guard)) => guard.unlock().await.map_err(|e| ("unlock", e)),
                    Ok(Err(e)) => Err(("lock", e)),
                }
            }));
        }
        // Hand the lock around a few times while the storm rages, so that wake-ups,
        // acquisitions and cancellations cross.
        let mut guard = Some(guard);
        for _ in 0..4 {
            tokio::time::sleep(Duration::from_millis(fastrand::u64(2..12))).await;
            if let Some(g) = guard.take() {
                g.unlock().await.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(fastrand::u64(0..5))).await;
            guard = hold.try_lock_for(Duration::from_millis(50)).await.unwrap();
        }
        // Abort a random tenth outright.
        for task in tasks.iter().filter(|_| fastrand::u8(0..10) == 0) {
            task.abort();
        }
        // Never a panic (invariant 10); of the errors only a command's deadline passing on a
        // loaded machine is expected — a dropped future is cancelled, not failed.
        let mut timeouts = 0;
        for task in tasks {
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err((_, Error::Timeout(_)))) => timeouts += 1,
                Ok(Err((call, e))) => panic!("round {round}: {call} failed: {e:?}"),
                Err(e) if e.is_cancelled() => {}
                Err(e) => panic!("round {round}: a storm task panicked: {e}"),
            }
        }
        if timeouts > 0 {
            println!("round {round}: {timeouts} calls timed out");
        }
        if let Some(g) = guard.take() {
            g.unlock().await.unwrap();
        }
        // Nothing left behind: no subscription, no hold of a dropped waiter.
        assert!(
            eventually(Duration::from_secs(5), || async {
                numsub(&raw, &channel).await == 0
            })
            .await,
            "round {round}: PUBSUB NUMSUB back to 0"
        );
        let gone = eventually(Duration::from_secs(3), || async {
            raw.exists::<i64, _>(name).await.unwrap() == 0
        })
        .await;
        let fields: std::collections::HashMap<String, i64> = raw.hgetall(name).await.unwrap();
        assert!(
            gone,
            "round {round}: a dropped waiter still holds: {fields:?} (holder {holder_owner})"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        let exists: i64 = raw.exists(name).await.unwrap();
        assert_eq!(
            exists, 0,
            "round {round}: no late acquisition by a dropped waiter"
        );
        rss.push(rss_bytes());
    }
    let mb = |b: u64| b as f64 / (1024.0 * 1024.0);
    println!(
        "RSS after each storm (MiB): {:?}",
        rss.iter()
            .map(|&b| (mb(b) * 10.0).round() / 10.0)
            .collect::<Vec<_>>()
    );
    let growth = rss[storms - 1].saturating_sub(rss[1]);
    assert!(
        growth < 16 * 1024 * 1024,
        "memory grows across storms: {:.1} MiB from storm 2 to {storms}",
        mb(growth)
    );
    holder.shutdown().await.unwrap();
    storm.shutdown().await.unwrap();
    println!("STORMS OK");
}

/// Scenario 6: cancellation storms of 1,000 waiting `lock()` futures.
#[test]
fn cancellation_storms_leave_nothing_behind() {
    if let Some(url) = child_arg() {
        return tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
            .block_on(child_storms(url));
    }
    let server = RedisServer::start();
    let mut child = spawn_child("cancellation_storms_leave_nothing_behind", &server.url());
    let stdout = child.0.stdout.take().unwrap();
    let lines: Vec<String> = std::io::BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .collect();
    let status = child.0.wait().unwrap();
    for line in &lines {
        if let Some(rss) = after_tag(line, "RSS") {
            println!("RSS {rss}");
        }
    }
    assert!(status.success(), "the storm child failed: {lines:#?}");
    assert!(lines.iter().any(|l| l.contains("STORMS OK")), "{lines:#?}");
}

/// Scenario 7a: a guard dropped without unlock is released at once and never renewed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_guard_is_released_and_never_renewed_afterwards() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let lease = Duration::from_secs(3);
    let client = client_with(&server.url(), lease, Duration::from_secs(2)).await;
    let name = "dropped";
    let guard = client.lock(name).lock().await.unwrap();
    let owner = guard.owner().to_string();
    drop(guard);
    assert!(
        eventually(Duration::from_secs(10), || async {
            raw.exists::<i64, _>(name).await.unwrap() == 0
        })
        .await,
        "released in the background"
    );
    // Released, not expired: Redis counts every key it expired, whenever that was.
    assert_eq!(expired_keys(&raw).await, 0, "released, not expired");

    support::assert_never_renewed(&raw, name, &owner, lease).await;
    client.shutdown().await.unwrap();
}

/// Scenario 7b: client shutdown while holding releases at once; the guard is lost; nothing
/// is renewed afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_while_holding_releases_and_never_renews() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let lease = Duration::from_secs(3);
    let client = client_with(&server.url(), lease, Duration::from_secs(2)).await;
    let other = client_with(&server.url(), lease, Duration::from_secs(2)).await;
    let name = "shut-down";
    let lock = client.lock(name);
    let outer = lock.lock().await.unwrap();
    let inner = outer.reenter().await.unwrap();
    let fixed = client
        .lock("shut-down-fixed")
        .lock_with_lease(lease)
        .await
        .unwrap();
    let owner = outer.owner().to_string();
    let waiter = support::spawn_waiter(other.lock(name));
    tokio::time::sleep(Duration::from_millis(200)).await;

    let shut_at = Instant::now();
    client.shutdown().await.unwrap();
    let exists: i64 = raw.exists(name).await.unwrap();
    assert_eq!(exists, 0, "released by shutdown, not left to expire");
    let exists: i64 = raw.exists("shut-down-fixed").await.unwrap();
    assert_eq!(exists, 0);
    tokio::time::timeout(Duration::from_millis(100), outer.lost())
        .await
        .expect("the guard reports the loss");
    assert!(inner.is_lost() && fixed.is_lost());
    let woke = waiter.await.unwrap();
    // Woken by the release's message: before the PTTL (at least 2 s of the 3 s lease, which
    // is renewed every second) would have let it in.
    assert!(
        woke.duration_since(shut_at) < Duration::from_millis(1500),
        "the waiter is woken: {:?}",
        woke.duration_since(shut_at)
    );
    assert_eq!(inner.unlock().await, Err(Error::ShutDown));
    assert_eq!(outer.unlock().await, Err(Error::ShutDown));
    drop(fixed);

    support::assert_never_renewed(&raw, name, &owner, lease).await;
    other.shutdown().await.unwrap();
}

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
