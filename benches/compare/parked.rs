//! Parked waiters: many tasks waiting on names held by one task.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::counters::{pubsub_connections, rss_bytes};
use crate::harness::{now_ns, Opts, LIVE_HEAP};
use crate::stats::ms;
use crate::support::{command_calls, RedisServer};

pub(crate) struct Parked {
    pub(crate) waiters: usize,
    pub(crate) rss_per_waiter: f64,
    pub(crate) pubsub_conns: usize,
    pub(crate) drain_ms: f64,
    pub(crate) evalsha_per_waiter: f64,
    /// Size of one `lock()` future (the state a parked task keeps).
    pub(crate) future_bytes: usize,
    /// Live heap bytes per parked waiter (allocator-counted).
    pub(crate) heap_per_waiter: f64,
}

/// Parked waiters: `parked` tasks wait on `parked_names` names held by one task.
pub(crate) async fn parked(
    server: &RedisServer,
    raw: &fred::clients::Client,
    opts: &Opts,
) -> Parked {
    let client = redbaton::Client::connect(&server.url())
        .await
        .expect("connect");
    let names: Vec<String> = (0..opts.parked_names)
        .map(|i| format!("bench:parked:{i}"))
        .collect();
    // One task takes every name; its guards are released from here later.
    let guards = {
        let (client, names) = (client.clone(), names.clone());
        tokio::spawn(async move {
            let mut guards = Vec::new();
            for n in &names {
                guards.push(client.lock(n).lock().await.expect("lock"));
            }
            guards
        })
        .await
        .expect("holder")
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let future_bytes = std::mem::size_of_val(&client.lock(&names[0]).lock());
    let unlock_future_bytes = {
        let guard = client
            .lock("bench:parked:probe")
            .lock()
            .await
            .expect("lock");
        let unlock = guard.unlock();
        let size = std::mem::size_of_val(&unlock);
        unlock.await.expect("unlock");
        size
    };
    println!("parked: lock() future {future_bytes} B, unlock() future {unlock_future_bytes} B");
    let rss0 = rss_bytes();
    let heap0 = LIVE_HEAP.load(Ordering::SeqCst);
    let before = command_calls(raw).await;
    let done = Arc::new(AtomicUsize::new(0));
    let mut handles = Vec::with_capacity(opts.parked);
    for i in 0..opts.parked {
        let lock = client.lock(&names[i % names.len()]);
        let done = done.clone();
        handles.push(tokio::spawn(async move {
            let guard = lock.lock().await.expect("lock");
            guard.unlock().await.expect("unlock");
            done.fetch_add(1, Ordering::SeqCst);
        }));
        // Arrivals in batches: the next batch starts once this one made its first attempts,
        // so the figure is the parked state, not the allocator's leftovers from one burst of
        // 10,000 simultaneous round trips (set parked_batch=0 to see that burst).
        let spawned = i + 1;
        if opts.parked_batch > 0 && spawned % opts.parked_batch == 0 {
            loop {
                tokio::time::sleep(Duration::from_millis(10)).await;
                let now = command_calls(raw).await;
                let evalsha = now.get("evalsha").copied().unwrap_or(0)
                    - before.get("evalsha").copied().unwrap_or(0);
                if evalsha >= spawned as u64 {
                    break;
                }
            }
        }
    }
    // Parked = every waiter ran its attempts and the EVALSHA count stopped moving.
    let mut last = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = command_calls(raw).await;
        let evalsha =
            now.get("evalsha").copied().unwrap_or(0) - before.get("evalsha").copied().unwrap_or(0);
        if evalsha >= opts.parked as u64 && evalsha == last {
            break;
        }
        last = evalsha;
    }
    let rss1 = rss_bytes();
    let heap1 = LIVE_HEAP.load(Ordering::SeqCst);
    let conns = pubsub_connections(raw).await;
    let t0 = now_ns();
    for g in guards {
        g.unlock().await.expect("unlock");
    }
    for h in handles {
        h.await.expect("waiter");
    }
    let drain = now_ns() - t0;
    assert_eq!(done.load(Ordering::SeqCst), opts.parked);
    let after = command_calls(raw).await;
    let evalsha =
        after.get("evalsha").copied().unwrap_or(0) - before.get("evalsha").copied().unwrap_or(0);
    client.shutdown().await.expect("shutdown");
    Parked {
        waiters: opts.parked,
        rss_per_waiter: rss1.saturating_sub(rss0) as f64 / opts.parked as f64,
        pubsub_conns: conns,
        drain_ms: ms(drain),
        evalsha_per_waiter: evalsha as f64 / opts.parked as f64,
        future_bytes,
        heap_per_waiter: (heap1 - heap0) as f64 / opts.parked as f64,
    }
}
