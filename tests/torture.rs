//! Mutual exclusion, proven by history: 4 clients × 16 workers (two joined in each task)
//! hammer 3 lock names with random `lock`/`try_lock`/`try_lock_for`/reentrant mixes and random
//! hold times, with a short watchdog lease, while faults are injected (pub/sub connections
//! killed, the script cache flushed, short `CLIENT PAUSE`s). Every critical section is
//! recorded with monotonic timestamps and a fencing number taken inside it (INCR on a side
//! key); a checker then proves that no two sections of one name overlapped while their leases
//! were valid, that the fencing numbers follow the order of the sections, that a non-atomic
//! read-sleep-write counter per name is exact, and that every worker finished.

mod support;

#[path = "support/history.rs"]
mod history;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use fred::prelude::*;
use history::{check_history, judge_history, told_ago, watch_lost, Section};
use parking_lot::Mutex;
use redbaton::{Client, Error, LockGuard};
use support::{command, RedisServer};
use tokio::time::Instant;

const CLIENTS: usize = 4;
const TASKS_PER_CLIENT: usize = 16;
const NAMES: [&str; 3] = ["torture:a", "torture:b", "{torture}:c"];
const ROUNDS_PER_TASK: usize = 50;

/// Now on the history's clock: time since the first call (monotonic).
fn now() -> Duration {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed()
}

/// The critical section, run while listening for `guard`'s lost-lease signal: fencing number,
/// then a non-atomic read-sleep-write increment; recorded in `log`.
async fn critical_section(
    client: &Client,
    guard: &LockGuard,
    name: usize,
    hold: Duration,
    log: &Mutex<Vec<Section>>,
) {
    let told = told_ago(guard.lost(), || guard.lost_at());
    let ((fence, start, end), lost_at) =
        watch_lost(read_sleep_write(client, name, hold), told, now).await;
    log.lock().push(Section {
        name,
        start,
        end,
        fence,
        lost_at,
    });
}

/// Fencing number, then a non-atomic read-sleep-write increment; returns the fence and when
/// the section began and ended.
async fn read_sleep_write(
    client: &Client,
    name: usize,
    hold: Duration,
) -> (Option<i64>, Duration, Duration) {
    let start = now();
    let redis = client.redis();
    let fence: i64 = redis.incr(format!("fence:{}", NAMES[name])).await.unwrap();
    let counter = format!("counter:{}", NAMES[name]);
    let value: Option<i64> = redis.get(&counter).await.unwrap();
    tokio::time::sleep(hold).await;
    let _: () = redis
        .set(&counter, value.unwrap_or(0) + 1, None, None, false)
        .await
        .unwrap();
    (Some(fence), start, now())
}

async fn release(guard: LockGuard) {
    let lost = guard.is_lost();
    match guard.unlock().await {
        Ok(()) => {}
        Err(Error::NotHeld { .. }) if lost => {}
        Err(e) => panic!("unlock failed: {e}"),
    }
}

async fn worker(client: Client, log: Arc<Mutex<Vec<Section>>>, seed: u64) -> usize {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut misses = 0;
    for _ in 0..ROUNDS_PER_TASK {
        let name = rng.usize(0..NAMES.len());
        let lock = client.lock(NAMES[name]);
        let hold = Duration::from_micros(rng.u64(0..4000));
        let guard = match rng.u8(0..4) {
            0 => Some(lock.lock().await.unwrap()),
            1 => lock.try_lock().await.unwrap(),
            2 => lock
                .try_lock_for(Duration::from_millis(rng.u64(0..400)))
                .await
                .unwrap(),
            _ => {
                // Reentrant: the section runs under a nested hold of the same owner.
                let outer = lock.lock().await.unwrap();
                let inner = outer.reenter().await.unwrap();
                let owned = lock.with_owner(outer.owner());
                assert_eq!(owned.hold_count().await.unwrap(), 2);
                critical_section(&client, &inner, name, hold, &log).await;
                let lost = inner.is_lost();
                release(inner).await;
                assert!(lost || owned.is_held_in_scope().await.unwrap());
                release(outer).await;
                continue;
            }
        };
        let Some(guard) = guard else {
            misses += 1;
            continue;
        };
        critical_section(&client, &guard, name, hold, &log).await;
        release(guard).await;
    }
    misses
}

/// Injects faults until told to stop: pub/sub connections killed, script cache flushed,
/// short server-wide pauses.
async fn inject_faults(raw: fred::clients::Client, stop: Arc<AtomicBool>) -> Vec<&'static str> {
    let mut injected = Vec::new();
    let mut step = 0usize;
    while !stop.load(Ordering::Acquire) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if stop.load(Ordering::Acquire) {
            break;
        }
        let fault = match step % 3 {
            0 => {
                support::kill_pubsub_connections(&raw).await;
                "pubsub kill"
            }
            1 => {
                let _ = command(&raw, "SCRIPT", vec!["FLUSH".into()]).await;
                "script flush"
            }
            _ => {
                let _ = command(
                    &raw,
                    "CLIENT",
                    vec!["PAUSE".into(), "250".into(), "ALL".into()],
                )
                .await;
                "client pause 250 ms"
            }
        };
        injected.push(fault);
        step += 1;
    }
    injected
}

/// The checker is not vacuous: it rejects overlapping sections and out-of-order fences, and
/// lets a section whose holder was told its lease was lost overlap after it was told.
#[test]
fn the_checker_rejects_bad_histories() {
    let ms = Duration::from_millis;
    // A section from `start` to `end` with fence `fence`, its holder told lost at `told`.
    let told = |start: u64, end: u64, fence: i64, told: Option<u64>| Section {
        name: 0,
        start: ms(start),
        end: ms(end),
        fence: Some(fence),
        lost_at: told.map(ms),
    };
    let section = |start: u64, end: u64, fence: i64| told(start, end, fence, None);
    let check = |sections: &[Section]| check_history("x", &sections.iter().collect::<Vec<_>>());
    assert_eq!(check(&[section(0, 10, 1), section(10, 20, 2)]), Ok(2));
    assert!(check(&[section(0, 10, 1), section(9, 20, 2)]).is_err());
    let nested = [section(0, 30, 1), section(10, 20, 2), section(25, 40, 3)];
    assert!(check(&nested).is_err());
    assert!(check(&[section(0, 10, 2), section(10, 20, 1)]).is_err());
    // Told at 3, before the next holder entered at 5: no overlap.
    assert_eq!(check(&[told(0, 10, 1, Some(3)), section(5, 20, 2)]), Ok(1));
    // Told lost as the section ended (or before it began): it claimed nothing beyond.
    assert_eq!(
        check(&[told(0, 10, 1, Some(12)), section(10, 20, 2)]),
        Ok(1)
    );
    assert_eq!(
        check(&[
            section(0, 10, 1),
            told(5, 20, 3, Some(4)),
            section(10, 20, 2)
        ]),
        Ok(2)
    );
    // A stalled holder told lost may take its fence late, inside a newer section.
    let stale = [
        section(0, 10, 1),
        told(5, 30, 3, Some(6)),
        section(10, 20, 2),
    ];
    assert!(
        check(&stale).is_err(),
        "told at 6: it believed it held at 5"
    );
    let stale = [
        section(0, 10, 1),
        told(10, 30, 3, Some(10)),
        section(10, 20, 2),
    ];
    assert_eq!(check(&stale), Ok(2));
    // Told late: the first holder's lease ended, another entered at 20, the first was told
    // only at 25 — invariant 8's failure, whichever of the two was told.
    assert!(check(&[told(0, 30, 1, Some(25)), section(20, 40, 2)]).is_err());
    assert!(check(&[section(0, 30, 1), told(20, 40, 2, Some(25))]).is_err());
    assert!(check(&[told(0, 30, 1, Some(25)), told(20, 40, 2, Some(22))]).is_err());
    let late = [told(0, 30, 1, Some(25)), section(20, 40, 2)];
    let verdict = judge_history("x", &late.iter().collect::<Vec<_>>());
    assert_eq!(
        (
            verdict.checked,
            verdict.checked_until_told,
            verdict.overlaps.len()
        ),
        (1, 1, 1)
    );
    // Every violation is counted, not only the first.
    let twice = [
        section(0, 10, 1),
        section(5, 12, 2),
        section(11, 20, 4),
        section(20, 30, 3),
    ];
    let verdict = judge_history("x", &twice.iter().collect::<Vec<_>>());
    assert_eq!(
        (verdict.overlaps.len(), verdict.fence_disorders.len()),
        (2, 1)
    );
}

/// The lost-lease signal is timed by the instant it carries, taken when it resolves, not
/// when the section ends; a section it never interrupts is not marked lost; a signal ready as
/// the section ends still marks it.
#[tokio::test]
async fn lost_signals_are_timed_by_the_instant_they_carry() {
    let clock = Instant::now();
    let since = || clock.elapsed();
    // Resolves after 300 ms, saying the lease ended 200 ms before it resolved.
    let resolved = std::cell::Cell::new(None);
    let told = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        resolved.set(Some(since()));
        Duration::from_millis(200)
    };
    let ((), at) = watch_lost(tokio::time::sleep(Duration::from_secs(2)), told, since).await;
    let at = at.expect("told during the section");
    let resolved = resolved.get().expect("the signal resolved");
    // Both are read in the same poll: the instant carried, not the resolution time.
    assert!(
        at >= Duration::from_millis(100) && at < resolved - Duration::from_millis(150),
        "timed by the instant carried (resolved at {resolved:?}): {at:?}"
    );
    assert!(
        at < Duration::from_secs(2),
        "timed when told, not at the end: {at:?}"
    );
    let ((), at) = watch_lost(async {}, std::future::pending(), since).await;
    assert_eq!(at, None);
    let ((), at) = watch_lost(async {}, async { Duration::ZERO }, since).await;
    assert!(at.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_holds_under_faults() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let lease = Duration::from_secs(2);
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(
            Client::builder()
                .url(server.url())
                .watchdog_lease(lease)
                .command_timeout(Duration::from_secs(3))
                .reconnect_max_delay(Duration::from_millis(200))
                .connect()
                .await
                .unwrap(),
        );
    }
    let log = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let faults = tokio::spawn(inject_faults(server.raw().await, stop.clone()));

    let seed = fastrand::u64(..);
    println!("seed {seed}");
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (c, client) in clients.iter().enumerate() {
        let worker_at = |t: usize| {
            let task_seed = seed ^ ((c * TASKS_PER_CLIENT + t) as u64).wrapping_mul(0x9E37_79B9);
            worker(client.clone(), log.clone(), task_seed)
        };
        // Two workers joined in each task: futures sharing a task contend as separate tasks
        // do (invariant 14), and must exclude each other just the same.
        for t in (0..TASKS_PER_CLIENT).step_by(2) {
            let pair = (worker_at(t), worker_at(t + 1));
            tasks.push(tokio::spawn(async move {
                let (a, b) = tokio::join!(pair.0, pair.1);
                a + b
            }));
        }
    }
    let mut finished = 0;
    let mut misses = 0;
    for task in tasks {
        misses += tokio::time::timeout(Duration::from_secs(120), task)
            .await
            .expect("every task finishes")
            .expect("no task panicked");
        finished += 2;
    }
    stop.store(true, Ordering::Release);
    let injected = faults.await.unwrap();
    let elapsed = started.elapsed();
    assert_eq!(finished, CLIENTS * TASKS_PER_CLIENT);

    // The checker.
    let sections = log.lock().clone();
    let lost = sections.iter().filter(|s| s.lost()).count();
    let mut checked = 0;
    for (n, name) in NAMES.iter().enumerate() {
        let mine: Vec<&Section> = sections.iter().filter(|s| s.name == n).collect();
        checked += check_history(name, &mine).unwrap_or_else(|e| panic!("{e}"));
        let fence: i64 = raw.get(format!("fence:{name}")).await.unwrap();
        assert_eq!(fence as usize, mine.len(), "{name}: one fence per section");
        let counter: Option<i64> = raw.get(format!("counter:{name}")).await.unwrap();
        assert_eq!(
            counter.unwrap_or(0) as usize,
            mine.len(),
            "{name}: the non-atomic counter is exact"
        );
        let exists: i64 = raw.exists(*name).await.unwrap();
        assert_eq!(exists, 0, "{name}: nothing left held");
    }
    println!(
        "checked {checked} acquisitions ({} sections, {lost} lost leases, {misses} missed tries) \
         from {finished} workers in {elapsed:?}; faults injected: {injected:?}",
        sections.len()
    );
    assert_eq!(
        lost, 0,
        "no lease was lost: every fault was shorter than the lease"
    );
    assert!(injected.len() >= 3, "every kind of fault ran: {injected:?}");
    assert!(checked > 500, "enough history to mean something: {checked}");
    for client in clients {
        client.shutdown().await.unwrap();
    }
}
