//! On a cluster: one slot per name, and wake-ups in both pub/sub modes.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_one_slot_per_name_and_wakeups_in_both_pubsub_modes() {
    use support::cluster::RedisCluster;
    let cluster = RedisCluster::start(3, 0);
    let slot = |key: &str| fred::util::redis_keyslot(key.as_bytes());
    let names = ["catalog:1", "{grp}:rw", "catalog:2"];
    for mode in support::pubsub_modes() {
        let connect = || Client::builder().url(cluster.url()).pubsub(mode).connect();
        // The default lease: a waiter's timer (the lock's PTTL) is far beyond the bounds
        // below, so only the message can wake it within them.
        let a = connect().await.unwrap();
        let b = connect().await.unwrap();
        for name in names {
            let what = format!("{mode:?} {name}");
            let r = a.read_write_lock(name).read().lock().await.unwrap();
            let r2 = r.reenter().await.unwrap();
            let owner = r.owner().to_string();
            for i in [1, 2] {
                let key = timeout_key(name, &owner, i);
                assert_eq!(slot(&key), slot(name), "{what}: {key}");
                let n: i64 = a.redis().exists(&key).await.unwrap();
                assert_eq!(n, 1, "{what}: {key}");
            }
            assert_eq!(
                slot(a.read_write_lock(name).channel()),
                slot(name),
                "{what}"
            );
            // A writer waits and is woken by the last read unlock.
            let writer = {
                let rw = b.read_write_lock(name);
                tokio::spawn(async move {
                    let g = rw.write().lock().await.unwrap();
                    let at = Instant::now();
                    (g, at)
                })
            };
            // Time for the writer to park (sooner, it would find the lock free: no wake-up).
            tokio::time::sleep(Duration::from_millis(1500)).await;
            r2.unlock().await.unwrap();
            let released = Instant::now();
            r.unlock().await.unwrap();
            let (w, at) = tokio::time::timeout(Duration::from_secs(10), writer)
                .await
                .unwrap_or_else(|_| panic!("{what}: writer not woken"))
                .unwrap();
            assert!(
                at.saturating_duration_since(released) < Duration::from_secs(3),
                "{what}: writer woken by the message"
            );
            // Readers wait and are all woken by the write unlock.
            let barrier = Arc::new(Barrier::new(3));
            let readers: Vec<_> = (0..3)
                .map(|_| spawn_reader(a.read_write_lock(name), barrier.clone()))
                .collect();
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let released = Instant::now();
            w.unlock().await.unwrap();
            for reader in readers {
                let at = tokio::time::timeout(Duration::from_secs(10), reader)
                    .await
                    .unwrap_or_else(|_| panic!("{what}: reader not woken"))
                    .unwrap();
                assert!(
                    at.saturating_duration_since(released) < Duration::from_secs(3),
                    "{what}: readers woken by the message"
                );
            }
            let n: i64 = a.redis().exists(name).await.unwrap();
            assert_eq!(n, 0, "{what}");
        }
        a.shutdown().await.unwrap();
        b.shutdown().await.unwrap();

        // Renewal across slots: read holds of every name, and their timeout keys, outlive two
        // short leases (one renewal script per slot).
        let renewer = Client::builder()
            .url(cluster.url())
            .pubsub(mode)
            .watchdog_lease(RENEWED_LEASE)
            .connect()
            .await
            .unwrap();
        let mut held = Vec::new();
        for name in names {
            let r = renewer.read_write_lock(name).read().lock().await.unwrap();
            let r2 = r.reenter().await.unwrap();
            held.push((name, r, r2));
        }
        tokio::time::sleep(RENEWED_LEASE * 2).await;
        for (name, r, r2) in held {
            let what = format!("{mode:?} {name}");
            assert!(!r.is_lost() && !r2.is_lost(), "{what}: renewed");
            let owner = r.owner().to_string();
            for i in [1, 2] {
                let n: i64 = renewer
                    .redis()
                    .exists(timeout_key(name, &owner, i))
                    .await
                    .unwrap();
                assert_eq!(n, 1, "{what}: timeout key {i} renewed");
            }
            r2.unlock().await.unwrap();
            r.unlock().await.unwrap();
        }
        renewer.shutdown().await.unwrap();
    }
}
