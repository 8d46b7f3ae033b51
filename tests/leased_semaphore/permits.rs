//! Permits: at most N held (a cluster too), wake-ups, several at once, nothing left taken.

use super::*;

#[tokio::test]
async fn a_release_wakes_a_parked_waiter() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let a = client(&server.url()).await;
    let b = client(&server.url()).await;
    let sem = a.leased_semaphore("wake");
    sem.try_set_permits(1).await.unwrap();
    let held = sem.acquire().await.unwrap();
    let waiter = b
        .leased_semaphore("wake")
        .with_recheck_interval(NO_RECHECK)
        .unwrap();
    let before = support::script_calls(&raw).await;
    let task = tokio::spawn(async move { waiter.acquire().await });
    support::parked_fresh(&raw, "redisson_sc:{wake}", before).await;
    let released_at = Instant::now();
    held.release().await.unwrap();
    let permit = tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .expect("woken by the release message")
        .unwrap()
        .unwrap();
    assert!(released_at.elapsed() < NO_RECHECK / 4);
    permit.release().await.unwrap();
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

const PERMITS: i64 = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_n_permits_are_held_at_any_instant() {
    let server = RedisServer::start();
    at_most_n_holders(&server.url(), "contended").await;
}

/// On a 3-primary cluster, permits of names in different slots are renewed by the watchdog
/// (its batches are per slot), and a contention run stays within N holders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_permits_are_renewed_and_stay_within_n() {
    let cluster = support::cluster::RedisCluster::start(3, 0);
    let url = cluster.url();
    let names = ["renewed-a", "renewed-b", "{tag}:renewed"];
    let slots: std::collections::HashSet<u16> = names
        .iter()
        .map(|name| fred::util::redis_keyslot(name.as_bytes()))
        .collect();
    assert!(slots.len() > 1, "the names share a slot: vacuous");
    futures::future::join_all(names.iter().map(|name| watchdog_keeps_a_permit(&url, name))).await;
    at_most_n_holders(&url, "{tag}:contended").await;
}

/// Takes a permit in one of four styles: a bounded wait retried, a fixed lease, two permits
/// at once, the plain acquire.
async fn acquire_in_style(sem: &LeasedSemaphore, style: usize) -> redbaton::LeasedPermit {
    match style {
        0 => loop {
            let wait = Duration::from_millis(fastrand::u64(1..50));
            if let Some(p) = sem.try_acquire_for(wait).await.unwrap() {
                break p;
            }
        },
        1 => sem
            .acquire_with_lease(Duration::from_secs(60))
            .await
            .unwrap(),
        2 => sem.acquire_many(2).await.unwrap(),
        _ => sem.acquire().await.unwrap(),
    }
}

/// Holds `permit` a few milliseconds, counted in `in_use` (never above `PERMITS`) and logged
/// in `history` as (from, to, permits).
async fn hold_counted(
    permit: &redbaton::LeasedPermit,
    history: &Mutex<Vec<(Instant, Instant, i64)>>,
    in_use: &AtomicI64,
) {
    let permits = i64::from(permit.permits());
    let from = Instant::now();
    let now = in_use.fetch_add(permits, Ordering::SeqCst) + permits;
    assert!(now <= PERMITS, "{now} permits in use");
    tokio::time::sleep(Duration::from_millis(fastrand::u64(0..4))).await;
    in_use.fetch_sub(permits, Ordering::SeqCst);
    history
        .lock()
        .unwrap()
        .push((from, Instant::now(), permits));
}

/// Twelve tasks on three clients take and release permits of `name` (N = 3) 20 times each,
/// in every acquire style; a history check proves no instant had more than N holders.
async fn at_most_n_holders(url: &str, name: &str) {
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(client(url).await);
    }
    clients[0]
        .leased_semaphore(name)
        .try_set_permits(PERMITS as u32)
        .await
        .unwrap();
    let history = Arc::new(Mutex::new(Vec::<(Instant, Instant, i64)>::new()));
    let in_use = Arc::new(AtomicI64::new(0));
    let mut tasks = Vec::new();
    for client in &clients {
        for t in 0..4 {
            let sem = client.leased_semaphore(name);
            let (history, in_use) = (history.clone(), in_use.clone());
            tasks.push(tokio::spawn(async move {
                for round in 0..20 {
                    let permit = acquire_in_style(&sem, (t + round) % 3).await;
                    hold_counted(&permit, &history, &in_use).await;
                    permit.release().await.unwrap();
                }
            }));
        }
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(120), task)
            .await
            .expect("the contention run finishes")
            .unwrap();
    }
    // History check: every hold interval lies inside the permit's real hold, so overlaps
    // seen really happened.
    let history = std::mem::take(&mut *history.lock().unwrap());
    assert_eq!(history.len(), 3 * 4 * 20);
    let most = max_held(&history, PERMITS);
    assert_eq!(most, PERMITS, "never every permit at once: vacuous");
    let sem = clients[0].leased_semaphore(name);
    assert_eq!(sem.available_permits().await.unwrap(), PERMITS);
    assert_eq!(sem.acquired_permits().await.unwrap(), 0);
    for client in clients {
        client.shutdown().await.unwrap();
    }
}

/// Contenders that share one task — futures joined, not spawned — on two clients of one
/// process stay within N holders too (invariant 14 of docs/DESIGN.md: a shared task is no shared
/// holder; the holds registry must not take a second permit of this task for the first), in every
/// acquire style, several permits at once among them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contenders_joined_in_one_task_stay_within_n() {
    let server = RedisServer::start();
    let (a, b) = (client(&server.url()).await, client(&server.url()).await);
    a.leased_semaphore("joined")
        .try_set_permits(PERMITS as u32)
        .await
        .unwrap();
    let history = Mutex::new(Vec::new());
    let in_use = AtomicI64::new(0);
    let contender = |sem: LeasedSemaphore, c: usize| {
        let (history, in_use) = (&history, &in_use);
        async move {
            for round in 0..15 {
                let permit = acquire_in_style(&sem, (c + round) % 4).await;
                hold_counted(&permit, history, in_use).await;
                permit.release().await.unwrap();
            }
        }
    };
    let contenders = (0..6).map(|c| {
        let client = if c % 2 == 0 { &a } else { &b };
        contender(client.leased_semaphore("joined"), c)
    });
    tokio::time::timeout(
        Duration::from_secs(120),
        futures::future::join_all(contenders),
    )
    .await
    .expect("the contention run finishes");
    let history = history.into_inner().unwrap();
    assert_eq!(history.len(), 6 * 15);
    assert_eq!(
        max_held(&history, PERMITS),
        PERMITS,
        "never every permit at once: vacuous"
    );
    let sem = a.leased_semaphore("joined");
    assert_eq!(sem.available_permits().await.unwrap(), PERMITS);
    assert_eq!(sem.acquired_permits().await.unwrap(), 0);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_acquires_and_dropped_permits_leave_nothing_taken() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let proxy = Proxy::start(server.port).await;
    let slow = Client::builder()
        .url(proxy.url())
        .command_timeout(Duration::from_millis(1000))
        .connect()
        .await
        .unwrap();
    let sem = slow.leased_semaphore("slow");
    sem.try_set_permits(3).await.unwrap();

    // Round trips whose callers left: one timed out, one dropped.
    // A second client for the dropped acquire, connected while replies are prompt.
    let other = Client::builder()
        .url(proxy.url())
        .command_timeout(Duration::from_millis(1000))
        .connect()
        .await
        .unwrap();
    proxy.set(Mode::RepliesDelayed(Duration::from_millis(1300)));
    let timed_out = sem.try_acquire().await;
    assert!(matches!(timed_out, Err(Error::Timeout(_))), "{timed_out:?}");
    // The second is dropped once its script has run on the server, or it times out. It goes
    // through a client of its own: one client's scripts travel one group at a time, so behind
    // the first's slow reply it could be cut (or time out) before it was even sent.
    let both_ran = || async { get(&raw, "slow").await.as_deref() == Some("1") };
    let other_sem = other.leased_semaphore("slow");
    tokio::select! {
        outcome = other_sem.acquire() => {
            assert!(matches!(outcome, Err(Error::Timeout(_))), "{outcome:?}")
        }
        ran = eventually(Duration::from_secs(10), both_ran) => {
            assert!(ran, "both acquires ran on the server")
        }
    }
    assert!(
        eventually(Duration::from_secs(10), both_ran).await,
        "both acquires ran on the server"
    );
    proxy.set(Mode::Open);
    assert!(
        eventually(Duration::from_secs(20), || async {
            get(&raw, "slow").await.as_deref() == Some("3")
        })
        .await,
        "the abandoned acquires released their permits"
    );

    // A dropped permit is released in the background; so is one whose client shuts down.
    let fast = client(&server.url()).await;
    let sem = fast.leased_semaphore("slow");
    drop(sem.acquire().await.unwrap());
    let _kept = sem.acquire().await.unwrap();
    fast.shutdown().await.unwrap();
    assert!(
        eventually(Duration::from_secs(10), || async {
            get(&raw, "slow").await.as_deref() == Some("3")
        })
        .await
    );
    let left: i64 = raw.zcard("{slow}:timeout").await.unwrap();
    assert_eq!(left, 0);
    slow.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_permits_are_taken_together_as_redisson_takes_them() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = lease_client(&server.url(), Duration::from_secs(3)).await;
    let sem = client.leased_semaphore("batch");
    sem.try_set_permits(5).await.unwrap();

    // Three at once: three ids, one score (the same lease), the counter down by three.
    let three = sem.acquire_many(3).await.unwrap();
    let ids = three.ids();
    assert_eq!((ids.len(), three.permits()), (3, 3));
    assert_eq!(three.id(), ids[0]);
    assert!(ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2]);
    assert_eq!(get(&raw, "batch").await.as_deref(), Some("2"));
    let members = taken(&raw, sem.timeout_key()).await;
    assert_eq!(members.len(), 3);
    for id in &ids {
        assert!(
            members
                .iter()
                .any(|(member, _)| member[..] == id.as_bytes()[..]),
            "{id} is a member, as 16 raw bytes"
        );
    }
    assert!(members.iter().all(|(_, score)| *score == members[0].1));

    // All or none: three are not free, nothing is taken.
    assert!(sem.try_acquire_many(3).await.unwrap().is_none());
    assert_eq!(get(&raw, "batch").await.as_deref(), Some("2"));
    assert_eq!(taken(&raw, sem.timeout_key()).await.len(), 3);

    // A Java peer takes the last two, several at once too; a waiter for two waits, and gets
    // two when the three are given back.
    let peer_ids = [[1u8; 16], [2u8; 16]];
    let reply = peer_acquire(&raw, &sem, &peer_ids, Some(Duration::from_secs(600))).await;
    assert_eq!(reply.as_str().as_deref(), Some("OK"));
    let waiter = {
        let sem = sem.with_recheck_interval(NO_RECHECK).unwrap();
        tokio::spawn(async move { sem.try_acquire_many_for(2, Duration::from_secs(60)).await })
    };
    assert!(
        eventually(Duration::from_secs(10), || async {
            numsub(&raw, "redisson_sc:{batch}").await == 1
        })
        .await
    );
    three.release().await.unwrap();
    let two = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("woken by the release")
        .unwrap()
        .unwrap()
        .expect("two permits");
    assert_eq!(two.permits(), 2);
    assert_eq!(get(&raw, "batch").await.as_deref(), Some("1"));
    assert_eq!(peer_release(&raw, &sem, &peer_ids[0]).await, 1);
    assert_eq!(sem.available_permits().await.unwrap(), 2);

    // The watchdog renews them together, past several leases.
    let renewed = server_ms(&raw).await + 5_000;
    assert!(
        eventually(Duration::from_secs(30), || async {
            let members = taken(&raw, sem.timeout_key()).await;
            two.ids().iter().all(|id| {
                members
                    .iter()
                    .any(|(m, score)| m[..] == id.as_bytes()[..] && *score > renewed)
            })
        })
        .await,
        "both permits renewed past {renewed}"
    );
    assert!(!two.is_lost());

    // One of them released by its id: the hold is lost, and the other one comes back when
    // its lease ends.
    assert!(sem.release_id(&two.ids()[1]).await.unwrap());
    tokio::time::timeout(Duration::from_secs(30), two.lost())
        .await
        .expect("the pair is lost once one of them is gone");
    assert!(
        eventually(Duration::from_secs(30), || async {
            sem.acquired_permits().await.unwrap() == 1
        })
        .await,
        "only the peer's second permit is left taken"
    );
    assert_eq!(sem.available_permits().await.unwrap(), 4);
    assert!(matches!(two.release().await, Err(Error::NotHeld { .. })));

    // A fixed lease for several: back when it ends.
    let leased = sem
        .try_acquire_many_with_lease(4, Duration::ZERO, Duration::from_secs(1))
        .await
        .unwrap()
        .expect("four free");
    assert_eq!(sem.acquired_permits().await.unwrap(), 5);
    assert!(
        eventually(Duration::from_secs(30), || async {
            sem.available_permits().await.unwrap() == 4
        })
        .await,
        "the four came back with their lease"
    );
    drop(leased);

    // Bad input: typed errors, nothing sent.
    for n in [0, MAX_PERMITS_AT_ONCE + 1] {
        let refused = sem.try_acquire_many(n).await;
        assert!(
            matches!(refused, Err(Error::InvalidArgument(_))),
            "{n}: {refused:?}"
        );
        let refused = sem.acquire_many(n).await;
        assert!(
            matches!(refused, Err(Error::InvalidArgument(_))),
            "{n}: {refused:?}"
        );
    }
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_released_permit_passes_a_larger_waiter_to_a_smaller_one() {
    // Two permits, held one by one. A waiter for two parks first, a waiter for one after
    // it, both in one process: a release ("1") wakes the first, which cannot use it and
    // passes the wake-up on; the second takes the permit at once, not at its recheck.
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = quiet_client(&server.url()).await;
    let sem = client
        .leased_semaphore("behind")
        .with_recheck_interval(NO_RECHECK)
        .unwrap();
    sem.try_set_permits(2).await.unwrap();
    let first = sem.acquire().await.unwrap();
    let _second = sem.acquire().await.unwrap();
    let quiet = Duration::from_millis(500);
    let big = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.acquire_many(2).await })
    };
    assert!(
        eventually(Duration::from_secs(10), || async {
            numsub(&raw, "redisson_sc:{behind}").await == 1
        })
        .await
    );
    settled_calls(&raw, "evalsha", quiet, Duration::from_secs(30)).await;
    let small = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.acquire().await })
    };
    settled_calls(&raw, "evalsha", quiet, Duration::from_secs(30)).await;
    first.release().await.unwrap();
    let permit = tokio::time::timeout(Duration::from_secs(20), small)
        .await
        .expect("the smaller waiter got the permit by the passed wake-up")
        .unwrap()
        .unwrap();
    assert_eq!(permit.permits(), 1);
    assert!(!big.is_finished());
    big.abort();
    client.shutdown().await.unwrap();
}

/// `set_permits` changes the total of a live leased semaphore: the permits taken stay
/// counted, those whose lease ended do not (reclaimed first); `permits_taken` lists what is
/// held, with the lease left (issue 39).
#[tokio::test]
async fn set_permits_changes_the_total_counting_live_leases_only() {
    let server = RedisServer::start();
    let client = client(&server.url()).await;
    let sem = client.leased_semaphore("pool");
    assert!(sem.try_set_permits(4).await.unwrap());
    let held = sem.acquire_many(2).await.unwrap();
    let short = sem
        .acquire_with_lease(Duration::from_millis(100))
        .await
        .unwrap();
    assert_eq!(sem.set_permits(6).await.unwrap(), 3, "6 in total, 3 taken");
    let listed = sem.permits_taken(10).await.unwrap();
    assert_eq!(listed.len(), 3, "{listed:?}");
    for id in held.ids() {
        let (_, left) = listed
            .iter()
            .find(|(listed, _)| *listed == id)
            .expect("listed");
        let left = left.expect("a lease");
        assert!(
            left > Duration::from_secs(5) && left <= Duration::from_secs(30),
            "{left:?}"
        );
    }
    tokio::time::timeout(Duration::from_secs(10), short.lost())
        .await
        .expect("the short lease ends");
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The ended lease is reclaimed, not counted.
    assert_eq!(sem.set_permits(3).await.unwrap(), 1, "3 in total, 2 taken");
    assert_eq!(sem.permits_taken(10).await.unwrap().len(), 2);
    assert_eq!(sem.permits_taken(1).await.unwrap().len(), 1);
    assert_eq!(sem.set_permits(1).await.unwrap(), -1);
    held.release().await.unwrap();
    assert_eq!(sem.available_permits().await.unwrap(), 1);
    assert!(matches!(
        sem.set_permits(u32::MAX).await,
        Err(Error::InvalidArgument(_))
    ));
    client.shutdown().await.unwrap();
}
