//! What replica sync costs: the uncontended lock+unlock cycle and the one-waiter hand-off,
//! with one replica attached, `ReplicaSync::Off` against `ReplicaSync::Auto` (which then
//! sends `WAIT 1` behind every lock script), measured in the same run, interleaved. A floor
//! row does the same with no lock library: `SET`+`DEL` on one fred connection, each alone or
//! pipelined with `WAIT 1` — what any client pays for two acknowledged writes.
//!
//! ```sh
//! cargo bench --bench replica_sync                 # 3 runs
//! cargo bench --bench replica_sync -- runs=5 iters=2000 handoffs=300 many_secs=3
//! ```
//!
//! A second table gives the many-keys throughput (`names` names × `many_tasks` tasks, each
//! task locking and unlocking names at random for `many_secs` seconds per mode).
//!
//! It starts a private primary and a replica of it on free loopback ports. Each run measures
//! both modes in alternating blocks and reports their medians and the ratio on/off; the
//! summary gives the median ratio over the runs with its range.

mod fred_client;
use testkit as support;

use std::time::{Duration, Instant};

use fred::interfaces::ClientLike;
use fred::types::{CustomCommand, Value};
use fred_client::fred_client;
use redbaton::{Client, ReplicaSync};
use support::cluster::cli;
use support::RedisServer;

fn opt(args: &[String], name: &str, default: usize) -> usize {
    args.iter()
        .find_map(|a| a.strip_prefix(&format!("{name}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

async fn client(url: &str, sync: ReplicaSync) -> Client {
    Client::builder()
        .url(url)
        .replica_sync(sync)
        .connect()
        .await
        .expect("connect")
}

/// Microseconds per lock+unlock, `iters` times.
async fn cycles(client: &Client, name: &str, iters: usize) -> Vec<f64> {
    let lock = client.lock(name);
    let mut out = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        let guard = lock.lock().await.unwrap();
        guard.unlock().await.unwrap();
        out.push(t.elapsed().as_secs_f64() * 1e6);
    }
    out
}

/// Acquisitions per second: `tasks` tasks lock and unlock names drawn from `names` for `secs`.
async fn many(client: &Client, names: usize, tasks: usize, secs: u64) -> f64 {
    let stop = Instant::now() + Duration::from_secs(secs);
    let workers = (0..tasks).map(|_| {
        let client = client.clone();
        tokio::spawn(async move {
            let mut done = 0u64;
            while Instant::now() < stop {
                let name = format!("bench:many:{}", fastrand::usize(..names));
                let guard = client.lock(&name).lock().await.unwrap();
                guard.unlock().await.unwrap();
                done += 1;
            }
            done
        })
    });
    let started = Instant::now();
    let mut total = 0;
    for worker in workers.collect::<Vec<_>>() {
        total += worker.await.unwrap();
    }
    total as f64 / started.elapsed().as_secs_f64()
}

/// One command on `redis`, followed in the same pipeline by `WAIT 1 5000` when `sync`.
async fn write(redis: &fred::clients::Client, name: &'static str, args: Vec<Value>, sync: bool) {
    let command = redis.custom::<Value, Value>(CustomCommand::new_static(name, None, false), args);
    if sync {
        let wait = redis.custom::<Value, Value>(
            CustomCommand::new_static("WAIT", None, false),
            vec![Value::from(1), Value::from(5000)],
        );
        // Joined in this order: both are enqueued back to back on the one connection.
        let (reply, acked) = tokio::join!(command, wait);
        reply.expect("write");
        assert_eq!(
            acked.expect("WAIT").as_i64(),
            Some(1),
            "the replica acknowledges"
        );
    } else {
        command.await.expect("write");
    }
}

/// Microseconds per `SET key v PX 30000` + `DEL key`, `iters` times: the floor of a cycle.
async fn floor_cycles(redis: &fred::clients::Client, sync: bool, iters: usize) -> Vec<f64> {
    let set = || {
        vec![
            Value::from("bench:floor"),
            Value::from("v"),
            Value::from("PX"),
            Value::from(30_000),
        ]
    };
    let mut out = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        write(redis, "SET", set(), sync).await;
        write(redis, "DEL", vec![Value::from("bench:floor")], sync).await;
        out.push(t.elapsed().as_secs_f64() * 1e6);
    }
    out
}

/// Microseconds from the holder's unlock call to the parked waiter's `lock()` returning.
async fn handoffs(client: &Client, name: &str, n: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let guard = client.lock(name).lock().await.unwrap();
        let lock = client.lock(name);
        let waiter = tokio::spawn(async move {
            let guard = lock.lock().await.unwrap();
            let got = Instant::now();
            guard.unlock().await.unwrap();
            got
        });
        // Long enough for the waiter to try, subscribe and park.
        tokio::time::sleep(Duration::from_millis(5)).await;
        let released = Instant::now();
        guard.unlock().await.unwrap();
        let got = waiter.await.unwrap();
        out.push(got.duration_since(released).as_secs_f64() * 1e6);
    }
    out
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runs = opt(&args, "runs", 3).max(1);
    let iters = opt(&args, "iters", 1000).max(10);
    let n_handoffs = opt(&args, "handoffs", 200).max(10);
    let many_secs = opt(&args, "many_secs", 2).max(1) as u64;
    let names = opt(&args, "names", 1000).max(1);
    let many_tasks = opt(&args, "many_tasks", 64).max(1);
    let blocks = 4;

    let primary = RedisServer::start();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &primary.port.to_string()]);
    let start = Instant::now();
    while !cli(primary.port, &["info", "replication"]).contains("state=online") {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "replica not online"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = &replica;
    let url = primary.url();
    let off = client(&url, ReplicaSync::Off).await;
    let on = client(&url, ReplicaSync::Auto).await;
    let floor = fred_client(&url).await;
    // Warm up both (scripts loaded, Auto has seen the replica).
    cycles(&off, "warm", 100).await;
    cycles(&on, "warm", 100).await;
    let waits_before = support::command_calls(&primary.raw().await)
        .await
        .get("wait")
        .copied()
        .unwrap_or(0);
    cycles(&on, "warm", 10).await;
    let waits_after = support::command_calls(&primary.raw().await)
        .await
        .get("wait")
        .copied()
        .unwrap_or(0);
    assert!(
        waits_after >= waits_before + 20,
        "sync on sends WAIT behind lock and unlock ({waits_before} -> {waits_after})"
    );

    println!(
        "replica sync cost: {runs} runs; per run {iters} uncontended cycles and {n_handoffs} \
         hand-offs per mode, in {blocks} alternating blocks; one replica attached"
    );
    println!();
    println!("| run | cycle off (µs) | cycle on (µs) | ratio | hand-off off (µs) | hand-off on (µs) | ratio | floor off (µs) | floor on (µs) | ratio |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut cycle_ratios = Vec::new();
    let mut handoff_ratios = Vec::new();
    let mut floor_ratios = Vec::new();
    for run in 1..=runs {
        let (mut c_off, mut c_on, mut h_off, mut h_on) = (vec![], vec![], vec![], vec![]);
        let (mut f_off, mut f_on) = (vec![], vec![]);
        for block in 0..blocks {
            // Alternate which mode goes first.
            let order: [(&Client, bool); 2] = if block % 2 == 0 {
                [(&off, false), (&on, true)]
            } else {
                [(&on, true), (&off, false)]
            };
            for (client, is_on) in order {
                let c = cycles(client, "bench:cycle", iters / blocks).await;
                let h = handoffs(client, "bench:handoff", n_handoffs / blocks).await;
                let f = floor_cycles(&floor, is_on, iters / blocks).await;
                if is_on {
                    c_on.extend(c);
                    h_on.extend(h);
                    f_on.extend(f);
                } else {
                    c_off.extend(c);
                    h_off.extend(h);
                    f_off.extend(f);
                }
            }
        }
        let (c_off, c_on, h_off, h_on) = (median(c_off), median(c_on), median(h_off), median(h_on));
        let (f_off, f_on) = (median(f_off), median(f_on));
        cycle_ratios.push(c_on / c_off);
        handoff_ratios.push(h_on / h_off);
        floor_ratios.push(f_on / f_off);
        println!(
            "| {run} | {c_off:.0} | {c_on:.0} | {:.2}× | {h_off:.0} | {h_on:.0} | {:.2}× | {f_off:.0} | {f_on:.0} | {:.2}× |",
            c_on / c_off,
            h_on / h_off,
            f_on / f_off
        );
    }
    println!();
    println!("many keys, {names} names × {many_tasks} tasks, {many_secs} s per mode, alternating:");
    println!();
    println!("| run | many off (acq/s) | many on (acq/s) | ratio |");
    println!("|---|---|---|---|");
    let mut many_ratios = Vec::new();
    for run in 1..=runs {
        let (m_off, m_on) = if run % 2 == 1 {
            let m_off = many(&off, names, many_tasks, many_secs).await;
            (m_off, many(&on, names, many_tasks, many_secs).await)
        } else {
            let m_on = many(&on, names, many_tasks, many_secs).await;
            (many(&off, names, many_tasks, many_secs).await, m_on)
        };
        many_ratios.push(m_on / m_off);
        println!("| {run} | {m_off:.0} | {m_on:.0} | {:.2}× |", m_on / m_off);
    }
    let summary = |v: &[f64]| {
        let min = v.iter().cloned().fold(f64::INFINITY, f64::min);
        let max = v.iter().cloned().fold(0.0, f64::max);
        format!("{:.2}× (range {min:.2}–{max:.2})", median(v.to_vec()))
    };
    println!();
    println!(
        "median over runs: cycle {}, hand-off {}; target ≤ 1.50×; floor (SET+DEL, no library) {}",
        summary(&cycle_ratios),
        summary(&handoff_ratios),
        summary(&floor_ratios)
    );
    println!(
        "median over runs: many keys on/off {}",
        summary(&many_ratios)
    );
    off.shutdown().await.unwrap();
    on.shutdown().await.unwrap();
    floor.quit().await.unwrap();
}
