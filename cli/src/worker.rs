//! `redbaton demo-worker` (hidden): one worker process of the demo.
//!
//! It connects, prints `ready`, waits for a line on stdin, then runs `--tasks` tasks that buy
//! items until the stock is gone. At the end it prints one line per purchase attempt made under
//! the lock — `hold <acquired ns> <released ns>` on the CLOCK_MONOTONIC clock, which all
//! processes of one Linux host share — then `done`.

use std::io::{BufRead, Write};
use std::sync::Arc;

use fred::interfaces::KeysInterface;
use nix::time::{clock_gettime, ClockId};
use redbaton::Client;

use crate::args::WorkerArgs;
use crate::exit::{self, Failure};

/// Nanoseconds on the host-wide monotonic clock.
pub fn monotonic_ns() -> u64 {
    clock_gettime(ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

/// The keys of one demo run.
pub struct Keys {
    pub stock: String,
    pub sold: String,
    pub lock: String,
}

impl Keys {
    pub fn new(run: &str) -> Self {
        Keys {
            stock: format!("{run}:stock"),
            sold: format!("{run}:sold"),
            lock: format!("{run}:lock"),
        }
    }
}

pub async fn run(url: &str, args: WorkerArgs) -> Result<u8, Failure> {
    let client = crate::connect(url, &Default::default(), redbaton::DEFAULT_WATCHDOG_LEASE).await?;
    println!("ready");
    let _ = std::io::stdout().flush();
    let mut go = String::new();
    // Blocking is fine: nothing else needs this thread until the start signal.
    let _ = std::io::stdin().lock().read_line(&mut go);

    let keys = Arc::new(Keys::new(&args.run));
    let mut tasks = Vec::new();
    for _ in 0..args.tasks {
        let client = client.clone();
        let keys = keys.clone();
        let think = args.think;
        let locked = !args.unlocked;
        tasks.push(tokio::spawn(async move {
            buy(&client, &keys, think, locked).await
        }));
    }
    let mut holds = Vec::new();
    let mut failure = None;
    for task in tasks {
        match task.await {
            Ok(Ok(mut h)) => holds.append(&mut h),
            Ok(Err(e)) => failure = Some(Failure::from(e)),
            Err(e) => failure = Some(Failure::new(exit::SOFTWARE, format!("worker task: {e}"))),
        }
    }
    let _ = client.shutdown().await;
    if let Some(failure) = failure {
        return Err(failure);
    }
    let mut out = std::io::stdout().lock();
    for (acquired, released) in holds {
        let _ = writeln!(out, "hold {acquired} {released}");
    }
    let _ = writeln!(out, "done");
    Ok(0)
}

/// Buys until the stock is gone: read the stock, think, write stock-1, count the sale.
async fn buy(
    client: &Client,
    keys: &Keys,
    think: std::time::Duration,
    locked: bool,
) -> redbaton::Result<Vec<(u64, u64)>> {
    let redis = client.redis();
    let lock = client.lock(&keys.lock);
    let fail = |e: fred::error::Error| redbaton::Error::Redis(e.to_string());
    let mut holds = Vec::new();
    loop {
        let guard = if locked {
            Some(lock.lock().await?)
        } else {
            None
        };
        let acquired = monotonic_ns();
        let stock: i64 = redis.get(&keys.stock).await.map_err(fail)?;
        let sold_one = stock > 0;
        if sold_one {
            tokio::time::sleep(think).await;
            let () = redis
                .set(&keys.stock, stock - 1, None, None, false)
                .await
                .map_err(fail)?;
            let _: i64 = redis.incr(&keys.sold).await.map_err(fail)?;
        }
        if let Some(guard) = guard {
            holds.push((acquired, monotonic_ns()));
            guard.unlock().await?;
        }
        if !sold_one {
            return Ok(holds);
        }
    }
}
