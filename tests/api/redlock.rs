//! Redlock over five independent redis-servers, and MultiLock over several clients: quorum
//! with nodes down, failure without a majority, the validity time, release on failure,
//! reentry, a node restarted empty during a hold, all-or-nothing and no deadlock.

use testkit as support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::interfaces::KeysInterface;
use redbaton::{Client, Error, Lock, MultiLock, RedLock};
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
    // Not much later either (a loaded machine may run the timer late).
    assert!(
        lost_after <= lease + Duration::from_secs(1),
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
    assert!(
        support::eventually(Duration::from_secs(5), || async {
            keys_present(&servers).await == 0
        })
        .await,
        "released on every node"
    );
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
    let inner = outer.reenter().await.unwrap();
    for c in &a {
        let part = outer.guards().iter().map(|g| g.owner());
        let owner = part.clone().find(|o| o.client_id() == c.id()).unwrap();
        let owned = c.lock(NAME).with_owner(owner);
        assert_eq!(owned.hold_count().await.unwrap(), 2);
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
    let lease = support::RENEWED_LEASE;
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
    // When A's guard reports the loss, noted as it happens (B's acquisition below takes its
    // own time on a loaded machine and must not count).
    let held = Arc::new(held);
    let told = {
        let held = held.clone();
        tokio::spawn(async move {
            held.lost().await;
            restarted.elapsed()
        })
    };
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
    let told = tokio::time::timeout(Duration::from_secs(10), told)
        .await
        .expect("A's guard reports lost")
        .unwrap();
    eprintln!("A was told {told:?} after node 2 restarted empty");
    // About one renewal period (lease / 3); generously bounded by two leases (a
    // guard never told would never resolve).
    assert!(told <= lease * 2, "{told:?}");
    assert!(!b_guard.is_lost());
    let held = Arc::into_inner(held).expect("the watcher task is done");
    assert!(matches!(held.unlock().await, Err(Error::NotHeld { .. })));
    b_guard.unlock().await.unwrap();
    for c in a.iter().chain(&b) {
        let _ = c.shutdown().await;
    }
}

/// Whether `lock` can be taken within a generous bound (taken and released again).
async fn gets_in(lock: &Lock) -> bool {
    support::eventually(Duration::from_secs(5), || async {
        match lock.try_lock().await.unwrap() {
            Some(guard) => {
                guard.unlock().await.unwrap();
                true
            }
            None => false,
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multilock_is_all_or_nothing_across_clients() {
    let s1 = RedisServer::start();
    let s2 = RedisServer::start();
    // A short watchdog lease so a lost part is noticed quickly, long enough that a renewal a
    // loaded machine delays does not lose a part.
    let short = |url: String| {
        Client::builder()
            .url(url)
            .watchdog_lease(support::RENEWED_LEASE)
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
    assert!(
        got_at - released < Duration::from_secs(5),
        "woken {:?} after the release: by the message, not the 30 s lease",
        got_at - released
    );
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

    // Reentry: the holder takes it again, each part counts 2.
    let g1 = multi.lock().await.unwrap();
    let g2 = g1.reenter().await.unwrap();
    let part = |c: &Client| {
        let mut owners = g1.guards().iter().map(|g| g.owner());
        owners.find(|o| o.client_id() == c.id()).unwrap()
    };
    let (p1, p2) = (part(&c1), part(&c2));
    assert_eq!(
        c1.lock("acct:1").with_owner(p1).hold_count().await.unwrap(),
        2
    );
    assert_eq!(
        c2.lock("acct:2").with_owner(p2).hold_count().await.unwrap(),
        2
    );
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
    // The guard's clock ends the lease when the request was *sent* plus the lease; Redis
    // expires the keys a little later (from when it *ran* the script). So others get in
    // shortly after lost(), not necessarily at once.
    assert!(
        gets_in(&other1.lock("acct:1")).await,
        "acct:1 free after the lease"
    );
    assert!(
        gets_in(&other.lock("acct:2")).await,
        "acct:2 free after the lease"
    );
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

/// A multi-lock that names one lock twice is refused before anything is sent. Taken as two
/// owners (two clients of one server), each part shut the other out and `lock()` spun for
/// ever, thousands of EVALSHA a second; through one client the second part re-entered the
/// first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multilock_refuses_the_same_lock_twice() {
    let s1 = RedisServer::start();
    let s2 = RedisServer::start();
    let a = Client::connect(&s1.url()).await.unwrap();
    let b = Client::connect(&s1.url()).await.unwrap();
    // The same server, its default database spelled out.
    let b0 = Client::connect(&format!("{}/0", s1.url())).await.unwrap();
    // A key prefix: `p:` + `x` is the key `p:x`.
    let prefixed = Client::builder()
        .url(s1.url())
        .key_prefix("p:")
        .connect()
        .await
        .unwrap();
    let elsewhere = Client::connect(&s2.url()).await.unwrap();
    let evalsha =
        |calls: std::collections::HashMap<String, u64>| calls.get("evalsha").copied().unwrap_or(0);
    let (raw1, raw2) = (s1.raw().await, s2.raw().await);
    let before = (
        evalsha(support::command_calls(&raw1).await),
        evalsha(support::command_calls(&raw2).await),
    );

    let cases = [
        ("two clients, one URL", vec![a.lock("x"), b.lock("x")]),
        ("one client twice", vec![a.lock("x"), a.lock("x")]),
        ("database 0 spelled out", vec![a.lock("x"), b0.lock("x")]),
        ("a key prefix", vec![prefixed.lock("x"), a.lock("p:x")]),
        (
            "among other parts",
            vec![elsewhere.lock("x"), a.lock("y"), b.lock("y")],
        ),
    ];
    for (what, locks) in cases {
        let multi = MultiLock::new(locks);
        let bounded = Duration::from_secs(5);
        let outcome = tokio::time::timeout(bounded, multi.lock())
            .await
            .unwrap_or_else(|_| panic!("{what}: lock() spins instead of refusing"));
        assert!(
            matches!(&outcome, Err(Error::InvalidArgument(m)) if m.contains("twice")),
            "{what}: {outcome:?}"
        );
        for outcome in [
            multi.try_lock().await,
            multi.try_lock_for(Duration::from_secs(1)).await,
            multi
                .try_lock_with_lease(Duration::from_secs(1), Duration::from_secs(1))
                .await,
        ] {
            assert!(
                matches!(outcome, Err(Error::InvalidArgument(_))),
                "{what}: {outcome:?}"
            );
        }
        let outcome = tokio::time::timeout(bounded, multi.lock_with_lease(Duration::from_secs(1)))
            .await
            .unwrap_or_else(|_| panic!("{what}: lock_with_lease() spins instead of refusing"));
        assert!(
            matches!(outcome, Err(Error::InvalidArgument(_))),
            "{what}: {outcome:?}"
        );
    }
    let after = (
        evalsha(support::command_calls(&raw1).await),
        evalsha(support::command_calls(&raw2).await),
    );
    assert_eq!(before, after, "nothing was sent");

    // Not the same lock: one name on two servers, or in two databases of one server.
    let db1 = Client::connect(&format!("{}/1", s1.url())).await.unwrap();
    for (what, locks) in [
        ("two servers", vec![a.lock("x"), elsewhere.lock("x")]),
        ("two databases", vec![a.lock("x"), db1.lock("x")]),
    ] {
        let multi = MultiLock::new(locks);
        let guard = tokio::time::timeout(Duration::from_secs(10), multi.lock())
            .await
            .unwrap_or_else(|_| panic!("{what}: hangs"))
            .unwrap_or_else(|e| panic!("{what}: {e:?}"));
        assert_eq!(guard.guards().len(), 2, "{what}");
        guard.unlock().await.unwrap();
    }
    for c in [a, b, b0, prefixed, elsewhere, db1] {
        c.shutdown().await.unwrap();
    }
}

/// A multi-lock and a Redlock take the other exclusive kinds: a read/write lock's write
/// halves (a reader of one part keeps the multi-lock out, and the multi-lock keeps readers
/// out), fair locks, and fenced locks whose guards each carry their node's token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multilock_and_redlock_take_the_other_exclusive_kinds() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let ours = clients(&servers, support::RENEWED_LEASE).await;
    let theirs = clients(&servers, support::RENEWED_LEASE).await;

    // Write halves on two servers.
    let writes = MultiLock::of(vec![
        ours[0].read_write_lock("catalog").write(),
        ours[1].read_write_lock("prices").write(),
    ]);
    let reader = theirs[1]
        .read_write_lock("prices")
        .read()
        .lock()
        .await
        .unwrap();
    assert!(writes.try_lock().await.unwrap().is_none());
    assert!(
        !ours[0]
            .read_write_lock("catalog")
            .write()
            .is_locked()
            .await
            .unwrap(),
        "nothing kept"
    );
    reader.unlock().await.unwrap();
    let guard = writes
        .try_lock_for(Duration::from_secs(10))
        .await
        .unwrap()
        .expect("the parts are free");
    for (client, name) in [(&theirs[0], "catalog"), (&theirs[1], "prices")] {
        let read = client.read_write_lock(name).read();
        assert!(
            read.try_lock().await.unwrap().is_none(),
            "{name}: readers kept out"
        );
    }
    guard.unlock().await.unwrap();
    let read = theirs[1].read_write_lock("prices").read();
    read.try_lock()
        .await
        .unwrap()
        .expect("released")
        .unlock()
        .await
        .unwrap();

    // Fair locks on two servers.
    let fair = MultiLock::of(vec![
        ours[0].fair_lock("queue:a"),
        ours[1].fair_lock("queue:b"),
    ]);
    let holder = theirs[0].fair_lock("queue:a").lock().await.unwrap();
    assert!(fair.try_lock().await.unwrap().is_none());
    assert!(
        !ours[1].fair_lock("queue:b").is_locked().await.unwrap(),
        "nothing kept"
    );
    holder.unlock().await.unwrap();
    let guard = fair
        .try_lock_for(Duration::from_secs(10))
        .await
        .unwrap()
        .expect("the parts are free");
    assert!(theirs[1]
        .fair_lock("queue:b")
        .try_lock()
        .await
        .unwrap()
        .is_none());
    guard.unlock().await.unwrap();

    // A Redlock of fenced locks: each granted part carries its node's token, and a later
    // hold's tokens are larger.
    let fenced = RedLock::of(ours.iter().map(|c| c.fenced_lock(NAME)).collect())
        .node_timeout(Duration::from_millis(500))
        .retry_delay(Duration::from_millis(100));
    let first = fenced.lock().await.unwrap();
    let tokens: Vec<u64> = first.guards().iter().map(|g| g.token()).collect();
    assert_eq!(tokens.len(), 3, "every node granted");
    let rival = RedLock::of(theirs.iter().map(|c| c.fenced_lock(NAME)).collect());
    assert!(rival.try_lock().await.unwrap().is_none());
    first.unlock().await.unwrap();
    let second = rival
        .try_lock_for(Duration::from_secs(10))
        .await
        .unwrap()
        .expect("free");
    let later: Vec<u64> = second.guards().iter().map(|g| g.token()).collect();
    assert_eq!(later.len(), 3, "every node granted");
    assert!(
        tokens.iter().zip(&later).all(|(a, b)| b > a),
        "tokens grow: {tokens:?} then {later:?}"
    );
    second.unlock().await.unwrap();

    for client in ours.iter().chain(&theirs) {
        client.shutdown().await.unwrap();
    }
}
