//! `FairLock` and `RFairLock`: one queue, served first come first served across both
//! languages.

use std::sync::Mutex;

use super::*;

/// Six waiters queue in turn, alternating sides (redbaton first), behind a Redisson holder;
/// each takes the lock and releases it at once. They get it in the order they queued.
pub async fn queue_order_holds_across_both_sides(env: &Env, name: &str) {
    let rust = env.rust().await;
    let java = env.java().await;
    let fair = rust.fair_lock(name);
    let holder = java.lock(0, "fair", name);
    holder.lock(None).await;
    let order: Arc<Mutex<Vec<(f64, String)>>> = Arc::default();
    let mut queued_as = Vec::new();
    let mut waiters = Vec::new();
    for i in 0..6u32 {
        let before = fair.queued().await.unwrap();
        let who = if i % 2 == 0 {
            let (lock, order) = (fair.clone(), order.clone());
            waiters.push(tokio::spawn(async move {
                let held = lock.lock().await.unwrap();
                order
                    .lock()
                    .unwrap()
                    .push((now_ms(), format!("redbaton {i}")));
                held.unlock().await.unwrap();
            }));
            None
        } else {
            // The thread's owner field, asked before its `lock()` keeps the thread busy.
            let owner = java.owner(i).await;
            let (lock, order) = (java.lock(i, "fair", name), order.clone());
            waiters.push(tokio::spawn(async move {
                let at = lock.lock(None).await;
                order.lock().unwrap().push((at, format!("Redisson {i}")));
                lock.unlock().await.unwrap();
            }));
            Some(owner)
        };
        let queued = eventually(Duration::from_secs(20), || async {
            fair.queued().await.unwrap().len() == before.len() + 1
        })
        .await;
        assert!(queued, "waiter {i} never queued");
        let now = fair.queued().await.unwrap();
        assert_eq!(now[..before.len()], before[..], "the queue kept its order");
        if let Some(owner) = who {
            assert_eq!(
                now.last(),
                Some(&owner),
                "Redisson's waiter {i} queued last"
            );
        }
        queued_as.push(now.last().cloned().unwrap());
    }
    holder.unlock().await.unwrap();
    for waiter in waiters {
        within("a fair waiter", Duration::from_secs(30), waiter).await;
    }
    let mut order = order.lock().unwrap().clone();
    order.sort_by(|a, b| a.0.total_cmp(&b.0));
    let served: Vec<&str> = order.iter().map(|(_, who)| who.as_str()).collect();
    let expected: Vec<String> = (0..6)
        .map(|i| format!("{} {i}", if i % 2 == 0 { "redbaton" } else { "Redisson" }))
        .collect();
    assert_eq!(served, expected, "queued as {queued_as:?}");
    assert!(fair.queued().await.unwrap().is_empty());
    report(&format!(
        "fair {name:?} ({:?}): served {served:?}",
        env.mode
    ));
    rust.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_order_holds_across_both_sides_single() {
    queue_order_holds_across_both_sides(&Env::single().await, "deploy:{prod}").await;
}
