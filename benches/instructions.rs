//! CPU per acquisition, counted: the client's instructions (valgrind's callgrind, repeatable
//! whatever else runs on the host) and redis-server's CPU time (`INFO cpu`), per row.
//!
//! ```sh
//! cargo bench --bench instructions                      # every row
//! cargo bench --bench instructions -- rows=redbaton,redbaton-scripts reps=3
//! ```
//!
//! Each row is this binary run again as a child (`RB_CHILD=<row>`) against one private
//! `redis-server`:
//!
//! - **client instructions per acquisition**: the child runs under
//!   `valgrind --tool=callgrind` twice, `cycles` and `3 × cycles` acquisitions after the same
//!   warm-up, and the difference of the two runs' instruction totals is divided by the
//!   difference in acquisitions — so connecting, the runtime's start, the warm-up and the
//!   exit cancel out. The whole process counts: every thread (tokio's workers, the client
//!   library's tasks), user space only (callgrind does not see the kernel).
//! - **server CPU per acquisition**: the child runs natively, `server_cycles` acquisitions,
//!   and redis-server's `used_cpu_user + used_cpu_sys` delta over them is divided by their
//!   number (microseconds: a time, so it moves with the host's load; the median of `reps`).
//!
//! Rows: `evalsha` (one trivial `EVALSHA`, `return 1`, on a fred connection configured like
//! redbaton's: the floor of one round trip; a lock+unlock is two), `redbaton` (uncontended
//! lock+unlock), `redbaton-scripts` (redbaton's acquire and release scripts sent raw through
//! fred), `naive` (`SET NX PX` + compare-and-delete on fred), `rslock`, and the same lock
//! rows with `many:` before them: 64 tasks (`many_tasks`) on 1,000 names (`names`), what
//! `compare only=many` runs.

#[path = "compare/contenders.rs"]
#[allow(dead_code)]
mod contenders;
#[path = "fred_client.rs"]
mod fred_client;
use testkit as support;

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use fred::interfaces::ClientLike;
use fred::types::scripts::Script;

use crate::contenders::{Ctx, Kind};
use crate::fred_client::server_cpu_us;
use crate::support::RedisServer;

const ROWS: &[&str] = &[
    "evalsha",
    "redbaton",
    "redbaton-scripts",
    "naive",
    "rslock",
    "many:redbaton",
    "many:redbaton-scripts",
    "many:naive",
    "many:rslock",
];

fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(format!("RB_{key}"))
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main]
async fn main() {
    for arg in std::env::args().skip(1) {
        if let Some((k, v)) = arg.split_once('=') {
            std::env::set_var(format!("RB_{}", k.to_uppercase()), v);
        }
    }
    if let Ok(row) = std::env::var("RB_CHILD") {
        child(&row).await;
        return;
    }
    let rows: Vec<String> = std::env::var("RB_ROWS")
        .map(|s| s.split(',').map(|r| r.trim().to_owned()).collect())
        .unwrap_or_else(|_| ROWS.iter().map(|r| r.to_string()).collect());
    let reps: usize = env_or("REPS", 1).max(1);
    let cycles: usize = env_or("CYCLES", 200);
    let many_cycles: usize = env_or("MANY_CYCLES", 2000);
    let server = RedisServer::start();
    let url = server.url();
    println!(
        "| row | client instructions per acquisition{} | server CPU µs per acquisition (median{}) |\n|---|---|---|",
        if reps > 1 { ", per repetition" } else { "" },
        if reps > 1 {
            format!(" of {reps}, spread")
        } else {
            String::new()
        }
    );
    for row in &rows {
        let n = if row.starts_with("many:") {
            many_cycles
        } else {
            cycles
        };
        let mut counts = Vec::new();
        for _ in 0..reps {
            let small = counted(row, &url, n);
            let large = counted(row, &url, 3 * n);
            counts.push((large - small) as f64 / (2 * n) as f64);
        }
        let mut server_us: Vec<f64> = (0..reps).map(|_| server_cpu(row, &url)).collect();
        server_us.sort_by(f64::total_cmp);
        let median = server_us[server_us.len() / 2];
        let counts: Vec<String> = counts.iter().map(|c| format!("{c:.0}")).collect();
        let spread = if reps > 1 {
            format!(" ({:.1}–{:.1})", server_us[0], server_us[reps - 1])
        } else {
            String::new()
        };
        println!("| {row} | {} | {median:.1}{spread} |", counts.join(" / "));
    }
}

/// The child's instruction total for `acquisitions` measured acquisitions after the warm-up.
fn counted(row: &str, url: &str, acquisitions: usize) -> u64 {
    let dir = std::env::temp_dir().join(format!("rb-instructions-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let out = dir.join("callgrind.out");
    let status = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg("--dump-instr=no")
        .arg(std::env::current_exe().expect("exe"))
        .env("RB_CHILD", row)
        .env("RB_URL", url)
        .env("RB_ACQUISITIONS", acquisitions.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("valgrind (Debian's valgrind package) must be on PATH");
    assert!(status.success(), "callgrind run of {row} failed: {status}");
    let text = std::fs::read_to_string(&out).expect("callgrind output");
    let _ = std::fs::remove_dir_all(&dir);
    text.lines()
        .find_map(|l| {
            l.strip_prefix("totals:")
                .or_else(|| l.strip_prefix("summary:"))
        })
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("callgrind totals")
}

/// redis-server's CPU µs per acquisition over a native run of the child.
fn server_cpu(row: &str, url: &str) -> f64 {
    let acquisitions = if row.starts_with("many:") {
        env_or("SERVER_MANY_CYCLES", 40_000)
    } else {
        env_or("SERVER_CYCLES", 4_000)
    };
    let output = Command::new(std::env::current_exe().expect("exe"))
        .env("RB_CHILD", row)
        .env("RB_URL", url)
        .env("RB_ACQUISITIONS", acquisitions.to_string())
        .env("RB_SERVER_CPU", "1")
        .output()
        .expect("child");
    assert!(output.status.success(), "native run of {row} failed");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("server_us_per_acq "))
        .and_then(|v| v.trim().parse().ok())
        .expect("server CPU line")
}

/// One row's work: a warm-up, then `RB_ACQUISITIONS` acquisitions (lock+unlock, or one
/// EVALSHA for the `evalsha` row).
async fn child(row: &str) {
    let url = std::env::var("RB_URL").expect("RB_URL");
    let acquisitions: usize = env_or("ACQUISITIONS", 200);
    let (many, contender) = match row.strip_prefix("many:") {
        Some(c) => (true, c),
        None => (false, row),
    };
    let raw = if std::env::var_os("RB_SERVER_CPU").is_some() {
        Some(fred_client::fred_client(&url).await)
    } else {
        None
    };
    let warm_up = if many { 640 } else { 50 };
    let work = Work::connect(contender, &url).await;
    let work = Arc::new(work);
    run(&work, many, warm_up).await;
    let before = match &raw {
        Some(raw) => server_cpu_us(raw).await,
        None => 0.0,
    };
    run(&work, many, acquisitions).await;
    if let Some(raw) = &raw {
        let used = server_cpu_us(raw).await - before;
        println!("server_us_per_acq {}", used / acquisitions as f64);
    }
    if let Ok(work) = Arc::try_unwrap(work) {
        work.shutdown().await;
    }
}

/// What a row does per acquisition.
enum Work {
    Evalsha(fred::clients::Client, String),
    Lock(Ctx),
}

impl Work {
    async fn connect(contender: &str, url: &str) -> Work {
        if contender == "evalsha" {
            let redis = fred_client::fred_client(url).await;
            let trivial = Script::from_lua("return 1");
            trivial.load(&redis).await.expect("load");
            return Work::Evalsha(redis, trivial.sha1().to_string());
        }
        let kind = match contender {
            "naive" => Kind::Naive,
            other => Kind::parse(other).unwrap_or_else(|| panic!("unknown row {other:?}")),
        };
        Work::Lock(Ctx::connect(kind, url).await)
    }

    async fn once(&self, name: &str) {
        match self {
            Work::Evalsha(redis, sha) => {
                let _: i64 = fred::interfaces::LuaInterface::evalsha(redis, sha.as_str(), name, ())
                    .await
                    .expect("evalsha");
            }
            Work::Lock(ctx) => {
                let held = ctx.lock(name).await;
                ctx.unlock(held).await;
            }
        }
    }

    async fn shutdown(self) {
        match self {
            Work::Evalsha(redis, _) => {
                let _ = redis.quit().await;
            }
            Work::Lock(ctx) => ctx.shutdown().await,
        }
    }
}

/// `n` acquisitions: one after another on one name, or by `many_tasks` tasks on random names
/// among `names`.
async fn run(work: &Arc<Work>, many: bool, n: usize) {
    if !many {
        for _ in 0..n {
            work.once("bench:instructions").await;
        }
        return;
    }
    let (tasks, names) = (env_or("MANY_TASKS", 64usize), env_or("NAMES", 1000usize));
    let left = Arc::new(AtomicUsize::new(n));
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (work, left) = (work.clone(), left.clone());
        handles.push(tokio::spawn(async move {
            while left
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| l.checked_sub(1))
                .is_ok()
            {
                let name = format!("bench:instructions:{}", fastrand::usize(0..names));
                work.once(&name).await;
            }
        }));
    }
    for h in handles {
        h.await.expect("task");
    }
}
