//! The write path's group commit: scripts that change a lock, issued while an earlier group
//! is in flight, go out together with one `WAIT` — and a stalled replica costs each acquire
//! its own acknowledgement timeout, not a queue of everyone's.

use testkit as support;

use std::process::Command;
use std::time::{Duration, Instant};

use fred::interfaces::{ClientLike, HashesInterface, KeysInterface};
use redbaton::{Client, Error, ReplicaSync, AUTO_REPLICA_TIMEOUT};
use support::cluster::RedisCluster;
use support::monitor::ScriptRuns;
use support::proxy::{Mode, Proxy};
use support::{eventually, RedisServer};

/// A primary and one replica of it, the replica online.
async fn primary_with_replica() -> (RedisServer, RedisServer) {
    let primary = RedisServer::start();
    let port = primary.port.to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    let raw = primary.raw().await;
    let online = eventually(Duration::from_secs(30), || {
        let raw = raw.clone();
        async move {
            let info: String = raw
                .info(Some(fred::types::InfoKind::Replication))
                .await
                .unwrap();
            info.contains("state=online")
        }
    })
    .await;
    assert!(online, "the replica came online");
    (primary, replica)
}

/// `ReplicaSync::Auto` counts a replica only once it is online: one still in its full resync
/// acknowledges nothing, and waiting for it would refuse every acquire on a healthy primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_in_its_full_resync_does_not_refuse_acquires() {
    // The primary delays the resync's transfer by 5 s, and the replica sits in `wait_bgsave`.
    let primary = RedisServer::start_with(&[
        "--repl-diskless-sync",
        "yes",
        "--repl-diskless-sync-delay",
        "5",
    ]);
    let client = client(primary.url(), ReplicaSync::Auto).await;
    let raw = primary.raw().await;
    let port = primary.port.to_string();
    let _replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    let syncing = eventually(Duration::from_secs(10), || async {
        let info: String = raw
            .info(Some(fred::types::InfoKind::Replication))
            .await
            .unwrap();
        info.contains("state=wait_bgsave")
    })
    .await;
    assert!(syncing, "the replica is in its full resync");
    // The client counts replicas every second.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let guard = client.lock("resyncing").try_lock().await;
    assert!(
        matches!(guard, Ok(Some(_))),
        "refused while the only replica resyncs: {guard:?}"
    );
    let info: String = raw
        .info(Some(fred::types::InfoKind::Replication))
        .await
        .unwrap();
    assert!(
        info.contains("state=wait_bgsave"),
        "still resyncing: {info}"
    );
    guard.unwrap().unwrap().unlock().await.unwrap();
    client.shutdown().await.unwrap();
}

async fn client(url: String, sync: ReplicaSync) -> Client {
    client_with(url, sync, Duration::from_secs(5)).await
}

/// Holds are checked at renewals only: the tests here count scripts and order calls, and a
/// check between renewals is a call too.
async fn client_with(url: String, sync: ReplicaSync, timeout: Duration) -> Client {
    Client::builder()
        .url(url)
        .command_timeout(timeout)
        .replica_sync(sync)
        .lease_check_interval(Duration::from_secs(3600))
        .connect()
        .await
        .unwrap()
}

/// `count` names in as many slots, all served by one primary: that primary's port, and them.
fn slots_of_one_primary(cluster: &RedisCluster, prefix: &str, count: usize) -> (u16, Vec<String>) {
    let slot = |name: &str| fred::util::redis_keyslot(name.as_bytes());
    let primary = cluster.primary_for_slot(slot(&format!("{prefix}-0")));
    let mut names: Vec<String> = Vec::new();
    for i in 0.. {
        let name = format!("{prefix}-{i}");
        let fresh = names.iter().all(|n| slot(n) != slot(&name));
        if fresh && cluster.primary_for_slot(slot(&name)) == primary {
            names.push(name);
        }
        if names.len() == count {
            break;
        }
    }
    (primary, names)
}

/// Takes and releases each of `names` once, acknowledged while the replicas run: the scripts
/// are loaded and the replicas counted.
async fn warm(client: &Client, names: &[String]) {
    for name in names {
        client
            .lock(name)
            .lock()
            .await
            .unwrap()
            .unlock()
            .await
            .unwrap();
    }
}

/// A plain fred client of the cluster's live nodes, to look at the keys.
async fn raw_cluster(cluster: &RedisCluster) -> fred::clients::Client {
    let config = fred::types::config::Config::from_url(&cluster.url()).unwrap();
    let raw = fred::clients::Client::new(config, None, None, None);
    raw.init().await.unwrap();
    raw
}

/// Sends `signal` (`-STOP`, `-CONT`) to a server's process.
fn signal(server: &RedisServer, signal: &str) {
    let pid = server.pid().expect("the server runs").to_string();
    let status = Command::new("kill").args([signal, &pid]).status().unwrap();
    assert!(status.success(), "kill {signal} {pid}");
}

/// A stopped replica never acknowledges: 32 tasks trying over and over on unrelated names
/// each get their typed refusal within their own acknowledgement timeout (plus slack for a
/// loaded machine, well under a second timeout) — an undo sent before its refusal would queue
/// behind the next group's `WAIT`, and its caller would pay that timeout too — and none leaves
/// its key held: each is undone right after its refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_replica_costs_each_acquire_its_own_timeout() {
    let timeout = Duration::from_secs(1);
    let sync = ReplicaSync::Replicas { min: 1, timeout };
    let (primary, replica) = primary_with_replica().await;
    let client = client(primary.url(), sync).await;
    let raw = primary.raw().await;
    warm(&client, &["warm".to_owned()]).await;
    signal(&replica, "-STOP");
    let names: Vec<String> = (0..32).map(|i| format!("unrelated-{i}")).collect();
    let until = Instant::now() + Duration::from_secs(4);
    let tries = names.iter().map(|name| {
        let lock = client.lock(name);
        tokio::spawn(async move {
            let mut slowest = Duration::ZERO;
            let mut refusals = 0;
            while Instant::now() < until {
                let started = Instant::now();
                let outcome = lock.try_lock().await.map(|guard| guard.is_some());
                slowest = slowest.max(started.elapsed());
                // Refused, or — right after its own refusal, whose undo is still on its way —
                // busy.
                assert!(
                    matches!(outcome, Err(Error::NotReplicated { .. }) | Ok(false)),
                    "{outcome:?} after {:?}",
                    started.elapsed()
                );
                refusals += 1;
            }
            (slowest, refusals)
        })
    });
    let outcomes = futures::future::join_all(tries).await;
    let (mut slowest, mut refusals) = (Duration::ZERO, 0);
    for outcome in outcomes {
        let (one, n) = outcome.unwrap();
        slowest = slowest.max(one);
        refusals += n;
    }
    eprintln!(
        "group_commit: the slowest of {refusals} refusals took {slowest:?} ({timeout:?} each)"
    );
    let bound = timeout + timeout * 3 / 5;
    assert!(
        slowest <= bound,
        "refused after {slowest:?}, past {bound:?}: refusals waited behind others' WAIT"
    );
    for name in &names {
        // Undone after the refusal, on the primary.
        assert!(
            eventually(Duration::from_secs(10), || async {
                raw.exists::<i64, _>(name).await.unwrap() == 0
            })
            .await,
            "{name} was left held on the primary after its refusal"
        );
    }
    signal(&replica, "-CONT");
    let _ = tokio::time::timeout(Duration::from_secs(10), client.shutdown()).await;
}

/// Concurrent tries, grouped, each get their own script's reply: on names another client
/// holds, `None`; on free names, a guard whose hold is in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_each_get_their_own_reply() {
    let server = RedisServer::start();
    let holder = client(server.url(), ReplicaSync::Off).await;
    let tried = client(server.url(), ReplicaSync::Off).await;
    let raw = server.raw().await;
    let names: Vec<String> = (0..200).map(|i| format!("mixed-{i}")).collect();
    let mut held = Vec::new();
    for name in names.iter().step_by(2) {
        held.push(holder.lock(name).lock().await.unwrap());
    }
    let tries = names.iter().map(|name| {
        let lock = tried.lock(name);
        tokio::spawn(async move { lock.try_lock().await })
    });
    let outcomes = futures::future::join_all(tries).await;
    let mut guards = Vec::new();
    for (i, (name, outcome)) in names.iter().zip(outcomes).enumerate() {
        let guard = outcome.unwrap().unwrap_or_else(|e| panic!("{name}: {e}"));
        if i % 2 == 0 {
            assert!(guard.is_none(), "{name} is held by the other client");
        } else {
            assert!(guard.is_some(), "{name} is free");
            let exists: i64 = raw.exists(name).await.unwrap();
            assert_eq!(exists, 1, "{name}'s hold is in Redis");
            guards.push(guard);
        }
    }
    drop(guards);
    drop(held);
    let left = support::still_held(&raw, names).await;
    assert!(left.is_empty(), "left held: {left:?}");
}

/// The script cache emptied under a group: every member reloads and runs its own script,
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noscript_in_a_group_runs_each_script_once() {
    let server = RedisServer::start();
    let client = client(server.url(), ReplicaSync::Off).await;
    let raw = server.raw().await;
    // Warm: the scripts are cached; then the cache is lost.
    drop(client.lock("warm").lock().await.unwrap());
    support::command(&raw, "SCRIPT", vec!["FLUSH".into()]).await;
    let names: Vec<String> = (0..50).map(|i| format!("flushed-{i}")).collect();
    let locks = names.iter().map(|name| {
        let lock = client.lock(name);
        tokio::spawn(async move { lock.lock().await })
    });
    let guards: Vec<_> = futures::future::join_all(locks)
        .await
        .into_iter()
        .map(|g| g.unwrap().unwrap())
        .collect();
    for name in &names {
        let counts: Vec<i64> = raw.hvals(name).await.unwrap();
        assert_eq!(counts, vec![1], "{name} has one owner holding once");
    }
    drop(guards);
    let left = support::still_held(&raw, names).await;
    assert!(left.is_empty(), "left held: {left:?}");
}

/// Takes and drops one lock, and waits (bounded) until its release is through: the scripts
/// are loaded, and nothing of the warm-up is in flight.
async fn warm_up(client: &Client, raw: &fred::clients::Client) {
    drop(client.lock("warm").lock().await.unwrap());
    let released = eventually(Duration::from_secs(5), || async {
        raw.exists::<i64, _>("warm").await.unwrap() == 0
    })
    .await;
    assert!(released, "the warm-up hold was released");
}

/// Callers that stop waiting while their group is in flight cancel neither their own
/// script (its hold, taken, is released) nor anyone else's in the group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_leaving_its_group_cancels_nothing() {
    let server = RedisServer::start();
    let client = client(server.url(), ReplicaSync::Off).await;
    let raw = server.raw().await;
    let names: Vec<String> = (0..40).map(|i| format!("left-{i}")).collect();
    let tasks: Vec<_> = names
        .iter()
        .map(|name| {
            let lock = client.lock(name);
            tokio::spawn(async move { lock.lock().await })
        })
        .collect();
    // Every other caller leaves at once, most of them with their scripts queued or sent.
    for task in tasks.iter().step_by(2) {
        task.abort();
    }
    let mut guards = Vec::new();
    for (i, (name, task)) in names.iter().zip(tasks).enumerate() {
        match task.await {
            Ok(guard) => {
                guards.push(guard.unwrap_or_else(|e| panic!("{name}: {e}")));
                let exists: i64 = raw.exists(name).await.unwrap();
                assert_eq!(exists, 1, "{name}'s hold is in Redis");
            }
            Err(e) => assert!(i % 2 == 0 && e.is_cancelled(), "{name}: {e}"),
        }
    }
    assert!(
        guards.len() >= names.len() / 2,
        "the callers that stayed got their guards"
    );
    drop(guards);
    let left = support::still_held(&raw, names).await;
    assert!(left.is_empty(), "left held: {left:?}");
}

/// A group whose replies are lost: its callers give up with a typed error, the scripts that
/// ran are settled (the owner's count trimmed back), and those still queued run once the
/// connection is back, their holds released since nobody waits for them — nothing is left
/// held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_whose_replies_are_lost_leaves_nothing_held() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port).await;
    let client = client_with(proxy.url(), ReplicaSync::Off, Duration::from_secs(1)).await;
    let raw = server.raw().await;
    // Loaded before the replies go: a NOSCRIPT's reload would be lost too.
    warm_up(&client, &raw).await;
    // Counted inside scripts too: only an acquire that ran on the server adds to it (a
    // release increments a field only where an acquire made it).
    let hincrbys = |calls: std::collections::HashMap<String, u64>| calls.get("hincrby").copied();
    let before = hincrbys(support::command_calls(&raw).await);
    proxy.set(Mode::RepliesLost);
    let names: Vec<String> = (0..10).map(|i| format!("lost-{i}")).collect();
    let tries = names.iter().map(|name| {
        let lock = client.lock(name);
        tokio::spawn(async move { lock.try_lock().await.map(|guard| guard.is_some()) })
    });
    let outcomes = futures::future::join_all(tries).await;
    for (name, outcome) in names.iter().zip(outcomes) {
        let outcome = outcome.unwrap();
        assert!(outcome.is_err(), "{name}: no reply, yet {outcome:?}");
    }
    // Waited for, not sampled: the callers gave up on their deadlines, and the group sent
    // after the first caller left may still be on its way to the server; a hold that did run
    // may already be settled (released) by now, so holds in Redis prove nothing either way.
    let ran = eventually(Duration::from_secs(10), || async {
        hincrbys(support::command_calls(&raw).await) > before
    })
    .await;
    assert!(
        ran,
        "the scripts ran on the server; only their replies were lost"
    );
    proxy.set(Mode::Cut);
    // Cut once the client's connections are gone: only `raw`'s is left.
    let cut = eventually(Duration::from_secs(10), || async {
        let info: String = raw
            .info(Some(fred::types::InfoKind::Clients))
            .await
            .unwrap();
        info.contains("connected_clients:1\r")
    })
    .await;
    assert!(cut, "the proxy cut the client's connections");
    proxy.set(Mode::Open);
    // The slot's groups go on: a later call gets its reply.
    let after = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Ok(guard) = client.lock("after").try_lock().await {
                return guard.is_some();
            }
        }
    })
    .await;
    assert_eq!(after, Ok(true), "a later call went out and got the lock");
    let left = support::still_held(&raw, names).await;
    assert!(left.is_empty(), "left held: {left:?}");
}

/// A healthy replica acknowledges every group: concurrent acquires and releases under `Auto`
/// all succeed, and what they took is on the replica before each guard exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_replica_acknowledges_every_group() {
    let (primary, replica) = primary_with_replica().await;
    let client = client(primary.url(), ReplicaSync::Auto).await;
    let on_replica = replica.raw().await;
    let tasks = (0..32).map(|task| {
        let client = client.clone();
        let on_replica = on_replica.clone();
        tokio::spawn(async move {
            for round in 0..10 {
                let name = format!("acked-{task}-{round}");
                let guard = client.lock(&name).lock().await.unwrap();
                let there: i64 = on_replica.exists(&name).await.unwrap();
                assert_eq!(there, 1, "{name} is on the replica once acquired");
                guard.unlock().await.unwrap();
            }
        })
    });
    for task in futures::future::join_all(tasks).await {
        task.unwrap();
    }
}

/// A caller that leaves while its script waits behind the group in flight: the script is not
/// dropped with it — it goes out with the next group, once — and the hold it took is released,
/// since nobody waits for it. (The test above aborts its callers at once, mostly before they
/// have issued anything; here the caller leaves provably while queued.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_leaving_while_queued_still_has_its_script_run_and_released() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port).await;
    let client = client_with(proxy.url(), ReplicaSync::Off, Duration::from_secs(10)).await;
    let raw = server.raw().await;
    // Loaded first: a NOSCRIPT's reload would not go through the group.
    warm_up(&client, &raw).await;
    // The first script's reply is held back this long: its group stays in flight.
    let delay = Duration::from_secs(3);
    proxy.set(Mode::RepliesDelayed(delay));
    let first = client.lock("first");
    let holder = tokio::spawn(async move { first.lock().await });
    let ran = eventually(Duration::from_secs(5), || async {
        raw.exists::<i64, _>("first").await.unwrap() == 1
    })
    .await;
    assert!(ran, "the first script ran; its reply is on its way back");
    let before = support::script_calls(&raw).await;
    // Issued behind the first group, then dropped well before that group's reply is back.
    let left = tokio::time::timeout(Duration::from_millis(300), client.lock("second").lock()).await;
    assert!(
        left.is_err(),
        "the second lock returned while the first group was in flight"
    );
    assert_eq!(
        raw.exists::<i64, _>("second").await.unwrap(),
        0,
        "the second script went out while the first group was in flight"
    );
    let guard = holder.await.unwrap().unwrap();
    // Its script runs with the next group, and the hold is released behind it: two scripts.
    let settled = eventually(Duration::from_secs(15), || async {
        support::script_calls(&raw).await >= before + 2
            && raw.exists::<i64, _>("second").await.unwrap() == 0
    })
    .await;
    assert!(
        settled,
        "the second caller's script ran and its hold was released ({} scripts since it left)",
        support::script_calls(&raw).await - before
    );
    drop(guard);
    let left = support::still_held(&raw, ["first".to_owned(), "second".to_owned()]).await;
    assert!(left.is_empty(), "left held: {left:?}");
}

/// Futures of one task trying one name at once, through one client: their scripts travel in
/// one group (behind an unrelated try in flight), and still exactly one of them holds the
/// lock — sharing a task or a group makes nobody a co-owner (invariants 14, 15, docs/DESIGN.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn futures_of_one_task_in_one_group_exclude_each_other() {
    let server = RedisServer::start();
    let client = client(server.url(), ReplicaSync::Off).await;
    let raw = server.raw().await;
    let other = client.lock("other");
    let shared = client.lock("shared");
    for round in 0..20 {
        // `join!` polls in order: the first try goes out alone, the others queue behind it.
        let (first, tries) = tokio::join!(
            other.try_lock(),
            futures::future::join_all((0..8).map(|_| shared.try_lock()))
        );
        let first = first.unwrap().expect("nobody else holds the other lock");
        let guards: Vec<_> = tries.into_iter().filter_map(|t| t.unwrap()).collect();
        assert_eq!(
            guards.len(),
            1,
            "round {round}: {} holders at once",
            guards.len()
        );
        let counts: Vec<i64> = raw.hvals("shared").await.unwrap();
        assert_eq!(counts, vec![1], "round {round}: one owner holding once");
        for guard in guards {
            guard.unlock().await.unwrap();
        }
        first.unlock().await.unwrap();
    }
    let left = support::still_held(&raw, ["other".to_owned(), "shared".to_owned()]).await;
    assert!(left.is_empty(), "left held: {left:?}");
}

/// On a cluster, the scripts of different slots of one primary share its one connection, and
/// a `WAIT` blocks that connection on the server until it returns: a stopped replica must
/// still cost each acquire its own acknowledgement timeout, not the sum of the `WAIT`s of the
/// slots queued before it (invariant 15, docs/DESIGN.md).
///
/// With groups per slot, each slot's script and `WAIT` queued behind the others' on the
/// primary's connection: one slot was refused in ~1 s, two in 2.04 s, five all ended at the
/// command timeout (5 s). Groups are per node now, so the four issued behind the first share
/// one `WAIT`, bounded by their own deadlines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_stopped_replica_costs_each_acquire_its_own_timeout() {
    let cluster = RedisCluster::start(3, 1);
    let (primary, names) = slots_of_one_primary(&cluster, "gc", 5);
    let client = client(cluster.url(), ReplicaSync::Auto).await;
    warm(&client, &names).await;
    let replica_port = cluster.replica_of(primary);
    let replica = cluster
        .nodes
        .iter()
        .find(|n| n.port == replica_port)
        .unwrap();
    signal(replica, "-STOP");
    let tries = names.iter().map(|name| {
        let lock = client.lock(name);
        tokio::spawn(async move {
            let started = Instant::now();
            let outcome = lock.try_lock().await.map(|guard| guard.is_some());
            (outcome, started.elapsed())
        })
    });
    let outcomes = futures::future::join_all(tries).await;
    signal(replica, "-CONT");
    let bound = AUTO_REPLICA_TIMEOUT + Duration::from_secs(1);
    for (name, outcome) in names.iter().zip(outcomes) {
        let (outcome, took) = outcome.unwrap();
        assert!(
            matches!(outcome, Err(Error::NotReplicated { .. })),
            "{name}: {outcome:?} after {took:?}"
        );
        assert!(
            took <= bound,
            "{name}: refused after {took:?}, past {bound:?}"
        );
    }
    let _ = tokio::time::timeout(Duration::from_secs(10), client.shutdown()).await;
}

/// A group spanning a failover (invariant 15, docs/DESIGN.md): acquires on several slots of one
/// primary are in flight — the first sent, the others queued behind it as the next group — when
/// that primary dies and its replica takes over. Every caller ends, within a bound, with a guard or
/// a typed error — a guard for all but the one whose script the dead primary took, as for
/// scripts sent alone; each guard returned is held in Redis (on the promoted replica), and
/// once they are released nothing is left held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_spanning_a_failover_ends_every_caller_and_leaves_nothing_held() {
    let mut cluster = RedisCluster::start(3, 1);
    let (primary, names) = slots_of_one_primary(&cluster, "gf", 8);
    let replica_port = cluster.replica_of(primary);
    // Sends again after the redirections for up to a command timeout: longer than a
    // failover on a loaded machine.
    let client = client_with(cluster.url(), ReplicaSync::Auto, Duration::from_secs(20)).await;
    warm(&client, &names).await;
    // Stopped, the primary takes the scripts and answers none: the group stays in flight.
    let node = cluster.nodes.iter().find(|n| n.port == primary).unwrap();
    signal(node, "-STOP");
    let started = Instant::now();
    let tries: Vec<_> = names
        .iter()
        .map(|name| {
            let lock = client.lock(name);
            tokio::spawn(async move {
                let outcome = lock.lock().await;
                (outcome, started.elapsed())
            })
        })
        .collect();
    // Time for the callers to issue their scripts before the kill; nothing is asserted on it
    // (a script issued later meets the failover instead, and must end the same ways).
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.node_mut(primary).kill();
    let promoted = support::eventually(Duration::from_secs(30), || async {
        names.iter().all(|name| {
            cluster.serving(fred::util::redis_keyslot(name.as_bytes())) == Some(replica_port)
        })
    })
    .await;
    assert!(promoted, "the replica took over the primary's slots");
    cluster.wait_healthy(3, 0, Duration::from_secs(60));
    // The failover (about two node timeouts), then a command timeout of sends again.
    let bound = Duration::from_secs(60);
    let mut guards = Vec::new();
    let mut refused = Vec::new();
    for (name, task) in names.iter().zip(tries) {
        let (outcome, took) = tokio::time::timeout(bound, task)
            .await
            .unwrap_or_else(|_| panic!("{name}: no outcome within {bound:?}"))
            .unwrap();
        assert!(
            took <= bound,
            "{name}: ended after {took:?}, past {bound:?}"
        );
        match outcome {
            Ok(guard) => guards.push((name.clone(), guard)),
            Err(e) => refused.push(format!("{name}: {e}")),
        }
    }
    // Only the script written to the primary before it died may be lost with it; those queued
    // behind it were never written there, and are served by the promoted replica.
    assert!(
        refused.len() <= 1,
        "{} guards; refused: {refused:?}",
        guards.len()
    );
    let raw = raw_cluster(&cluster).await;
    for (name, guard) in &guards {
        let counts: Vec<i64> = raw.hvals(name.as_str()).await.unwrap();
        assert_eq!(
            counts,
            vec![1],
            "{name}: the guard returned is one hold in Redis"
        );
        assert!(!guard.is_lost(), "{name}: the guard says its hold is lost");
    }
    for (name, guard) in guards {
        guard
            .unlock()
            .await
            .unwrap_or_else(|e| panic!("{name}: release after the failover: {e}"));
    }
    let left = support::still_held(&raw, names).await;
    assert!(left.is_empty(), "left held: {left:?}");
    let _ = tokio::time::timeout(Duration::from_secs(10), client.shutdown()).await;
}

/// A group in which some members are redirected and the others run: while a slot migrates,
/// releases of held names (their keys still on the source) run there, and acquires of free
/// names (absent there) are answered ASK. Each caller gets its own reply: every release
/// succeeds, once — it is not told it was redirected and sent again to the importing node,
/// where its key is not — and every acquire takes its lock on the importing node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_with_redirected_members_gives_the_others_their_own_replies() {
    let cluster = RedisCluster::start(3, 0);
    // One slot, by the hash tag: per slot or per node, these travel in one group.
    let held: Vec<String> = (0..4).map(|i| format!("{{mixed}}held-{i}")).collect();
    let free: Vec<String> = (0..4).map(|i| format!("{{mixed}}free-{i}")).collect();
    let slot = fred::util::redis_keyslot(b"mixed");
    let from = cluster.primary_for_slot(slot);
    let to = cluster
        .topology()
        .into_iter()
        .find(|n| n.primary && n.port != from)
        .expect("another primary")
        .port;
    let client = client(cluster.url(), ReplicaSync::Off).await;
    warm(&client, &["{mixed}warm".to_owned()]).await;
    let mut guards = Vec::new();
    for name in &held {
        guards.push(client.lock(name).lock().await.unwrap());
    }
    cluster.begin_migration(slot, from, to);
    let locks: Vec<_> = free.iter().map(|name| client.lock(name)).collect();
    // `join!` polls in order: the first release goes out alone, the others and the acquires
    // queue behind it as one group.
    let (released, taken) = tokio::join!(
        futures::future::join_all(guards.into_iter().map(|guard| guard.unlock())),
        futures::future::join_all(locks.iter().map(|lock| lock.try_lock())),
    );
    for (name, released) in held.iter().zip(released) {
        assert!(released.is_ok(), "{name}: {released:?}");
    }
    let mut taken_guards = Vec::new();
    for (name, taken) in free.iter().zip(taken) {
        match taken {
            Ok(Some(guard)) => taken_guards.push(guard),
            other => panic!("{name}: {other:?}"),
        }
    }
    cluster.move_keys(slot, from, to);
    cluster.finish_migration(slot, from, to);
    for guard in taken_guards {
        guard.unlock().await.unwrap();
    }
    let raw = raw_cluster(&cluster).await;
    let left = support::still_held(&raw, held.into_iter().chain(free)).await;
    assert!(left.is_empty(), "left held: {left:?}");
}

/// Takes `names` at once from `client`, each in a task of its own: the first goes alone,
/// the others are issued while it is in flight and so travel in groups.
async fn lock_all(client: &Client, names: &[String]) -> Vec<redbaton::Result<redbaton::LockGuard>> {
    let locks = names.iter().map(|name| {
        let lock = client.lock(name);
        tokio::spawn(async move { lock.lock().await })
    });
    futures::future::join_all(locks)
        .await
        .into_iter()
        .map(|joined| joined.unwrap())
        .collect()
}

/// A group's acquisitions of one node go as composite calls: each caller holds its own lock,
/// and the server ran fewer script calls than there were acquisitions — but as many scripts
/// ([`ScriptRuns`], the count tests of attempts use, sees each one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grouped_acquisitions_share_script_calls() {
    let server = RedisServer::start();
    // Renewals (every third of the lease) stay out of the count taken over the acquisitions.
    let client = Client::builder()
        .url(server.url())
        .replica_sync(ReplicaSync::Off)
        .watchdog_lease(Duration::from_secs(300))
        .connect()
        .await
        .unwrap();
    let raw = server.raw().await;
    warm_up(&client, &raw).await;
    let runs = ScriptRuns::start(&server, &raw).await;
    let names: Vec<String> = (0..200).map(|i| format!("composite-{i}")).collect();
    let (before, runs_before) = (support::script_calls(&raw).await, runs.count().await);
    let guards = lock_all(&client, &names).await;
    let calls = support::script_calls(&raw).await - before;
    assert_eq!(
        runs.count().await - runs_before,
        names.len() as u64,
        "one script run per acquisition, in {calls} calls"
    );
    for (name, guard) in names.iter().zip(&guards) {
        guard.as_ref().unwrap_or_else(|e| panic!("{name}: {e}"));
        let counts: Vec<i64> = raw.hvals(name).await.unwrap();
        assert_eq!(counts, vec![1], "{name} has one owner holding once");
    }
    assert!(
        calls < names.len() as u64,
        "{calls} script calls for {} grouped acquisitions",
        names.len()
    );
    drop(guards);
    let left = support::still_held(&raw, names).await;
    assert!(left.is_empty(), "left held: {left:?}");
}

/// One member of a composite call fails (its key holds a string): that caller gets its
/// typed error, as for a script sent alone; the others in the same call hold their locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_member_of_a_composite_call_fails_alone() {
    let server = RedisServer::start();
    let client = client(server.url(), ReplicaSync::Off).await;
    let raw = server.raw().await;
    warm_up(&client, &raw).await;
    let mut names: Vec<String> = (0..100).map(|i| format!("beside-{i}")).collect();
    let wrong = "wrong-type".to_owned();
    let _: () = raw
        .set(&wrong, "a string", None, None, false)
        .await
        .unwrap();
    // Among the later callers: those travel in groups.
    names.insert(50, wrong.clone());
    let before = support::script_calls(&raw).await;
    let outcomes = lock_all(&client, &names).await;
    let calls = support::script_calls(&raw).await - before;
    assert!(
        calls < names.len() as u64,
        "{calls} script calls for {} grouped acquisitions",
        names.len()
    );
    let mut guards = Vec::new();
    for (name, outcome) in names.iter().zip(outcomes) {
        if *name == wrong {
            match outcome {
                Err(Error::WrongType { name, .. }) => assert_eq!(name, wrong),
                other => panic!("{wrong}: expected WrongType, got {other:?}"),
            }
        } else {
            guards.push(outcome.unwrap_or_else(|e| panic!("{name}: {e}")));
            let counts: Vec<i64> = raw.hvals(name).await.unwrap();
            assert_eq!(counts, vec![1], "{name} has one owner holding once");
        }
    }
    let kept: String = raw.get(&wrong).await.unwrap();
    assert_eq!(kept, "a string", "the string key is left as it was");
    drop(guards);
    names.retain(|name| *name != wrong);
    let left = support::still_held(&raw, names).await;
    assert!(left.is_empty(), "left held: {left:?}");
}

/// The script cache emptied, then a group: the composite is loaded again and sent once more,
/// every caller holds its lock once, and the calls stay shared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_composite_is_loaded_again() {
    let server = RedisServer::start();
    let client = client(server.url(), ReplicaSync::Off).await;
    let raw = server.raw().await;
    warm_up(&client, &raw).await;
    support::command(&raw, "SCRIPT", vec!["FLUSH".into()]).await;
    let names: Vec<String> = (0..200).map(|i| format!("reloaded-{i}")).collect();
    let before = support::script_calls(&raw).await;
    let guards = lock_all(&client, &names).await;
    let calls = support::script_calls(&raw).await - before;
    for (name, guard) in names.iter().zip(&guards) {
        guard.as_ref().unwrap_or_else(|e| panic!("{name}: {e}"));
        let counts: Vec<i64> = raw.hvals(name).await.unwrap();
        assert_eq!(counts, vec![1], "{name} has one owner holding once");
    }
    assert!(
        calls < names.len() as u64,
        "{calls} script calls for {} grouped acquisitions",
        names.len()
    );
    drop(guards);
    let left = support::still_held(&raw, names).await;
    assert!(left.is_empty(), "left held: {left:?}");
}

/// A member whose script replies nil (a semaphore release that would pass the largest count a
/// Redisson peer reads) in a composite call: that caller gets its refusal, as for a script
/// sent alone; the others' releases count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nil_reply_in_a_composite_call_stays_nil() {
    let server = RedisServer::start();
    let client = client(server.url(), ReplicaSync::Off).await;
    let raw = server.raw().await;
    warm_up(&client, &raw).await;
    let names: Vec<String> = (0..100).map(|i| format!("sem-{i}")).collect();
    let full = |i: usize| i % 2 == 0;
    for (i, name) in names.iter().enumerate() {
        let count = if full(i) { i64::from(i32::MAX) } else { 0 };
        let _: () = raw.set(name, count, None, None, false).await.unwrap();
    }
    let before = support::script_calls(&raw).await;
    let releases = names.iter().map(|name| {
        let semaphore = client.semaphore(name);
        tokio::spawn(async move { semaphore.release(1).await })
    });
    let outcomes = futures::future::join_all(releases).await;
    let calls = support::script_calls(&raw).await - before;
    assert!(
        calls < names.len() as u64,
        "{calls} script calls for {} grouped releases",
        names.len()
    );
    for (i, (name, outcome)) in names.iter().zip(outcomes).enumerate() {
        let count: i64 = raw.get(name).await.unwrap();
        match outcome.unwrap() {
            Err(Error::InvalidArgument(message)) if full(i) => {
                assert!(message.contains("out of the range"), "{name}: {message}");
                assert_eq!(count, i64::from(i32::MAX), "{name} is left as it was");
            }
            Ok(()) if !full(i) => assert_eq!(count, 1, "{name} counts the release"),
            other => panic!("{name}: unexpected {other:?}"),
        }
    }
}
