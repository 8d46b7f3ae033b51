//! Sentinel: one master, one replica, three sentinels, started by the test. The master is
//! killed while a lock is held and others wait: the clients follow the promoted replica, the
//! waiters get the lock, and the holder's guard reports lost when the hold did not reach the
//! replica (Redis replicates asynchronously).

use testkit as support;

use std::time::{Duration, Instant};

use fred::interfaces::ClientLike;
use redbaton::{Client, Error};
use support::cluster::cli;
use support::sentinel::SentinelSetup;
use support::{command_calls, eventually};

/// A watchdog lease longer than a Sentinel failover's renewal gap.
const LONG_LEASE: Duration = Duration::from_secs(12);

async fn client(setup: &SentinelSetup) -> Client {
    client_with_lease(setup, Duration::from_secs(3)).await
}

async fn client_with_lease(setup: &SentinelSetup, lease: Duration) -> Client {
    Client::builder()
        .url(setup.url())
        .watchdog_lease(lease)
        .command_timeout(Duration::from_secs(2))
        .reconnect_max_delay(Duration::from_millis(500))
        .connect()
        .await
        .unwrap()
}

/// Kills the master and waits until every sentinel names the replica as the new master.
fn fail_over(setup: &mut SentinelSetup) {
    let old = setup.master.port;
    setup.master.kill();
    let start = Instant::now();
    while setup.master_port() != Some(setup.replica.port) {
        assert!(
            start.elapsed() < Duration::from_secs(40),
            "sentinels did not promote the replica (still {old})"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("promoted after {:?}", start.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_connects_through_sentinels_to_the_master() {
    let setup = SentinelSetup::start();
    let c = client(&setup).await;
    let guard = c.lock("via-sentinel").lock().await.unwrap();
    let on_master = cli(setup.master.port, &["exists", "via-sentinel"]);
    assert_eq!(on_master.trim(), "1", "the hold is on the master");
    guard.unlock().await.unwrap();
    // A URL naming an unknown service is refused with a typed error, not a panic.
    let bad = setup.url().replace("mymaster", "nosuchmaster");
    let err = Client::builder()
        .url(bad)
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Connection(_)), "{err:?}");
    c.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicated_hold_survives_master_death_and_waiters_follow() {
    let mut setup = SentinelSetup::start();
    // The failover takes about 2.5 s plus a reconnect. A hold survives it only if the lease
    // outlasts the renewal gap around it (up to a renewal period before the kill, the outage,
    // and a period after it): with 12 s the period is 4 s, longer than the outage.
    let holder = client_with_lease(&setup, LONG_LEASE).await;
    let waiter = client(&setup).await;
    // The hold reaches the replica before the master dies only because the library waits for
    // it (the default replica sync sends WAIT after the script, before handing out the guard):
    // the test sends none of its own.
    let master = setup.master.raw().await;
    let waits = || async {
        command_calls(&master)
            .await
            .get("wait")
            .copied()
            .unwrap_or(0)
    };
    let waits_before = waits().await;
    let guard = holder.lock("survivor").lock().await.unwrap();
    assert!(
        waits().await > waits_before,
        "the acquire was handed out without a WAIT"
    );
    // Not left reconnecting to the master about to be killed.
    let _ = master.quit().await;
    let lock = waiter.lock("survivor");
    let parked = tokio::spawn(async move {
        let guard = lock.lock().await.unwrap();
        let woke = Instant::now();
        guard.unlock().await.unwrap();
        woke
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    fail_over(&mut setup);
    // The hold is renewed on the new master: its PTTL, which only falls without a renewal,
    // goes back up. Bounded by the lease (a hold never renewed would be gone by then).
    let pttl = || -> i64 {
        cli(setup.replica.port, &["pttl", "survivor"])
            .trim()
            .parse()
            .unwrap()
    };
    let promoted_pttl = pttl();
    let renewed_at = Instant::now();
    let mut last = promoted_pttl;
    while last <= promoted_pttl {
        assert!(
            renewed_at.elapsed() < LONG_LEASE,
            "not renewed on the promoted replica: pttl {last} (was {promoted_pttl})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        last = pttl();
    }
    eprintln!(
        "renewed on the new master {:?} after the promotion: pttl {promoted_pttl} -> {last}",
        renewed_at.elapsed()
    );
    assert!(!guard.is_lost(), "the replicated hold survived");
    assert!(!parked.is_finished(), "exclusion held across the failover");
    assert_eq!(
        cli(setup.replica.port, &["exists", "survivor"]).trim(),
        "1",
        "the hold is on the promoted replica"
    );
    let released = Instant::now();
    guard.unlock().await.unwrap();
    let woke = tokio::time::timeout(Duration::from_secs(20), parked)
        .await
        .expect("the waiter hung")
        .unwrap();
    let delay = woke.saturating_duration_since(released);
    eprintln!("waiter woken {delay:?} after the release on the new master");
    assert!(
        delay < Duration::from_secs(2),
        "woken by the message, not its lease: {delay:?}"
    );
    holder.shutdown().await.unwrap();
    waiter.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreplicated_hold_is_lost_and_the_guard_says_so() {
    // With replica sync off: the hazard replica sync exists for, made visible.
    let mut setup = SentinelSetup::start();
    let unsynced = |setup: &SentinelSetup, lease: Duration| {
        Client::builder()
            .url(setup.url())
            .watchdog_lease(lease)
            .command_timeout(Duration::from_secs(2))
            .reconnect_max_delay(Duration::from_millis(500))
            .replica_sync(redbaton::ReplicaSync::Off)
            .connect()
    };
    let holder = unsynced(&setup, Duration::from_secs(3)).await.unwrap();
    // The waiter rides out connection errors for one lease: longer than a failover takes on
    // a loaded machine.
    let waiter = unsynced(&setup, Duration::from_secs(15)).await.unwrap();
    // Cut the replica off before the lock is taken: existing connections stay authenticated,
    // the replica cannot resync, so the hold never reaches it (the asynchronous-replication
    // window, made wide and deterministic).
    let master = setup.master.port;
    assert!(cli(master, &["config", "set", "requirepass", "cut-off"]).contains("OK"));
    // The kill goes through redis-cli with the new password: a fresh connection, as
    // `holder.redis()` (connected on first use) would be, must authenticate now.
    let killed = cli(
        master,
        &[
            "-a",
            "cut-off",
            "--no-auth-warning",
            "client",
            "kill",
            "type",
            "replica",
        ],
    );
    assert!(
        killed.trim().parse::<u32>().is_ok_and(|n| n >= 1),
        "{killed}"
    );
    let guard = holder.lock("doomed").lock().await.unwrap();
    let lock = waiter.lock("doomed");
    let parked = tokio::spawn(async move {
        let start = Instant::now();
        let guard = lock.lock().await.unwrap();
        (start.elapsed(), guard)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!parked.is_finished());
    fail_over(&mut setup);
    // The waiter gets the lock on the promoted replica, which never saw the hold ...
    let (waited, waiter_guard) = tokio::time::timeout(Duration::from_secs(30), parked)
        .await
        .expect("the waiter hung")
        .unwrap();
    eprintln!("waiter acquired after {waited:?}");
    // ... and the holder is told: its next renewal finds the hold gone.
    tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the holder's guard reports lost");
    assert!(guard.is_lost());
    assert!(matches!(guard.unlock().await, Err(Error::NotHeld { .. })));
    assert!(!waiter_guard.is_lost());
    waiter_guard.unlock().await.unwrap();
    // The holder follows the failover: connected to the new master, waited for with a bound
    // (the old master's restart as a replica may send it through one more reconnection).
    let reconnected = eventually(Duration::from_secs(20), || async {
        holder.redis().is_connected()
    })
    .await;
    assert!(
        reconnected,
        "the holder's client is connected after the failover"
    );
    holder.shutdown().await.unwrap();
    waiter.shutdown().await.unwrap();
}
