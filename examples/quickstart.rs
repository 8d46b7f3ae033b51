//! Starts a private redis-server (or uses `REDIS_URL`), then shows reentry, a waiter woken
//! by an unlock, and a lost lease.
//!
//! ```text
//! cargo run --example quickstart
//! ```

use std::time::{Duration, Instant};

use redbaton::Client;

#[path = "common/redis.rs"]
mod common;

#[tokio::main]
async fn main() -> redbaton::Result<()> {
    let redis = common::redis();
    let client = Client::builder()
        .url(&redis.url)
        .watchdog_lease(Duration::from_secs(3))
        .connect()
        .await?;
    let lock = client.lock("quickstart:order:42");

    // Reentry is by the hold's scope: inside `run` (or with `reenter`), the same owner takes
    // it again, and must release it again.
    let outer = lock.lock().await?;
    let inner = outer.run(|| lock.lock()).await??;
    println!(
        "hold count after a nested lock(): {}",
        outer.run(|| lock.hold_count()).await??
    );

    // Another task waits without polling and is woken by the final unlock.
    let waiter = {
        let lock = lock.clone();
        tokio::spawn(async move {
            let guard = lock.lock().await?;
            let at = Instant::now();
            guard.unlock().await?;
            Ok::<_, redbaton::Error>(at)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    inner.unlock().await?;
    let released = Instant::now();
    outer.unlock().await?;
    let acquired = waiter.await.expect("waiter task")?;
    println!(
        "hand-off to the waiting task took {:?}",
        acquired.saturating_duration_since(released)
    );

    // A lease lost to force_unlock is reported through the guard.
    let guard = lock.lock().await?;
    lock.force_unlock().await?;
    tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("lost() fires within one renewal period");
    println!("force_unlock -> guard.is_lost() = {}", guard.is_lost());

    client.shutdown().await?;
    Ok(())
}
