//! The run's ground: one clock for every process, the options (flags or `RB_*` variables),
//! and the allocator that counts live heap bytes.

use std::alloc::{GlobalAlloc, Layout, System};
use std::str::FromStr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use crate::contenders::Kind;

/// Nanoseconds on `CLOCK_MONOTONIC` (shared by all processes on this host).
pub(crate) fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC exists on every Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub(crate) async fn sleep_until_ns(t: u64) {
    let now = now_ns();
    if t > now {
        tokio::time::sleep(Duration::from_nanos(t - now)).await;
    }
}

pub(crate) fn env_or<T: FromStr>(key: &str, default: T) -> T {
    std::env::var(format!("RB_{key}"))
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Scenario sizes (flag `name=value` after `--`, or environment variable `RB_NAME`).
#[derive(Clone, Debug)]
pub(crate) struct Opts {
    /// Seconds each contended scenario runs per contender (`secs`, default 3).
    pub(crate) secs: f64,
    /// Uncontended lock+unlock iterations per contender (`iters`, default 2000).
    pub(crate) iters: usize,
    /// Hold time in µs inside the critical section (`hold_us`, default 1000).
    pub(crate) hold_us: u64,
    /// Tasks of the one-process hand-off (`tasks`, default 16).
    pub(crate) tasks: usize,
    /// Processes × tasks of the multi-process hand-off (`procs`, `per_proc`: 4 × 4).
    pub(crate) procs: usize,
    pub(crate) per_proc: usize,
    /// Many keys: names and tasks (`names` 1000, `many_tasks` 64).
    pub(crate) names: usize,
    pub(crate) many_tasks: usize,
    /// Parked waiters: tasks and names (`parked` 10000, `parked_names` 100).
    pub(crate) parked: usize,
    pub(crate) parked_names: usize,
    /// Parked waiters arrive in batches of this many (`parked_batch`, default 500; 0 = all at
    /// once).
    pub(crate) parked_batch: usize,
    /// Requests per redis-benchmark ceiling test (`ceiling_n`, default 200000).
    pub(crate) ceiling_n: usize,
    /// Many keys: runs per contender, interleaved; the median run and the spread are
    /// reported (`rounds`, default 3).
    pub(crate) rounds: usize,
    /// Comma-separated scenarios to run (`only`; default all): uncontended, handoff,
    /// handoff_mp, wakeup, many, java (Java Redisson beside redbaton), servers (redbaton on
    /// each server: `servers=redis-6.2,redis-7.0,valkey-8.1`, the default), parked.
    only: Option<Vec<String>>,
    /// Comma-separated contenders (`contenders`; default all): redbaton, redbaton-nobaton,
    /// redbaton-scripts and redbaton-nocheck (uncontended and many keys only), naive-10ms, naive-jitter, rslock, rslock-10ms, rlock, rlock-10ms, redisson.
    pub(crate) contenders: Vec<Kind>,
    /// Also write the JSON lines to this file (`json`; default: stdout only). Relative to the
    /// workspace root, since cargo runs benches from their package's directory.
    pub(crate) json: Option<std::path::PathBuf>,
}

impl Opts {
    pub(crate) fn from_env() -> Opts {
        let only = std::env::var("RB_ONLY")
            .ok()
            .map(|s| s.split(',').map(|x| x.trim().to_owned()).collect());
        let contenders = std::env::var("RB_CONTENDERS")
            .ok()
            .map(|s| s.split(',').filter_map(Kind::parse).collect())
            .unwrap_or_else(|| Kind::ALL.to_vec());
        Opts {
            secs: env_or("SECS", 3.0),
            iters: env_or("ITERS", 2000),
            hold_us: env_or("HOLD_US", 1000),
            tasks: env_or("TASKS", 16),
            procs: env_or("PROCS", 4),
            per_proc: env_or("PER_PROC", 4),
            names: env_or("NAMES", 1000),
            many_tasks: env_or("MANY_TASKS", 64),
            parked: env_or("PARKED", 10_000),
            parked_names: env_or("PARKED_NAMES", 100),
            parked_batch: env_or("PARKED_BATCH", 500),
            ceiling_n: env_or("CEILING_N", 200_000),
            rounds: env_or("ROUNDS", 3).max(1),
            only,
            contenders,
            json: std::env::var_os("RB_JSON").map(|p| workspace_path(p.as_ref())),
        }
    }

    /// The contenders a scenario runs: `redbaton-scripts` (no waiting of its own) only
    /// separates costs, in many keys and in the uncontended cycle, where it is the floor
    /// redbaton's own scripts set on a fred connection configured like redbaton's; so does
    /// `redbaton-nocheck` (what the checks between renewals cost).
    pub(crate) fn contenders_in(&self, scenario: &str) -> Vec<Kind> {
        let separates = |k: &Kind| {
            !matches!(k, Kind::Scripts | Kind::RedbatonNoCheck)
                || matches!(scenario, "many" | "uncontended")
        };
        self.contenders.iter().copied().filter(separates).collect()
    }

    pub(crate) fn runs(&self, scenario: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|o| o.iter().any(|s| s == scenario))
    }
}

/// `path` as given if absolute, else under the workspace root: `cargo bench` runs a bench with
/// its package directory (`benches/`) as the working directory, which is not where the user
/// typed the command.
fn workspace_path(path: &std::path::Path) -> std::path::PathBuf {
    if path.is_absolute() {
        path.to_owned()
    } else {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(path)
    }
}

/// The system allocator, counting live heap bytes (per-waiter memory without the allocator's
/// fragmentation, which the RSS figure includes) and allocations made (what a cycle costs the
/// allocator). Relaxed atomic adds per call, alike for every contender.
struct CountingAlloc;

pub(crate) static LIVE_HEAP: AtomicI64 = AtomicI64::new(0);

/// Allocations (and reallocations) made so far by the whole process.
pub(crate) static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            LIVE_HEAP.fetch_add(layout.size() as i64, Ordering::Relaxed);
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        LIVE_HEAP.fetch_sub(layout.size() as i64, Ordering::Relaxed);
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            LIVE_HEAP.fetch_add(layout.size() as i64, Ordering::Relaxed);
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        p
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            LIVE_HEAP.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;
