//! Wake-ups: by the unlock message, one per process, only once subscribed, passed on.

use super::*;
use crate::support::monitor::{self, Monitor, ScriptRuns};

/// A client whose watchdog renews (and checks its holds) only every 100 s, so that renewal
/// scripts stay out of EVALSHA counts taken over a few seconds.
async fn rarely_renewing_client(server: &RedisServer) -> Client {
    Client::builder()
        .url(server.url())
        .watchdog_lease(Duration::from_secs(300))
        .lease_check_interval(Duration::from_secs(100))
        .connect()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_woken_by_unlock_without_polling() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let server = RedisServer::start();
    let raw = server.raw().await;
    let holder = rarely_renewing_client(&server).await;
    let waiter_client = rarely_renewing_client(&server).await;
    let guard = holder.lock("wake").lock().await.unwrap();
    let before = command_calls(&raw).await;
    let waiter = support::spawn_waiter(waiter_client.lock("wake"));
    assert!(
        eventually(Duration::from_secs(10), || async {
            numsub(&raw, "redisson_lock__channel:{wake}").await == 1
        })
        .await,
        "the waiter subscribes"
    );
    // Parked for 1.5 s against a 30 s lease: a poller would show many attempts.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let released_at = Instant::now();
    guard.unlock().await.unwrap();
    let acquired_at = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .unwrap()
        .unwrap();
    let handoff = acquired_at.into_std().duration_since(released_at);
    // Woken by the message: far sooner than the 30 s lease, generously bounded.
    assert!(handoff < Duration::from_secs(5), "wake-up took {handoff:?}");
    let after = command_calls(&raw).await;
    let delta = |c: &str| after.get(c).copied().unwrap_or(0) - before.get(c).copied().unwrap_or(0);
    // waiter: attempt, subscribe + ping, re-check, attempt after wake, unlock;
    // holder: unlock; plus the INFO call itself.
    assert!(delta("evalsha") <= 5, "evalsha calls {}", delta("evalsha"));
    assert_eq!(delta("subscribe"), 1);
    holder.shutdown().await.unwrap();
    waiter_client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_woken_waiter_that_gives_up_passes_the_wake_up_on() {
    let server = RedisServer::start();
    let holder = client(&server).await;
    let waiters = client(&server).await;
    let guard = holder.lock("passon").lock().await.unwrap();
    // Waiter 1 gives up right at the moment of the release; waiter 2 waits on.
    let lock1 = waiters.lock("passon");
    let quitter = tokio::spawn(async move { lock1.try_lock_for(Duration::from_millis(800)).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let lock2 = waiters.lock("passon");
    let stayer = tokio::spawn(async move {
        let g = lock2.lock().await.unwrap();
        let t = Instant::now();
        g.unlock().await.unwrap();
        t
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    let released = Instant::now();
    guard.unlock().await.unwrap();
    let _ = quitter.await.unwrap();
    let acquired = tokio::time::timeout(Duration::from_secs(20), stayer)
        .await
        .unwrap()
        .unwrap();
    assert!(
        acquired.duration_since(released) < Duration::from_secs(5),
        "the wake-up was lost: waited {:?} (the lease is 30 s)",
        acquired.duration_since(released)
    );
    holder.shutdown().await.unwrap();
    waiters.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlock_wakes_one_waiter_per_process_not_all() {
    // Invariant 4 (docs/DESIGN.md): ten parked waiters of one process; one release wakes one of
    // them, which takes the lock — the other nine stay parked and send nothing.
    let server = RedisServer::start();
    let raw = server.raw().await;
    let holder = rarely_renewing_client(&server).await;
    let waiters = rarely_renewing_client(&server).await;
    let guard = holder.lock("wake-one").lock().await.unwrap();
    // Scripts run, not calls: attempts issued together travel in one call.
    let runs = ScriptRuns::start(&server, &raw).await;
    let base = runs.count().await;
    let (acquired_tx, mut acquired_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let lock = waiters.lock("wake-one");
        let acquired_tx = acquired_tx.clone();
        tasks.push(tokio::spawn(async move {
            let guard = lock.lock().await.unwrap();
            acquired_tx.send(()).unwrap();
            // Keep it: the other waiters must stay parked while it is held.
            tokio::time::sleep(Duration::from_secs(60)).await;
            drop(guard);
        }));
    }
    // Every waiter has made its attempts and parked: each has tried at least once, and
    // nothing more reaches the server.
    assert!(
        eventually(Duration::from_secs(15), || async {
            runs.count().await >= base + 10
        })
        .await,
        "every waiter made its first attempt"
    );
    let quiet = Duration::from_millis(500);
    let bound = Duration::from_secs(15);
    let before = runs.settled(quiet, bound).await;
    guard.unlock().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), acquired_rx.recv())
        .await
        .expect("one waiter is woken")
        .unwrap();
    let after = runs.settled(quiet, bound).await;
    // The holder's unlock and the woken waiter's winning attempt; a wake-all would add nine.
    assert_eq!(after - before, 2, "scripts run after one release");
    assert!(acquired_rx.try_recv().is_err(), "only one waiter holds it");
    for t in &tasks {
        t.abort();
    }
    holder.shutdown().await.unwrap();
    waiters.shutdown().await.unwrap();
}

/// Positions in `parsed` of acquire attempts on `key`: EVALSHAs of the lock script (one key
/// and two arguments, lease and owner; the unlock script has six) sent by a client, not from
/// inside a script.
fn lock_attempts(parsed: &[(String, Vec<String>)], key: &str) -> Vec<usize> {
    parsed
        .iter()
        .enumerate()
        .filter(|(_, (addr, w))| {
            addr != "lua"
                && w[0] == "evalsha"
                && w.get(2).map(String::as_str) == Some("1")
                && w.get(3).map(String::as_str) == Some(key)
                && w.len() == 6
        })
        .map(|(i, _)| i)
        .collect()
}

/// Reads MONITOR output until it shows `n` acquire attempts on `key`, or 10 s passed (the
/// caller's assertions then say what is missing).
async fn monitor_until(monitor: &mut Monitor, key: &str, n: usize) {
    monitor
        .read_until(Duration::from_secs(10), |lines| {
            let parsed: Vec<_> = lines.iter().filter_map(|l| monitor::command(l)).collect();
            lock_attempts(&parsed, key).len() >= n
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_rechecks_only_after_its_subscription_is_confirmed() {
    // Invariant 2 (docs/DESIGN.md), as the server saw it (MONITOR): the waiter's first attempt,
    // then the SUBSCRIBE and the barrier PING on the subscriber connection, and only then its
    // re-check.
    let server = RedisServer::start();
    let raw = server.raw().await;
    let holder = client(&server).await;
    let guard = holder.lock("ordered").lock().await.unwrap();
    let mut monitor = Monitor::start(&server, &raw).await;
    let waiters = client(&server).await;
    let waiter = support::spawn_waiter(waiters.lock("ordered"));
    assert!(
        eventually(Duration::from_secs(5), || async {
            numsub(&raw, "redisson_lock__channel:{ordered}").await == 1
        })
        .await
    );
    // Release only once the waiter has made its re-check (the attempt before parking): a
    // release before it would let the re-check win, and nothing would be left to wake. On a
    // loaded machine that can take a while after the subscription.
    monitor_until(&mut monitor, "ordered", 2).await;
    guard.unlock().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .unwrap()
        .unwrap();
    // Its winning attempt reaches MONITOR's output.
    monitor_until(&mut monitor, "ordered", 3).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    monitor.stop();

    let parsed = monitor.commands();
    let attempts = lock_attempts(&parsed, "ordered");
    let subscribe = parsed
        .iter()
        .position(|(_, w)| w[0] == "subscribe" && w[1] == "redisson_lock__channel:{ordered}")
        .expect("the waiter subscribed");
    let subscriber = &parsed[subscribe].0;
    let barrier = subscribe
        + parsed[subscribe..]
            .iter()
            .position(|(addr, w)| addr == subscriber && w[0] == "ping")
            .expect("a barrier PING on the subscriber connection");
    assert_eq!(
        attempts.len(),
        3,
        "attempt, re-check, attempt after the wake-up: {attempts:?}"
    );
    assert!(attempts[0] < subscribe, "first attempt before subscribing");
    assert!(
        barrier < attempts[1],
        "the re-check ({}) came before the subscription was confirmed ({barrier})",
        attempts[1]
    );
    holder.shutdown().await.unwrap();
    waiters.shutdown().await.unwrap();
}

/// The single-flight wait: waiters of `wait_until_free` take nothing, and the one unlock
/// message that frees the lock wakes them all together — without the group's wake-up, all
/// but the first would sleep until the holder's lease (30 s) ran out (issue 39 item 7).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_until_free_are_all_woken_by_one_unlock_and_take_nothing() {
    const WAITERS: usize = 40;
    let server = RedisServer::start();
    let holder = client(&server).await;
    let others = client(&server).await;
    let guard = holder.lock("report").lock().await.unwrap();
    assert!(!others
        .lock("report")
        .wait_until_free_for(Duration::from_millis(100))
        .await
        .unwrap());
    let mut waiters = Vec::new();
    for i in 0..WAITERS {
        // Half in the holder's own client, half in another.
        let lock = if i % 2 == 0 { &holder } else { &others }.lock("report");
        waiters.push(tokio::spawn(async move {
            lock.wait_until_free().await.unwrap();
            Instant::now()
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(waiters.iter().all(|w| !w.is_finished()), "the lock is held");
    let released = Instant::now();
    guard.unlock().await.unwrap();
    for waiter in waiters {
        let woken = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("every waiter is woken by the unlock, not by the lease's end")
            .unwrap();
        let late = woken.saturating_duration_since(released);
        assert!(
            late < Duration::from_secs(5),
            "woken {late:?} after the unlock"
        );
    }
    assert!(
        !holder.lock("report").is_locked().await.unwrap(),
        "nothing taken"
    );
    // Free already: at once, with no subscription.
    assert!(others
        .lock("report")
        .wait_until_free_for(Duration::ZERO)
        .await
        .unwrap());
    holder.shutdown().await.unwrap();
    others.shutdown().await.unwrap();
}

/// The figures of issue 39 item 7: a stampede guard — one task computes for 200 ms, 199
/// others wait — over a plain `Lock` and over a read/write lock (the computing task holds
/// the write half), the waiters spread over 1 or 4 clients (4 stand for 4 processes: each
/// has its own subscriber). Baseline: the waiters take the lock (or the read half) in turn,
/// `lock()` then `unlock()`; against `wait_until_free`. Prints how long after the computation
/// ended each waiter went on (p50, p99, max). Run with
/// `cargo test -p redbaton --test lock stampede_figures -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, not a check"]
async fn stampede_figures() {
    const WAITERS: usize = 199;
    let server = RedisServer::start();
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(client(&server).await);
    }
    for spread in [1, 4] {
        for (rwlock, free_wait) in [(false, false), (false, true), (true, false), (true, true)] {
            let name = format!("stampede-{spread}-{rwlock}-{free_wait}");
            let rw_guard = match rwlock {
                true => Some(
                    clients[0]
                        .read_write_lock(&name)
                        .write()
                        .lock()
                        .await
                        .unwrap(),
                ),
                false => None,
            };
            let guard = match rwlock {
                false => Some(clients[0].lock(&name).lock().await.unwrap()),
                true => None,
            };
            let mut waiters = Vec::new();
            for i in 0..WAITERS {
                let client = clients[i % spread].clone();
                let name = name.clone();
                waiters.push(tokio::spawn(async move {
                    match (rwlock, free_wait) {
                        (false, true) => client.lock(&name).wait_until_free().await.unwrap(),
                        (false, false) => {
                            let held = client.lock(&name).lock().await.unwrap();
                            held.unlock().await.unwrap()
                        }
                        (true, true) => client
                            .read_write_lock(&name)
                            .wait_until_free()
                            .await
                            .unwrap(),
                        (true, false) => {
                            let rw = client.read_write_lock(&name);
                            let held = rw.read().lock().await.unwrap();
                            held.unlock().await.unwrap()
                        }
                    }
                    Instant::now()
                }));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            let ended = Instant::now();
            if let Some(guard) = guard {
                guard.unlock().await.unwrap();
            }
            if let Some(guard) = rw_guard {
                guard.unlock().await.unwrap();
            }
            let mut after = Vec::new();
            for waiter in waiters {
                after.push(waiter.await.unwrap().saturating_duration_since(ended));
            }
            after.sort();
            let at = |q: f64| after[((after.len() - 1) as f64 * q) as usize];
            println!(
                "{} over {spread} client(s), {}: p50 {:?}, p99 {:?}, max {:?}",
                if rwlock { "read/write lock" } else { "lock" },
                if free_wait {
                    "wait_until_free"
                } else {
                    "taken in turn"
                },
                at(0.5),
                at(0.99),
                at(1.0)
            );
        }
    }
    for client in clients {
        client.shutdown().await.unwrap();
    }
}
