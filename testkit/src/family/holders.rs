//! Who holds: mutual exclusion, exact reentry, one holder per scope.

use super::*;

/// Invariant 1 of docs/DESIGN.md (mutual exclusion). The rival and the kind exclude each other
/// (both ways, `try_lock` and a bounded `try_lock_for`); exclusive kinds exclude another client and
/// another task of the same client; shared kinds share. Then a contention run with a
/// history checker: an exclusive kind's holders are never two at once, and a guarded
/// read-modify-write counter in Redis ends exact; for a shared kind, rival holders (which
/// increment the counter) never overlap with the kind's holders or with each other.
pub async fn exclusion<K: Family>() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let a = client(&server).await;
    let b = client(&server).await;
    let kind = K::KIND;

    let mine = K::make(&a, NAME);
    let held = mine.lock().await.unwrap();
    let rival = K::rival(&b, NAME);
    assert!(
        rival.try_lock().await.unwrap().is_none(),
        "{kind}: the rival must be excluded while held"
    );
    let started = Instant::now();
    assert!(
        rival
            .try_lock_for(Duration::from_millis(300))
            .await
            .unwrap()
            .is_none(),
        "{kind}: the rival's bounded wait must time out"
    );
    assert!(started.elapsed() >= Duration::from_millis(300));
    let other_client = K::make(&b, NAME).try_lock().await.unwrap();
    let other_task = {
        let mine = mine.clone();
        tokio::spawn(async move { mine.try_lock().await.unwrap() })
            .await
            .unwrap()
    };
    if K::EXCLUSIVE {
        assert!(
            other_client.is_none(),
            "{kind}: another client must be excluded"
        );
        assert!(
            other_task.is_none(),
            "{kind}: another task must be excluded"
        );
        assert!(
            mine.try_lock().await.unwrap().is_none(),
            "{kind}: this task, outside the hold's scope, is another owner"
        );
    } else {
        let other_client = other_client.expect("a shared kind: another client shares");
        let other_task = other_task.expect("a shared kind: another task shares");
        other_client.unlock().await.unwrap();
        other_task.unlock().await.unwrap();
    }
    held.unlock().await.unwrap();
    assert!(
        !mine.is_locked().await.unwrap(),
        "{kind}: free after unlock"
    );

    // The other way round: the rival's hold excludes the kind.
    let rival_held = rival.try_lock().await.unwrap().expect("free now");
    assert!(
        mine.try_lock().await.unwrap().is_none(),
        "{kind}: excluded by the rival's hold"
    );
    rival_held.unlock().await.unwrap();

    // Contention with a history checker.
    let inside = Arc::new(AtomicI32::new(0));
    let rival_inside = Arc::new(AtomicI32::new(0));
    let violations = Arc::new(AtomicI32::new(0));
    let mut tasks = Vec::new();
    let mut increments = 0;
    for (c, client) in [&a, &b].into_iter().enumerate() {
        for t in 0..3 {
            // Exclusive kinds: every task increments. Shared kinds: the rival's tasks
            // increment, the kind's tasks only read.
            let as_rival = !K::EXCLUSIVE && (c + t) % 2 == 0;
            let lock: Arc<dyn AnyLock> = if as_rival {
                K::rival(client, NAME)
            } else {
                Arc::new(K::make(client, NAME))
            };
            let writes = K::EXCLUSIVE || as_rival;
            if writes {
                increments += 8;
            }
            let counter = client.redis().clone();
            let (inside, rival_inside, violations) =
                (inside.clone(), rival_inside.clone(), violations.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..8 {
                    let held = lock.lock().await.unwrap();
                    let (mine, theirs) = if as_rival {
                        (&rival_inside, &inside)
                    } else {
                        (&inside, &rival_inside)
                    };
                    let before = mine.fetch_add(1, Ordering::SeqCst);
                    let exclusive_here = as_rival || K::EXCLUSIVE;
                    if theirs.load(Ordering::SeqCst) != 0 || (exclusive_here && before != 0) {
                        violations.fetch_add(1, Ordering::SeqCst);
                    }
                    let value: Option<i64> = counter.get("family:counter").await.unwrap();
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    if writes {
                        let _: () = counter
                            .set("family:counter", value.unwrap_or(0) + 1, None, None, false)
                            .await
                            .unwrap();
                    }
                    mine.fetch_sub(1, Ordering::SeqCst);
                    held.unlock().await.unwrap();
                }
            }));
        }
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("the contention run ends")
            .unwrap();
    }
    assert_eq!(
        violations.load(Ordering::SeqCst),
        0,
        "{kind}: holders overlapped"
    );
    let total: i64 = raw.get("family:counter").await.unwrap();
    assert_eq!(total, increments, "{kind}: a guarded increment was lost");
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// Invariants 6 (reentry is exact) and 14 (re-entry by scope) of docs/DESIGN.md. Outside a hold's
/// scope an acquire is a new owner (`try_lock` refuses, the count outside is 0); inside
/// `guard.run`, every acquire method re-enters at once, and so do `guard.reenter()` and a nested
/// `lock.run`: one owner field whose count follows every acquire and every release (in any
/// order); the key has the kind's Redis type while held and is gone after the last release.
pub async fn reentry<K: Family>() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let a = client(&server).await;
    let kind = K::KIND;
    let lock = K::make(&a, NAME);
    assert_eq!(lock.hold_count().await.unwrap(), 0);
    let first = lock.lock().await.unwrap();
    if K::EXCLUSIVE {
        assert!(
            lock.try_lock().await.unwrap().is_none(),
            "{kind}: outside the hold's scope, another owner"
        );
    }
    assert_eq!(
        lock.hold_count().await.unwrap(),
        0,
        "{kind}: no scope, no owner"
    );
    let owned = lock.with_owner(first.owner());
    let nested = tokio::sync::Mutex::new(Vec::new());
    let started = Instant::now();
    first
        .run(async {
            let mut nested = nested.lock().await;
            nested.push(lock.try_lock().await.unwrap().expect("re-enters"));
            nested.push(
                lock.try_lock_for(Duration::from_secs(1))
                    .await
                    .unwrap()
                    .expect("re-enters"),
            );
            nested.push(lock.lock_with_lease(Duration::from_secs(60)).await.unwrap());
            nested.push(
                lock.try_lock_with_lease(Duration::from_secs(1), Duration::from_secs(60))
                    .await
                    .unwrap()
                    .expect("re-enters"),
            );
            assert_eq!(lock.hold_count().await.unwrap(), 5, "{kind}: seen in scope");
            // A lock's own run nests too: one more hold while it runs.
            lock.run(Box::pin(async {
                assert_eq!(lock.hold_count().await.unwrap(), 6, "{kind}: nested run");
            }))
            .await
            .unwrap();
        })
        .await
        .unwrap();
    let mut guards = vec![first];
    guards.extend(nested.into_inner());
    guards.push(guards[0].reenter().await.unwrap());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{kind}: nested acquires never wait"
    );
    assert_eq!(
        owned.hold_count().await.unwrap(),
        6,
        "{kind}: six holds, one owner"
    );
    let key = lock.key();
    let key_type: String = raw.r#type(&key).await.unwrap();
    assert_eq!(key_type, K::KEY_TYPE, "{kind}: the key's type");
    // Release out of order: the middle, the first, then the rest.
    let order = [2usize, 0, 5, 3, 1, 4];
    let mut slots: Vec<Option<Held>> = guards.into_iter().map(Some).collect();
    for (done, &i) in order.iter().enumerate() {
        let held = slots[i].take().unwrap();
        held.unlock().await.unwrap();
        let left = 5 - done as u32;
        assert_eq!(
            owned.hold_count().await.unwrap(),
            left,
            "{kind}: count after {} releases",
            done + 1
        );
        assert_eq!(
            lock.is_locked().await.unwrap(),
            left > 0,
            "{kind}: is_locked"
        );
    }
    assert!(
        !exists(&raw, &key).await,
        "{kind}: the key goes with the last hold"
    );
    a.shutdown().await.unwrap();
}

/// Invariant 14 of docs/DESIGN.md (one holder means one holder). Critical sections on one name,
/// polled together in one task — `join!`, `select!`, `FuturesUnordered`, `for_each_concurrent`,
/// `buffer_unordered` — are never inside at once (an exclusive kind; a shared kind's sections
/// never overlap a rival's); on two names they run together.
pub async fn one_holder_per_scope<K: Family>() {
    use futures::stream::{self, FuturesUnordered, StreamExt};
    use std::sync::atomic::AtomicUsize;

    let server = RedisServer::start();
    let a = client(&server).await;
    let kind = K::KIND;
    // An exclusive kind excludes itself; a shared one is checked against its rival.
    let this: Arc<dyn AnyLock> = Arc::new(K::make(&a, NAME));
    let other = K::rival(&a, NAME);
    // Holders inside now: shared ones (a shared kind's) and exclusive ones (the rest).
    let (shared, exclusive) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let overlaps = AtomicUsize::new(0);
    let section = |lock: Arc<dyn AnyLock>, sharing: bool| {
        let (shared, exclusive, overlaps) = (&shared, &exclusive, &overlaps);
        async move {
            let held = lock.lock().await.unwrap();
            let (mine, theirs) = if sharing {
                (shared, exclusive)
            } else {
                (exclusive, shared)
            };
            // Left on drop too: `select!` drops the section that loses, inside or not.
            struct Inside<'a>(&'a AtomicUsize);
            impl Drop for Inside<'_> {
                fn drop(&mut self) {
                    self.0.fetch_sub(1, Ordering::SeqCst);
                }
            }
            let me = mine.fetch_add(1, Ordering::SeqCst) + 1;
            let inside = Inside(mine);
            if theirs.load(Ordering::SeqCst) > 0 || (!sharing && me > 1) {
                overlaps.fetch_add(1, Ordering::SeqCst);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            drop(inside);
            held.unlock().await.unwrap();
        }
    };
    // Alternates the kind and its rival, so a shared kind meets a writer every other time.
    let pick = |i: usize| {
        if i % 2 == 0 {
            section(this.clone(), !K::EXCLUSIVE)
        } else {
            section(other.clone(), false)
        }
    };
    let check = |how: &str| {
        let seen = overlaps.swap(0, Ordering::SeqCst);
        assert_eq!(seen, 0, "{kind}: {seen} overlapping holds under {how}");
    };

    tokio::join!(pick(0), pick(1), pick(2));
    check("join!");
    for _ in 0..3 {
        tokio::select! {
            _ = pick(0) => {}
            _ = pick(1) => {}
        }
    }
    check("select!");
    let mut unordered: FuturesUnordered<_> = (0..4).map(pick).collect();
    while unordered.next().await.is_some() {}
    check("FuturesUnordered");
    stream::iter(0..4).for_each_concurrent(4, pick).await;
    check("for_each_concurrent");
    stream::iter(0..4)
        .map(pick)
        .buffer_unordered(4)
        .collect::<Vec<()>>()
        .await;
    check("buffer_unordered");

    // Two names: each section waits until the other is inside too, so they must overlap.
    let both = tokio::sync::Barrier::new(2);
    let overlapping = |name: &'static str| {
        let (lock, both) = (K::make(&a, name), &both);
        async move {
            let held = lock.lock().await.unwrap();
            tokio::time::timeout(Duration::from_secs(20), both.wait())
                .await
                .unwrap_or_else(|_| panic!("{kind}: two names did not run together"));
            held.unlock().await.unwrap();
        }
    };
    tokio::join!(overlapping("family-a"), overlapping("family-b"));
    a.shutdown().await.unwrap();
}
