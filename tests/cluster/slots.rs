//! Locks in different slots: renewal, wake-ups and baton passes on every primary, bad names.

use super::*;

/// Names whose keys live on `count` different primaries.
fn names_on_distinct_primaries(cluster: &RedisCluster, count: usize) -> Vec<String> {
    let mut seen = HashSet::new();
    let mut names = Vec::new();
    for i in 0.. {
        let name = format!("order:{i}");
        if seen.insert(cluster.primary_for_slot(slot(&name))) {
            names.push(name);
            if names.len() == count {
                break;
            }
        }
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_in_different_slots_are_held_and_renewed() {
    let cluster = RedisCluster::start(3, 0);
    let names = names_on_distinct_primaries(&cluster, 3);
    // Slots of the three names differ, so one renewal script could not carry them all.
    let slots: HashSet<u16> = names.iter().map(|n| slot(n)).collect();
    assert_eq!(slots.len(), 3);

    let holder = client(&cluster, PubSubMode::Classic, RENEWED_LEASE).await;
    // The plain URL form: `redis-cluster://h1:p1?node=h2:p2&...`.
    let other = Client::connect(&cluster.url()).await.unwrap();
    let mut guards = Vec::new();
    for name in &names {
        let lock = holder.lock(name);
        let outer = lock.lock().await.unwrap();
        let inner = outer.reenter().await.unwrap();
        let owned = lock.with_owner(outer.owner());
        assert_eq!(owned.hold_count().await.unwrap(), 2);
        guards.push((outer, inner));
    }
    // Two watchdog leases: the renewals reached every primary.
    tokio::time::sleep(RENEWED_LEASE * 2).await;
    for (name, (outer, _)) in names.iter().zip(&guards) {
        assert!(!outer.is_lost(), "{name} lost");
        assert!(other.lock(name).try_lock().await.unwrap().is_none());
        let ttl = other.lock(name).remaining_ttl().await.unwrap().unwrap();
        assert!(ttl > Duration::from_millis(100), "{name}: {ttl:?}");
    }
    // Every primary forgets the scripts (as a promoted replica or a restarted node may):
    // the NOSCRIPT fallback reloads them and the releases below still work.
    for node in &cluster.nodes {
        assert!(cli(node.port, &["script", "flush"]).contains("OK"));
    }
    for (name, (outer, inner)) in names.iter().zip(guards) {
        inner.unlock().await.unwrap();
        assert!(other.lock(name).is_locked().await.unwrap());
        outer.unlock().await.unwrap();
        assert!(!other.lock(name).is_locked().await.unwrap());
        let g = other
            .lock(name)
            .try_lock()
            .await
            .unwrap()
            .expect("free now");
        g.unlock().await.unwrap();
    }
    holder.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

/// A waiter on each of three primaries is woken by the release well before the 30 s lease.
async fn wakeups_are_prompt(mode: PubSubMode) {
    let cluster = RedisCluster::start(3, 0);
    let names = names_on_distinct_primaries(&cluster, 3);
    let holder = client(&cluster, mode, Duration::from_secs(30)).await;
    let waiter = client(&cluster, mode, Duration::from_secs(30)).await;
    for round in 0..2 {
        let mut guards = Vec::new();
        for name in &names {
            guards.push(holder.lock(name).lock().await.unwrap());
        }
        let mut tasks = Vec::new();
        for name in &names {
            let lock = waiter.lock(name);
            tasks.push(tokio::spawn(async move {
                let guard = lock.lock().await.unwrap();
                let woke = Instant::now();
                guard.unlock().await.unwrap();
                woke
            }));
        }
        // Let the waiters subscribe and park.
        tokio::time::sleep(Duration::from_millis(500)).await;
        for (name, guard) in names.iter().zip(guards) {
            let released = Instant::now();
            guard.unlock().await.unwrap();
            let task = tasks.remove(0);
            let woke = tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .unwrap_or_else(|_| panic!("{mode:?} round {round}: {name} waiter not woken"))
                .unwrap();
            let delay = woke.saturating_duration_since(released);
            // By the message: far sooner than the 30 s lease, generously bounded.
            assert!(
                delay < Duration::from_secs(5),
                "{mode:?}: {name} woke {delay:?} after the release"
            );
        }
    }
    holder.shutdown().await.unwrap();
    waiter.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classic_pubsub_wakes_waiters_on_every_primary() {
    wakeups_are_prompt(PubSubMode::Classic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_pubsub_wakes_waiters_on_every_primary() {
    if !support::servers::supports(support::servers::Feature::ShardedPubSub, None) {
        return;
    }
    wakeups_are_prompt(PubSubMode::Sharded).await;
}

/// Unlock messages the node on `port` has sent (classic and sharded, scripts included).
fn messages_sent(port: u16) -> u64 {
    cli(port, &["INFO", "commandstats"])
        .lines()
        .filter(|l| l.starts_with("cmdstat_publish:") || l.starts_with("cmdstat_spublish:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// On every primary, a release passes the lock to a parked task of the same client with no
/// unlock message (the pass script counts the channel's subscribers on the key's node).
async fn passes_on_every_primary(mode: PubSubMode) {
    let cluster = RedisCluster::start(3, 0);
    let names = names_on_distinct_primaries(&cluster, 3);
    let client = client(&cluster, mode, Duration::from_secs(30)).await;
    for name in &names {
        let lock = client.lock(name);
        let held = lock.lock().await.unwrap();
        let next = {
            let lock = lock.clone();
            tokio::spawn(async move { lock.lock().await.unwrap() })
        };
        let parked = support::eventually(Duration::from_secs(10), || async {
            lock.passable_waiters() == 1
        });
        assert!(parked.await, "{mode:?}: {name}: the waiter parked");
        let node = cluster.primary_for_slot(slot(name));
        let sent = messages_sent(node);
        held.unlock().await.unwrap();
        let guard = tokio::time::timeout(Duration::from_secs(10), next)
            .await
            .unwrap_or_else(|_| panic!("{mode:?}: {name}: not passed on"))
            .unwrap();
        assert_eq!(
            messages_sent(node),
            sent,
            "{mode:?}: {name}: passed, no message"
        );
        assert_eq!(
            lock.with_owner(guard.owner()).hold_count().await.unwrap(),
            1
        );
        guard.unlock().await.unwrap();
        assert!(!lock.is_locked().await.unwrap());
    }
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classic_pubsub_passes_on_every_primary() {
    passes_on_every_primary(PubSubMode::Classic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_pubsub_passes_on_every_primary() {
    if !support::servers::supports(support::servers::Feature::ShardedPubSub, None) {
        return;
    }
    passes_on_every_primary(PubSubMode::Sharded).await;
}

/// Names whose key and channel Redis would put in different slots are refused on a cluster,
/// by every kind, before anything is sent; a lone server keeps taking them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unplaceable_names_are_refused_on_a_cluster() {
    if !support::servers::supports(support::servers::Feature::ShardedPubSub, None) {
        return;
    }
    let cluster = RedisCluster::start(3, 0);
    let client = client(&cluster, PubSubMode::Sharded, Duration::from_secs(30)).await;
    for name in ["a}b", "x{", "a{", "{}z"] {
        for kind in KINDS {
            match hold(&client, kind, name).await {
                Err(redbaton::Error::InvalidArgument(why)) => {
                    assert!(why.contains("slot"), "{kind:?} {name:?}: {why}")
                }
                Err(e) => panic!("{kind:?} {name:?}: {e}"),
                Ok(release) => {
                    let released = release.await;
                    panic!("{kind:?} {name:?} was taken (released: {released:?})");
                }
            }
        }
        // Nothing was written for it.
        for node in cluster.topology().into_iter().filter(|n| n.primary) {
            assert_eq!(cli(node.port, &["dbsize"]).trim(), "0", "{name:?}");
        }
    }
    client.shutdown().await.unwrap();
    let server = support::RedisServer::start();
    let lone = Client::connect(&server.url()).await.unwrap();
    for kind in KINDS {
        let release = hold(&lone, kind, "a}b").await.unwrap();
        release.await.unwrap();
    }
    lone.shutdown().await.unwrap();
}

/// The harness itself: a node whose first port was taken by the time it bound starts on the
/// next one. (A failed attempt once removed the directory every later attempt logged into, so
/// after one taken port all twenty attempts failed: CI saw "could not start redis-server".)
#[test]
fn a_node_whose_first_port_is_taken_starts_on_the_next() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_port = taken.local_addr().unwrap().port();
    let mut offered = vec![taken_port];
    let server = support::RedisServer::start_on(support::cluster::NODE_ARGS, || {
        offered.pop().unwrap_or_else(|| loop {
            let port = support::free_port();
            if port <= 55535 && std::net::TcpListener::bind(("127.0.0.1", port + 10000)).is_ok() {
                return port;
            }
        })
    });
    assert_ne!(server.port, taken_port);
    assert!(cli(server.port, &["info", "cluster"]).contains("cluster_enabled:1"));
}

/// The scripts added for issue 39 name keys of one slot on a cluster: a semaphore's total
/// set live (both kinds), a leased semaphore's permits listed, a lock waited on until free —
/// for names with and without a hash tag, on several primaries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_permits_and_wait_until_free_run_on_a_cluster() {
    let cluster = RedisCluster::start(3, 0);
    let client = client(&cluster, PubSubMode::Classic, RENEWED_LEASE).await;
    let mut names = names_on_distinct_primaries(&cluster, 3);
    names.push("{tagged}:slots".to_owned());
    for name in &names {
        let plain = client.semaphore(name);
        assert!(plain.try_set_permits(2).await.unwrap());
        let held = plain.acquire().await.unwrap();
        assert_eq!(plain.set_permits(4).await.unwrap(), 3, "{name}");
        held.release().await.unwrap();

        let leased = client.leased_semaphore(format!("{name}:leased"));
        assert!(leased.try_set_permits(1).await.unwrap());
        let permit = leased.acquire().await.unwrap();
        assert_eq!(leased.set_permits(3).await.unwrap(), 2, "{name}");
        assert_eq!(leased.permits_taken(10).await.unwrap().len(), 1);
        permit.release().await.unwrap();

        let lock = client.lock(format!("{name}:lock"));
        let guard = lock.lock().await.unwrap();
        let waiter = {
            let lock = lock.clone();
            tokio::spawn(async move { lock.wait_until_free_for(Duration::from_secs(20)).await })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        guard.unlock().await.unwrap();
        assert!(waiter.await.unwrap().unwrap(), "{name}: woken once free");
    }
    client.shutdown().await.unwrap();
}
