//! Reentry, exclusion between clients and tasks, unlock by a non-owner, guards moved.

use super::*;

#[tokio::test]
async fn reentry_counts_up_and_down_and_the_key_goes() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server).await;
    let lock = client.lock("reentry");
    assert_eq!(lock.hold_count().await.unwrap(), 0);
    let g1 = lock.lock().await.unwrap();
    let owned = lock.with_owner(g1.owner());
    assert_eq!(owned.hold_count().await.unwrap(), 1);
    // Outside the hold's scope a second acquire is another owner: it does not re-enter.
    assert!(lock.try_lock().await.unwrap().is_none());
    let g2 = g1.reenter().await.unwrap();
    let g3 = g1
        .run(|| async { lock.try_lock().await.unwrap().expect("re-enters in scope") })
        .await
        .unwrap();
    assert_eq!(owned.hold_count().await.unwrap(), 3);
    assert!(owned.is_held_in_scope().await.unwrap());
    assert!(g1.run(|| lock.is_held_in_scope()).await.unwrap().unwrap());
    assert_eq!(g1.run(|| lock.hold_count()).await.unwrap().unwrap(), 3);
    assert!(
        !lock.is_held_in_scope().await.unwrap(),
        "no scope, no owner"
    );
    g3.unlock().await.unwrap();
    assert_eq!(owned.hold_count().await.unwrap(), 2);
    g2.unlock().await.unwrap();
    assert_eq!(owned.hold_count().await.unwrap(), 1);
    assert!(lock.is_locked().await.unwrap());
    g1.unlock().await.unwrap();
    assert_eq!(owned.hold_count().await.unwrap(), 0);
    assert!(!lock.is_locked().await.unwrap());
    let exists: i64 = raw.exists("reentry").await.unwrap();
    assert_eq!(exists, 0, "the key is deleted at count 0");
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn two_clients_exclude_each_other() {
    let server = RedisServer::start();
    let a = client(&server).await;
    let b = client(&server).await;
    let held = a.lock("excl").lock().await.unwrap();
    assert!(b.lock("excl").try_lock().await.unwrap().is_none());
    assert_eq!(b.lock("excl").hold_count().await.unwrap(), 0);
    assert!(b.lock("excl").is_locked().await.unwrap());
    assert!(!b.lock("excl").is_held_in_scope().await.unwrap());
    held.unlock().await.unwrap();
    let got = b.lock("excl").try_lock().await.unwrap().expect("free now");
    got.unlock().await.unwrap();
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_tasks_of_one_process_wait() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let lock = client.lock("tasks");
    let guard = lock.lock().await.unwrap();
    let other = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.try_lock().await.unwrap().is_some() })
    };
    assert!(!other.await.unwrap(), "another task must not re-enter");
    guard.unlock().await.unwrap();
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_is_exact_under_contention() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let clients = [client(&server).await, client(&server).await];
    let mut tasks = Vec::new();
    for t in 0..8 {
        let lock = clients[t % 2].lock("counter-lock");
        let raw = raw.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..20 {
                let guard = lock.lock().await.unwrap();
                // Non-atomic read-modify-write: only mutual exclusion keeps it exact.
                let v: Option<i64> = raw.get("counter").await.unwrap();
                tokio::time::sleep(Duration::from_micros(200)).await;
                let _: () = raw
                    .set("counter", v.unwrap_or(0) + 1, None, None, false)
                    .await
                    .unwrap();
                guard.unlock().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let v: i64 = raw.get("counter").await.unwrap();
    assert_eq!(v, 160);
    for c in clients {
        c.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn unlock_by_a_non_owner_is_refused() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let a = client(&server).await;
    let b = client(&server).await;
    let guard = a.lock("mine").lock().await.unwrap();
    // b pretends to be some other owner of its own: refused, nothing changes.
    let other: redbaton::Owner = format!("{}:1", b.id()).parse().unwrap();
    let as_other = b.lock("mine").with_owner(other);
    assert!(as_other.try_lock().await.unwrap().is_none());
    let fields: HashMap<String, i64> = raw.hgetall("mine").await.unwrap();
    assert_eq!(fields.len(), 1);
    // Releasing a guard whose hold was removed underneath is NotHeld, never a delete.
    let _: i64 = raw.del("mine").await.unwrap();
    let _: () = raw.hset("mine", ("someone-else:9", 1)).await.unwrap();
    let _: () = raw.pexpire("mine", 30_000, None).await.unwrap();
    assert!(matches!(guard.unlock().await, Err(Error::NotHeld { .. })));
    let fields: HashMap<String, i64> = raw.hgetall("mine").await.unwrap();
    assert_eq!(fields.get("someone-else:9"), Some(&1));
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test]
async fn guards_move_into_spawned_tasks_and_drop_releases() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let lock = client.lock("moved");
    let guard = lock.lock().await.unwrap();
    tokio::spawn(async move {
        // Released in another task: it acts as the owner that acquired it.
        guard.unlock().await.unwrap();
    })
    .await
    .unwrap();
    assert!(!lock.is_locked().await.unwrap());
    let guard = lock.lock().await.unwrap();
    drop(guard);
    assert!(
        eventually(Duration::from_secs(5), || async {
            !lock.is_locked().await.unwrap()
        })
        .await,
        "a dropped guard is released in the background"
    );
    client.shutdown().await.unwrap();
}

#[test]
fn outside_a_task_scopes_still_decide() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = client(&server).await;
        let lock = client.lock("blockon");
        // The block_on body is no task: the scope decides there as anywhere.
        let g1 = lock.lock().await.unwrap();
        assert!(lock.try_lock().await.unwrap().is_none(), "a new owner");
        let g2 = g1
            .run(|| async { lock.try_lock().await.unwrap().expect("re-enters in scope") })
            .await
            .unwrap();
        assert_eq!(lock.with_owner(g1.owner()).hold_count().await.unwrap(), 2);
        let in_task = {
            let lock = lock.clone();
            tokio::spawn(async move { lock.try_lock().await.unwrap().is_some() })
        };
        assert!(!in_task.await.unwrap());
        g2.unlock().await.unwrap();
        g1.unlock().await.unwrap();
        client.shutdown().await.unwrap();
    });
}

#[tokio::test]
async fn arc_shared_client_and_clones() {
    let server = RedisServer::start();
    let client = Arc::new(client(&server).await);
    let lock = client.lock("clone");
    let copy = lock.clone();
    let g = lock.lock().await.unwrap();
    assert_eq!(g.run(|| copy.hold_count()).await.unwrap().unwrap(), 1);
    g.unlock().await.unwrap();
    client.shutdown().await.unwrap();
}
