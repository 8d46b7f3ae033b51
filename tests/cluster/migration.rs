//! Slot migrations: releases reach waiters, half-run scripts finish, churn loses nothing.

use super::*;

/// Whether `name` is held as `kind` (a read of its state, one key).
async fn is_held(client: &Client, kind: Kind, name: &str) -> redbaton::Result<bool> {
    match kind {
        Kind::Lock => client.lock(name).is_locked().await,
        Kind::Read => client.read_write_lock(name).read().is_locked().await,
        Kind::Write => client.read_write_lock(name).write().is_locked().await,
        Kind::Fair => client.fair_lock(name).is_locked().await,
        Kind::Fenced => client.fenced_lock(name).is_locked().await,
        Kind::Semaphore => Ok(client.semaphore(name).available_permits().await? == 0),
        Kind::LeasedSemaphore => Ok(client.leased_semaphore(name).available_permits().await? == 0),
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    /// The slot is MIGRATING and IMPORTING, its keys still on the source.
    Marked,
    /// The keys went to the target, the slot still open: ASK.
    KeysMoved,
}

/// How far a release gets while the slot's migration is open. Redis refuses a script whose
/// keys in a migrating slot are partly absent (TRYAGAIN) until the migration ends; the
/// scripts pass channels as arguments, so this is down to the real keys each one names.
#[derive(Clone, Copy, Debug, PartialEq)]
enum WhileOpen {
    /// The release runs, and the waiter is woken and takes the hold.
    Served,
    /// The release runs, the waiter only gets its turn once the migration ends: its acquire
    /// names keys of which some are absent (the fair lock's queue and timeouts without the
    /// hash; the fenced lock's token counter without the hash; the leased semaphore's counter
    /// without the set of taken permits, gone with the last one), or, with sharded pub/sub
    /// after the keys moved, the release runs on the importing node and its SPUBLISH reaches
    /// only that node's shard subscribers, while the waiter's subscription stays on the
    /// slot's owner until the slot is handed over.
    Released,
    /// Not even the release runs: a read release names timeout-key prefixes that never exist
    /// as keys (Redisson's layout; the keys under them must be declared to the cluster).
    Refused,
}

fn while_open(kind: Kind, mode: PubSubMode, phase: Phase) -> WhileOpen {
    match kind {
        Kind::Read => WhileOpen::Refused,
        Kind::Fair | Kind::Fenced | Kind::LeasedSemaphore => WhileOpen::Released,
        _ if mode == PubSubMode::Sharded && phase == Phase::KeysMoved => WhileOpen::Released,
        _ => WhileOpen::Served,
    }
}

/// For every kind and both phases of a migration: a holder releases while the lock's slot is
/// migrating, a waiter of another client gets it — while the migration is still open where
/// Redis allows it (see [`WhileOpen`]), else soon after it ends, never after the 30 s lease —
/// and reads of the state follow ASK to the importing node.
async fn releases_survive_a_slot_migration(mode: PubSubMode) {
    let cluster = RedisCluster::start(3, 0);
    let holder = client(&cluster, mode, Duration::from_secs(30)).await;
    let waiter = client(&cluster, mode, Duration::from_secs(30)).await;
    let topology = cluster.topology();
    // Generous for a loaded machine; far below the 30 s lease a lost release would cost.
    let prompt = Duration::from_secs(5);
    for kind in KINDS {
        for phase in [Phase::Marked, Phase::KeysMoved] {
            let name = format!("migrating:{kind:?}:{mode:?}:{phase:?}");
            let expect = while_open(kind, mode, phase);
            let case = format!("{kind:?} {mode:?} {phase:?} ({expect:?} while open)");
            let slot = slot(&name);
            let from = cluster.primary_for_slot(slot);
            let to = topology
                .iter()
                .find(|n| n.primary && n.port != from)
                .unwrap()
                .port;
            let release = hold(&holder, kind, &name).await.unwrap();
            let waiting = {
                let waiter = waiter.clone();
                let name = name.clone();
                tokio::spawn(async move {
                    let release = hold(&waiter, kind.waiter(), &name).await;
                    let took = Instant::now();
                    release.unwrap().await.unwrap();
                    took
                })
            };
            // Let the waiter subscribe and park.
            tokio::time::sleep(Duration::from_millis(300)).await;
            cluster.begin_migration(slot, from, to);
            if phase == Phase::KeysMoved {
                cluster.move_keys(slot, from, to);
            }
            // One key read: served by the source, or through ASK by the target.
            assert!(is_held(&waiter, kind, &name).await.unwrap(), "{case}");
            let released = tokio::spawn(release);
            let released = if expect == WhileOpen::Refused {
                // Kept open a moment: the release is refused meanwhile.
                tokio::time::sleep(Duration::from_millis(500)).await;
                Some(released)
            } else {
                tokio::time::timeout(prompt, released)
                    .await
                    .unwrap_or_else(|_| {
                        panic!("{case}: release not done {prompt:?} into the open migration")
                    })
                    .unwrap()
                    .unwrap_or_else(|e| panic!("{case}: release failed, migration open: {e}"));
                None
            };
            let waiting = if expect == WhileOpen::Served {
                tokio::time::timeout(prompt, waiting)
                    .await
                    .unwrap_or_else(|_| {
                        panic!("{case}: waiter not served {prompt:?} after the release, migration open")
                    })
                    .unwrap();
                None
            } else {
                // What keeps the waiter out is Redis's rule or the shard channel's node, not
                // timing: it is still out after the release.
                assert!(
                    !waiting.is_finished(),
                    "{case}: served while the migration was open"
                );
                Some(waiting)
            };
            let ended = Instant::now();
            match phase {
                Phase::Marked => cluster.cancel_migration(slot, from, to),
                Phase::KeysMoved => cluster.finish_migration(slot, from, to),
            }
            let timeout = Duration::from_secs(10);
            if let Some(released) = released {
                tokio::time::timeout(timeout, released)
                    .await
                    .unwrap_or_else(|_| {
                        panic!("{case}: release not done {timeout:?} after the migration ended")
                    })
                    .unwrap()
                    .unwrap_or_else(|e| panic!("{case}: release failed: {e}"));
            }
            if let Some(waiting) = waiting {
                let took = tokio::time::timeout(timeout, waiting)
                    .await
                    .unwrap_or_else(|_| {
                        panic!("{case}: waiter not served {timeout:?} after the migration ended")
                    })
                    .unwrap();
                // Served by the release, far from the 30 s lease.
                let after = took.saturating_duration_since(ended);
                assert!(
                    after < prompt,
                    "{case}: waiter got it {after:?} after the migration ended"
                );
            }
            assert!(!is_held(&holder, kind, &name).await.unwrap(), "{case}");
        }
    }
    holder.shutdown().await.unwrap();
    waiter.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_classic_releases_reach_the_waiter() {
    releases_survive_a_slot_migration(PubSubMode::Classic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_sharded_releases_reach_the_waiter() {
    if !support::servers::supports(support::servers::Feature::ShardedPubSub, None) {
        return;
    }
    releases_survive_a_slot_migration(PubSubMode::Sharded).await;
}

/// A script run on a node whose slot is MIGRATING fails half-way (its writes so far kept) when
/// it touches a key the node no longer has — one the script itself just emptied. Scripts that
/// empty a key run there now that channels are not keys (which made Redis refuse them
/// before they ran): the baton pass (it deletes the hash, then writes the next owner), a
/// fair-lock release that drops an expired waiter, the last in the queue, and a leased
/// acquire that reclaims the last permit before it takes one. Each finishes while the slot is
/// open, and the state stays right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_that_empty_a_key_finish_on_a_migrating_node() {
    if !support::servers::supports(support::servers::Feature::ShardedPubSub, None) {
        return;
    }
    let cluster = RedisCluster::start(3, 0);
    let topology = cluster.topology();
    let other = client(&cluster, PubSubMode::Sharded, Duration::from_secs(30)).await;
    let client = client(&cluster, PubSubMode::Sharded, Duration::from_secs(30)).await;
    let prompt = Duration::from_secs(5);
    let open = |name: &str| {
        let moving = slot(name);
        let from = cluster.primary_for_slot(moving);
        let to = topology
            .iter()
            .find(|n| n.primary && n.port != from)
            .unwrap()
            .port;
        cluster.begin_migration(moving, from, to);
        (moving, from, to)
    };

    // The baton pass: a task of the same client is parked, nobody else listens.
    let lock = client.lock("emptied:pass");
    let held = lock.lock().await.unwrap();
    let next = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.lock().await.unwrap().unlock().await })
    };
    assert!(
        support::eventually(prompt, || async { lock.passable_waiters() == 1 }).await,
        "the waiter parked"
    );
    let (moving, from, to) = open("emptied:pass");
    held.unlock()
        .await
        .unwrap_or_else(|e| panic!("pass on a migrating node: {e}"));
    tokio::time::timeout(prompt, next)
        .await
        .expect("the parked task got the lock, migration open")
        .unwrap()
        .unwrap();
    cluster.cancel_migration(moving, from, to);
    assert!(!lock.is_locked().await.unwrap());

    // A fair-lock release whose queue holds one waiter, dead (its timeout passed).
    let fair = client.fair_lock("emptied:fair");
    let held = fair.lock().await.unwrap();
    let port = cluster.primary_for_slot(slot(fair.key()));
    assert_eq!(
        cli(port, &["rpush", fair.queue_key(), "dead:1"]).trim(),
        "1"
    );
    assert_eq!(
        cli(port, &["zadd", fair.timeout_key(), "1", "dead:1"]).trim(),
        "1"
    );
    let (moving, from, to) = open("emptied:fair");
    held.unlock()
        .await
        .unwrap_or_else(|e| panic!("fair release on a migrating node: {e}"));
    assert!(!fair.is_locked().await.unwrap());
    cluster.cancel_migration(moving, from, to);
    assert_eq!(cli(port, &["exists", fair.queue_key()]).trim(), "0");

    // A leased acquire that reclaims the only permit, whose lease ended, and takes it.
    let semaphore = client.leased_semaphore("emptied:leased");
    assert!(semaphore.try_set_permits(1).await.unwrap());
    let expired = semaphore
        .try_acquire_with_lease(Duration::ZERO, Duration::from_millis(50))
        .await
        .unwrap()
        .expect("free");
    let port = cluster.primary_for_slot(slot(semaphore.key()));
    let server_ms = || {
        let time = cli(port, &["time"]);
        let mut parts = time.lines().map(|l| l.trim().parse::<u64>().unwrap());
        parts.next().unwrap() * 1000 + parts.next().unwrap() / 1000
    };
    // Its lease ended by the server's clock (the reclaim reads that one).
    assert!(
        support::eventually(prompt, || async {
            let now = server_ms().to_string();
            let count = cli(port, &["zcount", semaphore.timeout_key(), "0", &now]);
            count.trim() == "1"
        })
        .await,
        "the permit's lease ended"
    );
    let (moving, from, to) = open("emptied:leased");
    let taken = other
        .leased_semaphore("emptied:leased")
        .try_acquire()
        .await
        .unwrap_or_else(|e| panic!("leased acquire on a migrating node: {e}"))
        .expect("the expired permit was reclaimed and taken");
    assert_eq!(semaphore.available_permits().await.unwrap(), 0);
    taken.release().await.unwrap();
    cluster.cancel_migration(moving, from, to);
    assert_eq!(semaphore.available_permits().await.unwrap(), 1);
    assert!(expired.release().await.is_err(), "its lease had ended");
    assert_eq!(semaphore.available_permits().await.unwrap(), 1);
    client.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

/// Two clients × four tasks contend for four names while the names' slots move back and forth
/// between primaries: no call fails, and no wait comes near the 30 s lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_churn_under_contention_loses_no_release() {
    if !support::servers::supports(support::servers::Feature::ShardedPubSub, None) {
        return;
    }
    let cluster = Arc::new(RedisCluster::start(3, 0));
    let names: Vec<String> = (0..4).map(|i| format!("churn:{i}")).collect();
    let clients = [
        client(&cluster, PubSubMode::Sharded, Duration::from_secs(30)).await,
        client(&cluster, PubSubMode::Sharded, Duration::from_secs(30)).await,
    ];
    let stop = Arc::new(AtomicBool::new(false));
    let moves = Arc::new(AtomicUsize::new(0));
    let mover = {
        let (cluster, names, stop, moves) =
            (cluster.clone(), names.clone(), stop.clone(), moves.clone());
        std::thread::spawn(move || {
            let primaries: Vec<u16> = cluster
                .topology()
                .into_iter()
                .filter(|n| n.primary)
                .map(|n| n.port)
                .collect();
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(8) {
                let round = Instant::now();
                for name in &names {
                    let slot = slot(name);
                    let from = cluster.primary_for_slot(slot);
                    // Round the primaries: a slot never comes back to a node within a round.
                    let at = primaries.iter().position(|&p| p == from).unwrap();
                    let to = primaries[(at + 1) % primaries.len()];
                    cluster.begin_migration(slot, from, to);
                    // Held open a moment in each phase, as a reshard of many keys would be.
                    std::thread::sleep(Duration::from_millis(30));
                    cluster.move_keys(slot, from, to);
                    std::thread::sleep(Duration::from_millis(30));
                    cluster.finish_migration(slot, from, to);
                    moves.fetch_add(1, Ordering::Relaxed);
                }
                // A shard subscription follows its slot when the hub's next look at the slot
                // map (every second) finds a new owner: a slot that left a node and came back
                // between two looks would leave its waiters unsubscribed until the lease (not
                // what a reshard does; see the hub). Each slot moves at most every 2 s here.
                std::thread::sleep(Duration::from_secs(2).saturating_sub(round.elapsed()));
            }
            stop.store(true, Ordering::Release);
        })
    };
    let failures = Arc::new(parking_lot::Mutex::new(Vec::<String>::new()));
    let longest = Arc::new(parking_lot::Mutex::new(Duration::ZERO));
    let acquired = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for client in &clients {
        for t in 0..4 {
            let (client, names, stop, failures, longest, acquired) = (
                client.clone(),
                names.clone(),
                stop.clone(),
                failures.clone(),
                longest.clone(),
                acquired.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let mut i = t;
                while !stop.load(Ordering::Acquire) {
                    let lock = client.lock(&names[i % names.len()]);
                    i += 1;
                    let asked = Instant::now();
                    let guard = match lock.lock().await {
                        Ok(g) => g,
                        Err(e) => {
                            failures.lock().push(format!("lock: {e}"));
                            continue;
                        }
                    };
                    let waited = asked.elapsed();
                    acquired.fetch_add(1, Ordering::Relaxed);
                    {
                        let mut l = longest.lock();
                        *l = (*l).max(waited);
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    if let Err(e) = guard.unlock().await {
                        failures.lock().push(format!("unlock: {e}"));
                    }
                }
            }));
        }
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("a task ended within a lease after the churn")
            .unwrap();
    }
    mover.join().unwrap();
    let failures = failures.lock().clone();
    let longest = *longest.lock();
    let (moves, acquired) = (
        moves.load(Ordering::Relaxed),
        acquired.load(Ordering::Relaxed),
    );
    eprintln!("{moves} slot moves, {acquired} acquisitions, longest wait {longest:?}");
    assert!(moves >= 8, "slots moved {moves}");
    assert!(acquired >= 100, "only {acquired} acquisitions");
    assert!(
        failures.is_empty(),
        "{} failed calls: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    assert!(
        longest < Duration::from_secs(10),
        "longest wait {longest:?}"
    );
    for client in clients {
        client.shutdown().await.unwrap();
    }
}
