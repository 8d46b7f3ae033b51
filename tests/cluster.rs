//! Redis Cluster: a real 3-primary cluster (plus replicas for failover) started by the test.
//! Locks on names in different slots, watchdog renewals across slots, prompt wake-ups in
//! classic and sharded pub/sub, a primary failover while tasks contend, audits that no script
//! runs twice for one reply while a primary fails over, dies or has its connections reset
//! under load, the slot-map-sync race in fred 10.1 that does run one twice, and the baton pass
//! on every primary (classic and sharded pub/sub).

mod support;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redbaton::{Client, PubSubMode};
use support::cluster::{cli, ProxyMode, RedisCluster};
use support::RENEWED_LEASE;

async fn client(cluster: &RedisCluster, mode: PubSubMode, lease: Duration) -> Client {
    Client::builder()
        .url(cluster.url())
        .pubsub(mode)
        .watchdog_lease(lease)
        .command_timeout(Duration::from_secs(2))
        .reconnect_max_delay(Duration::from_millis(500))
        .connect()
        .await
        .unwrap()
}

fn slot(name: &str) -> u16 {
    fred::util::redis_keyslot(name.as_bytes())
}

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
    passes_on_every_primary(PubSubMode::Sharded).await;
}

/// What contending tasks saw around a failover.
#[derive(Debug)]
struct Contention {
    acquired_before: usize,
    acquired_after: usize,
    overlaps: usize,
    /// Failed calls during the switch-over.
    errors: usize,
    lost: usize,
    /// From the failover's start to the first acquisition after the new primary took over.
    recovery: Duration,
}

/// Six tasks on two clients take turns on one lock while its primary fails over, either
/// gracefully (`CLUSTER FAILOVER` on its replica) or by being killed.
async fn contend_through_failover(mode: PubSubMode, kill: bool) -> Contention {
    let mut cluster = RedisCluster::start(3, 1);
    let name = "failover:lock";
    let primary = cluster.primary_for_slot(slot(name));
    let replica = cluster.replica_of(primary);
    let clients = [
        client(&cluster, mode, Duration::from_secs(3)).await,
        client(&cluster, mode, Duration::from_secs(3)).await,
    ];
    // A client that sends nothing during the failover keeps its old slot map: its first
    // script afterwards meets MOVED.
    let idle = client(&cluster, mode, Duration::from_secs(3)).await;
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(AtomicUsize::new(0));
    let lost = Arc::new(AtomicUsize::new(0));
    let after = Arc::new(AtomicUsize::new(0));
    let before = Arc::new(AtomicUsize::new(0));
    let failed_over = Arc::new(AtomicBool::new(false));
    let first_after: Arc<parking_lot::Mutex<Option<Instant>>> = Default::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..6 {
        let lock = clients[i % 2].lock(name);
        let (inside, overlaps, errors, lost, after, before, failed_over, first_after, stop) = (
            inside.clone(),
            overlaps.clone(),
            errors.clone(),
            lost.clone(),
            after.clone(),
            before.clone(),
            failed_over.clone(),
            first_after.clone(),
            stop.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Acquire) {
                match lock.try_lock_for(Duration::from_secs(30)).await {
                    Ok(Some(guard)) => {
                        if inside.fetch_add(1, Ordering::AcqRel) != 0 {
                            overlaps.fetch_add(1, Ordering::AcqRel);
                        }
                        if failed_over.load(Ordering::Acquire) {
                            first_after.lock().get_or_insert_with(Instant::now);
                            after.fetch_add(1, Ordering::AcqRel);
                        } else {
                            before.fetch_add(1, Ordering::AcqRel);
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        inside.fetch_sub(1, Ordering::AcqRel);
                        if guard.is_lost() {
                            lost.fetch_add(1, Ordering::AcqRel);
                        }
                        if let Err(e) = guard.unlock().await {
                            // Lost with the old primary, or the release hit the switch-over.
                            eprintln!("unlock during the failover: {e}");
                            errors.fetch_add(1, Ordering::AcqRel);
                        }
                    }
                    Ok(None) => panic!("no turn within 30 s"),
                    Err(e) => {
                        // The primary went away under a request: retry, as a caller would.
                        eprintln!("lock during the failover: {e}");
                        errors.fetch_add(1, Ordering::AcqRel);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
                tokio::task::yield_now().await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let started = Instant::now();
    if kill {
        cluster.node_mut(primary).kill();
    } else {
        let reply = cli(replica, &["cluster", "failover"]);
        assert!(reply.contains("OK"), "CLUSTER FAILOVER: {reply}");
    }
    let promoted = Instant::now();
    while cluster.serving(slot(name)) != Some(replica) {
        assert!(
            promoted.elapsed() < Duration::from_secs(30),
            "replica not promoted"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    cluster.wait_healthy(3, if kill { 0 } else { 1 }, Duration::from_secs(30));
    failed_over.store(true, Ordering::Release);
    // The redirected script is re-sent to the new primary instead of failing the call.
    let first = idle.lock(name).try_lock().await;
    assert!(first.is_ok(), "first call after the move: {first:?}");
    drop(first);
    idle.shutdown().await.unwrap();
    let progressed = support::eventually(Duration::from_secs(60), || {
        let after = after.clone();
        async move { after.load(Ordering::Acquire) >= 30 }
    })
    .await;
    stop.store(true, Ordering::Release);
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(40), task)
            .await
            .expect("a contender hung after the failover")
            .unwrap();
    }
    assert!(progressed, "contenders made no progress after the failover");
    let recovery = first_after
        .lock()
        .expect("acquired after")
        .duration_since(started);
    for c in clients {
        let _ = c.shutdown().await;
    }
    let result = Contention {
        acquired_before: before.load(Ordering::Acquire),
        acquired_after: after.load(Ordering::Acquire),
        overlaps: overlaps.load(Ordering::Acquire),
        errors: errors.load(Ordering::Acquire),
        lost: lost.load(Ordering::Acquire),
        recovery,
    };
    eprintln!(
        "{mode:?} kill={kill}: {result:?} ({} failed calls)",
        result.errors
    );
    result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_failover_classic_keeps_exclusion_and_progress() {
    let c = contend_through_failover(PubSubMode::Classic, false).await;
    assert!(c.acquired_before > 0 && c.acquired_after >= 30);
    // A graceful failover waits for the replica to catch up: no hold is lost.
    assert_eq!(c.lost, 0, "{c:?}");
    assert_eq!(c.overlaps, 0, "two holders at once: {c:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_failover_sharded_keeps_exclusion_and_progress() {
    let c = contend_through_failover(PubSubMode::Sharded, false).await;
    assert!(c.acquired_before > 0 && c.acquired_after >= 30);
    assert_eq!(c.lost, 0, "{c:?}");
    assert_eq!(c.overlaps, 0, "two holders at once: {c:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_by_killed_primary_waiters_recover() {
    let c = contend_through_failover(PubSubMode::Sharded, true).await;
    assert!(c.acquired_before > 0 && c.acquired_after >= 30);
    // Every acquire was acknowledged by the replica before it counted (invariant 13), so the
    // promoted replica has every hold; and a 20 ms section cannot outlive a 3 s lease.
    assert_eq!(c.overlaps, 0, "two holders at once: {c:?}");
    // The new primary serves within a few node timeouts; waiters need no lease to notice.
    assert!(c.recovery < Duration::from_secs(20), "{c:?}");
}

/// A waiter parked (subscribed) before its lock's primary fails over is still woken promptly
/// by the release on the new primary: the hub follows the slot to its new owner.
async fn subscription_follows_failover(mode: PubSubMode, kill: bool) -> Duration {
    let mut cluster = RedisCluster::start(3, 1);
    let name = "moving:lock";
    let primary = cluster.primary_for_slot(slot(name));
    let replica = cluster.replica_of(primary);
    let holder = client(&cluster, mode, Duration::from_secs(30)).await;
    let waiter = client(&cluster, mode, Duration::from_secs(30)).await;
    let guard = holder.lock(name).lock().await.unwrap();
    // Redis replicates asynchronously; on loopback the hold reaches the replica in well under
    // the pause below, so this test is about wake-ups, not about losing the lock.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let lock = waiter.lock(name);
    let parked = tokio::spawn(async move {
        let guard = lock.lock().await.unwrap();
        let woke = Instant::now();
        guard.unlock().await.unwrap();
        woke
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    if kill {
        cluster.node_mut(primary).kill();
    } else {
        let reply = cli(replica, &["cluster", "failover"]);
        assert!(reply.contains("OK"), "CLUSTER FAILOVER: {reply}");
    }
    let promoted = Instant::now();
    while cluster.serving(slot(name)) != Some(replica) {
        assert!(promoted.elapsed() < Duration::from_secs(30), "not promoted");
        std::thread::sleep(Duration::from_millis(50));
    }
    cluster.wait_healthy(3, if kill { 0 } else { 1 }, Duration::from_secs(30));
    // Give the clients a moment to notice the new topology, as any caller would meet it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!guard.is_lost(), "the hold survived the failover");
    let released = Instant::now();
    let mut unlocked = guard.unlock().await;
    if unlocked.is_err() {
        // The first command after a kill may still meet the closed connection.
        unlocked = holder.lock(name).force_unlock().await.map(drop);
    }
    unlocked.unwrap();
    let woke = tokio::time::timeout(Duration::from_secs(60), parked)
        .await
        .expect("the waiter hung")
        .unwrap();
    let delay = woke.saturating_duration_since(released);
    eprintln!("{mode:?} kill={kill}: woken {delay:?} after the release");
    holder.shutdown().await.unwrap();
    waiter.shutdown().await.unwrap();
    delay
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_sharded_subscription_follows_graceful_failover() {
    let delay = subscription_follows_failover(PubSubMode::Sharded, false).await;
    assert!(
        delay < Duration::from_secs(5),
        "woken after {delay:?}, not by the message"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_sharded_subscription_follows_killed_primary() {
    let delay = subscription_follows_failover(PubSubMode::Sharded, true).await;
    assert!(
        delay < Duration::from_secs(5),
        "woken after {delay:?}, not by the message"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_classic_subscription_survives_graceful_failover() {
    let delay = subscription_follows_failover(PubSubMode::Classic, false).await;
    assert!(
        delay < Duration::from_secs(5),
        "woken after {delay:?}, not by the message"
    );
}

/// The first name `prefix:<i>` whose slot the primary behind `proxy_port` serves.
fn name_on(cluster: &RedisCluster, proxy_port: u16, prefix: &str) -> String {
    (0..)
        .map(|i| format!("{prefix}:{i}"))
        .find(|name| cluster.primary_for_slot(slot(name)) == proxy_port)
        .unwrap()
}

/// fred 10.1 re-reads the cluster map (`clustered::sync`) in its one router task after a
/// MOVED or a reconnection. That sync closes every connection whose socket already holds an
/// error and moves the commands still in flight on it into its retry buffer; re-written with
/// `max_command_attempts = 1`, they fail with "Too many failed write attempts." — the text
/// of a redirected command, which never ran. But these did run.
///
/// Here, deterministically: the lock script runs on primary B and its reply is lost; a MOVED
/// elsewhere starts a sync, which waits for the slot map; meanwhile B's connection is reset
/// (RST). When the map arrives, the sync finds B's connection broken, and the lock script
/// comes back as "Too many failed write attempts." although it ran. Treating that text as
/// "did not run" re-sends it: the owner's count in Redis is 2 for the one guard it got, and
/// after that guard's release the lock stays held by nobody.
///
/// Asserted here is the invariant: Redis counts exactly the holds the client accounts for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_in_flight_when_a_cluster_resync_finds_its_connection_reset_runs_once() {
    let cluster = RedisCluster::start(3, 0);
    let proxies = cluster.announce_proxies().await;
    let proxy = |port: u16| proxies.iter().find(|p| p.port == port).unwrap();
    let name = "resync:lock";
    // B serves the lock; A is the only seed node in the URL, so fred's slot-map requests
    // (CLUSTER SLOTS) go to A; C answers the MOVED that starts the sync.
    let b = proxy(cluster.primary_for_slot(slot(name)));
    let a = proxies.iter().find(|p| p.port != b.port).unwrap();
    let c = proxies
        .iter()
        .find(|p| p.port != b.port && p.port != a.port)
        .unwrap();
    let key_on_a = name_on(&cluster, a.port, "resync:other");
    let slot_on_c = slot(&name_on(&cluster, c.port, "resync:third"));

    let client = Client::builder()
        .url(format!("redis-cluster://127.0.0.1:{}", a.port))
        .command_timeout(Duration::from_secs(10))
        .connect_timeout(Duration::from_secs(5))
        .reconnect_max_delay(Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    let lock = client.lock(name);
    let key = lock.key().to_owned();
    // Every connection is up and the scripts are loaded.
    lock.try_lock()
        .await
        .unwrap()
        .unwrap()
        .unlock()
        .await
        .unwrap();

    // 1. The lock script runs on B; its reply is lost.
    b.set(ProxyMode::DropReplies);
    let locking = tokio::spawn(async move {
        let result = lock.try_lock().await;
        let owner = result
            .as_ref()
            .ok()
            .and_then(|g| g.as_ref())
            .map(|g| g.owner().to_string());
        (result, owner)
    });
    let ran = support::eventually(Duration::from_secs(10), || {
        let key = key.clone();
        let node = b.node_port;
        async move { cli(node, &["hlen", &key]).trim() == "1" }
    })
    .await;
    assert!(ran, "the lock script ran on B");

    // 2. A MOVED from C starts a slot-map sync, which waits for A: fred opens a new
    //    connection for it, and A's proxy holds its request. (Any MOVED this client meets
    //    does the same: a lock on a resharded slot, a failover of another primary.)
    a.set(ProxyMode::HoldRequests);
    let seen = a.connections();
    let redis = client.redis().clone();
    let moved = tokio::spawn(async move {
        let get = fred::types::CustomCommand::new_static(
            "GET",
            fred::types::ClusterHash::Custom(slot_on_c),
            false,
        );
        let reply: Result<fred::types::Value, fred::error::Error> =
            fred::interfaces::ClientLike::custom(&redis, get, vec![key_on_a]).await;
        reply
    });
    let syncing =
        support::eventually(Duration::from_secs(10), || async { a.connections() > seen }).await;
    assert!(syncing, "fred asks A for the slot map");

    // 3. B's connection is reset while the sync waits; then the slot map arrives.
    b.set(ProxyMode::Open);
    b.reset().await;
    assert!(
        !moved.is_finished(),
        "the sync still waits for the slot map"
    );
    a.set(ProxyMode::Open);

    let moved = tokio::time::timeout(Duration::from_secs(20), moved)
        .await
        .expect("the redirected GET ends")
        .unwrap();
    // Redirected: it did not run, whatever fred calls it (`tests/errors.rs` pins the texts).
    assert!(moved.is_err(), "{moved:?}");
    let (result, owner) = tokio::time::timeout(Duration::from_secs(20), locking)
        .await
        .expect("the lock call ends")
        .unwrap();
    let fields = cli(b.node_port, &["hgetall", &key]);
    eprintln!("lock call: {result:?}; hash on B: {fields:?}");
    match result {
        Ok(Some(guard)) => {
            let owner = owner.unwrap();
            let count = cli(b.node_port, &["hget", &key, &owner]);
            assert_eq!(
                count.trim(),
                "1",
                "one guard, so Redis must count one hold of {owner}, not {count:?}"
            );
            guard.unlock().await.unwrap();
            assert_eq!(cli(b.node_port, &["exists", &key]).trim(), "0");
        }
        Ok(None) => panic!("nobody else holds the lock"),
        Err(e) => {
            // An error is fine, a hold nobody accounts for is not.
            assert_eq!(
                cli(b.node_port, &["exists", &key]).trim(),
                "0",
                "the call failed ({e}), yet its hold stayed: {fields:?}"
            );
        }
    }
    client.shutdown().await.unwrap();
}

/// How the primary under load fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Failure {
    /// `CLUSTER FAILOVER` on its replica: the old primary pauses writes, hands over, and
    /// answers the paused commands with MOVED.
    Graceful,
    /// SIGKILL; its replica takes over after the node timeout.
    Killed,
    /// Every client connection to it is reset (RST) a few times; no failover.
    Reset,
}

/// What [`audit_scripts_through`] saw.
#[derive(Debug, Default)]
struct Audit {
    /// Acquisitions (fresh holds) that came back `Ok`.
    acquired: usize,
    /// Counts checked against what the owner's guards account for.
    checked: usize,
    /// Of those, checked once the failure began.
    checked_after: usize,
    /// Counts Redis never answered for (not checked).
    unanswered: usize,
    /// Redis counted more holds than an owner with only `Ok` replies had guards: a lock
    /// script ran more often than its caller heard.
    phantoms: Vec<String>,
    /// Redis counted fewer holds than such an owner had guards.
    undercounts: Vec<String>,
    /// Owners whose call failed and whose field stayed behind (the call may have run).
    ambiguous_leftovers: usize,
    /// Failed calls, by error text.
    errors: std::collections::BTreeMap<String, usize>,
}

/// The owner's reentry count, read again until Redis answers (bounded).
async fn count_of(lock: &redbaton::Lock) -> Option<u32> {
    for _ in 0..100 {
        if let Ok(n) = lock.hold_count().await {
            return Some(n);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// Tasks on two clients lock, re-enter, and release names served by one primary, each round
/// as a fresh explicit owner, while that primary fails. After each step the owner's count in
/// Redis is compared with the guards the owner holds. A script that ran twice for one reply
/// shows up as a count above the guards (or, for an unlock, below them).
///
/// Every acquire is a single `try_lock` (no wait loop), so a second run can only come from
/// the script runner's re-sends or from fred's own.
async fn audit_scripts_through(failure: Failure) -> Audit {
    let replicas = if failure == Failure::Reset { 0 } else { 1 };
    let mut cluster = RedisCluster::start(3, replicas);
    let proxies = if failure == Failure::Reset {
        cluster.announce_proxies().await
    } else {
        Vec::new()
    };
    let victim = cluster.primary_for_slot(slot("audit:seed"));
    let names: Vec<String> = (0..)
        .map(|i| format!("audit:{i}"))
        .filter(|n| cluster.primary_for_slot(slot(n)) == victim)
        .take(4)
        .collect();
    let mut clients = Vec::new();
    for _ in 0..2 {
        let client = Client::builder()
            .url(cluster.url())
            .watchdog_lease(Duration::from_secs(5))
            .command_timeout(Duration::from_secs(2))
            .reconnect_max_delay(Duration::from_millis(300))
            .connect()
            .await
            .unwrap();
        clients.push(client);
    }
    let audit = Arc::new(parking_lot::Mutex::new(Audit::default()));
    let next_owner = Arc::new(AtomicUsize::new(1 << 40));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for t in 0..8 {
        let client = clients[t % 2].clone();
        let name = names[t % names.len()].clone();
        let (audit, next_owner, stop) = (audit.clone(), next_owner.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Acquire) {
                let n = next_owner.fetch_add(1, Ordering::AcqRel);
                let owner: redbaton::Owner = format!("{}:{n}", client.id()).parse().unwrap();
                let lock = client.lock(&name).with_owner(owner.clone());
                let failed = |e: redbaton::Error| {
                    *audit.lock().errors.entry(e.to_string()).or_default() += 1;
                };
                let check = |expected: u32, stage: &'static str| {
                    let (lock, audit, owner) = (lock.clone(), audit.clone(), owner.clone());
                    async move {
                        let Some(count) = count_of(&lock).await else {
                            audit.lock().unanswered += 1;
                            return;
                        };
                        let mut audit = audit.lock();
                        audit.checked += 1;
                        let what =
                            format!("{owner} {stage}: Redis counts {count}, guards {expected}");
                        if count > expected {
                            audit.phantoms.push(what);
                        } else if count < expected {
                            audit.undercounts.push(what);
                        }
                    }
                };
                let outer = loop {
                    if stop.load(Ordering::Acquire) {
                        break None;
                    }
                    match lock.try_lock().await {
                        Ok(Some(guard)) => break Some(guard),
                        Ok(None) => tokio::time::sleep(Duration::from_millis(5)).await,
                        Err(e) => {
                            failed(e);
                            if count_of(&lock).await.unwrap_or(0) > 0 {
                                audit.lock().ambiguous_leftovers += 1;
                            }
                            break None;
                        }
                    }
                };
                let Some(outer) = outer else { continue };
                audit.lock().acquired += 1;
                check(1, "after the acquire").await;
                match lock.try_lock().await {
                    Ok(Some(inner)) => {
                        check(2, "after the re-entry").await;
                        match inner.unlock().await {
                            Ok(()) => check(1, "after the inner release").await,
                            Err(e) => {
                                failed(e);
                                drop(outer);
                                continue;
                            }
                        }
                    }
                    // The hold was lost with the old primary: nothing to re-enter.
                    Ok(None) => {}
                    Err(e) => {
                        failed(e);
                        drop(outer);
                        continue;
                    }
                }
                match outer.unlock().await {
                    Ok(()) => check(0, "after the release").await,
                    Err(e) => failed(e),
                }
            }
        }));
    }
    let acquired = || audit.lock().acquired;
    let warmed = support::eventually(Duration::from_secs(20), || async { acquired() >= 50 }).await;
    assert!(warmed, "no progress before the failure");
    let before = acquired();
    let checked_before = audit.lock().checked;
    match failure {
        Failure::Graceful => {
            let replica = cluster.replica_of(victim);
            let reply = cli(replica, &["cluster", "failover"]);
            assert!(reply.contains("OK"), "CLUSTER FAILOVER: {reply}");
        }
        Failure::Killed => cluster.node_mut(victim).kill(),
        Failure::Reset => {
            let proxy = proxies.iter().find(|p| p.port == victim).unwrap();
            for _ in 0..5 {
                let from = acquired();
                proxy.reset().await;
                let resumed = support::eventually(Duration::from_secs(10), || async {
                    acquired() >= from + 20
                })
                .await;
                assert!(resumed, "no progress after a reset");
            }
        }
    }
    if failure != Failure::Reset {
        let replica_slot = slot(&names[0]);
        let moved = support::eventually(Duration::from_secs(30), || async {
            cluster.serving(replica_slot).is_some_and(|p| p != victim)
        })
        .await;
        assert!(moved, "no new primary");
        let survivors = if failure == Failure::Killed { 0 } else { 1 };
        cluster.wait_healthy(3, survivors, Duration::from_secs(30));
    }
    let from = acquired();
    let progressed = support::eventually(Duration::from_secs(30), || async {
        acquired() >= from + 50
    })
    .await;
    stop.store(true, Ordering::Release);
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("a task hung")
            .unwrap();
    }
    assert!(progressed, "no progress after the failure");
    for client in clients {
        let _ = client.shutdown().await;
    }
    let mut audit = Arc::try_unwrap(audit).unwrap().into_inner();
    audit.checked_after = audit.checked - checked_before;
    eprintln!(
        "{failure:?}: {} acquired ({before} before the failure), {} counts checked ({} after \
         it, {} unanswered), {} phantom, {} undercounts, {} ambiguous leftovers; errors: {:#?}",
        audit.acquired,
        audit.checked,
        audit.checked_after,
        audit.unanswered,
        audit.phantoms.len(),
        audit.undercounts.len(),
        audit.ambiguous_leftovers,
        audit.errors
    );
    // An audit that checked nothing, or nothing once the failure began, proves nothing.
    assert!(
        audit.checked_after > 0,
        "{failure:?}: no count checked after the failure began: {audit:?}"
    );
    assert!(
        audit.unanswered < audit.checked,
        "{failure:?}: most counts went unanswered: {audit:?}"
    );
    audit
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_failover_under_load_runs_each_script_once() {
    let audit = audit_scripts_through(Failure::Graceful).await;
    assert!(audit.phantoms.is_empty(), "{:#?}", audit.phantoms);
    // The replica caught up before taking over: no hold is lost either.
    assert!(audit.undercounts.is_empty(), "{:#?}", audit.undercounts);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_primary_under_load_runs_each_script_once() {
    let audit = audit_scripts_through(Failure::Killed).await;
    // Writes the dead primary had not replicated are gone (undercounts); none is doubled.
    assert!(audit.phantoms.is_empty(), "{:#?}", audit.phantoms);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_connections_under_load_run_each_script_once() {
    let audit = audit_scripts_through(Failure::Reset).await;
    assert!(audit.phantoms.is_empty(), "{:#?}", audit.phantoms);
    assert!(audit.undercounts.is_empty(), "{:#?}", audit.undercounts);
}

/// The kinds a slot migration is tried on.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Lock,
    /// A read hold, waited for by a writer (readers share).
    Read,
    Write,
    Fair,
    Fenced,
    Semaphore,
    LeasedSemaphore,
}

const KINDS: [Kind; 7] = [
    Kind::Lock,
    Kind::Read,
    Kind::Write,
    Kind::Fair,
    Kind::Fenced,
    Kind::Semaphore,
    Kind::LeasedSemaphore,
];

impl Kind {
    /// The kind a waiter of a hold of this kind asks for: what the hold excludes.
    fn waiter(self) -> Kind {
        match self {
            Kind::Read => Kind::Write,
            kind => kind,
        }
    }
}

type Release = std::pin::Pin<Box<dyn std::future::Future<Output = redbaton::Result<()>> + Send>>;

/// Takes `name` as `kind` (waiting for it), and how to give it back.
async fn hold(client: &Client, kind: Kind, name: &str) -> redbaton::Result<Release> {
    fn boxed<F>(f: F) -> Release
    where
        F: std::future::Future<Output = redbaton::Result<()>> + Send + 'static,
    {
        Box::pin(f)
    }
    Ok(match kind {
        Kind::Lock => {
            let g = client.lock(name).lock().await?;
            boxed(async move { g.unlock().await })
        }
        Kind::Read => {
            let g = client.read_write_lock(name).read().lock().await?;
            boxed(async move { g.unlock().await })
        }
        Kind::Write => {
            let g = client.read_write_lock(name).write().lock().await?;
            boxed(async move { g.unlock().await })
        }
        Kind::Fair => {
            let g = client.fair_lock(name).lock().await?;
            boxed(async move { g.unlock().await })
        }
        Kind::Fenced => {
            let g = client.fenced_lock(name).lock().await?;
            boxed(async move { g.unlock().await })
        }
        Kind::Semaphore => {
            let semaphore = client.semaphore(name);
            semaphore.try_set_permits(1).await?;
            let permit = semaphore.acquire(1).await?;
            boxed(async move { permit.release().await })
        }
        Kind::LeasedSemaphore => {
            let semaphore = client.leased_semaphore(name);
            semaphore.try_set_permits(1).await?;
            let permit = semaphore.acquire().await?;
            boxed(async move { permit.release().await })
        }
    })
}

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

/// Names whose key and channel Redis would put in different slots are refused on a cluster,
/// by every kind, before anything is sent; a lone server keeps taking them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unplaceable_names_are_refused_on_a_cluster() {
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
