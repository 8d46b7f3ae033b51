//! Permits: at most N held; given back on cancel, failure, drop and shutdown; drained.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_n_permits_are_held_at_any_instant() {
    const PERMITS: i64 = 3;
    let server = RedisServer::start();
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(client(&server.url()).await);
    }
    clients[0]
        .semaphore("contended")
        .try_set_permits(PERMITS as u32)
        .await
        .unwrap();
    let history = Arc::new(Mutex::new(Vec::new()));
    let in_use = Arc::new(AtomicI64::new(0));
    let mut tasks = Vec::new();
    for (c, client) in clients.iter().enumerate() {
        for t in 0..4 {
            let sem = client.semaphore("contended");
            let (history, in_use) = (history.clone(), in_use.clone());
            tasks.push(tokio::spawn(async move {
                for round in 0..25 {
                    let permits = 1 + ((c + t + round) % 2) as u32;
                    if (t + round) % 3 == 0 {
                        while !kept(
                            sem.try_acquire_many_for(
                                permits,
                                Duration::from_millis(fastrand::u64(1..50)),
                            )
                            .await
                            .unwrap(),
                        ) {}
                    } else {
                        sem.acquire_many(permits).await.unwrap().forget();
                    }
                    let from = Instant::now();
                    let now =
                        in_use.fetch_add(i64::from(permits), Ordering::SeqCst) + i64::from(permits);
                    assert!(now <= PERMITS, "{now} permits in use");
                    tokio::time::sleep(Duration::from_millis(fastrand::u64(0..4))).await;
                    in_use.fetch_sub(i64::from(permits), Ordering::SeqCst);
                    let to = Instant::now();
                    history.lock().unwrap().push((from, to, i64::from(permits)));
                    sem.release(permits).await.unwrap();
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
    let history = std::mem::take(&mut *history.lock().unwrap());
    assert_eq!(history.len(), 3 * 4 * 25);
    let most = max_held(&history, PERMITS);
    assert_eq!(
        most, PERMITS,
        "the run never used every permit at once: vacuous"
    );
    let sem = clients[0].semaphore("contended");
    assert_eq!(sem.available_permits().await.unwrap(), PERMITS);
    for client in clients {
        client.shutdown().await.unwrap();
    }
}

/// Contenders that share one task — futures joined, not spawned — on two clients of one
/// process stay within N holders too (invariant 14 of docs/DESIGN.md: a shared task is no shared
/// holder), each through its guard: released, or dropped and given back in the background.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contenders_joined_in_one_task_stay_within_n() {
    const PERMITS: i64 = 2;
    let server = RedisServer::start();
    let (a, b) = (client(&server.url()).await, client(&server.url()).await);
    a.semaphore("joined")
        .try_set_permits(PERMITS as u32)
        .await
        .unwrap();
    let history = Mutex::new(Vec::new());
    let in_use = AtomicI64::new(0);
    let contender = |sem: Semaphore, c: usize| {
        let (history, in_use) = (&history, &in_use);
        async move {
            for round in 0..15 {
                let permits = 1 + ((c + round) % 2) as u32;
                let permit = if round % 3 == 0 {
                    loop {
                        let wait = Duration::from_millis(fastrand::u64(1..50));
                        if let Some(p) = sem.try_acquire_many_for(permits, wait).await.unwrap() {
                            break p;
                        }
                    }
                } else {
                    sem.acquire_many(permits).await.unwrap()
                };
                let from = Instant::now();
                let now =
                    in_use.fetch_add(i64::from(permits), Ordering::SeqCst) + i64::from(permits);
                assert!(now <= PERMITS, "{now} permits in use");
                tokio::time::sleep(Duration::from_millis(fastrand::u64(0..4))).await;
                in_use.fetch_sub(i64::from(permits), Ordering::SeqCst);
                let to = Instant::now();
                history.lock().unwrap().push((from, to, i64::from(permits)));
                if round % 2 == 0 {
                    permit.release().await.unwrap();
                } else {
                    drop(permit);
                }
            }
        }
    };
    let contenders = (0..6).map(|c| {
        let client = if c % 2 == 0 { &a } else { &b };
        contender(client.semaphore("joined"), c)
    });
    tokio::time::timeout(
        Duration::from_secs(120),
        futures::future::join_all(contenders),
    )
    .await
    .expect("the contention run finishes");
    let history = history.into_inner().unwrap();
    assert_eq!(history.len(), 6 * 15);
    let most = max_held(&history, PERMITS);
    assert_eq!(
        most, PERMITS,
        "the run never used every permit at once: vacuous"
    );
    // Dropped permits come back in the background.
    let sem = a.semaphore("joined");
    let back = eventually(Duration::from_secs(10), || async {
        sem.available_permits().await.unwrap() == PERMITS
    })
    .await;
    assert!(back, "every permit came back");
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_and_timed_out_acquires_leave_no_permit_taken() {
    // Acquires cut short at random points (dropped while parked, while their round trip is
    // in flight, or after a timed-out wait) while permits come and go: once everything is
    // released, every permit is free again.
    const PERMITS: u32 = 2;
    let server = RedisServer::start();
    let a = client(&server.url()).await;
    let b = client(&server.url()).await;
    let sem = a.semaphore("cancel");
    sem.try_set_permits(PERMITS).await.unwrap();
    let mut tasks = Vec::new();
    for (i, client) in [&a, &b].into_iter().cycle().take(12).enumerate() {
        let sem = client.semaphore("cancel");
        tasks.push(tokio::spawn(async move {
            for _ in 0..30 {
                let permits = 1 + (i % 2) as u32;
                let cut = Duration::from_micros(fastrand::u64(0..20_000));
                let got = if i % 3 == 0 {
                    kept(sem.try_acquire_many_for(permits, cut).await.unwrap())
                } else {
                    let acquire = sem.acquire_many(permits);
                    match tokio::time::timeout(cut, acquire).await {
                        Ok(permit) => permit.unwrap().forget() == permits,
                        Err(_) => false,
                    }
                };
                if got {
                    tokio::time::sleep(Duration::from_micros(fastrand::u64(0..2000))).await;
                    sem.release(permits).await.unwrap();
                }
            }
        }));
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(120), task)
            .await
            .unwrap()
            .unwrap();
    }
    assert!(
        eventually(Duration::from_secs(20), || async {
            sem.available_permits().await.unwrap() == i64::from(PERMITS)
        })
        .await,
        "permits leaked: {} of {PERMITS} free",
        sem.available_permits().await.unwrap()
    );
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_whose_caller_left_gives_its_permits_back() {
    // The acquire script runs and takes the permits, but its reply is slow: one caller stops
    // waiting (command timeout), another is dropped. Both round trips are finished in the
    // background, and the permits they took are given back.
    let server = RedisServer::start();
    let raw = server.raw().await;
    let proxy = Proxy::start(server.port).await;
    let client = Client::builder()
        .url(proxy.url())
        .command_timeout(Duration::from_millis(1000))
        .connect()
        .await
        .unwrap();
    let sem = client.semaphore("slow");
    sem.try_set_permits(5).await.unwrap();
    // A second client for the dropped acquire, connected while replies are prompt.
    let other = Client::builder()
        .url(proxy.url())
        .command_timeout(Duration::from_millis(1000))
        .connect()
        .await
        .unwrap();
    proxy.set(Mode::RepliesDelayed(Duration::from_millis(1300)));

    let timed_out = sem.try_acquire_many(2).await;
    assert!(matches!(timed_out, Err(Error::Timeout(_))), "{timed_out:?}");
    // The other is dropped once its script ran (or it times out). It goes through a client of
    // its own: one client's scripts travel one group at a time, so behind the first's slow
    // reply it could be cut before it was even sent.
    // Both scripts ran: the server took all five permits.
    let both_ran = || async { get(&raw, "slow").await.as_deref() == Some("0") };
    let other_sem = other.semaphore("slow");
    tokio::select! {
        outcome = other_sem.acquire_many(3) => {
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
            get(&raw, "slow").await.as_deref() == Some("5")
        })
        .await,
        "the permits taken by abandoned acquires came back: {:?}",
        get(&raw, "slow").await
    );
    client.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

/// A job that takes permits the ordinary way — bound for as long as it runs — and then fails
/// before it gives them back, as code using `?` does.
async fn failing_job(sem: &Semaphore) -> redbaton::Result<()> {
    let _one = sem.acquire().await?;
    let _two = sem.try_acquire_many_for(2, Duration::from_secs(5)).await?;
    Err(Error::InvalidArgument("the job failed".to_owned()))
}

#[tokio::test]
async fn permits_taken_by_a_job_that_fails_come_back() {
    // The job's permits are given back when they go out of scope on its error path, as a
    // tokio permit is: none may leak.
    let server = RedisServer::start();
    let client = client(&server.url()).await;
    let sem = client.semaphore("jobs");
    sem.try_set_permits(6).await.unwrap();
    for _ in 0..2 {
        let job = tokio::time::timeout(Duration::from_secs(30), failing_job(&sem)).await;
        assert!(matches!(job, Ok(Err(Error::InvalidArgument(_)))), "{job:?}");
    }
    assert!(
        eventually(Duration::from_secs(20), || async {
            sem.available_permits().await.unwrap() == 6
        })
        .await,
        "permits leaked by failed jobs: {} of 6 free",
        sem.available_permits().await.unwrap()
    );
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_is_given_back_by_release_drop_or_cancel_and_kept_by_forget() {
    let server = RedisServer::start();
    let client = client(&server.url()).await;
    let sem = client.semaphore("guarded");
    sem.try_set_permits(5).await.unwrap();

    // release: back before it returns.
    let permit = sem.acquire_many(2).await.unwrap();
    assert_eq!(permit.permits(), 2);
    assert_eq!(permit.semaphore_name(), "guarded");
    assert_eq!(sem.available_permits().await.unwrap(), 3);
    permit.release().await.unwrap();
    assert_eq!(sem.available_permits().await.unwrap(), 5);

    // forget keeps them taken; a permit dropped after it comes back, the forgotten ones stay
    // out until a release(n) gives them back.
    assert_eq!(sem.acquire_many(2).await.unwrap().forget(), 2);
    drop(sem.try_acquire().await.unwrap().expect("3 free"));
    assert!(
        eventually(Duration::from_secs(20), || async {
            sem.available_permits().await.unwrap() == 3
        })
        .await,
        "the dropped permit came back, the forgotten ones did not: {} free",
        sem.available_permits().await.unwrap()
    );
    sem.release(2).await.unwrap();
    assert_eq!(sem.available_permits().await.unwrap(), 5);

    // A task holding permits is cancelled: they come back.
    let (held_tx, held_rx) = tokio::sync::oneshot::channel();
    let holder = {
        let sem = sem.clone();
        tokio::spawn(async move {
            let _permits = sem.acquire_many(4).await.unwrap();
            held_tx.send(()).unwrap();
            std::future::pending::<()>().await;
        })
    };
    held_rx.await.unwrap();
    assert_eq!(sem.available_permits().await.unwrap(), 1);
    holder.abort();
    assert!(
        eventually(Duration::from_secs(20), || async {
            sem.available_permits().await.unwrap() == 5
        })
        .await,
        "the cancelled task's permits came back: {} free",
        sem.available_permits().await.unwrap()
    );

    // release reports a refusal: the count would pass what a Redisson peer reads.
    let permit = sem.acquire().await.unwrap();
    sem.add_permits(i64::from(MAX_PERMITS) - 4).await.unwrap();
    let refused = permit.release().await;
    assert!(
        matches!(refused, Err(Error::InvalidArgument(_))),
        "{refused:?}"
    );
    assert_eq!(
        sem.available_permits().await.unwrap(),
        i64::from(MAX_PERMITS)
    );
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn drain_permits_takes_every_free_permit_as_redisson_does() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server.url()).await;
    let sem = client.semaphore("drained");
    let (_subscriber, mut messages) = subscribe(&server.url(), "redisson_sc:{drained}").await;

    // No count yet: 0, and none is created.
    assert_eq!(sem.drain_permits().await.unwrap(), 0);
    let exists: i64 = raw.exists("drained").await.unwrap();
    assert_eq!(exists, 0, "nothing created");

    sem.try_set_permits(5).await.unwrap();
    sem.acquire_many(2).await.unwrap().forget();
    let _: () = raw.pexpire("drained", 60_000, None).await.unwrap();
    assert_eq!(sem.drain_permits().await.unwrap(), 3);
    assert_eq!(get(&raw, "drained").await.as_deref(), Some("0"));
    let pttl: i64 = raw.pttl("drained").await.unwrap();
    assert_eq!(pttl, -1, "the SET clears the expiry, as Redisson's does");
    assert!(sem.try_acquire().await.unwrap().is_none(), "none left");

    // A negative count is raised to 0 and returned as it was.
    sem.add_permits(-3).await.unwrap();
    assert_eq!(sem.drain_permits().await.unwrap(), -3);
    assert_eq!(get(&raw, "drained").await.as_deref(), Some("0"));

    // Nothing published by a drain: only the set's "5".
    let seen = drain(&mut messages, Duration::from_millis(500)).await;
    assert_eq!(seen, ["5"]);

    // Another type, or a string that is not a count: refused, left alone.
    let _: () = raw.set("text", "many", None, None, false).await.unwrap();
    let refused = client.semaphore("text").drain_permits().await;
    assert!(
        matches!(refused, Err(Error::WrongType { .. })),
        "{refused:?}"
    );
    assert_eq!(get(&raw, "text").await.as_deref(), Some("many"));
    let _: () = raw.lpush("list", "x").await.unwrap();
    let refused = client.semaphore("list").drain_permits().await;
    assert!(
        matches!(refused, Err(Error::WrongType { .. })),
        "{refused:?}"
    );
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn shutdown_gives_back_the_permits_still_held() {
    // A permit still in scope when the client shuts down (the end of `main`, say): shutdown
    // gives its permits back, as it releases the locks still held; a forgotten one stays out.
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server.url()).await;
    let sem = client.semaphore("at-exit");
    sem.try_set_permits(5).await.unwrap();
    let held = sem.acquire_many(2).await.unwrap();
    sem.acquire().await.unwrap().forget();
    client.shutdown().await.unwrap();
    assert_eq!(
        get(&raw, "at-exit").await.as_deref(),
        Some("4"),
        "the held permits are back once shutdown returns; the forgotten one is not"
    );
    let late = held.release().await;
    assert!(matches!(late, Err(Error::ShutDown)), "{late:?}");
    assert_eq!(get(&raw, "at-exit").await.as_deref(), Some("4"));
}

/// A permit dropped just before shutdown (the end of a scope, then the end of `main`) is back
/// once shutdown returns: its give-back, spawned by the drop, is waited for, as shutdown waits
/// for a dropped lock guard's release — a runtime dropped after `shutdown` would cancel it and
/// lose the permits for good. (The test's runtime is current-thread: the give-back has not
/// even started when shutdown begins.)
#[tokio::test]
async fn a_permit_dropped_just_before_shutdown_is_back_once_shutdown_returns() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server.url()).await;
    let sem = client.semaphore("dropped-at-exit");
    sem.try_set_permits(100).await.unwrap();
    let mut permits = Vec::new();
    for _ in 0..50 {
        permits.push(sem.acquire_many(2).await.unwrap());
    }
    drop(permits);
    client.shutdown().await.unwrap();
    assert_eq!(
        get(&raw, "dropped-at-exit").await.as_deref(),
        Some("100"),
        "the dropped permits are back once shutdown returns"
    );
}

/// `set_permits` changes the total of a live semaphore: permits held stay counted, the free
/// count moves by the difference, waiters are woken by the permits it frees; `add_permits`
/// moves the recorded total too (issue 39: `try_set_permits` works once only).
#[tokio::test]
async fn set_permits_changes_the_total_of_a_live_semaphore() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server.url()).await;
    let sem = client.semaphore("pool");
    assert!(sem.try_set_permits(4).await.unwrap());
    assert_eq!(sem.total_permits().await.unwrap(), Some(4));
    let held = sem.acquire_many(3).await.unwrap();
    assert_eq!(sem.set_permits(6).await.unwrap(), 3, "6 in total, 3 held");
    assert_eq!(sem.available_permits().await.unwrap(), 3);
    assert_eq!(sem.set_permits(2).await.unwrap(), -1, "2 in total, 3 held");
    // A waiter is woken by the permits a larger total frees.
    let waiter = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.acquire_many(2).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "no permit is free");
    assert_eq!(sem.set_permits(4).await.unwrap(), 1);
    assert_eq!(sem.set_permits(5).await.unwrap(), 2);
    let woken = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter is woken by the permits set_permits freed")
        .unwrap()
        .unwrap();
    woken.release().await.unwrap();
    held.release().await.unwrap();
    assert_eq!(sem.available_permits().await.unwrap(), 5);
    sem.add_permits(2).await.unwrap();
    assert_eq!(sem.total_permits().await.unwrap(), Some(7));
    assert_eq!(get(&raw, sem.total_key()).await.as_deref(), Some("7"));

    // A count set without the record (a Redisson peer's `trySetPermits`): its total is
    // unknown, and nothing changes.
    let () = raw.set("peer", "3", None, None, false).await.unwrap();
    let peer = client.semaphore("peer");
    assert!(matches!(
        peer.set_permits(5).await,
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(get(&raw, "peer").await.as_deref(), Some("3"));
    assert_eq!(peer.total_permits().await.unwrap(), None);
    // An absent count is a new semaphore.
    let fresh = client.semaphore("fresh");
    assert_eq!(fresh.set_permits(5).await.unwrap(), 5);
    assert_eq!(fresh.available_permits().await.unwrap(), 5);
    assert!(!fresh.try_set_permits(9).await.unwrap());
    assert!(matches!(
        fresh.set_permits(MAX_PERMITS + 1).await,
        Err(Error::InvalidArgument(_))
    ));
    client.shutdown().await.unwrap();
}
