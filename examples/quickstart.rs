//! Starts a private redis-server (or uses `REDIS_URL`), then shows reentry, a waiter woken
//! by an unlock, and a lost lease.
//!
//! ```text
//! cargo run --example quickstart
//! ```

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redbaton::Client;

fn start_private_redis() -> (Child, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port");
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server is not installed: apt-get install -y redis-server");
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "redis-server did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (child, format!("redis://127.0.0.1:{port}"))
}

#[tokio::main]
async fn main() -> redbaton::Result<()> {
    let (mut server, url) = match std::env::var("REDIS_URL") {
        Ok(url) => (None, url),
        Err(_) => {
            let (child, url) = start_private_redis();
            (Some(child), url)
        }
    };
    let client = Client::builder()
        .url(&url)
        .watchdog_lease(Duration::from_secs(3))
        .connect()
        .await?;
    let lock = client.lock("quickstart:order:42");

    // Reentry: the same task locks twice and must unlock twice.
    let outer = lock.lock().await?;
    let inner = lock.lock().await?;
    println!(
        "hold count after two lock() calls: {}",
        lock.hold_count().await?
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
    if let Some(server) = server.as_mut() {
        let _ = server.kill();
        let _ = server.wait();
    }
    Ok(())
}
