//! The baton pass: a release handing the lock straight to the next parked task of the same
//! client, in one script, with no unlock message — and each of its safety rules.
//!
//! A hold is handed on in memory instead when it can be (see `tests/cohort.rs`): the waiters
//! here ask for a fixed lease longer than what a watchdog hold has left, [`PAST_WATCHDOG`],
//! which only the script can give them.

use testkit as support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use parking_lot::Mutex;
use redbaton::{Client, Error, Lock, LockGuard};
use support::monitor::ScriptRuns;
use support::passing::{calls, client, fields, joined, parked};
use support::proxy::{Mode, Proxy};
use support::{command, eventually, numsub, RedisServer, RENEWED_LEASE};

const BOUND: Duration = Duration::from_secs(10);

/// A fixed lease longer than the 30 s watchdog lease: a waiter asking for it is passed the
/// lock by the script, never handed the releaser's hold in memory.
const PAST_WATCHDOG: Duration = Duration::from_secs(60);

/// A task that waits for `lock` and returns its guard.
fn waiter(lock: &Lock) -> tokio::task::JoinHandle<LockGuard> {
    let lock = lock.clone();
    tokio::spawn(async move { lock.lock_with_lease(PAST_WATCHDOG).await.unwrap() })
}

#[tokio::test]
async fn a_release_passes_the_lock_to_a_parked_task_in_one_script_without_a_message() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    // Scripts run, not calls: an attempt of the waiter's could travel in one call with the
    // pass.
    let runs = ScriptRuns::start(&server, &raw).await;
    let client = client(&server, 8).await;
    let lock = client.lock("baton:one");
    let held = lock.lock().await.unwrap();
    let next = waiter(&lock);
    parked(&lock, 1).await;

    let (publishes, scripts) = (calls(&raw, "publish").await, runs.count().await);
    held.unlock().await.unwrap();
    let guard = joined(next).await;

    assert_eq!(
        calls(&raw, "publish").await,
        publishes,
        "no unlock message was sent"
    );
    assert_eq!(
        runs.count().await,
        scripts + 1,
        "the pass was the only script: the waiter made no attempt of its own"
    );
    let owner = guard.owner().to_string();
    assert_eq!(
        fields(&raw, "baton:one").await,
        HashMap::from([(owner, 1)]),
        "the waiter holds it, once, alone"
    );
    let ttl = lock.remaining_ttl().await.unwrap().unwrap();
    assert!(
        ttl > Duration::from_secs(40),
        "the waiter's own lease: {ttl:?}"
    );
    assert!(!guard.is_lost());
    guard.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());
    assert!(
        eventually(BOUND, || async { numsub(&raw, lock.channel()).await == 0 }).await,
        "no subscription outlives the last waiter served by a pass"
    );
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn local_waiters_are_served_in_the_order_they_parked() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server, 8).await;
    let lock = client.lock("baton:order");
    let held = lock.lock().await.unwrap();
    let served = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..5 {
        let (task_lock, served) = (lock.clone(), served.clone());
        tasks.push(tokio::spawn(async move {
            let guard = task_lock.lock_with_lease(PAST_WATCHDOG).await.unwrap();
            served.lock().push(i);
            tokio::time::sleep(Duration::from_millis(5)).await;
            guard.unlock().await.unwrap();
        }));
        parked(&lock, i + 1).await;
    }
    let publishes = calls(&raw, "publish").await;
    held.unlock().await.unwrap();
    for task in tasks {
        joined(task).await;
    }
    assert_eq!(*served.lock(), vec![0, 1, 2, 3, 4]);
    assert_eq!(
        calls(&raw, "publish").await,
        publishes + 1,
        "five passes, then one ordinary release once nobody waits"
    );
    assert!(!lock.is_locked().await.unwrap());
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn after_the_configured_passes_in_a_row_a_release_is_an_ordinary_one() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server, 2).await;
    let lock = client.lock("baton:bound");
    let held = lock.lock().await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..4 {
        tasks.push(lock_and_unlock(&lock));
        parked(&lock, i + 1).await;
    }
    let publishes = calls(&raw, "publish").await;
    held.unlock().await.unwrap();
    for task in tasks {
        joined(task).await;
    }
    // Passed twice, then released with a message (the third waiter takes it by itself),
    // passed once more, and released with a message when nobody waits.
    assert_eq!(calls(&raw, "publish").await, publishes + 2);
    client.shutdown().await.unwrap();
}

/// A task that waits for `lock` and releases it at once.
fn lock_and_unlock(lock: &Lock) -> tokio::task::JoinHandle<()> {
    let lock = lock.clone();
    tokio::spawn(async move { lock.lock().await.unwrap().unlock().await.unwrap() })
}

#[tokio::test]
async fn with_passes_off_every_release_publishes() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server, 0).await;
    let lock = client.lock("baton:off");
    let held = lock.lock().await.unwrap();
    let tasks: Vec<_> = (0..2).map(|_| lock_and_unlock(&lock)).collect();
    assert!(eventually(BOUND, || async { numsub(&raw, lock.channel()).await == 1 }).await);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(lock.passable_waiters(), 0, "no waiter is passable");
    let publishes = calls(&raw, "publish").await;
    held.unlock().await.unwrap();
    for task in tasks {
        joined(task).await;
    }
    assert_eq!(calls(&raw, "publish").await, publishes + 3);
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_waiter_of_another_client_makes_the_release_an_ordinary_one() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let other = client(&server, 8).await;
    let client = client(&server, 8).await;
    // `other`: its own subscriber connection, as another process would have.
    let lock = client.lock("baton:foreign");
    let held = lock.lock().await.unwrap();
    // Each holds it until the messages are counted, so the one counted is the first release's.
    let (counted, may_release) = tokio::sync::watch::channel(false);
    let hold_until_counted = |lock: Lock| {
        let mut may_release = may_release.clone();
        tokio::spawn(async move {
            let guard = lock.lock_with_lease(PAST_WATCHDOG).await.unwrap();
            may_release.wait_for(|counted| *counted).await.unwrap();
            guard.unlock().await.unwrap();
        })
    };
    let local = hold_until_counted(lock.clone());
    parked(&lock, 1).await;
    let foreign = hold_until_counted(other.lock("baton:foreign"));
    assert!(
        eventually(BOUND, || async { numsub(&raw, lock.channel()).await == 2 }).await,
        "the other client's waiter subscribed"
    );
    let publishes = calls(&raw, "publish").await;
    held.unlock().await.unwrap();
    assert_eq!(
        calls(&raw, "publish").await,
        publishes + 1,
        "released with the unlock message, for the other client's waiter"
    );
    counted.send(true).unwrap();
    joined(local).await;
    joined(foreign).await;
    client.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_releaser_that_no_longer_holds_gets_not_held_and_writes_nothing() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server, 8).await;
    let lock = client.lock("baton:gone");
    let held = lock.lock().await.unwrap();
    let next = waiter(&lock);
    parked(&lock, 1).await;
    // Someone else holds it now (say the lease ran out and another owner took it).
    let _: i64 = raw.del("baton:gone").await.unwrap();
    let _: i64 = raw.hset("baton:gone", ("other:1", 1)).await.unwrap();
    let _: bool = raw.pexpire("baton:gone", 30_000, None).await.unwrap();

    let e = held.unlock().await.unwrap_err();
    assert!(matches!(e, Error::NotHeld { .. }), "{e:?}");
    assert_eq!(
        fields(&raw, "baton:gone").await,
        HashMap::from([("other:1".to_owned(), 1)]),
        "nothing was written"
    );
    parked(&lock, 1).await;
    assert!(!next.is_finished(), "the waiter was not handed a lock");

    let _: i64 = raw.del("baton:gone").await.unwrap();
    let _: i64 = raw.publish(lock.channel(), "0").await.unwrap();
    joined(next).await.unlock().await.unwrap();
    client.shutdown().await.unwrap();
}

/// Whether `lock` is free within 5 s: a hold released by the client is, one left to its
/// 30 s lease is not.
async fn freed_well_before_its_lease(lock: &Lock) -> bool {
    eventually(Duration::from_secs(5), || async {
        !lock.is_locked().await.unwrap()
    })
    .await
}

/// Releases `held` while the server holds every write (scripts included; reads still run),
/// waits until its pass has claimed the first parked waiter (`left` waiters stay claimable),
/// cancels that waiter, and only then lets the pass run.
async fn cancel_the_claimed_waiter(
    raw: &fred::clients::Client,
    lock: &Lock,
    held: LockGuard,
    chosen: tokio::task::JoinHandle<LockGuard>,
    left: usize,
) {
    // Far longer than any wait below: it ends by the UNPAUSE, not by time.
    let pause = vec!["PAUSE".into(), "60000".into(), "WRITE".into()];
    command(raw, "CLIENT", pause).await;
    let release = tokio::spawn(held.unlock());
    // Claimed: no longer claimable, its pass waiting on the paused server.
    parked(lock, left).await;
    chosen.abort();
    assert!(chosen.await.unwrap_err().is_cancelled());
    command(raw, "CLIENT", vec!["UNPAUSE".into()]).await;
    release.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_chosen_waiter_cancelled_while_the_pass_is_in_flight_leaves_no_hold() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server, 8).await;
    let lock = client.lock("baton:cancelled");
    let held = lock.lock().await.unwrap();
    let chosen = waiter(&lock);
    parked(&lock, 1).await;

    cancel_the_claimed_waiter(&raw, &lock, held, chosen, 0).await;

    assert!(
        freed_well_before_its_lease(&lock).await,
        "the hold passed to the cancelled waiter was released at once, not left to its 30 s lease"
    );
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_hold_passed_to_a_cancelled_waiter_goes_on_to_the_next() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server, 8).await;
    let lock = client.lock("baton:onwards");
    let held = lock.lock().await.unwrap();
    let chosen = waiter(&lock);
    parked(&lock, 1).await;
    let next = waiter(&lock);
    parked(&lock, 2).await;

    cancel_the_claimed_waiter(&raw, &lock, held, chosen, 1).await;

    let guard = joined(next).await;
    assert_eq!(
        fields(&raw, "baton:onwards").await,
        HashMap::from([(guard.owner().to_string(), 1)])
    );
    guard.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());
    client.shutdown().await.unwrap();
}

/// A client behind `proxy` with one task holding `name` and one parked on it.
async fn held_with_a_parked_waiter(
    proxy: &Proxy,
    name: &str,
) -> (Client, Lock, LockGuard, tokio::task::JoinHandle<LockGuard>) {
    let client = Client::builder()
        .url(proxy.url())
        .command_timeout(Duration::from_secs(1))
        .reconnect_max_delay(Duration::from_millis(100))
        .connect()
        .await
        .unwrap();
    let lock = client.lock(name);
    let held = lock.lock().await.unwrap();
    let next = waiter(&lock);
    parked(&lock, 1).await;
    (client, lock, held, next)
}

/// Releases `held` so that its pass runs on the server but the reply is lost: the claimed
/// waiter `next` holds the lock in Redis and has been handed nothing.
async fn pass_unheard(
    raw: &fred::clients::Client,
    proxy: &Proxy,
    lock: &Lock,
    held: LockGuard,
    next: &tokio::task::JoinHandle<LockGuard>,
) {
    let releaser = held.owner().to_string();
    proxy.set(Mode::RepliesLost);
    let outcome = held.unlock().await;
    assert!(matches!(outcome, Err(Error::Timeout(_))), "{outcome:?}");
    assert!(
        eventually(BOUND, || async {
            let now = fields(raw, lock.name()).await;
            now.len() == 1 && !now.contains_key(&releaser)
        })
        .await,
        "the pass ran on the server"
    );
    assert!(!next.is_finished(), "the waiter was handed nothing");
}

/// Breaks the connection with the pass's reply still awaited (its outcome is now unknown
/// to the client), then lets the client reconnect.
async fn break_and_reopen(proxy: &Proxy) {
    proxy.set(Mode::Cut);
    tokio::time::sleep(Duration::from_millis(100)).await;
    proxy.set(Mode::Open);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_of_unknown_outcome_is_settled_and_the_waiter_served_once() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let proxy = Proxy::start(server.port).await;
    let (client, lock, held, next) = held_with_a_parked_waiter(&proxy, "baton:unknown").await;
    pass_unheard(&raw, &proxy, &lock, held, &next).await;
    break_and_reopen(&proxy).await;

    let guard = joined(next).await;
    assert_eq!(
        fields(&raw, "baton:unknown").await,
        HashMap::from([(guard.owner().to_string(), 1)]),
        "the waiter holds it alone, counted once"
    );
    guard.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap(), "one unlock freed it");
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_of_unknown_outcome_leaves_no_hold_for_a_waiter_that_left() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let proxy = Proxy::start(server.port).await;
    let (client, lock, held, next) = held_with_a_parked_waiter(&proxy, "baton:unknown-left").await;
    pass_unheard(&raw, &proxy, &lock, held, &next).await;
    // Nobody will unlock the hold the pass wrote: only the client's settle of the unknown
    // outcome can end it before its 30 s lease.
    next.abort();
    assert!(next.await.unwrap_err().is_cancelled());
    break_and_reopen(&proxy).await;

    assert!(
        freed_well_before_its_lease(&lock).await,
        "the hold written for the waiter that left was released, not left to its lease"
    );
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_passed_waiter_gets_its_own_fixed_lease() {
    let server = RedisServer::start();
    let client = client(&server, 8).await;
    let lock = client.lock("baton:fixed");
    let held = lock.lock().await.unwrap();
    let next = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.lock_with_lease(PAST_WATCHDOG).await.unwrap() })
    };
    parked(&lock, 1).await;
    held.unlock().await.unwrap();
    let guard = joined(next).await;
    let ttl = lock.remaining_ttl().await.unwrap().unwrap();
    assert!(
        ttl <= PAST_WATCHDOG && ttl > Duration::from_secs(40),
        "the waiter's 60 s lease, not the releaser's 30 s: {ttl:?}"
    );
    guard.unlock().await.unwrap();
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_passed_watchdog_hold_is_renewed_and_reenters_from_one() {
    let server = RedisServer::start();
    let client = Client::builder()
        .url(server.url())
        .watchdog_lease(RENEWED_LEASE)
        .connect()
        .await
        .unwrap();
    let lock = client.lock("baton:renewed");
    let held = lock.lock().await.unwrap();
    let next = {
        let lock = lock.clone();
        tokio::spawn(async move {
            let guard = lock.lock().await.unwrap();
            let owned = lock.with_owner(guard.owner());
            let first = owned.hold_count().await.unwrap();
            // Two leases long: only renewals keep it.
            tokio::time::sleep(RENEWED_LEASE * 2).await;
            let inner = guard.run(|| lock.lock()).await.unwrap().unwrap();
            let second = owned.hold_count().await.unwrap();
            inner.unlock().await.unwrap();
            (guard, first, second)
        })
    };
    parked(&lock, 1).await;
    held.unlock().await.unwrap();
    let (guard, first, second) = joined(next).await;
    assert_eq!(
        (first, second),
        (1, 2),
        "counts start at 1, and it re-enters"
    );
    assert!(!guard.is_lost(), "renewed by the watchdog");
    assert!(lock.is_locked().await.unwrap());
    guard.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_racing_shutdown_leave_nothing_held() {
    const ROUNDS: usize = 10;
    const NAMES: usize = 20;
    let server = RedisServer::start();
    let raw = server.raw().await;
    let mut leaked = Vec::new();
    for round in 0..ROUNDS {
        let client = client(&server, 8).await;
        let names: Vec<String> = (0..NAMES).map(|i| format!("race:{round}:{i}")).collect();
        let mut guards = Vec::new();
        for name in &names {
            let lock = client.lock(name);
            guards.push(lock.lock().await.unwrap());
            // Whatever the waiter gets (a passed guard, or ShutDown) it drops.
            let waiting = lock.clone();
            tokio::spawn(async move { drop(waiting.lock().await) });
            parked(&lock, 1).await;
        }
        // The releases (passes) start on the other worker thread while this one shuts down.
        for guard in guards {
            tokio::spawn(async move { drop(guard.unlock().await) });
        }
        for _ in 0..(round * 7) % 64 {
            std::hint::spin_loop();
        }
        client.shutdown().await.unwrap();
        leaked.extend(support::still_held(&raw, names).await);
    }
    assert!(leaked.is_empty(), "left held after shutdown: {leaked:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_in_a_row_stay_bounded_when_tasks_reenter() {
    const LIMIT: usize = 4;
    const TASKS: usize = 4;
    let server = RedisServer::start();
    let raw = server.raw().await;
    let other = client(&server, LIMIT as u32).await;
    let client = client(&server, LIMIT as u32).await;
    let lock = client.lock("baton:reentered");
    let served = Arc::new(AtomicBool::new(false));
    // Per hold, in the order of the holds: the unlock messages published before it. A hold
    // taken after an ordinary release sees one more than the hold before it; a hold passed
    // to it sees the same number.
    let published = Arc::new(Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (lock, raw) = (lock.clone(), raw.clone());
            let (served, published) = (served.clone(), published.clone());
            tokio::spawn(async move {
                let mut rounds = 0;
                while rounds < 50 || !served.load(Ordering::Relaxed) {
                    let outer = lock.lock().await.unwrap();
                    // The same owner again: it re-enters, and this second hold goes last.
                    let inner = outer.reenter().await.unwrap();
                    let messages = calls(&raw, "publish").await;
                    published.lock().push(messages);
                    outer.unlock().await.unwrap();
                    inner.unlock().await.unwrap();
                    rounds += 1;
                }
            })
        })
        .collect();
    assert!(
        eventually(BOUND, || async { published.lock().len() >= 20 }).await,
        "the tasks took turns"
    );
    // Another client polling without subscribing (a Redisson tryLock(0) loop, or a waiter
    // subscribed through another node of a cluster): only an ordinary release serves it.
    let foreign = other.lock("baton:reentered");
    let foreign_served = tokio::time::timeout(BOUND, async {
        loop {
            if let Some(guard) = foreign.try_lock().await.unwrap() {
                guard.unlock().await.unwrap();
                break;
            }
        }
    })
    .await
    .is_ok();
    served.store(true, Ordering::Relaxed);
    for task in tasks {
        joined(task).await;
    }

    let published = published.lock().clone();
    // A run of equal counts: one hold, then the holds passed on from it.
    let longest = published.chunk_by(|a, b| a == b).map(<[u64]>::len).max();
    let passes = longest.unwrap() - 1;
    let ordinary = published.last().unwrap() - published.first().unwrap();
    assert!(
        passes <= LIMIT,
        "{passes} passes in a row with a limit of {LIMIT} ({} holds, {ordinary} ordinary releases)",
        published.len()
    );
    assert!(
        foreign_served,
        "another client never got the lock in {BOUND:?}"
    );
    client.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

/// Pauses every write on the server (scripts included; reads still run) for `ms`.
async fn pause_writes(raw: &fred::clients::Client, ms: u64) {
    let pause = vec!["PAUSE".into(), ms.to_string(), "WRITE".into()];
    command(raw, "CLIENT", pause).await;
}

/// A client with a 2 s command timeout: a call is awaited 8 s (four of them) before its
/// outcome counts as unknown.
async fn client_with_2s_timeout(server: &RedisServer) -> Client {
    Client::builder()
        .url(server.url())
        .command_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimed_waiter_leaves_at_its_deadline_and_the_pass_is_released() {
    const WAIT: Duration = Duration::from_secs(2);
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client_with_2s_timeout(&server).await;
    let lock = client.lock("baton:deadline");
    let held = lock.lock().await.unwrap();
    let waiting = {
        let lock = lock.clone();
        tokio::spawn(async move {
            let start = tokio::time::Instant::now();
            let got = lock.try_lock_with_lease(WAIT, PAST_WATCHDOG).await;
            (got, start.elapsed())
        })
    };
    parked(&lock, 1).await;
    // Until the UNPAUSE below: the pass to the waiter stays in flight past its deadline.
    pause_writes(&raw, 60_000).await;
    let release = tokio::spawn(held.unlock());
    parked(&lock, 0).await;

    let (got, waited) = tokio::time::timeout(BOUND, waiting)
        .await
        .expect("the waiter left")
        .unwrap();
    assert!(matches!(got, Ok(None)), "{got:?}");
    assert!(
        waited < WAIT + Duration::from_secs(3),
        "left at its {WAIT:?} deadline, not with the pass's outcome: {waited:?}"
    );
    command(&raw, "CLIENT", vec!["UNPAUSE".into()]).await;
    // Its reply came after the command timeout; the round trip finished in the background.
    drop(release.await.unwrap());
    assert!(
        freed_well_before_its_lease(&lock).await,
        "the hold passed to the waiter that left was released, not left to its lease"
    );
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_racing_a_stalled_pass_leaves_nothing_held() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client_with_2s_timeout(&server).await;
    let lock = client.lock("baton:stalled-shutdown");
    let held = lock.lock().await.unwrap();
    let next = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.lock_with_lease(PAST_WATCHDOG).await })
    };
    parked(&lock, 1).await;
    // Shorter than a call is awaited, so the pass runs and its reply is heard; longer than
    // the command timeout.
    pause_writes(&raw, 5_000).await;
    let release = tokio::spawn(held.unlock());
    parked(&lock, 0).await;

    client.shutdown().await.unwrap();
    let left = joined(next).await;
    assert!(matches!(left, Err(Error::ShutDown)), "{left:?}");
    drop(release.await.unwrap());
    assert_eq!(
        support::still_held(&raw, ["baton:stalled-shutdown".to_owned()]).await,
        Vec::<String>::new(),
        "the hold the pass wrote was released, not left to its 30 s lease"
    );
}
