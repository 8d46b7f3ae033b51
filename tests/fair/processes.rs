//! Across processes (children of this binary): FIFO order, and a crashed waiter purged.

use super::*;

// --- child processes -------------------------------------------------------------------------

/// The child of `fifo_order_across_three_processes`: once told to go, starts five tasks
/// 25 ms apart (so the processes' waiters interleave in the queue) that wait for the fair
/// lock; each, once it holds it, appends its owner to the order list, then releases.
async fn child_fifo_waiters(arg: String) {
    let parts: Vec<&str> = arg.split('|').collect();
    let [url, name, order_key] = parts[..] else {
        panic!("bad child argument {arg:?}")
    };
    let client = Client::connect(url).await.unwrap();
    let redis = client.redis();
    let _: i64 = redis.incr(format!("{order_key}:ready")).await.unwrap();
    let go = format!("{order_key}:go");
    assert!(
        eventually(Duration::from_secs(60), || async {
            redis.exists::<i64, _>(&go).await.unwrap() == 1
        })
        .await
    );
    let mut tasks = Vec::new();
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(25)).await;
        let lock = client.fair_lock(name);
        let redis = client.redis().clone();
        let order_key = order_key.to_owned();
        tasks.push(tokio::spawn(async move {
            let guard = lock.lock().await.unwrap();
            let _: i64 = redis
                .rpush(&order_key, guard.owner().to_string())
                .await
                .unwrap();
            guard.unlock().await.unwrap();
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    client.shutdown().await.unwrap();
    println!("DONE");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_order_across_three_processes() {
    if let Some(arg) = child_arg() {
        return child_fifo_waiters(arg).await;
    }
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server).await;
    let name = "fifo";
    let order_key = "fifo-order";
    let lock = client.fair_lock(name);
    let holder = lock.lock().await.unwrap();

    let arg = format!("{}|{name}|{order_key}", server.url());
    let mut children: Vec<ChildProcess> = (0..3)
        .map(|_| {
            spawn_child(
                &test_name(module_path!(), "fifo_order_across_three_processes"),
                &arg,
            )
        })
        .collect();
    assert!(
        eventually(Duration::from_secs(60), || async {
            raw.get::<Option<i64>, _>(format!("{order_key}:ready"))
                .await
                .unwrap()
                == Some(3)
        })
        .await,
        "three children connected"
    );
    let _: () = raw
        .set(format!("{order_key}:go"), 1, None, None, false)
        .await
        .unwrap();
    assert!(
        eventually(Duration::from_secs(60), || async {
            queue(&raw, &lock).await.len() == 15
        })
        .await,
        "3 processes × 5 waiters queue"
    );
    let queued = queue(&raw, &lock).await;
    let clients: std::collections::BTreeSet<&str> = queued
        .iter()
        .map(|f| f.rsplit_once(':').unwrap().0)
        .collect();
    assert_eq!(clients.len(), 3, "three processes: {queued:?}");

    let released = Instant::now();
    holder.unlock().await.unwrap();
    let outputs: Vec<_> = children
        .iter_mut()
        .map(|child| {
            let stdout = child.0.stdout.take().unwrap();
            // Read to the end: a closed pipe would fail the child's last prints.
            tokio::task::spawn_blocking(move || {
                let lines: Vec<String> = std::io::BufReader::new(stdout)
                    .lines()
                    .map_while(Result::ok)
                    .collect();
                lines.iter().any(|l| after_tag(l, "DONE").is_some())
            })
        })
        .collect();
    for output in outputs {
        let done = tokio::time::timeout(Duration::from_secs(60), output)
            .await
            .expect("every child finishes")
            .unwrap();
        assert!(done, "a child finished its five waiters");
    }
    let all_served = released.elapsed();
    let order: Vec<String> = raw.lrange(order_key, 0, -1).await.unwrap();
    let position = |field: &str| {
        let client = field.rsplit_once(':').unwrap().0;
        let process = clients.iter().position(|c| *c == client).unwrap();
        format!("p{process}:{}", field.rsplit_once(':').unwrap().1)
    };
    println!(
        "FIFO queue order:       {:?}",
        queued.iter().map(|f| position(f)).collect::<Vec<_>>()
    );
    println!(
        "FIFO acquisition order: {:?}",
        order.iter().map(|f| position(f)).collect::<Vec<_>>()
    );
    println!("all 15 served {all_served:?} after the release");
    assert_eq!(order, queued, "acquired in queue order");
    // One lost hand-off would cost a 30 s lease.
    assert!(all_served < Duration::from_secs(25), "{all_served:?}");
    assert!(queue(&raw, &lock).await.is_empty());
    for child in &mut children {
        let status = child.0.wait().unwrap();
        assert!(status.success());
    }
    client.shutdown().await.unwrap();
}

/// The child of `a_crashed_waiter_is_purged_after_its_wait`: queues for the fair lock with a
/// 4 s wait time and says so; killed while it waits.
async fn child_fair_waiter(arg: String) {
    let (url, name) = arg.split_once('|').unwrap();
    let client = Client::builder()
        .url(url)
        .fair_lock_wait(Duration::from_secs(4))
        .connect()
        .await
        .unwrap();
    let lock = client.fair_lock(name);
    tokio::spawn(async move {
        let owner: redbaton::Owner = format!("{}:{}", client.id(), 1u64 << 40).parse().unwrap();
        let lock = lock.with_owner(owner.clone());
        println!("WAITING {owner}");
        let _guard = lock.lock().await.unwrap();
        println!("ACQUIRED");
        std::future::pending::<()>().await;
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_waiter_is_purged_after_its_wait() {
    if let Some(arg) = child_arg() {
        return child_fair_waiter(arg).await;
    }
    let server = RedisServer::start();
    let raw = server.raw().await;
    let name = "fair-crash";
    // The holder's lease is short (2 s, renewed), so the crashed waiter's timeout is at most
    // that plus its 4 s wait away.
    let holder_client = Client::builder()
        .url(server.url())
        .watchdog_lease(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let lock = holder_client.fair_lock(name);
    let holder = lock.lock().await.unwrap();

    let mut child = spawn_child(
        &test_name(module_path!(), "a_crashed_waiter_is_purged_after_its_wait"),
        &format!("{}|{name}", server.url()),
    );
    let stdout = child.0.stdout.take().unwrap();
    let crashed = tokio::task::spawn_blocking(move || {
        let mut lines = std::io::BufReader::new(stdout).lines();
        lines.find_map(|line| after_tag(&line.ok()?, "WAITING "))
    });
    let crashed = tokio::time::timeout(Duration::from_secs(60), crashed)
        .await
        .expect("the child starts waiting")
        .unwrap()
        .expect("the child reports its owner");
    assert!(queue_becomes(&raw, &lock, &[&crashed]).await);

    // A live waiter of default settings (300 s wait) queues behind it.
    let client = client(&server).await;
    let fair = client.fair_lock(name);
    let (live, taker) = spawn_as(&fair, |lock| async move {
        lock.lock().await.unwrap().unlock().await.unwrap();
        now_ms()
    })
    .await;
    assert!(queue_becomes(&raw, &lock, &[&crashed, &live]).await);

    // SIGKILL while queued; then the holder releases (to the dead head's channel).
    let crashed_timeout = score(&raw, &lock, &crashed)
        .await
        .expect("the queued waiter has its timeout") as i64;
    drop(child);
    holder.unlock().await.unwrap();
    let released = Instant::now();
    let acquired_ms = tokio::time::timeout(Duration::from_secs(30), taker)
        .await
        .expect("the queue is not blocked for good by a dead waiter")
        .unwrap();
    assert!(
        released.elapsed() < Duration::from_secs(15),
        "served about the dead waiter's 4 s wait after its turn, took {:?}",
        released.elapsed()
    );
    assert!(
        acquired_ms + 5 >= crashed_timeout,
        "the dead waiter kept its place until its timeout ({} ms early)",
        crashed_timeout - acquired_ms
    );
    assert_eq!(score(&raw, &lock, &crashed).await, None, "purged");
    assert!(queue(&raw, &lock).await.is_empty());
    client.shutdown().await.unwrap();
    holder_client.shutdown().await.unwrap();
}
