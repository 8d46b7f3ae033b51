//! Scenarios 1-3: a holder killed with SIGKILL, the subscriber killed, Redis restarted.

use super::*;

/// The child of `holder_killed_with_sigkill_frees_the_lock_within_the_lease`: takes the lock
/// with a 1 s watchdog lease, says so on stdout, and holds until killed.
async fn child_holder(arg: String) {
    let (url, name) = arg.split_once('|').unwrap();
    let client = client_with(url, Duration::from_secs(1), Duration::from_secs(1)).await;
    let guard = client.lock(name).lock().await.unwrap();
    println!("HELD {}", guard.owner());
    std::future::pending::<()>().await;
}

/// Scenario 1: a holder process killed with SIGKILL while others wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_killed_with_sigkill_frees_the_lock_within_the_lease() {
    if let Some(arg) = child_arg() {
        return child_holder(arg).await;
    }
    let server = RedisServer::start();
    let raw = server.raw().await;
    let name = "killed-holder";
    let lease = Duration::from_secs(1);
    let mut child = spawn_child(
        &test_name(
            module_path!(),
            "holder_killed_with_sigkill_frees_the_lock_within_the_lease",
        ),
        &format!("{}|{name}", server.url()),
    );
    let stdout = child.0.stdout.take().unwrap();
    let owner = tokio::task::spawn_blocking(move || {
        let mut lines = std::io::BufReader::new(stdout).lines();
        lines.find_map(|line| after_tag(&line.ok()?, "HELD "))
    });
    let owner = tokio::time::timeout(Duration::from_secs(30), owner)
        .await
        .expect("the child takes the lock")
        .unwrap()
        .expect("the child reports its owner");
    assert!(hexists(&raw, name, &owner).await);

    // Waiters in three other clients.
    let mut waiters = Vec::new();
    let acquired = Arc::new(Mutex::new(Vec::new()));
    for _ in 0..3 {
        let client = client_with(&server.url(), lease, Duration::from_secs(2)).await;
        let acquired = acquired.clone();
        waiters.push(tokio::spawn(async move {
            let guard = client.lock(name).lock().await.unwrap();
            acquired.lock().push(Instant::now());
            guard.unlock().await.unwrap();
            client.shutdown().await.unwrap();
        }));
    }
    let channel = format!("redisson_lock__channel:{{{name}}}");
    assert!(
        eventually(Duration::from_secs(5), || async {
            numsub(&raw, &channel).await == 3
        })
        .await
    );
    // The child's watchdog keeps its 1 s lease alive past several leases.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(
        hexists(&raw, name, &owner).await,
        "the live child still holds"
    );
    assert!(
        acquired.lock().is_empty(),
        "nobody acquired from a live holder"
    );

    child.0.kill().unwrap();
    let killed_at = Instant::now();
    child.0.wait().unwrap();
    for waiter in waiters {
        tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("every waiter acquires in turn")
            .unwrap();
    }
    let times = acquired.lock().clone();
    assert_eq!(times.len(), 3);
    let first = times.iter().min().unwrap().duration_since(killed_at);
    println!("first waiter acquired {first:?} after SIGKILL (lease {lease:?})");
    assert!(
        first <= lease + Duration::from_secs(2),
        "a waiter acquires within lease + 2 s, took {first:?}"
    );
    assert!(
        !hexists(&raw, name, &owner).await,
        "the killed owner's field is gone"
    );
    let exists: i64 = raw.exists(name).await.unwrap();
    assert_eq!(exists, 0);
}

/// Scenario 2: the shared subscriber connection is killed while 50 tasks wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriber_killed_while_fifty_wait_then_wake_ups_are_prompt_again() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    // A long lease: a lost wake-up would cost a waiter the holder's whole PTTL (5 s).
    let lease = Duration::from_secs(5);
    let holder = client_with(&server.url(), lease, Duration::from_secs(2)).await;
    let waiters = client_with(&server.url(), lease, Duration::from_secs(2)).await;
    let name = "pubsub-killed";
    let lock = holder.lock(name);
    let held = lock.lock().await.unwrap();

    // Each waiter records (acquired, released); releases are what hand-offs start from.
    let sections = Arc::new(Mutex::new(Vec::<(Instant, Instant)>::new()));
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let lock = waiters.lock(name);
        let sections = sections.clone();
        tasks.push(tokio::spawn(async move {
            let guard = lock.lock().await.unwrap();
            let start = Instant::now();
            tokio::time::sleep(Duration::from_millis(30)).await;
            let end = Instant::now();
            guard.unlock().await.unwrap();
            sections.lock().push((start, end));
        }));
    }
    let channel = lock.channel().to_owned();
    assert!(
        eventually(Duration::from_secs(5), || async {
            numsub(&raw, &channel).await == 1
        })
        .await
    );
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Kill every pub/sub connection while all 50 wait, and wait for the resubscription.
    support::kill_pubsub_connections(&raw).await;
    assert!(
        eventually(Duration::from_secs(5), || async {
            numsub(&raw, &channel).await == 1
        })
        .await,
        "the hub resubscribes by itself"
    );
    let released_at = Instant::now();
    held.unlock().await.unwrap();

    // Kill it again in the middle of the hand-offs.
    assert!(
        eventually(Duration::from_secs(10), || async {
            sections.lock().len() >= 20
        })
        .await
    );
    support::kill_pubsub_connections(&raw).await;
    let killed_again = Instant::now();

    for task in tasks {
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("every waiter acquires in turn")
            .unwrap();
    }
    let mut sections = sections.lock().clone();
    sections.sort();
    assert_eq!(sections.len(), 50);
    for pair in sections.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "critical sections never overlap");
    }
    let first = sections[0].0.duration_since(released_at);
    // Hand-off gaps: previous release to next acquisition.
    let gaps: Vec<Duration> = sections
        .windows(2)
        .map(|p| p[1].0.duration_since(p[0].1))
        .collect();
    let worst = gaps.iter().max().unwrap();
    let after_second_kill: Vec<Duration> = sections
        .windows(2)
        .filter(|p| p[0].1 > killed_again + Duration::from_millis(300))
        .map(|p| p[1].0.duration_since(p[0].1))
        .collect();
    let worst_after = after_second_kill.iter().max().copied().unwrap_or_default();
    println!(
        "first hand-off after reconnect {first:?}, worst gap {worst:?}, \
         worst gap once resubscribed {worst_after:?} over {} hand-offs, lease {lease:?}",
        after_second_kill.len()
    );
    // A lost wake-up costs a waiter the PTTL it parked with (up to the 5 s lease); bounds
    // are generous for a loaded machine yet below that.
    assert!(
        first < Duration::from_secs(2),
        "wake-up after the reconnect took {first:?}"
    );
    assert!(
        *worst < Duration::from_millis(2500),
        "no hand-off waits for the lease ({lease:?}), worst {worst:?}"
    );
    assert!(
        worst_after < Duration::from_secs(1),
        "hand-offs are prompt again after the reconnect, worst {worst_after:?}"
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            numsub(&raw, &channel).await == 0
        })
        .await
    );
    holder.shutdown().await.unwrap();
    waiters.shutdown().await.unwrap();
}

/// Scenario 3: Redis restarted (empty, same port) while one client holds and others wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_loses_the_hold_and_waiters_acquire_without_manual_reconnect() {
    let mut server = RedisServer::start();
    let lease = Duration::from_secs(2);
    let holder = client_with(&server.url(), lease, Duration::from_secs(1)).await;
    let waiters = client_with(&server.url(), lease, Duration::from_secs(1)).await;
    let name = "restarted";
    let guard = holder.lock(name).lock().await.unwrap();

    let acquired = Arc::new(Mutex::new(Vec::<(Instant, Instant)>::new()));
    let mut tasks = Vec::new();
    for _ in 0..5 {
        let lock = waiters.lock(name);
        let acquired = acquired.clone();
        tasks.push(tokio::spawn(async move {
            let guard = lock.lock().await.unwrap();
            let start = Instant::now();
            tokio::time::sleep(Duration::from_millis(20)).await;
            acquired.lock().push((start, Instant::now()));
            guard.unlock().await.unwrap();
        }));
    }
    {
        let raw = server.raw().await;
        let channel = holder.lock(name).channel().to_owned();
        assert!(
            eventually(Duration::from_secs(5), || async {
                numsub(&raw, &channel).await == 1
            })
            .await
        );
        raw.quit().await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    tokio::task::block_in_place(|| server.restart());
    let restarted = Instant::now();

    tokio::time::timeout(lease + lease / 3 + Duration::from_secs(1), guard.lost())
        .await
        .expect("the holder's guard reports the lost lease");
    println!(
        "holder learned of the loss {:?} after the restart",
        restarted.elapsed()
    );
    assert!(guard.is_lost());
    assert_eq!(
        guard.unlock().await,
        Err(Error::NotHeld {
            name: name.to_owned()
        })
    );

    for task in tasks {
        tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("waiters acquire after the restart")
            .unwrap();
    }
    let mut sections = acquired.lock().clone();
    sections.sort();
    assert_eq!(sections.len(), 5);
    for pair in sections.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "critical sections never overlap");
    }
    println!(
        "all waiters done {:?} after the restart",
        sections.last().unwrap().1.duration_since(restarted)
    );

    // The script cache was empty: the scripts were loaded again (NOSCRIPT fallback).
    let raw = server.raw().await;
    let calls = command_calls(&raw).await;
    assert!(
        support::subcommand_calls(&calls, "script|load") >= 1,
        "{calls:?}"
    );
    // The holder's client needs no manual reconnect either.
    let again = holder
        .lock(name)
        .try_lock()
        .await
        .unwrap()
        .expect("free now");
    again.unlock().await.unwrap();
    holder.shutdown().await.unwrap();
    waiters.shutdown().await.unwrap();
}
