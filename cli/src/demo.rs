//! `redbaton demo`: the flash sale. P worker processes × T tasks buy S items by
//! read–think–write, first under the lock, then without it.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, IsTerminal, Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fred::interfaces::{ClientLike, KeysInterface};
use fred::types::{ClusterHash, CustomCommand};
use nix::sys::signal::Signal;

use crate::args::DemoArgs;
use crate::exit::{self, Failure};
use crate::server::PrivateRedis;
use crate::worker::Keys;

/// Commands the lock itself sends (the workload's GET/SET/INCR and the commands that run
/// inside the scripts are not counted).
const LOCK_COMMANDS: &[&str] = &[
    "evalsha",
    "eval",
    "subscribe",
    "unsubscribe",
    "ssubscribe",
    "sunsubscribe",
    "ping",
];

/// What one run measured.
struct Run {
    sold: i64,
    stock_left: i64,
    elapsed: Duration,
    /// (acquired, released) per hold, monotonic ns, sorted by acquisition.
    holds: Vec<(u64, u64)>,
    /// Lock commands sent during the run, by name.
    commands: HashMap<String, u64>,
}

pub async fn run(url: Option<String>, args: DemoArgs) -> Result<u8, Failure> {
    let (server, url) = match url {
        Some(url) => (None, url),
        None => {
            let server = PrivateRedis::start()?;
            let url = server.url.clone();
            (Some(server), url)
        }
    };
    let client =
        crate::connect(&url, &Default::default(), redbaton::DEFAULT_WATCHDOG_LEASE).await?;
    let redis = client.redis().clone();
    println!(
        "redbaton demo: {} processes x {} tasks buy {} items (each purchase reads the stock, \
         thinks {}, writes stock-1)",
        args.processes,
        args.tasks,
        args.stock,
        humantime::format_duration(args.think)
    );
    println!(
        "Redis: {}{}",
        client.config().redacted_url(),
        if server.is_some() {
            " (a private redis-server, stopped at the end)"
        } else {
            ""
        }
    );
    let locked = sale(&redis, &url, &args, true).await;
    let unlocked = match &locked {
        Ok(_) => sale(&redis, &url, &args, false).await,
        Err(_) => Err(Failure::new(exit::SOFTWARE, "skipped")),
    };
    let _ = client.shutdown().await;
    drop(server);
    let locked = locked?;
    let unlocked = unlocked?;
    let stock = i64::from(args.stock);

    let overlaps = locked.holds.windows(2).filter(|w| w[1].0 < w[0].1).count();
    let mut handoffs: Vec<u64> = locked
        .holds
        .windows(2)
        .map(|w| w[1].0.saturating_sub(w[0].1))
        .collect();
    handoffs.sort_unstable();
    let acquisitions = locked.holds.len() as u64;
    let total_commands: u64 = locked.commands.values().sum();
    let per = |n: u64| n as f64 / acquisitions.max(1) as f64;
    let count = |names: &[&str]| -> u64 {
        names
            .iter()
            .map(|n| locked.commands.get(*n).copied().unwrap_or(0))
            .sum()
    };

    println!();
    println!("with the lock:");
    println!(
        "  sold {} of {} (oversold {}), stock left {}, in {:.2} s",
        locked.sold,
        stock,
        (locked.sold - stock).max(0),
        locked.stock_left,
        locked.elapsed.as_secs_f64()
    );
    println!(
        "  acquisitions      {} = {:.0}/s",
        acquisitions,
        acquisitions as f64 / locked.elapsed.as_secs_f64().max(1e-9)
    );
    println!(
        "  hand-off latency  p50 {}, p99 {}  (release -> next holder, {} hand-offs)",
        millis(percentile(&handoffs, 50)),
        millis(percentile(&handoffs, 99)),
        handoffs.len()
    );
    println!(
        "  Redis commands    {:.2} per acquisition: EVALSHA {:.2} (lock + unlock + the tries of \
         waiters woken in other processes), SUBSCRIBE/UNSUBSCRIBE {:.2}, PING {:.2}",
        per(total_commands),
        per(count(&["evalsha", "eval"])),
        per(count(&[
            "subscribe",
            "unsubscribe",
            "ssubscribe",
            "sunsubscribe"
        ])),
        per(count(&["ping"])),
    );
    println!("  overlapping holds {overlaps}");
    println!("without the lock:");
    println!(
        "  sold {} of {} (OVERSOLD {}), in {:.2} s",
        unlocked.sold,
        stock,
        (unlocked.sold - stock).max(0),
        unlocked.elapsed.as_secs_f64()
    );
    if locked.sold != stock || overlaps > 0 {
        return Err(Failure::new(
            exit::SOFTWARE,
            format!(
                "the locked run sold {} of {stock} items with {overlaps} overlapping holds",
                locked.sold
            ),
        ));
    }
    Ok(0)
}

fn percentile(sorted: &[u64], p: usize) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (sorted.len() * p).div_ceil(100).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn millis(ns: u64) -> String {
    format!("{:.2} ms", ns as f64 / 1e6)
}

/// A started worker: its process, its stdin (the start line) and a thread reading its output.
struct Worker {
    child: Child,
    stdin: Option<ChildStdin>,
    output: Option<JoinHandle<String>>,
}

fn start_worker(url: &str, args: &DemoArgs, run: &str, locked: bool) -> Result<Worker, Failure> {
    let exe = std::env::current_exe()
        .map_err(|e| Failure::new(exit::SOFTWARE, format!("cannot find my executable: {e}")))?;
    let mut command = Command::new(exe);
    command
        .arg("--url")
        .arg(url)
        .arg("demo-worker")
        .args(["--tasks", &args.tasks.to_string()])
        .args(["--think", &format!("{}us", args.think.as_micros())])
        .args(["--run", run])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if !locked {
        command.arg("--unlocked");
    }
    // SAFETY: only the async-signal-safe prctl runs between fork and exec.
    unsafe {
        command.pre_exec(|| Ok(nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?));
    }
    let mut child = command
        .spawn()
        .map_err(|e| Failure::new(exit::SOFTWARE, format!("cannot start a worker: {e}")))?;
    let stdin = child.stdin.take();
    let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
    let mut ready = String::new();
    let _ = stdout.read_line(&mut ready);
    if ready.trim() != "ready" {
        let _ = child.kill();
        let _ = child.wait();
        return Err(Failure::new(exit::SOFTWARE, "a worker failed to start"));
    }
    let output = std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = stdout.read_to_string(&mut rest);
        rest
    });
    Ok(Worker {
        child,
        stdin,
        output: Some(output),
    })
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// `INFO commandstats` as command → calls.
async fn command_calls(redis: &fred::clients::Client) -> Result<HashMap<String, u64>, Failure> {
    let info: String = redis
        .custom(
            CustomCommand::new_static("INFO", ClusterHash::Random, false),
            vec!["commandstats"],
        )
        .await
        .map_err(|e| Failure::new(exit::SOFTWARE, format!("INFO commandstats: {e}")))?;
    Ok(info
        .lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect())
}

fn redis_failure(e: fred::error::Error) -> Failure {
    Failure::new(exit::UNAVAILABLE, format!("Redis: {e}"))
}

/// One sale: set the stock, start the workers, start them together, wait, measure.
async fn sale(
    redis: &fred::clients::Client,
    url: &str,
    args: &DemoArgs,
    locked: bool,
) -> Result<Run, Failure> {
    let label = if locked {
        "with the lock"
    } else {
        "without the lock"
    };
    let run = format!(
        "redbaton-demo:{}:{}",
        std::process::id(),
        if locked { "locked" } else { "unlocked" }
    );
    let keys = Keys::new(&run);
    let () = redis
        .set(&keys.stock, i64::from(args.stock), None, None, false)
        .await
        .map_err(redis_failure)?;
    let () = redis
        .set(&keys.sold, 0, None, None, false)
        .await
        .map_err(redis_failure)?;

    let mut workers = Vec::new();
    for _ in 0..args.processes {
        workers.push(start_worker(url, args, &run, locked)?);
    }
    let before = command_calls(redis).await?;
    let started = Instant::now();
    for worker in &mut workers {
        if let Some(mut stdin) = worker.stdin.take() {
            let _ = stdin.write_all(b"go\n");
        }
    }
    let live = std::io::stdout().is_terminal();
    loop {
        let mut running = 0;
        for worker in &mut workers {
            match worker.child.try_wait() {
                Ok(Some(status)) if !status.success() => {
                    return Err(Failure::new(
                        exit::SOFTWARE,
                        format!("a worker failed ({status})"),
                    ))
                }
                Ok(Some(_)) => {}
                _ => running += 1,
            }
        }
        if live {
            let sold: i64 = redis.get(&keys.sold).await.unwrap_or(0);
            print!(
                "\r  {label}: sold {sold:>6}/{}  {:>5.1} s  {running} workers running   ",
                args.stock,
                started.elapsed().as_secs_f64()
            );
            let _ = std::io::stdout().flush();
        }
        if running == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if live {
        println!();
    }
    let after = command_calls(redis).await?;

    let mut holds = Vec::new();
    for worker in &mut workers {
        let output = worker
            .output
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        for line in output.lines() {
            let mut parts = line.split_whitespace();
            if parts.next() != Some("hold") {
                continue;
            }
            let (Some(a), Some(r)) = (parts.next(), parts.next()) else {
                continue;
            };
            if let (Ok(a), Ok(r)) = (a.parse::<u64>(), r.parse::<u64>()) {
                holds.push((a, r));
            }
        }
    }
    holds.sort_unstable();
    let elapsed = match (holds.first(), holds.iter().map(|h| h.1).max()) {
        (Some(first), Some(last)) if last > first.0 => Duration::from_nanos(last - first.0),
        _ => started.elapsed(),
    };
    let commands = LOCK_COMMANDS
        .iter()
        .map(|name| {
            let calls = |stats: &HashMap<String, u64>| stats.get(*name).copied().unwrap_or(0);
            let delta = calls(&after).saturating_sub(calls(&before));
            (name.to_string(), delta)
        })
        .collect();
    let sold: i64 = redis.get(&keys.sold).await.map_err(redis_failure)?;
    let stock_left: i64 = redis.get(&keys.stock).await.map_err(redis_failure)?;
    let _: i64 = redis
        .del(vec![keys.sold.as_str(), keys.stock.as_str()])
        .await
        .map_err(redis_failure)?;
    Ok(Run {
        sold,
        stock_left,
        elapsed: if locked { elapsed } else { started.elapsed() },
        holds,
        commands,
    })
}
