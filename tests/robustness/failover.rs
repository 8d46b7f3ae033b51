//! Failover without a second holder: a primary, a replica that replicates THROUGH a relay
//! (a loopback proxy the test can stall, holding back the replication stream), and one
//! Sentinel. The primary is SIGKILLed while the relay is stalled and Sentinel promotes the
//! replica, which never saw what the relay held back.
//!
//! - sync off: the hazard, shown — a second client takes a lock whose first guard still says
//!   held (so these tests can fail);
//! - sync on: an acquire the replica did not acknowledge fails with `NotReplicated` and leaves
//!   nothing behind; a hold it did acknowledge survives the failover, and nobody else gets it;
//! - a renewal the replica did not acknowledge extends nothing: the guard is lost once the
//!   replica's copy expired, although the primary's copy was renewed;
//! - a baton pass the replica did not acknowledge hands the waiter nothing;
//! - a hold handed on in memory (lock cohorting) is the replicated hold itself: it outlives
//!   neither the replica's copy nor a failover.
//!
//! The holder connects straight to the primary (a `redis://` URL), so once the primary is
//! killed it can neither renew nor learn anything: its guard says "held" exactly as long as
//! its own validity says so, which is what these tests judge.

use testkit as support;

use std::time::{Duration, Instant};

use fred::interfaces::HashesInterface;
use redbaton::{Client, Error, ReplicaSync};
use support::cluster::cli;
use support::proxy::{Mode, Proxy};
use support::sentinel::{Sentinel, MASTER_NAME};
use support::{eventually, RedisServer};

/// A primary, its replica fed through `relay`, and one sentinel (quorum 1).
struct Relayed {
    master: RedisServer,
    relay: Proxy,
    replica: RedisServer,
    sentinel: Sentinel,
}

impl Relayed {
    async fn start() -> Relayed {
        let master = RedisServer::start();
        let relay = Proxy::start(master.port).await;
        let relay_port = relay.port.to_string();
        let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &relay_port]);
        // One sentinel: no split votes. A long failover timeout: the sentinel would otherwise
        // "fix" the replica (point it at the primary's real address, around the relay) once
        // that timeout passed; a failover with one replica never waits for it.
        let master_port = master.port;
        let sentinel =
            tokio::task::spawn_blocking(move || Sentinel::start_with(master_port, 1, 120_000))
                .await
                .unwrap();
        let setup = Relayed {
            master,
            relay,
            replica,
            sentinel,
        };
        let ready = eventually(Duration::from_secs(30), || async {
            let replication = cli(setup.master.port, &["info", "replication"]);
            let known = cli(setup.sentinel.port, &["sentinel", "replicas", MASTER_NAME]);
            replication.contains("state=online") && known.contains(&setup.replica.port.to_string())
        })
        .await;
        assert!(ready, "replica online and known to the sentinel");
        setup
    }

    fn sentinel_url(&self) -> String {
        format!(
            "redis-sentinel://127.0.0.1:{}?sentinelServiceName={MASTER_NAME}",
            self.sentinel.port
        )
    }

    fn exists(port: u16, key: &str) -> bool {
        cli(port, &["exists", key]).trim() == "1"
    }

    fn pttl(port: u16, key: &str) -> i64 {
        cli(port, &["pttl", key]).trim().parse().unwrap_or(-3)
    }

    /// SIGKILLs the primary and waits until the sentinel names the replica and the replica
    /// serves as a primary. Sentinel promotes it by itself (about 2 s); should that failover
    /// abort (a sentinel that found the replica's INFO too old when it chose one waits twice
    /// the failover timeout before trying again), it is asked to fail over explicitly.
    async fn fail_over(&mut self) {
        self.master.kill();
        let started = Instant::now();
        let replica = self.replica.port;
        let sentinel = self.sentinel.port;
        let promoted = || async move {
            let addr = cli(
                sentinel,
                &["sentinel", "get-master-addr-by-name", MASTER_NAME],
            );
            addr.lines().nth(1).map(str::trim) == Some(&replica.to_string())
                && cli(replica, &["role"]).starts_with("master")
        };
        if !eventually(Duration::from_secs(15), promoted).await {
            eprintln!(
                "no promotion in {:?}; forcing it. Sentinel log:\n{}",
                started.elapsed(),
                self.sentinel.log()
            );
            let forced = cli(sentinel, &["sentinel", "failover", MASTER_NAME]);
            eprintln!("SENTINEL FAILOVER: {}", forced.trim());
            let done = eventually(Duration::from_secs(20), promoted).await;
            assert!(
                done,
                "the sentinel did not promote the replica; its log:\n{}",
                self.sentinel.log()
            );
        }
        eprintln!("promoted {:?} after the kill", started.elapsed());
    }
}

async fn client(url: String, sync: ReplicaSync, lease: Duration) -> Client {
    Client::builder()
        .url(url)
        .watchdog_lease(lease)
        .command_timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_secs(5))
        .reconnect_max_delay(Duration::from_millis(300))
        .replica_sync(sync)
        .connect()
        .await
        .unwrap()
}

/// Shuts a client down whose server may be gone: bounded, outcome ignored.
async fn close(client: Client) {
    let _ = tokio::time::timeout(Duration::from_secs(10), client.shutdown()).await;
}

/// After a failover: a second client, through the sentinel, finds `name` free on the
/// promoted replica and takes it.
async fn assert_free_after_failover(setup: &Relayed, name: &str) {
    let second = client(
        setup.sentinel_url(),
        ReplicaSync::Auto,
        Duration::from_secs(5),
    )
    .await;
    let taken = second.lock(name).try_lock().await.unwrap();
    assert!(taken.is_some(), "{name} is free on the promoted replica");
    taken.unwrap().unlock().await.unwrap();
    close(second).await;
}

/// Longer than any of these tests: a holder that cannot renew keeps a valid guard throughout.
const LONG_LEASE: Duration = Duration::from_secs(60);

const SYNC_ONE: ReplicaSync = ReplicaSync::Replicas {
    min: 1,
    timeout: Duration::from_millis(300),
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_off_a_failover_hands_a_held_lock_to_a_second_client() {
    let mut setup = Relayed::start().await;
    let holder = client(setup.master.url(), ReplicaSync::Off, LONG_LEASE).await;
    setup.relay.set(Mode::Stalled);
    let guard = holder.lock("off").lock().await.unwrap();
    assert!(Relayed::exists(setup.master.port, "off"));
    assert!(
        !Relayed::exists(setup.replica.port, "off"),
        "the stalled relay holds the hold back"
    );
    setup.fail_over().await;
    let second = client(
        setup.sentinel_url(),
        ReplicaSync::Off,
        Duration::from_secs(5),
    )
    .await;
    let taken = second
        .lock("off")
        .try_lock_for(Duration::from_secs(10))
        .await
        .unwrap();
    // The hazard: two holders at once.
    assert!(taken.is_some(), "a second client took the lock");
    assert!(!guard.is_lost(), "while the first guard still says held");
    taken.unwrap().unlock().await.unwrap();
    close(second).await;
    drop(guard);
    close(holder).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_on_an_unreplicated_acquire_fails_and_a_replicated_hold_survives_failover() {
    let mut setup = Relayed::start().await;
    let holder = client(setup.master.url(), SYNC_ONE, LONG_LEASE).await;
    // Acknowledged: on the replica before the guard exists.
    let guard = holder.lock("kept").lock().await.unwrap();
    assert!(Relayed::exists(setup.replica.port, "kept"));

    setup.relay.set(Mode::Stalled);
    // Not acknowledged: no guard, whatever the wait, and nothing left on the primary.
    for wait in [Duration::ZERO, Duration::from_secs(2)] {
        let started = Instant::now();
        let refused = holder.lock("refused").try_lock_for(wait).await;
        assert!(
            matches!(
                refused,
                Err(Error::NotReplicated {
                    acked: 0,
                    wanted: 1
                })
            ),
            "wait {wait:?}: {refused:?}"
        );
        eprintln!("wait {wait:?}: refused after {:?}", started.elapsed());
        assert!(
            !Relayed::exists(setup.master.port, "refused"),
            "the unacknowledged acquire was undone"
        );
    }
    let reentry = guard.reenter().await;
    assert!(
        matches!(reentry, Err(Error::NotReplicated { .. })),
        "{reentry:?}"
    );
    assert_eq!(
        cli(
            setup.master.port,
            &["hget", "kept", &guard.owner().to_string()]
        )
        .trim(),
        "1",
        "the unacknowledged re-entry was undone"
    );

    setup.fail_over().await;
    let second = client(
        setup.sentinel_url(),
        ReplicaSync::Auto,
        Duration::from_secs(5),
    )
    .await;
    let taken = second
        .lock("kept")
        .try_lock_for(Duration::from_secs(3))
        .await
        .unwrap();
    assert!(
        taken.is_none(),
        "no second holder while the first guard says held"
    );
    assert!(!guard.is_lost());
    assert!(Relayed::exists(setup.replica.port, "kept"));
    // What was refused is free on the promoted replica: it never reached it.
    let free = second.lock("refused").try_lock().await.unwrap();
    assert!(free.is_some());
    free.unwrap().unlock().await.unwrap();
    close(second).await;
    drop(guard);
    close(holder).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unacknowledged_renewal_extends_nothing() {
    let mut setup = Relayed::start().await;
    // Renewed every second.
    let lease = Duration::from_secs(3);
    let holder = client(setup.master.url(), SYNC_ONE, lease).await;
    let guard = holder.lock("renewed").lock().await.unwrap();
    setup.relay.set(Mode::Stalled);
    let (master, replica) = (setup.master.port, setup.replica.port);
    // The primary's copy gets renewed; the replica's does not.
    let renewed = eventually(Duration::from_secs(5), || async move {
        Relayed::pttl(master, "renewed") > Relayed::pttl(replica, "renewed") + 500
    })
    .await;
    assert!(renewed, "renewed on the primary only");
    // Once the replica's copy expired, the guard must know itself lost: the replica that
    // would take over does not have the renewed expiry.
    let expired = eventually(Duration::from_secs(10), || async move {
        !Relayed::exists(replica, "renewed")
    })
    .await;
    assert!(expired, "the replica's copy expired");
    assert!(
        Relayed::exists(master, "renewed"),
        "the primary still has its renewed copy"
    );
    assert!(
        guard.is_lost(),
        "the guard believed a renewal no replica acknowledged"
    );
    tokio::time::timeout(Duration::from_secs(1), guard.lost())
        .await
        .expect("lost() fired");

    setup.fail_over().await;
    assert_free_after_failover(&setup, "renewed").await;
    drop(guard);
    close(holder).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreplicated_acquire_is_retried_within_the_wait() {
    let setup = Relayed::start().await;
    let holder = client(setup.master.url(), SYNC_ONE, LONG_LEASE).await;
    let raw = setup.master.raw().await;
    setup.relay.set(Mode::Stalled);
    // The whole budget spent unacknowledged: the typed error, after the budget, no guard.
    let started = Instant::now();
    let refused = holder
        .lock("retried")
        .try_lock_for(Duration::from_secs(2))
        .await;
    assert!(
        matches!(refused, Err(Error::NotReplicated { .. })),
        "{refused:?}"
    );
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "retried until the wait was spent: {:?}",
        started.elapsed()
    );
    // The replica comes back within the budget: the acquire gets its guard.
    let waits_before = support::command_calls(&raw)
        .await
        .get("wait")
        .copied()
        .unwrap_or(0);
    let lock = holder.lock("retried");
    let waiting = tokio::spawn(async move { lock.try_lock_for(Duration::from_secs(20)).await });
    let tried = eventually(Duration::from_secs(10), || {
        let raw = raw.clone();
        async move {
            let calls = support::command_calls(&raw).await;
            calls.get("wait").copied().unwrap_or(0) >= waits_before + 4
        }
    })
    .await;
    assert!(tried, "attempts went unacknowledged");
    assert!(!waiting.is_finished(), "still waiting, not failed");
    setup.relay.set(Mode::Open);
    let guard = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the wait ended")
        .unwrap()
        .unwrap()
        .expect("acquired once the replica acknowledged");
    assert!(Relayed::exists(setup.replica.port, "retried"));
    guard.unlock().await.unwrap();
    close(holder).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_lost_to_an_unacknowledged_renewal_is_not_revived_by_reentry() {
    let setup = Relayed::start().await;
    // Renewed every 3 s: the primary's copy outlives the guard by up to that.
    let holder = client(setup.master.url(), SYNC_ONE, Duration::from_secs(9)).await;
    let lock = holder.lock("revived");
    let guard = lock.lock().await.unwrap();
    let owner = guard.owner().to_string();
    setup.relay.set(Mode::Stalled);
    let (master, replica) = (setup.master.port, setup.replica.port);
    let renewed = eventually(Duration::from_secs(8), || async move {
        Relayed::pttl(master, "revived") > Relayed::pttl(replica, "revived") + 1000
    })
    .await;
    assert!(renewed, "renewed on the primary only");
    let lost = tokio::time::timeout(Duration::from_secs(12), guard.lost()).await;
    assert!(
        lost.is_ok(),
        "the guard is lost once its acknowledged lease ran out"
    );
    // The primary's copy lives on; the replica catches up with it.
    setup.relay.set(Mode::Open);
    assert!(
        Relayed::exists(master, "revived"),
        "the primary's copy outlived the guard"
    );
    assert!(matches!(guard.unlock().await, Err(Error::NotHeld { .. })));
    // The same owner takes the lock again: the leftover hold must not count on.
    let again = lock
        .with_owner(owner.parse().unwrap())
        .lock()
        .await
        .unwrap();
    let trimmed = eventually(Duration::from_secs(10), || {
        let owner = owner.clone();
        async move { cli(master, &["hget", "revived", &owner]).trim() == "1" }
    })
    .await;
    assert!(
        trimmed,
        "the owner's count in Redis is {}, its guards 1",
        cli(master, &["hget", "revived", &owner]).trim()
    );
    again.unlock().await.unwrap();
    assert!(!Relayed::exists(master, "revived"), "released for good");
    close(holder).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_on_an_unreplicated_baton_pass_hands_nothing_over() {
    // A release passes the lock to a parked task of the same client while the replica is cut
    // off: the pass's `WAIT` is not acknowledged, so the waiter must get no guard from it — it
    // gets the lock only once the replica acknowledges an acquire of its own. The waiter asks
    // for a fixed lease longer than what the hold has left, so the pass is the script's, not
    // the hand-off in memory (see the next test).
    let setup = Relayed::start().await;
    let holder = client(setup.master.url(), SYNC_ONE, LONG_LEASE).await;
    let lock = holder.lock("passed");
    let held = lock.lock().await.unwrap();
    let next = {
        let lock = lock.clone();
        tokio::spawn(async move {
            let guard = lock.lock_with_lease(LONG_LEASE * 2).await.unwrap();
            (Instant::now(), guard)
        })
    };
    assert!(
        eventually(Duration::from_secs(10), || async {
            lock.passable_waiters() == 1
        })
        .await,
        "the waiter parked where a release can pass it the lock"
    );

    setup.relay.set(Mode::Stalled);
    let released = held.unlock().await;
    assert!(
        matches!(released, Err(Error::NotReplicated { .. })),
        "{released:?}"
    );
    // Long enough for a waiter handed a guard to have returned it (the only way this test
    // can see a wrong hand-over); a right one keeps retrying unacknowledged meanwhile.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let reopened = Instant::now();
    setup.relay.set(Mode::Open);

    let (acquired, guard) = tokio::time::timeout(Duration::from_secs(30), next)
        .await
        .expect("the waiter gets the lock once the replica is back")
        .unwrap();
    assert!(
        acquired >= reopened,
        "the waiter was handed an unacknowledged pass ({:?} before the replica was back)",
        reopened - acquired
    );
    assert!(Relayed::exists(setup.replica.port, "passed"));
    guard.unlock().await.unwrap();
    close(holder).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_on_a_hold_handed_on_in_memory_never_outlives_the_replicated_hold() {
    // The holder's hold was acknowledged; then the replica is cut off and the hold is handed
    // to a parked task of the same client in memory. Nothing is written, so nothing waits for
    // an acknowledgement — but the new guard inherits the hold's validity, which no
    // unacknowledged renewal extends: it must know itself lost once the replica's copy has
    // expired, and after a failover to that replica another client gets the lock.
    let mut setup = Relayed::start().await;
    // Renewed every 2 s; a hand-off in memory needs more than half of it (3 s) left.
    let lease = Duration::from_secs(6);
    let holder = client(setup.master.url(), SYNC_ONE, lease).await;
    let lock = holder.lock("cohort");
    let held = lock.lock().await.unwrap();
    let acquired = tokio::time::Instant::now();
    // Read from Redis: an owner read from the guard is given out, and its hold is then never
    // handed on in memory (invariant 16, docs/DESIGN.md).
    let fields: Vec<String> = setup.master.raw().await.hkeys("cohort").await.unwrap();
    let owner = fields.concat();
    let next = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.lock().await.unwrap() })
    };
    assert!(
        eventually(Duration::from_secs(10), || async {
            lock.passable_waiters() == 1
        })
        .await,
        "the waiter parked where a release can hand it the lock"
    );
    setup.relay.set(Mode::Stalled);
    // Handed on well into the lease (with 1.5 s to spare over the half it needs), so a new
    // guard that counted its validity from the hand-off would outlive the replica's copy by
    // a margin this test can see.
    tokio::time::sleep_until(acquired + Duration::from_millis(1500)).await;
    // In memory: no script, so no `WAIT` to go unacknowledged.
    held.unlock()
        .await
        .expect("handed on in memory, nothing to acknowledge");
    let guard = tokio::time::timeout(Duration::from_secs(10), next)
        .await
        .expect("the waiter was handed the hold")
        .unwrap();
    assert_eq!(
        guard.owner().to_string(),
        owner,
        "the same hold, under the field the replica has"
    );
    let (master, replica) = (setup.master.port, setup.replica.port);
    let expired = eventually(Duration::from_secs(15), || async move {
        !Relayed::exists(replica, "cohort")
    })
    .await;
    assert!(expired, "the replica's copy expired");
    assert!(
        Relayed::exists(master, "cohort"),
        "the primary still has its (unacknowledged) renewed copy"
    );
    assert!(
        guard.is_lost(),
        "the handed guard outlived the replica's copy of its hold"
    );

    setup.fail_over().await;
    assert_free_after_failover(&setup, "cohort").await;
    drop(guard);
    close(holder).await;
}
