//! Scenarios 6-7: cancellation storms, dropped guards and shutdown while holding.

use super::*;

/// Keys the server has expired since it started (`INFO stats`).
async fn expired_keys(raw: &fred::clients::Client) -> u64 {
    let info: String = raw.info(Some(fred::types::InfoKind::Stats)).await.unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix("expired_keys:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("INFO stats has expired_keys")
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
        // Never a panic (invariant 10, docs/DESIGN.md); of the errors only a command's deadline
        // passing on a loaded machine is expected — a dropped future is cancelled, not failed.
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
    let mut child = spawn_child(
        &test_name(module_path!(), "cancellation_storms_leave_nothing_behind"),
        &server.url(),
    );
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
