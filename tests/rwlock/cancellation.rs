//! Shutdown, dropped guards and cancelled waiters: no hold and no subscription left.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_and_dropped_guards_release_read_and_write_holds() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server).await;
    let r1 = client.read_write_lock("s1").read().lock().await.unwrap();
    let r2 = client.read_write_lock("s1").read().lock().await.unwrap();
    let w = client.read_write_lock("s2").write().lock().await.unwrap();
    let s2 = client.read_write_lock("s2");
    let wr = w
        .run(|| async { s2.read().lock().await })
        .await
        .unwrap()
        .unwrap();
    let w3 = client.read_write_lock("s3").write().lock().await.unwrap();
    let w3b = w3.reenter().await.unwrap();
    client.shutdown().await.unwrap();
    for key in ["s1", "s2", "s3"] {
        assert!(!exists(&raw, key).await, "{key} released by shutdown");
    }
    assert!(keys(&raw, "*rwlock_timeout*").await.is_empty());
    for lost in [
        r1.is_lost(),
        r2.is_lost(),
        w.is_lost(),
        wr.is_lost(),
        w3.is_lost(),
    ] {
        assert!(lost);
    }
    drop((r1, r2, w, wr, w3, w3b));

    let client = self::client(&server).await;
    let rw = client.read_write_lock("dropped");
    drop(rw.read().lock().await.unwrap());
    assert!(
        eventually(Duration::from_secs(5), || async {
            !exists(&raw, "dropped").await
        })
        .await,
        "a dropped read guard is released"
    );
    drop(rw.write().lock().await.unwrap());
    assert!(
        eventually(Duration::from_secs(5), || async {
            !exists(&raw, "dropped").await
        })
        .await,
        "a dropped write guard is released"
    );
    assert!(keys(&raw, "*rwlock_timeout*").await.is_empty());
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waiters_leave_no_hold_and_no_subscription() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let holder = client(&server).await;
    let waiters = client(&server).await;
    let guard = holder
        .read_write_lock("cancel")
        .write()
        .lock()
        .await
        .unwrap();
    let rw = waiters.read_write_lock("cancel");
    let mut tasks = Vec::new();
    for i in 0..10 {
        let rw = rw.clone();
        tasks.push(tokio::spawn(async move {
            if i % 2 == 0 {
                rw.read().lock().await.map(drop)
            } else {
                rw.write().lock().await.map(drop)
            }
        }));
    }
    assert!(
        eventually(Duration::from_secs(5), || async {
            numsub(&raw, "redisson_rwlock:{cancel}").await == 1
        })
        .await
    );
    for t in &tasks {
        t.abort();
    }
    for t in tasks {
        assert!(t.await.unwrap_err().is_cancelled());
    }
    assert!(
        eventually(Duration::from_secs(5), || async {
            numsub(&raw, "redisson_rwlock:{cancel}").await == 0
        })
        .await
    );
    guard.unlock().await.unwrap();
    assert!(
        eventually(Duration::from_secs(5), || async {
            !exists(&raw, "cancel").await
        })
        .await
    );
    // Acquires cut short mid-flight: any hold they took is undone.
    for round in 0..20u64 {
        let mut tasks = Vec::new();
        for i in 0..8u64 {
            let rw = rw.clone();
            tasks.push(tokio::spawn(async move {
                let wait = Duration::from_micros(20 + (round * 37 + i * 53) % 400);
                if i % 3 == 0 {
                    let _ = tokio::time::timeout(wait, rw.write().lock()).await;
                } else {
                    let _ = tokio::time::timeout(wait, rw.read().lock()).await;
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    }
    assert!(
        eventually(Duration::from_secs(5), || async {
            !exists(&raw, "cancel").await && keys(&raw, "*rwlock_timeout*").await.is_empty()
        })
        .await,
        "a cancelled acquire left a hold behind"
    );
    holder.shutdown().await.unwrap();
    waiters.shutdown().await.unwrap();
}
