//! redbaton against the physical floor and the alternatives, side by side, in one run.
//!
//! `cargo bench --bench compare` starts a private `redis-server` on a free loopback port and
//! measures, in the same run: the floor (EVALSHA and PING round trips), a naive
//! `SET NX PX` lock (10 ms sleep and jittered), the peer crates `rslock`, `rlock` and
//! `redisson`, and redbaton twice: `redbaton` at its defaults (baton pass on) and
//! `redbaton-nobaton` (`baton_passes(0)`, the behaviour before the baton pass) — uncontended, reentrant, hand-off (1 process and several
//! processes), wake-up without barging, many keys and parked waiters. `redbaton-scripts`
//! sends redbaton's own acquire and release scripts straight through fred with no library
//! around them (polling 10 ms), so the many-keys table separates what the library costs from
//! what the protocol costs; that table also gives the CPU time each acquisition costs the
//! bench process and redis-server. It prints markdown tables, a target summary and one JSON
//! line per scenario and contender.
//!
//! Sizes are flags: `cargo bench --bench compare -- secs=2 procs=4 only=handoff,wakeup`, or
//! the same as environment variables (`RB_SECS=2`). See `Opts` for the list.
//!
//! `json=path` also writes the JSON lines to that file (relative paths are taken from the
//! workspace root), which `cargo bench --bench chart` turns into the wake-up latency chart.
//!
//! Times come from `CLOCK_MONOTONIC`, which every process on the host shares, so hand-offs
//! between processes are measured on one clock.

#[path = "../fred_client.rs"]
mod fred_client;
#[path = "../../tests/support/mod.rs"]
mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::process::Stdio;
use std::str::FromStr;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fred::interfaces::{ClientLike, KeysInterface, LuaInterface};
use fred::types::scripts::Script;
use fred::types::{CustomCommand, Expiration, SetOptions, Value};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::watch;

use fred_client::fred_client;
use support::{command_calls, RedisServer};

// ---------------------------------------------------------------------------------------
// Clock, options, statistics
// ---------------------------------------------------------------------------------------

/// Nanoseconds on `CLOCK_MONOTONIC` (shared by all processes on this host).
fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC exists on every Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

async fn sleep_until_ns(t: u64) {
    let now = now_ns();
    if t > now {
        tokio::time::sleep(Duration::from_nanos(t - now)).await;
    }
}

fn env_or<T: FromStr>(key: &str, default: T) -> T {
    std::env::var(format!("RB_{key}"))
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Scenario sizes (flag `name=value` after `--`, or environment variable `RB_NAME`).
#[derive(Clone, Debug)]
struct Opts {
    /// Seconds each contended scenario runs per contender (`secs`, default 3).
    secs: f64,
    /// Uncontended lock+unlock iterations per contender (`iters`, default 2000).
    iters: usize,
    /// Hold time in µs inside the critical section (`hold_us`, default 1000).
    hold_us: u64,
    /// Tasks of the one-process hand-off (`tasks`, default 16).
    tasks: usize,
    /// Processes × tasks of the multi-process hand-off (`procs`, `per_proc`: 4 × 4).
    procs: usize,
    per_proc: usize,
    /// Many keys: names and tasks (`names` 1000, `many_tasks` 64).
    names: usize,
    many_tasks: usize,
    /// Parked waiters: tasks and names (`parked` 10000, `parked_names` 100).
    parked: usize,
    parked_names: usize,
    /// Parked waiters arrive in batches of this many (`parked_batch`, default 500; 0 = all at
    /// once).
    parked_batch: usize,
    /// Requests per redis-benchmark ceiling test (`ceiling_n`, default 200000).
    ceiling_n: usize,
    /// Many keys: runs per contender, interleaved; the median run and the spread are
    /// reported (`rounds`, default 3).
    rounds: usize,
    /// Comma-separated scenarios to run (`only`; default all): uncontended, handoff,
    /// handoff_mp, wakeup, many, parked.
    only: Option<Vec<String>>,
    /// Comma-separated contenders (`contenders`; default all): redbaton, redbaton-nobaton,
    /// redbaton-scripts (many keys only), naive-10ms, naive-jitter, rslock, rslock-10ms, rlock, rlock-10ms, redisson.
    contenders: Vec<Kind>,
    /// Also write the JSON lines to this file (`json`; default: stdout only). Relative to the
    /// workspace root, since cargo runs benches from their package's directory.
    json: Option<std::path::PathBuf>,
}

impl Opts {
    fn from_env() -> Opts {
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

    /// The contenders a scenario runs: `redbaton-scripts` only separates costs in many keys.
    fn contenders_in(&self, scenario: &str) -> Vec<Kind> {
        let only_many = |k: &Kind| *k != Kind::Scripts || scenario == "many";
        self.contenders.iter().copied().filter(only_many).collect()
    }

    fn runs(&self, scenario: &str) -> bool {
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

/// Nearest-rank percentile of sorted values.
fn pct(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// Jain's fairness index: (Σx)² / (n·Σx²); 1 = perfectly even.
fn jain(counts: &[u64]) -> f64 {
    let n = counts.len() as f64;
    let sum: f64 = counts.iter().map(|&c| c as f64).sum();
    let sq: f64 = counts.iter().map(|&c| (c as f64).powi(2)).sum();
    if sq == 0.0 {
        0.0
    } else {
        sum * sum / (n * sq)
    }
}

/// The system allocator, counting live heap bytes: per-waiter memory without the allocator's
/// fragmentation (which the RSS figure includes). One relaxed atomic add per call, alike for
/// every contender.
struct CountingAlloc;

static LIVE_HEAP: AtomicI64 = AtomicI64::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            LIVE_HEAP.fetch_add(layout.size() as i64, Ordering::Relaxed);
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
        }
        p
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            LIVE_HEAP.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

// ---------------------------------------------------------------------------------------
// Contenders
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// redbaton at its defaults: the baton pass is on.
    Redbaton,
    /// redbaton with `baton_passes(0)`: every release is an ordinary one (the behaviour before
    /// the baton pass), measured beside `Redbaton` in the same run.
    RedbatonNoBaton,
    /// redbaton's own acquire and release scripts sent straight through fred, no library:
    /// what the protocol costs without redbaton's layer.
    Scripts,
    Naive,
    NaiveJitter,
    Rslock,
    /// rslock with retries U(0,10) ms apart instead of U(0,200) ms.
    RslockTuned,
    Rlock,
    /// rlock polling every 10 ms instead of 100 ms.
    RlockTuned,
    Redisson,
}

impl Kind {
    const ALL: [Kind; 10] = [
        Kind::Redbaton,
        Kind::RedbatonNoBaton,
        Kind::Scripts,
        Kind::Naive,
        Kind::NaiveJitter,
        Kind::Rslock,
        Kind::RslockTuned,
        Kind::Rlock,
        Kind::RlockTuned,
        Kind::Redisson,
    ];

    fn name(self) -> &'static str {
        match self {
            Kind::Redbaton => "redbaton",
            Kind::RedbatonNoBaton => "redbaton-nobaton",
            Kind::Scripts => "redbaton-scripts",
            Kind::Naive => "naive-10ms",
            Kind::NaiveJitter => "naive-jitter",
            Kind::Rslock => "rslock",
            Kind::RslockTuned => "rslock-10ms",
            Kind::Rlock => "rlock",
            Kind::RlockTuned => "rlock-10ms",
            Kind::Redisson => "redisson",
        }
    }

    fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == s.trim())
    }

    /// How a waiter of this contender learns that the lock is free.
    fn waits_by(self) -> &'static str {
        match self {
            Kind::Redbaton => "baton pass in process, else pub/sub wake one",
            Kind::RedbatonNoBaton => "pub/sub, wake one",
            Kind::Scripts => "poll 10 ms (no library)",
            Kind::Naive => "poll 10 ms",
            Kind::NaiveJitter => "poll U(0,20) ms",
            Kind::Rslock => "poll U(0,200) ms",
            Kind::RslockTuned => "poll U(0,10) ms (tuned)",
            Kind::Rlock => "poll 100 ms",
            Kind::RlockTuned => "poll 10 ms (tuned)",
            Kind::Redisson => "poll 100 ms",
        }
    }

    /// Commands this contender sends over the network besides scripts, pub/sub and PING
    /// (everything else it causes runs inside its scripts).
    fn direct_commands(self) -> &'static [&'static str] {
        match self {
            Kind::Naive
            | Kind::NaiveJitter
            | Kind::Rslock
            | Kind::RslockTuned
            | Kind::Rlock
            | Kind::RlockTuned => &["set"],
            Kind::Redbaton | Kind::RedbatonNoBaton | Kind::Scripts | Kind::Redisson => &[],
        }
    }
}

/// Per-process state of one contender, shared by its tasks.
enum Ctx {
    Redbaton(redbaton::Client),
    Naive {
        redis: fred::clients::Client,
        release: Script,
        jitter: bool,
    },
    Scripts {
        redis: fred::clients::Client,
        acquire: Script,
        release: Script,
        /// Stands in for the client uuid of redbaton's owner fields.
        uuid: String,
    },
    Rslock(Box<rslock::LockManager>),
    /// The lock and the options its acquires use.
    Rlock(Box<rlock::async_lock::RLock>, rlock::AcquireOptions),
    Redisson(Box<redisson::AsyncRedissonClient>),
}

/// One hold, whatever the contender.
enum Held {
    Redbaton(redbaton::LockGuard),
    Naive { key: String, token: String },
    Scripts { key: String, field: String },
    Rslock(rslock::LockGuard),
    Rlock(rlock::async_lock::RLockGuard),
    Redisson(redisson::AsyncRLock),
}

/// The compare-and-delete every article pairs with `SET NX PX`.
const NAIVE_RELEASE: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0";

/// Connections in redisson's pool: enough for every task of every scenario.
const REDISSON_POOL: u32 = 96;

static TOKENS: AtomicU64 = AtomicU64::new(0);

impl Ctx {
    async fn connect(kind: Kind, url: &str) -> Ctx {
        match kind {
            Kind::Redbaton => Ctx::Redbaton(redbaton::Client::connect(url).await.expect("connect")),
            Kind::RedbatonNoBaton => Ctx::Redbaton(
                redbaton::Client::builder()
                    .url(url)
                    .baton_passes(0)
                    .connect()
                    .await
                    .expect("connect"),
            ),
            Kind::Naive | Kind::NaiveJitter => {
                let redis = fred_client(url).await;
                let release = Script::from_lua(NAIVE_RELEASE);
                release.load(&redis).await.expect("script load");
                Ctx::Naive {
                    redis,
                    release,
                    jitter: kind == Kind::NaiveJitter,
                }
            }
            Kind::Scripts => {
                let redis = fred_client(url).await;
                let acquire = Script::from_lua(include_str!("../../lua/lock/acquire.lua"));
                let release = Script::from_lua(include_str!("../../lua/lock/release.lua"));
                acquire.load(&redis).await.expect("script load");
                release.load(&redis).await.expect("script load");
                Ctx::Scripts {
                    redis,
                    acquire,
                    release,
                    uuid: format!("{:032x}", fastrand::u128(..)),
                }
            }
            Kind::Rslock => Ctx::Rslock(Box::new(rslock::LockManager::new(vec![url.to_owned()]))),
            Kind::RslockTuned => {
                let mut manager = rslock::LockManager::new(vec![url.to_owned()]);
                manager.set_retry(3, Duration::from_millis(10));
                Ctx::Rslock(Box::new(manager))
            }
            Kind::Rlock | Kind::RlockTuned => {
                let options = if kind == Kind::RlockTuned {
                    rlock::AcquireOptions::builder()
                        .retry_interval(Duration::from_millis(10))
                        .build()
                        .expect("rlock options")
                } else {
                    rlock::AcquireOptions::default()
                };
                Ctx::Rlock(
                    Box::new(rlock::async_lock::RLock::new(url).await.expect("rlock")),
                    options,
                )
            }
            Kind::Redisson => Ctx::Redisson(Box::new(
                redisson::AsyncRedissonClient::new(
                    // Its default pool runs dry under 64 tasks ("no connection available").
                    redisson::RedissonConfig::single_server(url).with_pool_size(REDISSON_POOL),
                )
                .await
                .expect("redisson"),
            )),
        }
    }

    /// Waits for the lock as the contender's blocking acquire does at its defaults.
    async fn lock(&self, name: &str) -> Held {
        match self {
            Ctx::Redbaton(client) => Held::Redbaton(client.lock(name).lock().await.expect("lock")),
            Ctx::Naive { redis, jitter, .. } => {
                let token = format!(
                    "{}:{}",
                    std::process::id(),
                    TOKENS.fetch_add(1, Ordering::Relaxed)
                );
                loop {
                    let reply: Value = redis
                        .set(
                            name,
                            token.as_str(),
                            Some(Expiration::PX(30_000)),
                            Some(SetOptions::NX),
                            false,
                        )
                        .await
                        .expect("set");
                    if !reply.is_null() {
                        return Held::Naive {
                            key: name.to_owned(),
                            token,
                        };
                    }
                    let pause = if *jitter {
                        fastrand::u64(0..=20_000)
                    } else {
                        10_000
                    };
                    tokio::time::sleep(Duration::from_micros(pause)).await;
                }
            }
            Ctx::Scripts {
                redis,
                acquire,
                uuid,
                ..
            } => {
                let field = format!("{uuid}:{}", TOKENS.fetch_add(1, Ordering::Relaxed));
                loop {
                    let reply: Vec<i64> = acquire
                        .evalsha(redis, name, vec!["30000", field.as_str()])
                        .await
                        .expect("acquire");
                    if reply.first() == Some(&1) {
                        return Held::Scripts {
                            key: name.to_owned(),
                            field,
                        };
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            Ctx::Rslock(manager) => Held::Rslock(
                manager
                    .acquire(name.as_bytes(), Duration::from_secs(30))
                    .await
                    .expect("rslock"),
            ),
            Ctx::Rlock(rlock, options) => Held::Rlock(
                rlock
                    .acquire_mutex_with_options(name, options.clone())
                    .await
                    .expect("rlock"),
            ),
            Ctx::Redisson(client) => {
                let lock = client.get_lock(name);
                lock.lock().await.expect("redisson lock");
                Held::Redisson(lock)
            }
        }
    }

    async fn unlock(&self, held: Held) {
        match (self, held) {
            (_, Held::Redbaton(guard)) => guard.unlock().await.expect("unlock"),
            (Ctx::Naive { redis, release, .. }, Held::Naive { key, token }) => {
                let _: i64 = release
                    .evalsha(redis, key.as_str(), token.as_str())
                    .await
                    .expect("release");
            }
            (Ctx::Scripts { redis, release, .. }, Held::Scripts { key, field }) => {
                let channel = format!("redisson_lock__channel:{{{key}}}");
                let _: i64 = release
                    .evalsha(
                        redis,
                        key.as_str(),
                        vec![field.as_str(), "1", "0", "0", "PUBLISH", channel.as_str()],
                    )
                    .await
                    .expect("release");
            }
            (_, Held::Rslock(guard)) => guard.release().await,
            (_, Held::Rlock(mut guard)) => guard.release().await.expect("rlock release"),
            (_, Held::Redisson(lock)) => {
                lock.unlock().await.expect("redisson unlock");
            }
            _ => unreachable!("a hold is released by the contender that took it"),
        }
    }

    async fn shutdown(self) {
        match self {
            Ctx::Redbaton(client) => client.shutdown().await.expect("shutdown"),
            Ctx::Naive { redis, .. } | Ctx::Scripts { redis, .. } => {
                let _ = redis.quit().await;
            }
            Ctx::Rslock(_) => {}
            Ctx::Rlock(rlock, _) => rlock.shutdown().await,
            Ctx::Redisson(client) => {
                let _ = client.shutdown().await;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Redis-side counters
// ---------------------------------------------------------------------------------------

/// Commands the bench itself sends while measuring; never charged to a contender.
fn is_bench_command(name: &str) -> bool {
    name == "info" || name.starts_with("client") || name.starts_with("pubsub")
}

fn is_network_command(kind: Kind, name: &str) -> bool {
    const NET: &[&str] = &[
        "eval",
        "evalsha",
        "eval_ro",
        "evalsha_ro",
        "fcall",
        "ping",
        "subscribe",
        "unsubscribe",
        "ssubscribe",
        "sunsubscribe",
        "psubscribe",
        "punsubscribe",
        "hello",
        "select",
        "auth",
        "quit",
    ];
    NET.contains(&name) || name.starts_with("script") || kind.direct_commands().contains(&name)
}

/// Commands per acquisition between two `INFO commandstats` snapshots: (network, in scripts).
fn commands_per_acq(
    kind: Kind,
    before: &HashMap<String, u64>,
    after: &HashMap<String, u64>,
    acquisitions: usize,
) -> (f64, f64) {
    let (mut net, mut scripted) = (0u64, 0u64);
    for (name, &calls) in after {
        if is_bench_command(name) {
            continue;
        }
        let delta = calls - before.get(name).copied().unwrap_or(0);
        if is_network_command(kind, name) {
            net += delta;
        } else {
            scripted += delta;
        }
    }
    let n = acquisitions.max(1) as f64;
    (net as f64 / n, scripted as f64 / n)
}

/// Connections in pub/sub mode right now (`CLIENT LIST TYPE pubsub`).
async fn pubsub_connections(raw: &fred::clients::Client) -> usize {
    let list: String = raw
        .custom(
            CustomCommand::new_static("CLIENT", None, false),
            vec!["LIST", "TYPE", "pubsub"],
        )
        .await
        .expect("client list");
    list.lines().filter(|l| !l.trim().is_empty()).count()
}

/// Samples the pub/sub connection count until `end_ns`; returns the maximum seen.
fn sample_pubsub(raw: fred::clients::Client, end_ns: u64) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let mut max = 0;
        while now_ns() < end_ns {
            tokio::time::sleep(Duration::from_millis(200)).await;
            max = max.max(pubsub_connections(&raw).await);
        }
        max
    })
}

/// Resident memory after returning freed heap pages to the OS, so that buffers of commands
/// that already finished do not count as memory of the waiters still parked.
fn rss_bytes() -> u64 {
    // SAFETY: malloc_trim only releases free memory; it has no preconditions.
    unsafe { libc::malloc_trim(0) };
    let statm = std::fs::read_to_string("/proc/self/statm").expect("statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("statm rss");
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    pages * page
}

// ---------------------------------------------------------------------------------------
// Hand-off: the task loop (shared by the one-process run and worker processes)
// ---------------------------------------------------------------------------------------

/// One acquisition: when the task called lock, got it, and called unlock (ns, monotonic).
/// A wait still pending when the scenario stopped has `acq` 0 and `rel` = the stop time: it
/// counts in the wait percentiles at its length so far (a lock that starves a task must not
/// look good by never finishing its wait).
#[derive(Clone, Copy, Debug)]
struct Event {
    task: u32,
    call: u64,
    acq: u64,
    rel: u64,
}

struct LoopSpec {
    name: String,
    tasks: usize,
    task_base: u32,
    start_ns: u64,
    end_ns: u64,
    hold: Duration,
    /// false: a releaser queues again only once another task holds the lock.
    barging: bool,
}

/// Holds the lock for `d`, timed by the OS rather than tokio's timer wheel: a tokio sleep
/// would end on the same millisecond tick on which polling contenders' retry sleeps end,
/// handing them a hand-off no real critical section would.
async fn hold(d: Duration) {
    tokio::task::spawn_blocking(move || std::thread::sleep(d))
        .await
        .expect("hold");
}

/// Runs `spec.tasks` tasks contending for one name; returns their events and the number of
/// times a task found another holder inside the critical section.
async fn contend(ctx: Arc<Ctx>, spec: LoopSpec) -> (Vec<Event>, u64) {
    let holders = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicU64::new(0));
    let (seq_tx, _) = watch::channel(0u64);
    let seq_tx = Arc::new(seq_tx);
    let spec = Arc::new(spec);
    let mut handles = Vec::new();
    for t in 0..spec.tasks {
        let (ctx, holders, overlaps, seq_tx, spec) = (
            ctx.clone(),
            holders.clone(),
            overlaps.clone(),
            seq_tx.clone(),
            spec.clone(),
        );
        handles.push(tokio::spawn(async move {
            let mut events = Vec::new();
            let mut seq_rx = seq_tx.subscribe();
            sleep_until_ns(spec.start_ns).await;
            let stop = tokio::time::Instant::now()
                + Duration::from_nanos(spec.end_ns.saturating_sub(now_ns()));
            while now_ns() < spec.end_ns {
                let call = now_ns();
                let Ok(held) = tokio::time::timeout_at(stop, ctx.lock(&spec.name)).await else {
                    // Still waiting at the stop: counted as a wait of (stop - call).
                    events.push(Event {
                        task: spec.task_base + t as u32,
                        call,
                        acq: 0,
                        rel: now_ns().max(call),
                    });
                    break;
                };
                let acq = now_ns();
                if holders.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                let mut mine = 0;
                seq_tx.send_modify(|s| {
                    *s += 1;
                    mine = *s;
                });
                hold(spec.hold).await;
                holders.fetch_sub(1, Ordering::SeqCst);
                let rel = now_ns();
                ctx.unlock(held).await;
                events.push(Event {
                    task: spec.task_base + t as u32,
                    call,
                    acq,
                    rel,
                });
                if !spec.barging {
                    // Queue again only after someone else took the lock (or the run ended).
                    let left = spec.end_ns.saturating_sub(now_ns()) + 50_000_000;
                    let next = seq_rx.wait_for(|s| *s > mine);
                    if tokio::time::timeout(Duration::from_nanos(left), next)
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            }
            events
        }));
    }
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.expect("task"));
    }
    (all, overlaps.load(Ordering::SeqCst))
}

/// What one contended run measured.
struct ContendedResult {
    acquisitions: usize,
    /// Waits still pending when the scenario stopped (counted in the wait percentiles).
    pending: usize,
    acq_per_s: f64,
    handoff_p50_us: f64,
    handoff_p99_us: f64,
    /// Hand-offs measured (the sample behind the hand-off percentiles).
    handoff_samples: usize,
    /// Hand-off percentiles p0 (min), p1, …, p99, p100 (max) in µs: the whole distribution
    /// in 101 numbers, for the wake-up chart.
    handoff_pcts_us: Vec<f64>,
    wait_p99_ms: f64,
    wait_max_ms: f64,
    jain: f64,
    net_per_acq: f64,
    script_per_acq: f64,
    pubsub_conns: usize,
    overlaps: u64,
    /// Of the releases with another task waiting, the share the releaser itself won again.
    regained_pct: f64,
    /// Releases with another task waiting (the sample behind `regained_pct`).
    contested: usize,
}

fn analyse(
    events: Vec<Event>,
    tasks: usize,
    overlaps_in_process: u64,
    cmds: (f64, f64),
    pubsub_conns: usize,
) -> ContendedResult {
    let (pending, mut events): (Vec<Event>, Vec<Event>) =
        events.into_iter().partition(|e| e.acq == 0);
    events.sort_by_key(|e| e.acq);
    let mut handoffs = Vec::new();
    let mut overlaps = overlaps_in_process;
    let (mut contested, mut regained) = (0usize, 0usize);
    for pair in events.windows(2) {
        let (prev, next) = (pair[0], pair[1]);
        // Another task was already waiting when `prev` released: did the releaser win again?
        if events
            .iter()
            .any(|e| e.task != prev.task && e.call < prev.rel && e.acq > prev.rel)
        {
            contested += 1;
            if next.task == prev.task {
                regained += 1;
            }
        }
        if next.acq < prev.rel {
            overlaps += 1; // two holders at once: a mutual-exclusion violation
        } else if next.call < prev.rel {
            // The next holder was already waiting when the previous one released.
            handoffs.push(next.acq - prev.rel);
        }
    }
    handoffs.sort_unstable();
    let mut waits: Vec<u64> = events
        .iter()
        .map(|e| e.acq - e.call)
        .chain(pending.iter().map(|e| e.rel - e.call))
        .collect();
    waits.sort_unstable();
    let mut counts = vec![0u64; tasks];
    for e in &events {
        if let Some(c) = counts.get_mut(e.task as usize) {
            *c += 1;
        }
    }
    let span = match (events.first(), events.iter().map(|e| e.rel).max()) {
        (Some(first), Some(last)) => (last - first.acq).max(1),
        _ => 1,
    };
    ContendedResult {
        pending: pending.len(),
        acquisitions: events.len(),
        acq_per_s: events.len() as f64 / (span as f64 / 1e9),
        handoff_p50_us: us(pct(&handoffs, 50.0)),
        handoff_p99_us: us(pct(&handoffs, 99.0)),
        handoff_samples: handoffs.len(),
        handoff_pcts_us: (0..=100).map(|p| us(pct(&handoffs, p as f64))).collect(),
        wait_p99_ms: ms(pct(&waits, 99.0)),
        wait_max_ms: ms(waits.last().copied().unwrap_or(0)),
        jain: jain(&counts),
        net_per_acq: cmds.0,
        script_per_acq: cmds.1,
        pubsub_conns,
        overlaps,
        regained_pct: 100.0 * regained as f64 / contested.max(1) as f64,
        contested,
    }
}

fn contended_json(scenario: &str, kind: Kind, r: &ContendedResult, extra: serde_json::Value) {
    let mut v = json!({
        "scenario": scenario,
        "contender": kind.name(),
        "waits_by": kind.waits_by(),
        "acquisitions": r.acquisitions,
        "acq_per_s": r.acq_per_s,
        "handoff_p50_us": r.handoff_p50_us,
        "handoff_p99_us": r.handoff_p99_us,
        "wait_p99_ms": r.wait_p99_ms,
        "wait_max_ms": r.wait_max_ms,
        "waits_pending_at_stop": r.pending,
        "jain": r.jain,
        "net_cmds_per_acq": r.net_per_acq,
        "script_cmds_per_acq": r.script_per_acq,
        "pubsub_connections": r.pubsub_conns,
        "mutual_exclusion_violations": r.overlaps,
        "releaser_regained_pct": r.regained_pct,
    });
    if let (Some(obj), serde_json::Value::Object(more)) = (v.as_object_mut(), extra) {
        obj.extend(more);
    }
    json_line(v);
}

/// JSON lines are collected and printed together after the tables.
static JSON: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn json_line(v: serde_json::Value) {
    JSON.lock().unwrap().push(v.to_string());
}

const CONTENDED_HEADER: &str = "| contender | waits by | acq/s | hand-off p50 µs | hand-off p99 µs | wait p99 ms | wait max ms | pending at stop | Jain | net cmds/acq | script cmds/acq | pub/sub conns | overlaps | releaser won again |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|";

fn contended_row(kind: Kind, r: &ContendedResult) -> String {
    format!(
        "| {} | {} | {:.0} | {:.0} | {:.0} | {:.1} | {:.1} | {} | {:.3} | {:.2} | {:.2} | {} | {} | {:.0} % |",
        kind.name(),
        kind.waits_by(),
        r.acq_per_s,
        r.handoff_p50_us,
        r.handoff_p99_us,
        r.wait_p99_ms,
        r.wait_max_ms,
        r.pending,
        r.jain,
        r.net_per_acq,
        r.script_per_acq,
        r.pubsub_conns,
        r.overlaps,
        r.regained_pct
    )
}

/// Contention inside this process: `tasks` tasks on one name.
async fn contended_in_process(
    kind: Kind,
    server: &RedisServer,
    raw: &fred::clients::Client,
    opts: &Opts,
    tasks: usize,
    barging: bool,
    tag: &str,
) -> ContendedResult {
    let ctx = Arc::new(Ctx::connect(kind, &server.url()).await);
    let before = command_calls(raw).await;
    let start_ns = now_ns() + 50_000_000;
    let end_ns = start_ns + (opts.secs * 1e9) as u64;
    let sampler = sample_pubsub(raw.clone(), end_ns);
    let spec = LoopSpec {
        name: format!("bench:{tag}:{}", kind.name()),
        tasks,
        task_base: 0,
        start_ns,
        end_ns,
        hold: Duration::from_micros(opts.hold_us),
        barging,
    };
    let (events, overlaps) = contend(ctx.clone(), spec).await;
    let after = command_calls(raw).await;
    let conns = sampler.await.expect("sampler");
    let acquired = events.iter().filter(|e| e.acq != 0).count();
    let cmds = commands_per_acq(kind, &before, &after, acquired);
    if let Ok(ctx) = Arc::try_unwrap(ctx) {
        ctx.shutdown().await;
    }
    analyse(events, tasks, overlaps, cmds, conns)
}

/// Contention across `procs` worker processes (this binary re-executed) × `per_proc` tasks.
async fn contended_processes(
    kind: Kind,
    server: &RedisServer,
    raw: &fred::clients::Client,
    opts: &Opts,
) -> ContendedResult {
    let exe = std::env::current_exe().expect("current exe");
    let mut children = Vec::new();
    for p in 0..opts.procs {
        let mut child = tokio::process::Command::new(&exe)
            .env("RB_WORKER", "1")
            .env("RB_KIND", kind.name())
            .env("RB_URL", server.url())
            .env("RB_WORKER_TASKS", opts.per_proc.to_string())
            .env("RB_TASK_BASE", (p * opts.per_proc).to_string())
            .env("RB_HOLD_US", opts.hold_us.to_string())
            .env("RB_NAME", format!("bench:handoff_mp:{}", kind.name()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn worker");
        let stdin = child.stdin.take().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let ready = lines.next_line().await.expect("worker output");
        assert_eq!(ready.as_deref(), Some("READY"), "worker did not start");
        children.push((child, stdin, lines));
    }
    let before = command_calls(raw).await;
    let start_ns = now_ns() + 100_000_000;
    let end_ns = start_ns + (opts.secs * 1e9) as u64;
    let sampler = sample_pubsub(raw.clone(), end_ns);
    for (_, stdin, _) in &mut children {
        stdin
            .write_all(format!("{start_ns} {end_ns}\n").as_bytes())
            .await
            .expect("start worker");
    }
    let mut events = Vec::new();
    let mut overlaps = 0;
    for (_, _, lines) in &mut children {
        while let Some(line) = lines.next_line().await.expect("worker output") {
            let mut f = line.split_whitespace();
            match f.next() {
                Some("E") => {
                    let n: Vec<u64> = f.map(|x| x.parse().expect("number")).collect();
                    events.push(Event {
                        task: n[0] as u32,
                        call: n[1],
                        acq: n[2],
                        rel: n[3],
                    });
                }
                Some("V") => overlaps += f.next().and_then(|x| x.parse::<u64>().ok()).unwrap_or(0),
                Some("END") => break,
                _ => panic!("unexpected worker line {line:?}"),
            }
        }
    }
    let after = command_calls(raw).await;
    let conns = sampler.await.expect("sampler");
    for (mut child, mut stdin, _) in children {
        let _ = stdin.write_all(b"q\n").await;
        drop(stdin);
        let status = child.wait().await.expect("worker exit");
        assert!(status.success(), "worker failed: {status}");
    }
    let acquired = events.iter().filter(|e| e.acq != 0).count();
    let cmds = commands_per_acq(kind, &before, &after, acquired);
    analyse(events, opts.procs * opts.per_proc, overlaps, cmds, conns)
}

/// Worker process: connect, say READY, run the hand-off loop between the times the parent
/// sends, print events, wait for `q`, shut down.
async fn worker() {
    let kind = Kind::parse(&std::env::var("RB_KIND").expect("RB_KIND")).expect("kind");
    let url = std::env::var("RB_URL").expect("RB_URL");
    let ctx = Arc::new(Ctx::connect(kind, &url).await);
    println!("READY");
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    let line = stdin.next_line().await.expect("stdin").expect("start line");
    let mut f = line
        .split_whitespace()
        .map(|x| x.parse::<u64>().expect("ns"));
    let (start_ns, end_ns) = (f.next().unwrap(), f.next().unwrap());
    let spec = LoopSpec {
        name: std::env::var("RB_NAME").expect("RB_NAME"),
        tasks: env_or("WORKER_TASKS", 4),
        task_base: env_or("TASK_BASE", 0),
        start_ns,
        end_ns,
        hold: Duration::from_micros(env_or("HOLD_US", 1000)),
        barging: true,
    };
    let (events, overlaps) = contend(ctx.clone(), spec).await;
    let mut out = String::new();
    for e in events {
        out.push_str(&format!("E {} {} {} {}\n", e.task, e.call, e.acq, e.rel));
    }
    out.push_str(&format!("V {overlaps}\nEND\n"));
    let mut stdout = tokio::io::stdout();
    stdout.write_all(out.as_bytes()).await.expect("stdout");
    stdout.flush().await.expect("stdout");
    let _ = stdin.next_line().await;
    if let Ok(ctx) = Arc::try_unwrap(ctx) {
        ctx.shutdown().await;
    }
}

// ---------------------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------------------

struct Floor {
    evalsha_p50: u64,
    /// A trivial EVALSHA sent right after a 1 ms hold (the client's workers and the server
    /// idle meanwhile): the round trip a hand-off after a critical section starts from.
    after_hold_p50: u64,
    ping_p50: u64,
}

/// Floor, uncontended and reentrant figures, interleaved in blocks so that background noise
/// hits every contender alike.
async fn uncontended(server: &RedisServer, opts: &Opts, out: &mut String) -> Floor {
    let url = server.url();
    let kinds = opts.contenders_in("uncontended");
    let iters = opts.iters.max(10);
    let task = tokio::spawn(async move {
        let mut ctxs = Vec::new();
        for &k in &kinds {
            ctxs.push((k, Ctx::connect(k, &url).await));
        }
        let rb = match ctxs.iter().find(|(k, _)| *k == Kind::Redbaton) {
            Some((_, Ctx::Redbaton(c))) => c.clone(),
            _ => redbaton::Client::connect(&url).await.expect("connect"),
        };
        // The floor runs on redbaton's own command connection.
        let redis = rb.redis().clone();
        let trivial = Script::from_lua("return 1");
        trivial.load(&redis).await.expect("load");
        let sha = trivial.sha1().to_string();
        // redbaton's own two scripts sent raw: the server-side cost of its protocol.
        let lock_script = Script::from_lua(include_str!("../../lua/lock/acquire.lua"));
        let unlock_script = Script::from_lua(include_str!("../../lua/lock/release.lua"));
        lock_script.load(&redis).await.expect("load");
        unlock_script.load(&redis).await.expect("load");
        let mut samples: HashMap<&'static str, Vec<u64>> = HashMap::new();
        // Small interleaved blocks: background load hits the floor and every contender alike.
        let per_block = 5;
        let blocks = (iters / per_block).max(1);
        for block in 0..=blocks {
            let keep = block >= blocks / 10; // the first tenth warms up
            let mut record = |what: &'static str, ns: u64| {
                if keep {
                    samples.entry(what).or_default().push(ns);
                }
            };
            for _ in 0..per_block {
                let t = now_ns();
                let _: i64 = redis
                    .evalsha(sha.as_str(), "bench:floor", ())
                    .await
                    .expect("evalsha");
                record("evalsha", now_ns() - t);
            }
            for _ in 0..per_block {
                let t = now_ns();
                let _: Value = redis.ping(None).await.expect("ping");
                record("ping", now_ns() - t);
            }
            for _ in 0..per_block {
                let t = now_ns();
                let _: i64 = redis
                    .evalsha(sha.as_str(), "bench:floor", ())
                    .await
                    .expect("evalsha");
                let _: i64 = redis
                    .evalsha(sha.as_str(), "bench:floor", ())
                    .await
                    .expect("evalsha");
                record("evalsha2", now_ns() - t);
            }
            for _ in 0..per_block {
                let t = now_ns();
                let (key, channel) = (
                    "bench:raw-scripts",
                    "redisson_lock__channel:{bench:raw-scripts}",
                );
                let _: Value = lock_script
                    .evalsha(
                        &redis,
                        key,
                        vec![Value::from(30_000i64), "bench-raw:1".into()],
                    )
                    .await
                    .expect("lock script");
                let _: Value = unlock_script
                    .evalsha(
                        &redis,
                        key,
                        vec![
                            Value::from("bench-raw:1"),
                            Value::from(1i64),
                            Value::from(0i64),
                            "0".into(),
                            "PUBLISH".into(),
                            channel.into(),
                        ],
                    )
                    .await
                    .expect("unlock script");
                record("scripts", now_ns() - t);
            }
            for (k, ctx) in &ctxs {
                let name = format!("bench:uncontended:{}", k.name());
                for _ in 0..per_block {
                    let t = now_ns();
                    let held = ctx.lock(&name).await;
                    ctx.unlock(held).await;
                    record(k.name(), now_ns() - t);
                }
            }
            let lock = rb.lock("bench:reentrant");
            for _ in 0..per_block {
                let t = now_ns();
                let a = lock.lock().await.expect("lock");
                let b = a.reenter().await.expect("lock");
                let c = a.reenter().await.expect("lock");
                c.unlock().await.expect("unlock");
                b.unlock().await.expect("unlock");
                a.unlock().await.expect("unlock");
                record("reentrant", now_ns() - t);
            }
        }
        // Apart from the interleaved blocks: idle milliseconds between them would slow the
        // round trips measured after them (the host's cores and redis-server go idle too).
        let after_hold = samples.entry("after_hold").or_default();
        for _ in 0..iters.min(500) {
            hold(Duration::from_millis(1)).await;
            let t = now_ns();
            let _: i64 = redis
                .evalsha(sha.as_str(), "bench:floor", ())
                .await
                .expect("evalsha");
            after_hold.push(now_ns() - t);
        }
        for (_, ctx) in ctxs {
            ctx.shutdown().await;
        }
        samples
    });
    let mut samples = task.await.expect("uncontended task");
    for v in samples.values_mut() {
        v.sort_unstable();
    }
    let floor = Floor {
        evalsha_p50: pct(&samples["evalsha"], 50.0),
        after_hold_p50: pct(&samples["after_hold"], 50.0),
        ping_p50: pct(&samples["ping"], 50.0),
    };
    let two_floor = 2.0 * floor.evalsha_p50 as f64;
    out.push_str("\n### Floor and uncontended lock+unlock (one task, one name)\n\n");
    out.push_str(
        "| measurement | median µs | p99 µs | median / (2 × EVALSHA) |\n|---|---|---|---|\n",
    );
    for (label, key, ratio) in [
        ("trivial EVALSHA (floor)", "evalsha", false),
        (
            "trivial EVALSHA right after a 1 ms hold",
            "after_hold",
            false,
        ),
        ("PING", "ping", false),
        ("2 × trivial EVALSHA, back to back", "evalsha2", false),
        (
            "redbaton's lock + unlock scripts by raw EVALSHA",
            "scripts",
            false,
        ),
    ] {
        let v = &samples[key];
        let _ = ratio;
        out.push_str(&format!(
            "| {label} | {:.1} | {:.1} | — |\n",
            us(pct(v, 50.0)),
            us(pct(v, 99.0))
        ));
        json_line(json!({"scenario": "floor", "measurement": key,
            "median_us": us(pct(v, 50.0)), "p99_us": us(pct(v, 99.0))}));
    }
    for k in opts.contenders_in("uncontended") {
        let v = &samples[k.name()];
        let p50 = pct(v, 50.0);
        out.push_str(&format!(
            "| {} lock+unlock | {:.1} | {:.1} | {:.2} |\n",
            k.name(),
            us(p50),
            us(pct(v, 99.0)),
            p50 as f64 / two_floor
        ));
        json_line(json!({"scenario": "uncontended", "contender": k.name(),
            "median_us": us(p50), "p99_us": us(pct(v, 99.0)),
            "evalsha_floor_us": us(floor.evalsha_p50),
            "ratio_to_2x_evalsha": p50 as f64 / two_floor}));
    }
    let v = &samples["reentrant"];
    out.push_str(&format!(
        "| redbaton reentrant: lock + reenter ×2 + unlock ×3 | {:.1} | {:.1} | {:.2} (÷ 3 pairs) |\n",
        us(pct(v, 50.0)),
        us(pct(v, 99.0)),
        pct(v, 50.0) as f64 / (3.0 * two_floor)
    ));
    out.push_str("\nPeers are not reentrant (rslock, rlock, the naive lock: a second lock() waits for itself; redisson 0.1.0 draws a fresh owner per attempt, so re-locking waits for its own lease), so the reentrant row is redbaton's alone.\n");
    json_line(json!({"scenario": "reentrant", "contender": "redbaton",
        "median_us": us(pct(v, 50.0)), "p99_us": us(pct(v, 99.0)),
        "ratio_to_6x_evalsha": pct(v, 50.0) as f64 / (3.0 * two_floor)}));
    if let Some(v) = samples.get("redbaton") {
        println!(
            "uncontended: redbaton lock+unlock median {:.1} µs; trivial EVALSHA median {:.1} µs (ratio to 2× floor {:.2})",
            us(pct(v, 50.0)),
            us(floor.evalsha_p50),
            pct(v, 50.0) as f64 / two_floor
        );
    }
    floor
}

/// Many keys: `many_tasks` tasks lock+unlock random names among `names`.
async fn many_keys(
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
struct ManyRun {
    rate: f64,
    /// Commands per acquisition: (network, in scripts).
    cmds: (f64, f64),
    /// CPU time per acquisition, µs: this process (all its threads) and redis-server.
    client_us: f64,
    server_us: f64,
}

/// CPU time this process has used so far (user + system, all threads), in µs.
fn process_cpu_us() -> f64 {
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct it is given and nothing else.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let us = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    us(usage.ru_utime) + us(usage.ru_stime)
}

/// CPU time redis-server has used so far (`INFO cpu`: used_cpu_user + used_cpu_sys), in µs.
async fn server_cpu_us(raw: &fred::clients::Client) -> f64 {
    let info: String = raw
        .info(Some(fred::types::InfoKind::Cpu))
        .await
        .expect("INFO cpu");
    info.lines()
        .filter_map(|line| match line.trim().split_once(':')? {
            ("used_cpu_user" | "used_cpu_sys", value) => value.parse::<f64>().ok(),
            _ => None,
        })
        .sum::<f64>()
        * 1e6
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
fn redis_benchmark(
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

struct Parked {
    waiters: usize,
    rss_per_waiter: f64,
    pubsub_conns: usize,
    drain_ms: f64,
    evalsha_per_waiter: f64,
    /// Size of one `lock()` future (the state a parked task keeps).
    future_bytes: usize,
    /// Live heap bytes per parked waiter (allocator-counted).
    heap_per_waiter: f64,
}

/// Parked waiters: `parked` tasks wait on `parked_names` names held by one task.
async fn parked(server: &RedisServer, raw: &fred::clients::Client, opts: &Opts) -> Parked {
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

// ---------------------------------------------------------------------------------------
// Main
// ---------------------------------------------------------------------------------------

/// Wait p99 against the best peer crate (the target) and the best naive baseline (shown).
fn wait_targets(
    targets: &mut Vec<(String, String, &'static str)>,
    rows: &[(Kind, ContendedResult)],
    rb: &ContendedResult,
    label: &str,
) {
    let best = |kinds: &[Kind]| {
        rows.iter()
            .filter(|(k, _)| kinds.contains(k))
            .min_by(|a, b| a.1.wait_p99_ms.total_cmp(&b.1.wait_p99_ms))
    };
    if let Some((pk, pr)) = best(&[
        Kind::Rslock,
        Kind::RslockTuned,
        Kind::Rlock,
        Kind::RlockTuned,
        Kind::Redisson,
    ]) {
        targets.push((
            format!("wait p99 ({label}) ≤ best peer crate's"),
            format!(
                "{:.1} ms vs {:.1} ms ({})",
                rb.wait_p99_ms,
                pr.wait_p99_ms,
                pk.name()
            ),
            verdict(rb.wait_p99_ms <= pr.wait_p99_ms),
        ));
    }
    if let Some((pk, pr)) = best(&[Kind::Naive, Kind::NaiveJitter]) {
        targets.push((
            format!("(baseline, no target) wait p99 ({label}) vs best naive lock"),
            format!(
                "{:.1} ms vs {:.1} ms ({})",
                rb.wait_p99_ms,
                pr.wait_p99_ms,
                pk.name()
            ),
            if rb.wait_p99_ms <= pr.wait_p99_ms {
                "lower"
            } else {
                "higher"
            },
        ));
    }
}

/// The baton pass's one-process hand-off target: the release call to the next holder's
/// acquisition p50 ≤ 1.3 × the trivial EVALSHA median, with redbaton-nobaton's ratio beside,
/// and the ratio to a trivial EVALSHA sent right after a 1 ms hold (`after_hold_us`): the
/// cheapest round trip a hand-off that follows a critical section could make.
fn baton_handoff_target(
    targets: &mut Vec<(String, String, &'static str)>,
    rows: &[(Kind, &ContendedResult)],
    rb: &ContendedResult,
    (evalsha_us, after_hold_us): (f64, f64),
    label: &str,
) {
    let nb = rows
        .iter()
        .find(|(k, _)| *k == Kind::RedbatonNoBaton)
        .map_or("redbaton-nobaton not run".to_owned(), |(_, nb)| {
            format!(
                "redbaton-nobaton {:.0} µs = {:.2} ×",
                nb.handoff_p50_us,
                nb.handoff_p50_us / evalsha_us
            )
        });
    targets.push((
        format!("baton: hand-off p50 ≤ 1.3 × EVALSHA ({label})"),
        format!(
            "{:.0} µs = {:.2} × {:.1} µs ({:.2} × {:.1} µs after a 1 ms hold); {nb}",
            rb.handoff_p50_us,
            rb.handoff_p50_us / evalsha_us,
            evalsha_us,
            rb.handoff_p50_us / after_hold_us,
            after_hold_us
        ),
        verdict(rb.handoff_p50_us <= 1.3 * evalsha_us),
    ));
}

/// The baton pass's throughput target: acquisitions/s ≥ redbaton-nobaton's in the same run.
fn baton_rate_target(
    targets: &mut Vec<(String, String, &'static str)>,
    rb: &ContendedResult,
    nb: Option<&ContendedResult>,
    label: &str,
) {
    if let Some(nb) = nb {
        targets.push((
            format!("baton: acq/s ≥ redbaton-nobaton's ({label})"),
            format!(
                "{:.2} × ({:.0} vs {:.0})",
                rb.acq_per_s / nb.acq_per_s,
                rb.acq_per_s,
                nb.acq_per_s
            ),
            verdict(rb.acq_per_s >= nb.acq_per_s),
        ));
    }
}

/// Issue 12 §2's targets on the one-process hot key (`tasks` tasks, one name): redbaton
/// (baton on) against the floor, against redbaton-nobaton and against every other contender,
/// all from this run.
fn hot_key_targets(
    targets: &mut Vec<(String, String, &'static str)>,
    rows: &[(Kind, ContendedResult)],
    rb: &ContendedResult,
    floors_us: Option<(f64, f64)>,
    tasks: usize,
) {
    let label = format!("hot key, {tasks} tasks, 1 process");
    let nb = rows
        .iter()
        .find(|(k, _)| *k == Kind::RedbatonNoBaton)
        .map(|(_, r)| r);
    let refs: Vec<(Kind, &ContendedResult)> = rows.iter().map(|(k, r)| (*k, r)).collect();
    if let Some(floors) = floors_us {
        baton_handoff_target(targets, &refs, rb, floors, &label);
    }
    // A fair FIFO leaves the releaser 1 chance in `tasks`; noise = 2 standard errors of a
    // share of 1/tasks over the contested releases measured.
    let fair = 1.0 / tasks.max(1) as f64;
    let bound = 100.0 * (fair + 2.0 * (fair * (1.0 - fair) / rb.contested.max(1) as f64).sqrt());
    targets.push((
        format!(
            "baton: releaser won again ≤ 1/{tasks} ({:.2} %) + noise ({label})",
            100.0 * fair
        ),
        format!(
            "{:.1} % of {} contested releases (bound {bound:.2} % with 2 σ); {}",
            rb.regained_pct,
            rb.contested,
            nb.map_or("redbaton-nobaton not run".into(), |nb| format!(
                "redbaton-nobaton {:.1} %",
                nb.regained_pct
            ))
        ),
        verdict(rb.regained_pct <= bound),
    ));
    targets.push((
        format!("baton: Jain's index ≥ 0.95 ({label})"),
        format!(
            "{:.3}; {}",
            rb.jain,
            nb.map_or("redbaton-nobaton not run".into(), |nb| format!(
                "redbaton-nobaton {:.3}",
                nb.jain
            ))
        ),
        verdict(rb.jain >= 0.95),
    ));
    if let Some((ok, ork)) = rows
        .iter()
        .filter(|(k, _)| *k != Kind::Redbaton)
        .min_by(|a, b| a.1.wait_p99_ms.total_cmp(&b.1.wait_p99_ms))
    {
        targets.push((
            format!("baton: wait p99 ≤ every other contender's, naive-jitter included ({label})"),
            format!(
                "{:.1} ms (max {:.1} ms) vs lowest other {:.1} ms ({}); {}",
                rb.wait_p99_ms,
                rb.wait_max_ms,
                ork.wait_p99_ms,
                ok.name(),
                nb.map_or("redbaton-nobaton not run".into(), |nb| format!(
                    "redbaton-nobaton {:.1} ms (max {:.1} ms)",
                    nb.wait_p99_ms, nb.wait_max_ms
                ))
            ),
            verdict(rb.wait_p99_ms <= ork.wait_p99_ms),
        ));
    }
    baton_rate_target(targets, rb, nb, &label);
}

/// Issue 12 §2 on the multi-process hot key: the baton pass must make no figure worse than
/// redbaton-nobaton's in the same run (each row gives redbaton / redbaton-nobaton).
fn multi_process_baton_targets(
    targets: &mut Vec<(String, String, &'static str)>,
    rb: &ContendedResult,
    nb: Option<&ContendedResult>,
    label: &str,
) {
    let Some(nb) = nb else { return };
    // (figure, redbaton, redbaton-nobaton, unit, format precision, higher is better)
    let figures = [
        ("acq/s", rb.acq_per_s, nb.acq_per_s, "", 0, true),
        ("wait p99", rb.wait_p99_ms, nb.wait_p99_ms, " ms", 1, false),
        ("Jain's index", rb.jain, nb.jain, "", 3, true),
        (
            "hand-off p50",
            rb.handoff_p50_us,
            nb.handoff_p50_us,
            " µs",
            0,
            false,
        ),
    ];
    for (figure, r, n, unit, prec, higher_better) in figures {
        let ok = if higher_better { r >= n } else { r <= n };
        targets.push((
            format!("baton: {figure} no worse than redbaton-nobaton's ({label})"),
            format!(
                "{:.2} × ({r:.prec$}{unit} vs {n:.prec$}{unit})",
                r / n,
                prec = prec
            ),
            verdict(ok),
        ));
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "**missed**"
    }
}

#[tokio::main]
async fn main() {
    for arg in std::env::args().skip(1) {
        if let Some((k, v)) = arg.split_once('=') {
            std::env::set_var(format!("RB_{}", k.to_uppercase()), v);
        }
    }
    if std::env::var_os("RB_WORKER").is_some() {
        worker().await;
        return;
    }
    let opts = Opts::from_env();
    let wall = now_ns();
    let server = RedisServer::start();
    let raw = server.raw().await;
    let version: String = raw
        .info::<String>(Some(fred::types::InfoKind::Server))
        .await
        .expect("info")
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:").map(str::to_owned))
        .unwrap_or_default();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mut out = format!(
        "## Results\n\nredis-server {version} on 127.0.0.1, {cores} cores; secs={} iters={} hold={} µs; contenders: {}\n",
        opts.secs,
        opts.iters,
        opts.hold_us,
        opts.contenders.iter().map(|k| k.name()).collect::<Vec<_>>().join(", ")
    );
    let mut targets: Vec<(String, String, &'static str)> = Vec::new();
    let has_rb = opts.contenders.contains(&Kind::Redbaton);

    let mut floor = None;
    if opts.runs("uncontended") {
        let f = uncontended(&server, &opts, &mut out).await;
        floor = Some(f);
    }
    let floors_us = floor
        .as_ref()
        .map(|f| (us(f.evalsha_p50), us(f.after_hold_p50)));
    if let (Some(f), true) = (&floor, has_rb) {
        if let Some(line) = JSON
            .lock()
            .unwrap()
            .iter()
            .find(|l| l.contains("\"uncontended\"") && l.contains("\"redbaton\""))
        {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let r = v["ratio_to_2x_evalsha"].as_f64().unwrap_or(f64::NAN);
            targets.push((
                "uncontended lock+unlock ≤ 1.15 × (2 × EVALSHA)".into(),
                format!(
                    "{:.2} × ({:.1} µs vs 2 × {:.1} µs)",
                    r,
                    v["median_us"].as_f64().unwrap_or(0.0),
                    us(f.evalsha_p50)
                ),
                verdict(r <= 1.15),
            ));
        }
        let _ = f.ping_p50;
    }

    let mut handoff_1p: Vec<(Kind, ContendedResult)> = Vec::new();
    if opts.runs("handoff") {
        out.push_str(&format!(
            "\n### Hand-off: one name, {} tasks in 1 process, hold {} µs, barging allowed\n\n{CONTENDED_HEADER}\n",
            opts.tasks, opts.hold_us
        ));
        for k in opts.contenders_in("handoff") {
            let r =
                contended_in_process(k, &server, &raw, &opts, opts.tasks, true, "handoff").await;
            out.push_str(&contended_row(k, &r));
            out.push('\n');
            contended_json(
                "handoff_1p",
                k,
                &r,
                json!({"tasks": opts.tasks, "processes": 1}),
            );
            handoff_1p.push((k, r));
        }
    }
    let mut handoff_mp: Vec<(Kind, ContendedResult)> = Vec::new();
    if opts.runs("handoff_mp") {
        out.push_str(&format!(
            "\n### Hand-off: one name, {} processes × {} tasks, hold {} µs, barging allowed\n\n{CONTENDED_HEADER}\n",
            opts.procs, opts.per_proc, opts.hold_us
        ));
        for k in opts.contenders_in("handoff_mp") {
            let r = contended_processes(k, &server, &raw, &opts).await;
            out.push_str(&contended_row(k, &r));
            out.push('\n');
            contended_json(
                "handoff_mp",
                k,
                &r,
                json!({"tasks": opts.procs * opts.per_proc, "processes": opts.procs}),
            );
            handoff_mp.push((k, r));
        }
    }
    let mut wakeups: Vec<(usize, Kind, ContendedResult)> = Vec::new();
    if opts.runs("wakeup") {
        for waiters in [1usize, 15] {
            out.push_str(&format!(
                "\n### Wake-up without barging: {waiters} parked waiter(s), hold {} µs (every hand-off goes to a parked waiter)\n\n{CONTENDED_HEADER}\n",
                opts.hold_us
            ));
            for k in opts.contenders_in("wakeup") {
                let r = contended_in_process(
                    k,
                    &server,
                    &raw,
                    &opts,
                    waiters + 1,
                    false,
                    &format!("wakeup{waiters}"),
                )
                .await;
                out.push_str(&contended_row(k, &r));
                out.push('\n');
                // The distribution rides only on the wake-up lines: that is what the chart
                // draws, and it keeps the other lines short.
                contended_json(
                    "wakeup",
                    k,
                    &r,
                    json!({"waiters": waiters,
                        "handoff_samples": r.handoff_samples,
                        "handoff_percentiles_us": r.handoff_pcts_us}),
                );
                wakeups.push((waiters, k, r));
            }
        }
    }
    let mut many: Vec<(Kind, f64, (f64, f64))> = Vec::new();
    let mut ceiling = None;
    if opts.runs("many") {
        let sha: String = {
            let s = Script::from_lua("return 1");
            s.load(&raw).await.expect("load");
            s.sha1().to_string()
        };
        // Unpipelined, as many connections as the bench has tasks (what the old "ceiling"
        // was: every contender could beat it), and pipelined (-P 16) over 128 connections, so
        // that the server is the limit: the real ceiling.
        let evalsha = ["EVALSHA", sha.as_str(), "1", "k:__rand_int__"];
        let set = ["SET", "k:__rand_int__", "v"];
        let evalsha_c64 =
            redis_benchmark(server.port, opts.many_tasks, 1, opts.ceiling_n, &evalsha);
        let evalsha_ceiling = redis_benchmark(server.port, 128, 16, opts.ceiling_n * 4, &evalsha);
        let set_ceiling = redis_benchmark(server.port, 128, 16, opts.ceiling_n * 4, &set);
        ceiling = evalsha_ceiling;
        let fmt = |c: Option<f64>| c.map_or("n/a".into(), |c| format!("{c:.0}"));
        out.push_str(&format!(
            "\n### Many keys: {} names, {} tasks, lock+unlock without hold\n\nredis-benchmark in this run: trivial EVALSHA {} req/s (-c {}, no pipelining); ceiling (-c 128 -P 16): trivial EVALSHA {} req/s, SET {} req/s. One lock+unlock is two commands, so the ceiling for a script lock is EVALSHA / 2.\n\n{} run(s) per contender, interleaved; acq/s is the median run, spread = lowest–highest run.\n\n| contender | acq/s (median) | spread | fraction of (EVALSHA ceiling / 2) | ratio to redbaton | client CPU µs/acq | redis-server CPU µs/acq | net cmds/acq | script cmds/acq |\n|---|---|---|---|---|---|---|---|---|\n",
            opts.names, opts.many_tasks, fmt(evalsha_c64), opts.many_tasks,
            fmt(evalsha_ceiling), fmt(set_ceiling), opts.rounds,
        ));
        let mut rates: Vec<Vec<f64>> = vec![Vec::new(); opts.contenders.len()];
        let mut cmds_of: Vec<(f64, f64)> = vec![(0.0, 0.0); opts.contenders.len()];
        let mut cpu_of: Vec<Vec<(f64, f64)>> = vec![Vec::new(); opts.contenders.len()];
        for round in 0..opts.rounds {
            for (i, &k) in opts.contenders.iter().enumerate() {
                let run = many_keys(k, &server, &raw, &opts).await;
                let rate = run.rate;
                eprintln!(
                    "many keys, run {}: {} {rate:.0} acq/s, CPU µs/acq: client {:.1}, server {:.1}",
                    round + 1,
                    k.name(),
                    run.client_us,
                    run.server_us
                );
                json_line(
                    json!({"scenario": "many_keys_run", "contender": k.name(), "run": round + 1,
                    "acq_per_s": rate, "client_cpu_us_per_acq": run.client_us,
                    "server_cpu_us_per_acq": run.server_us}),
                );
                rates[i].push(rate);
                cpu_of[i].push((run.client_us, run.server_us));
                cmds_of[i] = run.cmds;
            }
        }
        let median = |v: &[f64]| {
            let mut v = v.to_vec();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let rb_median = opts
            .contenders
            .iter()
            .position(|&k| k == Kind::Redbaton)
            .map(|i| median(&rates[i]));
        for (i, &k) in opts.contenders.iter().enumerate() {
            let rate = median(&rates[i]);
            let lo = rates[i].iter().copied().fold(f64::INFINITY, f64::min);
            let hi = rates[i].iter().copied().fold(0.0, f64::max);
            let ratio = evalsha_ceiling.map(|c| rate / (c / 2.0));
            let cmds = cmds_of[i];
            let client_us = median(&cpu_of[i].iter().map(|c| c.0).collect::<Vec<_>>());
            let server_us = median(&cpu_of[i].iter().map(|c| c.1).collect::<Vec<_>>());
            out.push_str(&format!(
                "| {} | {:.0} | {:.0}–{:.0} | {} | {} | {:.1} | {:.1} | {:.2} | {:.2} |\n",
                k.name(),
                rate,
                lo,
                hi,
                ratio.map_or("n/a".into(), |r| format!("{r:.2}")),
                rb_median.map_or("n/a".into(), |rb| format!("{:.2}", rate / rb)),
                client_us,
                server_us,
                cmds.0,
                cmds.1
            ));
            json_line(
                json!({"scenario": "many_keys", "contender": k.name(), "names": opts.names,
                "tasks": opts.many_tasks, "acq_per_s": rate, "acq_per_s_runs": rates[i],
                "evalsha_unpipelined": evalsha_c64,
                "evalsha_ceiling": evalsha_ceiling,
                "set_ceiling": set_ceiling, "ratio_to_half_ceiling": ratio,
                "client_cpu_us_per_acq": client_us, "server_cpu_us_per_acq": server_us,
                "net_cmds_per_acq": cmds.0, "script_cmds_per_acq": cmds.1}),
            );
            many.push((k, rate, cmds));
        }
    }
    let mut parked_result = None;
    if opts.runs("parked") && has_rb {
        let p = parked(&server, &raw, &opts).await;
        out.push_str(&format!(
            "\n### Parked waiters (redbaton): {} tasks on {} names in one process, arriving in batches of {}\n\n| waiters | live heap per waiter | RSS per waiter | lock() future | pub/sub conns | drain after release | EVALSHA per waiter |\n|---|---|---|---|---|---|---|\n| {} | {:.0} B | {:.0} B | {} B | {} | {:.0} ms | {:.2} |\n",
            p.waiters, opts.parked_names, opts.parked_batch, p.waiters, p.heap_per_waiter, p.rss_per_waiter, p.future_bytes, p.pubsub_conns, p.drain_ms, p.evalsha_per_waiter
        ));
        json_line(
            json!({"scenario": "parked", "contender": "redbaton", "waiters": p.waiters,
            "names": opts.parked_names, "arrival_batch": opts.parked_batch,
            "rss_per_waiter_bytes": p.rss_per_waiter,
            "pubsub_connections": p.pubsub_conns, "drain_ms": p.drain_ms,
            "lock_future_bytes": p.future_bytes,
            "heap_per_waiter_bytes": p.heap_per_waiter,
            "evalsha_per_waiter": p.evalsha_per_waiter}),
        );
        parked_result = Some(p);
    }

    // ----- targets -----
    if has_rb {
        if let Some((e, after_hold)) = floors_us {
            for waiters in [1usize, 15] {
                let rows: Vec<_> = wakeups.iter().filter(|(w, _, _)| *w == waiters).collect();
                if let Some((_, _, rb)) = rows.iter().find(|(_, k, _)| *k == Kind::Redbaton) {
                    targets.push((
                        format!("wake-up p50 ≤ 4 × EVALSHA ({waiters} waiter(s))"),
                        format!(
                            "{:.0} µs = {:.2} × {:.1} µs",
                            rb.handoff_p50_us,
                            rb.handoff_p50_us / e,
                            e
                        ),
                        verdict(rb.handoff_p50_us <= 4.0 * e),
                    ));
                    let pairs: Vec<_> = rows.iter().map(|(_, k, r)| (*k, r)).collect();
                    baton_handoff_target(
                        &mut targets,
                        &pairs,
                        rb,
                        (e, after_hold),
                        &format!("wake-up, {waiters} waiter(s)"),
                    );
                    let nb = pairs.iter().find(|(k, _)| *k == Kind::RedbatonNoBaton);
                    baton_rate_target(
                        &mut targets,
                        rb,
                        nb.map(|(_, r)| *r),
                        &format!("wake-up, {waiters} waiter(s)"),
                    );
                    for (_, k, r) in rows.iter().filter(|(_, k, _)| {
                        ![Kind::Redbaton, Kind::RedbatonNoBaton, Kind::NaiveJitter].contains(k)
                    }) {
                        let factor = r.handoff_p50_us / rb.handoff_p50_us;
                        targets.push((
                            format!(
                                "wake-up p50 ≥ 20× lower than {} ({waiters} waiter(s))",
                                k.name()
                            ),
                            format!(
                                "{factor:.0}× ({:.0} µs vs {:.0} µs)",
                                r.handoff_p50_us, rb.handoff_p50_us
                            ),
                            verdict(factor >= 20.0),
                        ));
                    }
                }
            }
        }
        if let Some((_, rb)) = handoff_1p.iter().find(|(k, _)| *k == Kind::Redbaton) {
            hot_key_targets(&mut targets, &handoff_1p, rb, floors_us, opts.tasks);
            wait_targets(
                &mut targets,
                &handoff_1p,
                rb,
                &format!("{} tasks, 1 process", opts.tasks),
            );
            targets.push((
                format!(
                    "network commands per acquisition ≤ 4 ({} tasks / 1 process)",
                    opts.tasks
                ),
                format!(
                    "{:.2} (+ {:.2} inside scripts)",
                    rb.net_per_acq, rb.script_per_acq
                ),
                verdict(rb.net_per_acq <= 4.0),
            ));
            targets.push((
                "mutual exclusion (1 process)".into(),
                format!("{} overlaps", rb.overlaps),
                verdict(rb.overlaps == 0),
            ));
        }
        if let Some((_, rb)) = handoff_mp.iter().find(|(k, _)| *k == Kind::Redbaton) {
            let nb = handoff_mp.iter().find(|(k, _)| *k == Kind::RedbatonNoBaton);
            multi_process_baton_targets(
                &mut targets,
                rb,
                nb.map(|(_, r)| r),
                &format!("{} processes × {} tasks", opts.procs, opts.per_proc),
            );
            wait_targets(
                &mut targets,
                &handoff_mp,
                rb,
                &format!("{} processes × {} tasks", opts.procs, opts.per_proc),
            );
            let p = opts.procs as f64;
            targets.push((
                format!(
                    "network commands per acquisition ≤ P + 3 = {} ({} processes)",
                    p + 3.0,
                    opts.procs
                ),
                format!(
                    "{:.2} (+ {:.2} inside scripts)",
                    rb.net_per_acq, rb.script_per_acq
                ),
                verdict(rb.net_per_acq <= p + 3.0),
            ));
            targets.push((
                format!(
                    "subscriber connections = {} ({} processes)",
                    opts.procs, opts.procs
                ),
                format!("{}", rb.pubsub_conns),
                verdict(rb.pubsub_conns <= opts.procs),
            ));
            targets.push((
                "mutual exclusion (processes)".into(),
                format!("{} overlaps", rb.overlaps),
                verdict(rb.overlaps == 0),
            ));
        }
        if let (Some(c), Some((_, rate, _))) =
            (ceiling, many.iter().find(|(k, _, _)| *k == Kind::Redbaton))
        {
            let r = rate / (c / 2.0);
            targets.push((
                "many keys ≥ 0.60 × (EVALSHA ceiling / 2), pipelined ceiling".into(),
                format!("{r:.2} ({rate:.0} acq/s vs {c:.0} / 2)"),
                verdict(r >= 0.60),
            ));
        }
        if let Some((_, rb, _)) = many.iter().find(|(k, _, _)| *k == Kind::Redbaton) {
            let peers = [
                Kind::Rslock,
                Kind::RslockTuned,
                Kind::Rlock,
                Kind::RlockTuned,
                Kind::Redisson,
            ];
            if let Some((pk, peer, _)) = many
                .iter()
                .filter(|(k, _, _)| peers.contains(k))
                .max_by(|a, b| a.1.total_cmp(&b.1))
            {
                targets.push((
                    "many keys acq/s ≥ best peer crate's (medians)".into(),
                    format!("{:.2} × ({rb:.0} vs {peer:.0}, {})", rb / peer, pk.name()),
                    verdict(rb >= peer),
                ));
            }
            if let Some((_, naive, _)) = many.iter().find(|(k, _, _)| *k == Kind::Naive) {
                targets.push((
                    "(baseline, no target) many keys vs the naive SET NX lock on fred".into(),
                    format!("{:.2} × ({rb:.0} vs {naive:.0})", rb / naive),
                    "shown",
                ));
            }
        }
        if let Some(p) = &parked_result {
            targets.push((
                "parked: 1 subscriber connection per process".into(),
                format!("{}", p.pubsub_conns),
                verdict(p.pubsub_conns == 1),
            ));
            targets.push((
                "parked: ≤ 2 KiB per waiter (RSS delta)".into(),
                format!(
                    "{:.0} B RSS ({:.0} B live heap)",
                    p.rss_per_waiter, p.heap_per_waiter
                ),
                verdict(p.rss_per_waiter <= 2048.0),
            ));
        }
    }
    if !targets.is_empty() {
        out.push_str("\n### Targets\n\n| target | measured | verdict |\n|---|---|---|\n");
        for (t, m, v) in &targets {
            out.push_str(&format!("| {t} | {m} | {v} |\n"));
        }
    }
    out.push_str(&format!(
        "\nWhole run: {:.0} s.\n",
        (now_ns() - wall) as f64 / 1e9
    ));
    println!("{out}");
    println!("### JSON\n");
    let lines = JSON.lock().unwrap();
    for line in lines.iter() {
        println!("{line}");
    }
    let mut json_written = true;
    if let Some(path) = &opts.json {
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        match std::fs::write(path, text) {
            Ok(()) => eprintln!("JSON lines written to {}", path.display()),
            Err(e) => {
                eprintln!("could not write {}: {e}", path.display());
                json_written = false;
            }
        }
    }
    drop(lines);
    drop(raw);
    drop(server);
    if !json_written {
        // After the server is stopped: the tables are on stdout, but the file asked for is not.
        std::process::exit(1);
    }
}
