//! Redlock over five independent redis-servers, and MultiLock over several clients: quorum
//! with nodes down, failure without a majority, the validity time, release on failure,
//! reentry, a node restarted empty during a hold, all-or-nothing and no deadlock.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::interfaces::KeysInterface;
use redbaton::{Client, Error, MultiLock, RedLock};
use support::RedisServer;

const NAME: &str = "redlock:resource";

async fn clients(servers: &[RedisServer], lease: Duration) -> Vec<Client> {
    let mut out = Vec::new();
    for s in servers {
        out.push(
            Client::builder()
                .url(s.url())
                .watchdog_lease(lease)
                .command_timeout(Duration::from_secs(2))
                .reconnect_max_delay(Duration::from_millis(200))
                .connect()
                .await
                .unwrap(),
        );
    }
    out
}

fn redlock(clients: &[Client]) -> RedLock {
    RedLock::new(clients.iter().map(|c| c.lock(NAME)).collect())
        .node_timeout(Duration::from_millis(500))
        .retry_delay(Duration::from_millis(100))
}

fn five() -> Vec<RedisServer> {
    (0..5).map(|_| RedisServer::start()).collect()
}

async fn keys_present(servers: &[RedisServer]) -> usize {
    let mut n = 0;
    for s in servers {
        let raw = s.raw().await;
        let exists: i64 = raw.exists(NAME).await.unwrap();
        n += exists as usize;
        let _ = fred::interfaces::ClientLike::quit(&raw).await;
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn majority_with_two_nodes_down() {
    let mut servers = five();
    let a = clients(&servers, Duration::from_secs(30)).await;
    let b = clients(&servers, Duration::from_secs(30)).await;
    servers[3].kill();
    servers[4].kill();
    let started = Instant::now();
    let guard = redlock(&a)
        .try_lock()
        .await
        .unwrap()
        .expect("3 of 5 is a majority");
    let took = started.elapsed();
    assert_eq!(guard.guards().len(), 3);
    assert!(!guard.is_lost());
    // Parallel tries: the dead nodes cost about one node timeout, not one each.
    assert!(took < Duration::from_millis(1500), "attempt took {took:?}");
    // Another client set cannot get a majority now.
    assert!(redlock(&b).try_lock().await.unwrap().is_none());
    // The watchdog keeps the three holds.
    let live = &servers[..3];
    assert_eq!(keys_present(live).await, 3);
    guard.unlock().await.unwrap();
    assert_eq!(keys_present(live).await, 0, "released everywhere");
    let again = redlock(&b).try_lock().await.unwrap().expect("free again");
    again.unlock().await.unwrap();
    for c in a.iter().chain(&b) {
        let _ = c.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_majority_with_three_nodes_down_or_busy() {
    let mut servers = five();
    let a = clients(&servers, Duration::from_secs(30)).await;
    let b = clients(&servers, Duration::from_secs(30)).await;

    // Three nodes busy (held by another owner): None, and nothing is left behind.
    let mut others = Vec::new();
    for c in &b[..3] {
        others.push(c.lock(NAME).lock().await.unwrap());
    }
    assert!(redlock(&a).try_lock().await.unwrap().is_none());
    let started = Instant::now();
    assert!(redlock(&a)
        .try_lock_for(Duration::from_millis(600))
        .await
        .unwrap()
        .is_none());
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(600) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    for c in &a[3..] {
        assert!(
            !c.lock(NAME).is_locked().await.unwrap(),
            "released on failure"
        );
    }
    // Released by the other owner during the wait: acquired.
    let waiter = {
        let rl = redlock(&a);
        tokio::spawn(async move { rl.try_lock_for(Duration::from_secs(10)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    for g in others {
        g.unlock().await.unwrap();
    }
    let got = waiter
        .await
        .unwrap()
        .unwrap()
        .expect("acquired after the release");
    got.unlock().await.unwrap();

    // Three nodes down: an error, not a wait.
    servers[2].kill();
    servers[3].kill();
    servers[4].kill();
    let err = redlock(&a).try_lock().await.unwrap_err();
    assert!(
        matches!(err, Error::Connection(_) | Error::Timeout(_)),
        "{err:?}"
    );
    let err = redlock(&a)
        .try_lock_for(Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Connection(_) | Error::Timeout(_)),
        "{err:?}"
    );
    assert_eq!(
        keys_present(&servers[..2]).await,
        0,
        "the two grants were released"
    );
    for c in a.iter().chain(&b) {
        let _ = c.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validity_time_is_honoured() {
    let servers = five();
    let a = clients(&servers, Duration::from_secs(30)).await;

    // A fixed lease: the guard is valid for lease - elapsed - drift, then lost.
    let lease = Duration::from_millis(1500);
    let started = Instant::now();
    let guard = redlock(&a)
        .try_lock_with_lease(Duration::ZERO, lease)
        .await
        .unwrap()
        .expect("all nodes free");
    assert_eq!(guard.guards().len(), 5);
    assert!(!guard.is_lost());
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("lost at the end of the validity time");
    let lost_after = started.elapsed();
    let drift = lease / 100 + Duration::from_millis(2);
    assert!(
        lost_after >= lease - drift - Duration::from_millis(5),
        "{lost_after:?}"
    );
    assert!(
        lost_after <= lease + Duration::from_millis(300),
        "{lost_after:?}"
    );
    assert!(matches!(guard.unlock().await, Err(Error::NotHeld { .. })));

    // A majority that arrives after the lease is worth nothing: three nodes answer only after
    // 600 ms (CLIENT PAUSE), the lease is 400 ms, so the grants are released and nothing is held.
    for s in &servers[..3] {
        let reply = support::cluster::cli(s.port, &["client", "pause", "600", "all"]);
        assert!(reply.contains("OK"), "CLIENT PAUSE: {reply}");
    }
    let slow =
        RedLock::new(a.iter().map(|c| c.lock(NAME)).collect()).node_timeout(Duration::from_secs(2));
    let got = slow
        .try_lock_with_lease(Duration::ZERO, Duration::from_millis(400))
        .await
        .unwrap();
    assert!(
        got.is_none(),
        "a majority after the validity time is refused"
    );
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(keys_present(&servers).await, 0, "released on every node");
    for c in &a {
        let _ = c.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_is_reentrant_and_excludes_other_tasks() {
    let servers = five();
    let a = clients(&servers, Duration::from_secs(30)).await;
    let rl = redlock(&a);
    let outer = rl.lock().await.unwrap();
    let inner = rl.try_lock().await.unwrap().expect("same task re-enters");
    for c in &a {
        assert_eq!(c.lock(NAME).hold_count().await.unwrap(), 2);
    }
    let other = {
        let rl = rl.clone();
        tokio::spawn(async move { rl.try_lock().await.unwrap().is_none() })
    };
    assert!(other.await.unwrap(), "another task is excluded");
    inner.unlock().await.unwrap();
    assert_eq!(keys_present(&servers).await, 5);
    outer.unlock().await.unwrap();
    assert_eq!(keys_present(&servers).await, 0);

    // Contending tasks: never two inside at once.
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (rl, inside, overlaps) = (rl.clone(), inside.clone(), overlaps.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..5 {
                let g = rl
                    .try_lock_for(Duration::from_secs(30))
                    .await
                    .unwrap()
                    .unwrap();
                if inside.fetch_add(1, Ordering::AcqRel) != 0 {
                    overlaps.fetch_add(1, Ordering::AcqRel);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
                inside.fetch_sub(1, Ordering::AcqRel);
                g.unlock().await.unwrap();
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("no hang")
            .unwrap();
    }
    assert_eq!(overlaps.load(Ordering::Acquire), 0);
    // Bad input is a typed error.
    assert!(matches!(
        RedLock::new(Vec::new()).try_lock().await,
        Err(Error::InvalidArgument(_))
    ));
    let twice = RedLock::new(vec![a[0].lock(NAME), a[0].lock(NAME)]);
    assert!(matches!(
        twice.try_lock().await,
        Err(Error::InvalidArgument(_))
    ));
    for c in &a {
        let _ = c.shutdown().await;
    }
}

/// The articles' story: A holds the Redlock on nodes 0-2 (3 and 4 are down); node 2 crashes
/// and restarts empty, 3 and 4 come back; B now wins 2, 3, 4 — a majority — while A still
/// holds 0 and 1. A's watchdog renewal finds its hold gone on node 2 and A's guard reports
/// lost within one renewal period: the overlap is bounded by that period, not closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_restarted_empty_during_a_hold() {
    let mut servers = five();
    let lease = Duration::from_millis(1500); // renewed every 500 ms
    let a = clients(&servers, lease).await;
    let b = clients(&servers, lease).await;
    servers[3].kill();
    servers[4].kill();
    let held = redlock(&a).try_lock().await.unwrap().expect("3 of 5");
    assert_eq!(held.guards().len(), 3);

    // Node 2 crashes and restarts empty: A still believes it holds the Redlock until its next
    // renewal finds the hold gone there (2 of the needed 3 left).
    servers[2].restart();
    let restarted = Instant::now();
    // Nodes 3 and 4 come back empty: B wins 2, 3, 4 — a majority beside A's 0 and 1.
    servers[3].restart();
    servers[4].restart();
    let b_guard = tokio::time::timeout(
        Duration::from_secs(10),
        redlock(&b).try_lock_for(Duration::from_secs(5)),
    )
    .await
    .unwrap()
    .unwrap()
    .expect("B wins a majority with the restarted nodes");
    tokio::time::timeout(Duration::from_secs(5), held.lost())
        .await
        .expect("A's guard reports lost");
    let told = restarted.elapsed();
    eprintln!("A was told {told:?} after node 2 restarted empty");
    // About one renewal period (lease / 3 = 500 ms); generously bounded by one lease.
    assert!(told <= lease, "{told:?}");
    assert!(!b_guard.is_lost());
    assert!(matches!(held.unlock().await, Err(Error::NotHeld { .. })));
    b_guard.unlock().await.unwrap();
    for c in a.iter().chain(&b) {
        let _ = c.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multilock_is_all_or_nothing_across_clients() {
    let s1 = RedisServer::start();
    let s2 = RedisServer::start();
    // A short watchdog lease (renewed every 500 ms) so a lost part is noticed quickly.
    let short = |url: String| {
        Client::builder()
            .url(url)
            .watchdog_lease(Duration::from_millis(1500))
            .connect()
    };
    let c1 = short(s1.url()).await.unwrap();
    let c2 = short(s2.url()).await.unwrap();
    let other = Client::connect(&s2.url()).await.unwrap();
    let other1 = Client::connect(&s1.url()).await.unwrap();
    let multi = MultiLock::new(vec![c1.lock("acct:1"), c2.lock("acct:2")]);

    let blocker = other.lock("acct:2").lock().await.unwrap();
    assert!(multi.try_lock().await.unwrap().is_none());
    assert!(
        !c1.lock("acct:1").is_locked().await.unwrap(),
        "nothing kept"
    );
    assert!(multi
        .try_lock_for(Duration::from_millis(300))
        .await
        .unwrap()
        .is_none());
    assert!(
        !c1.lock("acct:1").is_locked().await.unwrap(),
        "nothing kept"
    );

    // Woken by the busy part's release, well before its 30 s lease.
    let waiting = {
        let multi = multi.clone();
        tokio::spawn(async move {
            let g = multi.lock().await.unwrap();
            (Instant::now(), g)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    blocker.unlock().await.unwrap();
    let (got_at, guard) = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("woken")
        .unwrap();
    assert!(got_at - released < Duration::from_secs(3));
    assert!(c1.lock("acct:1").is_locked().await.unwrap());
    assert!(c2.lock("acct:2").is_locked().await.unwrap());
    assert!(other1.lock("acct:1").try_lock().await.unwrap().is_none());
    assert!(other.lock("acct:2").try_lock().await.unwrap().is_none());

    // One part lost (force-unlocked) = the multi-lock is lost.
    assert!(!guard.is_lost());
    assert!(other1.lock("acct:1").force_unlock().await.unwrap());
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("lost reported at the next renewal");
    assert!(matches!(guard.unlock().await, Err(Error::NotHeld { .. })));
    assert!(
        !c2.lock("acct:2").is_locked().await.unwrap(),
        "the rest released"
    );

    // Reentry: the same task takes it twice, each part counts 2.
    let g1 = multi.lock().await.unwrap();
    let g2 = multi.try_lock().await.unwrap().expect("re-enters");
    assert_eq!(c1.lock("acct:1").hold_count().await.unwrap(), 2);
    assert_eq!(c2.lock("acct:2").hold_count().await.unwrap(), 2);
    g2.unlock().await.unwrap();
    g1.unlock().await.unwrap();
    assert!(!c1.lock("acct:1").is_locked().await.unwrap());
    assert!(matches!(
        MultiLock::new(Vec::new()).try_lock().await,
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        multi
            .try_lock_with_lease(Duration::ZERO, Duration::ZERO)
            .await,
        Err(Error::InvalidArgument(_))
    ));

    // A fixed lease: every part expires, the guard reports lost, others get in.
    let leased = multi
        .lock_with_lease(Duration::from_millis(400))
        .await
        .unwrap();
    let ttl = c2.lock("acct:2").remaining_ttl().await.unwrap().unwrap();
    assert!(ttl <= Duration::from_millis(400));
    tokio::time::timeout(Duration::from_secs(3), leased.lost())
        .await
        .expect("lost when the lease ends");
    assert!(other1.lock("acct:1").try_lock().await.unwrap().is_some());
    assert!(other.lock("acct:2").try_lock().await.unwrap().is_some());
    drop(leased);
    for c in [c1, c2, other, other1] {
        c.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multilocks_in_opposite_orders_do_not_deadlock() {
    let s1 = RedisServer::start();
    let s2 = RedisServer::start();
    let c1 = Client::connect(&s1.url()).await.unwrap();
    let c2 = Client::connect(&s2.url()).await.unwrap();
    let forward = MultiLock::new(vec![c1.lock("x"), c2.lock("y")]);
    let backward = MultiLock::new(vec![c2.lock("y"), c1.lock("x")]);
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..4 {
        let multi = if i % 2 == 0 {
            forward.clone()
        } else {
            backward.clone()
        };
        let (inside, overlaps) = (inside.clone(), overlaps.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                let g = multi.lock().await.unwrap();
                if inside.fetch_add(1, Ordering::AcqRel) != 0 {
                    overlaps.fetch_add(1, Ordering::AcqRel);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                inside.fetch_sub(1, Ordering::AcqRel);
                g.unlock().await.unwrap();
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("deadlocked")
            .unwrap();
    }
    assert_eq!(overlaps.load(Ordering::Acquire), 0);
    c1.shutdown().await.unwrap();
    c2.shutdown().await.unwrap();
}
