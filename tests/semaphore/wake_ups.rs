//! Wake-ups: as many waiters as permits appeared, across processes, to one that can use it.

use super::*;
use support::monitor::ScriptRuns;

/// Waits until the server ran at least `min` scripts, then none for `quiet`: the waiters made
/// their attempts and parked. Scripts run, not calls: scripts issued together travel in one
/// call.
async fn wait_quiet(runs: &ScriptRuns, min: u64, quiet: Duration) -> u64 {
    let bound = Duration::from_secs(30);
    let reached = eventually(bound, || async { runs.count().await >= min }).await;
    assert!(
        reached,
        "waiters never settled: {} of {min} scripts",
        runs.count().await
    );
    runs.settled(quiet, bound).await
}

#[tokio::test]
async fn a_release_wakes_exactly_as_many_waiters_as_permits_appeared() {
    // Five waiters of one process park on an empty semaphore; release(2) must wake two of
    // them (not one, not all five), by message: their recheck timer is two minutes.
    let server = RedisServer::start();
    let raw = server.raw().await;
    let runs = ScriptRuns::start(&server, &raw).await;
    let waiters = client(&server.url()).await;
    let releaser = client(&server.url()).await;
    let sem = waiters
        .semaphore("wake")
        .with_recheck_interval(NO_RECHECK)
        .unwrap();
    assert!(sem.try_set_permits(0).await.unwrap());
    let before = runs.count().await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for i in 0..5 {
        let (sem, tx) = (sem.clone(), tx.clone());
        tasks.push(tokio::spawn(async move {
            sem.acquire().await.unwrap().forget();
            tx.send(i).unwrap();
        }));
    }
    assert!(
        eventually(Duration::from_secs(10), || async {
            numsub(&raw, "redisson_sc:{wake}").await == 1
        })
        .await
    );
    let parked = wait_quiet(&runs, before + 5, Duration::from_secs(1)).await;

    let released_at = Instant::now();
    releaser.semaphore("wake").release(2).await.unwrap();
    for _ in 0..2 {
        tokio::time::timeout(Duration::from_secs(20), rx.recv())
            .await
            .expect("two waiters are woken by the message")
            .unwrap();
    }
    assert!(released_at.elapsed() < NO_RECHECK / 4, "not by the timer");
    let after = wait_quiet(&runs, parked + 3, Duration::from_millis(700)).await;
    assert!(rx.try_recv().is_err(), "two permits, two holders");
    // The release, and one attempt by each of the two woken waiters: the other three were
    // not woken (a wake-all would add three attempts; a wake-one could not give two holders).
    assert_eq!(after - parked, 3, "scripts run after release(2)");
    assert_eq!(sem.available_permits().await.unwrap(), 0);

    releaser.semaphore("wake").release(3).await.unwrap();
    for _ in 0..3 {
        tokio::time::timeout(Duration::from_secs(20), rx.recv())
            .await
            .expect("the other three are woken")
            .unwrap();
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(sem.available_permits().await.unwrap(), 0);
    waiters.shutdown().await.unwrap();
    releaser.shutdown().await.unwrap();
}

#[tokio::test]
async fn waiters_across_processes_are_woken_by_releases() {
    // A waiter of another client, and one of the same client, each woken promptly by the
    // release of another process; the recheck timer is two minutes.
    let server = RedisServer::start();
    let a = client(&server.url()).await;
    let b = client(&server.url()).await;
    let raw = server.raw().await;
    let holder = a.semaphore("cross");
    holder.try_set_permits(2).await.unwrap();
    assert!(kept(holder.try_acquire_many(2).await.unwrap()));
    for waiter_client in [&b, &a] {
        let waiter = waiter_client
            .semaphore("cross")
            .with_recheck_interval(NO_RECHECK)
            .unwrap();
        assert!(!kept(waiter.try_acquire().await.unwrap()));
        let before = support::script_calls(&raw).await;
        let task = tokio::spawn(async move { waiter.acquire().await.map(SemaphorePermit::forget) });
        support::parked_fresh(&raw, "redisson_sc:{cross}", before).await;
        holder.release(1).await.unwrap();
        tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("woken by the release message")
            .unwrap()
            .unwrap();
    }
    assert_eq!(holder.available_permits().await.unwrap(), 0);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// A waiter asking for 2 permits parks first, then one asking for 1 (on the same client, or
/// on another), on an empty semaphore whose waiters recheck only every two minutes. A
/// `release(1)` must reach the waiter that can use it, by message, while the larger request
/// keeps waiting.
async fn a_released_permit_reaches_the_waiter_that_can_use_it(same_client: bool) {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let runs = ScriptRuns::start(&server, &raw).await;
    let big_client = client(&server.url()).await;
    let other = match same_client {
        true => None,
        false => Some(client(&server.url()).await),
    };
    let small_client = other.as_ref().unwrap_or(&big_client);
    let sem = |c: &Client| {
        c.semaphore("behind")
            .with_recheck_interval(NO_RECHECK)
            .unwrap()
    };
    assert!(sem(&big_client).try_set_permits(0).await.unwrap());

    let before = runs.count().await;
    let big = sem(&big_client);
    let big_task =
        tokio::spawn(async move { big.acquire_many(2).await.map(SemaphorePermit::forget) });
    // Parked before the smaller request comes: first in its process's line for a wake-up.
    let parked = wait_quiet(&runs, before + 1, Duration::from_millis(500)).await;
    let small = sem(small_client);
    let small_task =
        tokio::spawn(async move { small.acquire().await.map(SemaphorePermit::forget) });
    wait_quiet(&runs, parked + 1, Duration::from_millis(500)).await;
    let subscribers = if same_client { 1 } else { 2 };
    assert!(
        eventually(Duration::from_secs(10), || async {
            numsub(&raw, "redisson_sc:{behind}").await == subscribers
        })
        .await
    );

    let released_at = Instant::now();
    sem(&big_client).release(1).await.unwrap();
    tokio::time::timeout(Duration::from_secs(20), small_task)
        .await
        .expect("the released permit never reached the waiter asking for one")
        .unwrap()
        .unwrap();
    assert!(released_at.elapsed() < NO_RECHECK / 4, "not by the timer");
    assert!(
        !big_task.is_finished(),
        "one permit cannot serve a request for two"
    );
    assert_eq!(sem(&big_client).available_permits().await.unwrap(), 0);

    sem(&big_client).release(2).await.unwrap();
    tokio::time::timeout(Duration::from_secs(20), big_task)
        .await
        .expect("two permits wake the larger request")
        .unwrap()
        .unwrap();
    big_client.shutdown().await.unwrap();
    if let Some(other) = other {
        other.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn a_released_permit_passes_a_larger_waiter_of_the_same_client() {
    a_released_permit_reaches_the_waiter_that_can_use_it(true).await;
}

#[tokio::test]
async fn a_released_permit_passes_a_larger_waiter_of_another_client() {
    a_released_permit_reaches_the_waiter_that_can_use_it(false).await;
}
