//! Cancellation and shutdown leave nothing behind; bad input and wrong types are refused.

use super::*;

/// Every key with its serialized value and TTL: equal snapshots mean nothing changed.
async fn snapshot(raw: &fred::clients::Client) -> Vec<(String, Option<Vec<u8>>, i64)> {
    let mut keys: Vec<String> = raw
        .custom(CustomCommand::new_static("KEYS", None, false), vec!["*"])
        .await
        .unwrap();
    keys.sort();
    let mut out = Vec::new();
    for key in keys {
        let dump: Option<Vec<u8>> = raw
            .custom(
                CustomCommand::new_static("DUMP", None, false),
                vec![key.clone()],
            )
            .await
            .unwrap();
        let pttl: i64 = raw.pttl(&key).await.unwrap();
        out.push((key, dump, pttl));
    }
    out
}

fn is_invalid<T>(outcome: &Result<T>) -> bool {
    matches!(outcome, Err(Error::InvalidArgument(_)))
}

fn is_wrong_type<T>(outcome: &Result<T>) -> bool {
    matches!(outcome, Err(Error::WrongType { .. }))
}

/// Invariant 9 of docs/DESIGN.md (cancellation safety). Ten parked waiters aborted leave no
/// subscription and take nothing when the rival releases; acquires cancelled at random points
/// (mid-flight included) leave no hold; a dropped guard is released in the background.
pub async fn cancellation_leaves_nothing_behind<K: Family>() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let holder = client(&server).await;
    let waiters = client(&server).await;
    let kind = K::KIND;
    let lock = K::make(&waiters, NAME);
    let key = lock.key();

    let rival = K::rival(&holder, NAME).lock().await.unwrap();
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let lock = lock.clone();
            tokio::spawn(async move { lock.lock().await.map(|_| ()) })
        })
        .collect();
    assert!(
        eventually(Duration::from_secs(5), || async {
            !channels(&raw).await.is_empty()
        })
        .await,
        "{kind}: the waiters subscribe"
    );
    quiet_script_calls(&raw).await;
    for task in &tasks {
        task.abort();
    }
    for task in tasks {
        assert!(task.await.unwrap_err().is_cancelled());
    }
    assert!(
        eventually(Duration::from_secs(5), || async {
            channels(&raw).await.is_empty()
        })
        .await,
        "{kind}: a subscription was left behind: {:?}",
        channels(&raw).await
    );
    rival.unlock().await.unwrap();
    // Nothing may take it now; give a leaked waiter time to show itself.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !exists(&raw, &key).await,
        "{kind}: an aborted waiter took the lock"
    );

    for round in 0..20u64 {
        let tasks: Vec<_> = (0..8u64)
            .map(|i| {
                let lock = lock.clone();
                tokio::spawn(async move {
                    let cut = Duration::from_micros(20 + (round * 37 + i * 53) % 600);
                    let _ = tokio::time::timeout(cut, lock.lock()).await;
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    }
    assert!(
        eventually(Duration::from_secs(5), || async {
            !exists(&raw, &key).await
        })
        .await,
        "{kind}: a cancelled acquire left a hold behind"
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            channels(&raw).await.is_empty()
        })
        .await,
        "{kind}: a cancelled acquire left a subscription behind"
    );

    let held = lock.lock().await.unwrap();
    drop(held);
    assert!(
        eventually(Duration::from_secs(5), || async {
            !exists(&raw, &key).await
        })
        .await,
        "{kind}: a dropped guard is released in the background"
    );
    holder.shutdown().await.unwrap();
    waiters.shutdown().await.unwrap();
}

/// Shutdown releases what the client holds (re-entered holds included), its guards report
/// lost, and every later call is `Error::ShutDown`.
pub async fn shutdown_releases_and_refuses<K: Family>() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let a = client(&server).await;
    let kind = K::KIND;
    let lock = K::make(&a, NAME);
    let outer = lock.lock().await.unwrap();
    let inner = outer.reenter().await.unwrap();
    a.shutdown().await.unwrap();
    assert!(
        !exists(&raw, &lock.key()).await,
        "{kind}: shutdown releases"
    );
    assert!(
        outer.is_lost() && inner.is_lost(),
        "{kind}: guards are lost"
    );
    let after = lock.try_lock().await;
    assert!(
        matches!(after, Err(Error::ShutDown)),
        "{kind}: after shutdown: {}",
        describe(&after)
    );
    let made_after = K::make(&a, NAME).lock().await;
    assert!(matches!(made_after, Err(Error::ShutDown)));
    assert!(matches!(lock.is_locked().await, Err(Error::ShutDown)));
}

/// Invariant 10 of docs/DESIGN.md (bad input). An empty name, a name over the limit, and leases
/// under 1 ms or over `MAX_LEASE` are `Error::InvalidArgument` from every method, before anything
/// is sent; a zero and an endless wait work.
pub async fn bad_input_is_refused_before_anything_is_sent<K: Family>() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let a = client(&server).await;
    let kind = K::KIND;
    let sent = |calls: std::collections::HashMap<String, u64>| -> u64 {
        calls
            .iter()
            .filter(|(name, _)| name.as_str() != "info")
            .map(|(_, n)| n)
            .sum()
    };
    let before = sent(command_calls(&raw).await);
    let long = "n".repeat(redbaton::MAX_NAME_LEN + 1);
    let second = Duration::from_secs(1);
    macro_rules! invalid {
        ($what:expr, $outcome:expr) => {{
            let outcome = $outcome;
            assert!(
                is_invalid(&outcome),
                "{kind}: {}: {}",
                $what,
                describe(&outcome)
            );
        }};
    }
    for name in ["", long.as_str()] {
        let lock = K::make(&a, name);
        let what = |method: &str| format!("{method} on a name of {} bytes", name.len());
        invalid!(what("lock"), lock.lock().await);
        invalid!(what("try_lock"), lock.try_lock().await);
        invalid!(what("try_lock_for"), lock.try_lock_for(second).await);
        invalid!(what("lock_with_lease"), lock.lock_with_lease(second).await);
        invalid!(
            what("try_lock_with_lease"),
            lock.try_lock_with_lease(second, second).await
        );
        invalid!(what("is_locked"), lock.is_locked().await);
        invalid!(what("hold_count"), lock.hold_count().await);
        invalid!(what("force_unlock"), lock.force_unlock().await);
    }
    let lock = K::make(&a, NAME);
    for lease in [
        Duration::ZERO,
        Duration::from_micros(999),
        redbaton::MIN_LEASE - Duration::from_micros(1),
        redbaton::MAX_LEASE + Duration::from_millis(1),
        Duration::MAX,
    ] {
        invalid!(
            format!("lease {lease:?}"),
            lock.lock_with_lease(lease).await
        );
        invalid!(
            format!("lease {lease:?}"),
            lock.try_lock_with_lease(second, lease).await
        );
    }
    assert_eq!(
        sent(command_calls(&raw).await),
        before,
        "{kind}: bad input reached Redis"
    );
    // The extremes that are valid work.
    let held = lock
        .try_lock_for(Duration::ZERO)
        .await
        .unwrap()
        .expect("a zero wait is one attempt");
    let owned = lock.with_owner(held.owner());
    let again = owned
        .try_lock_for(Duration::MAX)
        .await
        .unwrap()
        .expect("an endless wait re-enters");
    let longest = owned.lock_with_lease(redbaton::MAX_LEASE).await.unwrap();
    let shortest = owned.lock_with_lease(redbaton::MIN_LEASE).await.unwrap();
    assert_eq!(owned.hold_count().await.unwrap(), 4);
    for held in [shortest, longest, again, held] {
        held.unlock().await.unwrap();
    }
    assert!(!lock.is_locked().await.unwrap());
    a.shutdown().await.unwrap();
}

/// Invariant 10 of docs/DESIGN.md (a key of the wrong type). With a string, a list or a set (or a
/// hash, for a kind whose key is not a hash) at the lock's key, every acquire method, `hold_count`
/// and `force_unlock` return `Error::WrongType`, and Redis is exactly as it was: the key's value
/// and TTL unchanged, no other key created, no subscription left.
pub async fn wrong_type_keys_are_refused_and_untouched<K: Family>() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let a = client(&server).await;
    let kind = K::KIND;
    let lock = K::make(&a, NAME);
    let key = lock.key();
    let second = Duration::from_secs(1);
    let bounded = Duration::from_secs(5);
    macro_rules! wrong_type {
        ($what:expr, $outcome:expr) => {{
            let outcome = $outcome;
            assert!(
                is_wrong_type(&outcome),
                "{kind}: {}: {}",
                $what,
                describe(&outcome)
            );
        }};
    }
    for key_type in ["string", "list", "set", "hash"] {
        if key_type == K::KEY_TYPE {
            continue;
        }
        let _: () = raw.flushall(false).await.unwrap();
        match key_type {
            "string" => raw.set(&key, "user data", None, None, false).await.unwrap(),
            "list" => raw.rpush(&key, vec!["a", "b"]).await.unwrap(),
            "set" => raw.sadd(&key, "a").await.unwrap(),
            _ => raw.hset(&key, ("f", "v")).await.unwrap(),
        }
        let _: () = raw.pexpire(&key, 60_000, None).await.unwrap();
        let before = snapshot(&raw).await;
        let what = |method: &str| format!("{method} on a {key_type} key");
        let waited = |outcome: std::result::Result<Result<Held>, tokio::time::error::Elapsed>| {
            outcome.unwrap_or_else(|_| panic!("{kind}: waited on a {key_type}"))
        };
        wrong_type!(
            what("lock"),
            waited(tokio::time::timeout(bounded, lock.lock()).await)
        );
        wrong_type!(what("try_lock"), lock.try_lock().await);
        wrong_type!(what("try_lock_for"), lock.try_lock_for(second).await);
        wrong_type!(
            what("lock_with_lease"),
            waited(tokio::time::timeout(bounded, lock.lock_with_lease(second)).await)
        );
        wrong_type!(
            what("try_lock_with_lease"),
            lock.try_lock_with_lease(second, second).await
        );
        // Without an owner nothing is read: ask as one.
        let owned = lock.with_owner(format!("{}:1", a.id()).parse().unwrap());
        wrong_type!(what("hold_count"), owned.hold_count().await);
        wrong_type!(what("force_unlock"), lock.force_unlock().await);
        let after = snapshot(&raw).await;
        // The TTL ticks down between the snapshots: compare it coarsely.
        let coarse = |s: &[(String, Option<Vec<u8>>, i64)]| {
            s.iter()
                .map(|(k, v, t)| (k.clone(), v.clone(), *t > 50_000))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            coarse(&after),
            coarse(&before),
            "{kind}: a {key_type} key (and nothing else) is left exactly as it was"
        );
        assert!(
            eventually(Duration::from_secs(5), || async {
                channels(&raw).await.is_empty()
            })
            .await,
            "{kind}: no subscription left"
        );
    }
    a.shutdown().await.unwrap();
}
