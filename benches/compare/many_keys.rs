//! Many keys: tasks lock and unlock random names among many, with the CPU time each
//! acquisition costs the bench process and redis-server.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::contenders::{Ctx, Kind};
use crate::counters::commands_per_acq;
use crate::fred_client::server_cpu_us;
use crate::harness::{now_ns, sleep_until_ns, Opts};
use crate::support::{command_calls, RedisServer};

/// Many keys: `many_tasks` tasks lock+unlock random names among `names`.
pub(crate) async fn many_keys(
    kind: Kind,
    server: &RedisServer,
    raw: &fred::clients::Client,
    opts: &Opts,
) -> ManyRun {
    let ctx = Arc::new(Ctx::connect(kind, &server.url()).await);
    let before = command_calls(raw).await;
    let (client_cpu, server_cpu) = (process_cpu_us(), server_cpu_us(raw).await);
    let start_ns = now_ns() + 50_000_000;
    let end_ns = start_ns + (opts.secs * 1e9) as u64;
    let count = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for _ in 0..opts.many_tasks {
        let (ctx, count, names) = (ctx.clone(), count.clone(), opts.names);
        handles.push(tokio::spawn(async move {
            sleep_until_ns(start_ns).await;
            while now_ns() < end_ns {
                let name = format!("bench:many:{}:{}", ctx_tag(&ctx), fastrand::usize(0..names));
                let held = ctx.lock(&name).await;
                ctx.unlock(held).await;
                count.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for h in handles {
        h.await.expect("task");
    }
    let elapsed = (now_ns() - start_ns) as f64 / 1e9;
    let n = count.load(Ordering::Relaxed) as usize;
    let client_us = (process_cpu_us() - client_cpu) / n.max(1) as f64;
    let server_us = (server_cpu_us(raw).await - server_cpu) / n.max(1) as f64;
    let after = command_calls(raw).await;
    if let Ok(ctx) = Arc::try_unwrap(ctx) {
        ctx.shutdown().await;
    }
    ManyRun {
        rate: n as f64 / elapsed,
        cmds: commands_per_acq(kind, &before, &after, n),
        client_us,
        server_us,
    }
}

/// One many-keys run of one contender.
pub(crate) struct ManyRun {
    pub(crate) rate: f64,
    /// Commands per acquisition: (network, in scripts).
    pub(crate) cmds: (f64, f64),
    /// CPU time per acquisition, µs: this process (all its threads) and redis-server.
    pub(crate) client_us: f64,
    pub(crate) server_us: f64,
}

/// CPU time this process has used so far (user + system, all threads), in µs.
fn process_cpu_us() -> f64 {
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct it is given and nothing else.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let us = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    us(usage.ru_utime) + us(usage.ru_stime)
}

fn ctx_tag(ctx: &Ctx) -> &'static str {
    match ctx {
        Ctx::Redbaton(_) => "rb",
        Ctx::Naive { .. } => "naive",
        Ctx::Scripts { .. } => "scripts",
        Ctx::Rslock(_) => "rslock",
        Ctx::Rlock(..) => "rlock",
        Ctx::Redisson(_) => "redisson",
    }
}

/// `redis-benchmark`'s requests/s for one command line, `-c clients`, `-P pipeline`.
pub(crate) fn redis_benchmark(
    port: u16,
    clients: usize,
    pipeline: usize,
    n: usize,
    command: &[&str],
) -> Option<f64> {
    let output = std::process::Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args([
            "-c",
            &clients.to_string(),
            "-n",
            &n.to_string(),
            "-P",
            &pipeline.to_string(),
            "-r",
            "1000",
            "--csv",
        ])
        .args(command)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    let last = text.lines().rfind(|l| !l.trim().is_empty())?;
    last.split("\",\"").nth(1)?.trim_matches('"').parse().ok()
}
