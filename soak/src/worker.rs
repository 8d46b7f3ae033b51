//! A worker process: two clients (one straight to the server, one through the fault proxy),
//! many tasks taking the locks with every kind of call, each critical section recorded.
//!
//! Files in the run directory: `ready-<id>` once connected, `progress-<id>` (valid sections
//! so far, rewritten every 200 ms), and at the end `history-<id>` (one record a line) and
//! `summary-<id>` (`<counter>\t<value>` lines). The worker stops when `stop` appears.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::interfaces::{HashesInterface, KeysInterface, LuaInterface};
use fred::types::Value;
use parking_lot::Mutex;
use redbaton::{Client, Error, Lock, LockGuard};

use crate::history::{told_ago, watch_lost};
use crate::record::{
    counter_key, fence_key, kind_of, mono_ns, names, NameKind, Record, WriteOutcome, CAS_SCRIPT,
};

/// The worker's settings, passed by the parent on the command line.
#[derive(clap::Args, Clone, Debug)]
pub struct WorkerArgs {
    #[arg(long)]
    pub id: usize,
    #[arg(long)]
    pub direct_port: u16,
    #[arg(long)]
    pub proxy_port: u16,
    #[arg(long)]
    pub dir: PathBuf,
    #[arg(long)]
    pub seed: u64,
    #[arg(long)]
    pub tasks: usize,
    #[arg(long)]
    pub lease_ms: u64,
    #[arg(long)]
    pub command_timeout_ms: u64,
    /// Percent of sections run without taking the lock (the checker's self-test).
    #[arg(long, default_value_t = 0.0)]
    pub sabotage: f64,
    /// How long tasks may take to finish once told to stop.
    #[arg(long)]
    pub grace_secs: u64,
    /// The calls to mix (see `--calls` of the soak).
    #[arg(long)]
    pub calls: String,
    /// How many of the names to use.
    #[arg(long)]
    pub names: usize,
    /// Where the locks live when not on the direct server (a failover topology); the
    /// fences and counters then stay on the direct server.
    #[arg(long)]
    pub lock_url: Option<String>,
    /// `auto` or `off`.
    #[arg(long, default_value = "auto")]
    pub replica_sync: String,
    /// The mixed soak's names, one of each kind, shared with Java Redisson workers.
    #[arg(long)]
    pub mixed: bool,
    /// When above 0, this worker also runs an operator: a client of its own that
    /// force-unlocks a `Lock` name about this often (ms) and then holds it itself for a
    /// section (see `forced-<id>`).
    #[arg(long, default_value_t = 0)]
    pub operator_every_ms: u64,
}

/// Counters by label (`miss`, `acquire error: Timeout`, …), summed by the parent.
#[derive(Default)]
struct Counters(Mutex<BTreeMap<String, u64>>);

impl Counters {
    fn add(&self, label: impl Into<String>, n: u64) {
        *self.0.lock().entry(label.into()).or_default() += n;
    }
}

struct Ctx {
    id: usize,
    stop: AtomicBool,
    valid_sections: AtomicU64,
    history: Mutex<Vec<Record>>,
    counters: Counters,
    sabotage: f64,
    calls: Vec<(Op, u32)>,
    names: &'static [&'static str],
    mixed: bool,
    /// Where fences and counters live, when not with the locks.
    ledger: Option<fred::clients::Client>,
    /// When each call refused as not replicated returned (`mono_ns`): the parent checks none
    /// came while the only replica was in a full resync (`refusals-<id>`).
    refusals: Mutex<Vec<u64>>,
}

fn error_kind(e: &Error) -> &'static str {
    match e {
        Error::NotHeld { .. } => "NotHeld",
        Error::WrongType { .. } => "WrongType",
        Error::InvalidArgument(_) => "InvalidArgument",
        Error::Connection(_) => "Connection",
        Error::Timeout(_) => "Timeout",
        Error::Auth(_) => "Auth",
        Error::Redis(_) => "Redis",
        Error::ShutDown => "ShutDown",
        Error::NotReplicated { .. } => "NotReplicated",
        _ => "other",
    }
}

/// Writes `items` to `path` atomically, one a line.
fn write_lines(path: &Path, items: &[impl std::fmt::Display]) {
    let text: String = items.iter().map(|item| format!("{item}\n")).collect();
    write_atomically(path, &text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// Writes `text` to `path` atomically (write a temporary file, rename).
fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

async fn connect(url: &str, args: &WorkerArgs) -> Client {
    let started = Instant::now();
    loop {
        let connected = Client::builder()
            .url(url)
            .watchdog_lease(Duration::from_millis(args.lease_ms))
            .command_timeout(Duration::from_millis(args.command_timeout_ms))
            .connect_timeout(Duration::from_secs(2))
            .reconnect_max_delay(Duration::from_millis(200))
            // A fair-lock waiter whose give-up did not reach Redis blocks its queue this long.
            .fair_lock_wait(FAIR_LOCK_WAIT)
            .replica_sync(if args.replica_sync == "off" {
                redbaton::ReplicaSync::Off
            } else {
                redbaton::ReplicaSync::Auto
            })
            .connect()
            .await;
        match connected {
            Ok(client) => return client,
            Err(e) if started.elapsed() < Duration::from_secs(60) => {
                eprintln!("worker {}: connect {url}: {e}; retrying", args.id);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("worker {}: cannot connect to {url}: {e}", args.id),
        }
    }
}

/// The fair lock's `fair_lock_wait`, on both sides of a mixed soak (Redisson's
/// `fairLockWaitTimeout`): short, so a waiter that left without leaving the queue (its give-up
/// lost to a fault) delays the queue for seconds, not the default five minutes.
pub const FAIR_LOCK_WAIT: Duration = Duration::from_secs(5);

/// A plain fred client to the ledger (fences and counters), reconnecting for ever.
async fn ledger(url: &str) -> fred::clients::Client {
    use fred::prelude::{Builder, ClientLike, Config, ReconnectPolicy};
    let client = Builder::from_config(Config::from_url(url).expect("the ledger's URL"))
        .with_performance_config(|p| p.default_command_timeout = Duration::from_secs(5))
        .set_policy(ReconnectPolicy::new_constant(0, 100))
        .build()
        .expect("a ledger client");
    client.init().await.expect("connect to the ledger");
    client
}

/// Runs a worker process to its end.
pub fn main(args: WorkerArgs) -> std::process::ExitCode {
    // The library's own logs, into the worker's log, when asked for (`RUST_LOG=redbaton=debug`).
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .init();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let code = runtime.block_on(run(args));
    // Tasks that never finished stay behind in the runtime: do not wait for them.
    std::process::exit(code)
}

async fn run(args: WorkerArgs) -> i32 {
    let direct_url = format!("redis://127.0.0.1:{}", args.direct_port);
    let (direct, proxied, ledger) = match &args.lock_url {
        Some(url) => {
            let ledger = ledger(&direct_url).await;
            (
                connect(url, &args).await,
                connect(url, &args).await,
                Some(ledger),
            )
        }
        None => {
            let proxy_url = format!("redis://127.0.0.1:{}", args.proxy_port);
            (
                connect(&direct_url, &args).await,
                connect(&proxy_url, &args).await,
                None,
            )
        }
    };
    let ctx = Arc::new(Ctx {
        id: args.id,
        stop: AtomicBool::new(false),
        valid_sections: AtomicU64::new(0),
        history: Mutex::new(Vec::new()),
        counters: Counters::default(),
        sabotage: args.sabotage / 100.0,
        calls: parse_calls(&args.calls).expect("the parent checked --calls"),
        names: names(args.mixed, args.names),
        mixed: args.mixed,
        ledger,
        refusals: Mutex::new(Vec::new()),
    });
    let dir = args.dir.clone();
    std::fs::write(dir.join(format!("ready-{}", args.id)), "").expect("write the ready file");

    // Progress for the parent; the stop file from it.
    let watcher = {
        let ctx = ctx.clone();
        let dir = dir.clone();
        tokio::spawn(async move {
            let progress = dir.join(format!("progress-{}", ctx.id));
            let stop = dir.join("stop");
            let parent = nix::unistd::getppid();
            let mut beat = 0u32;
            loop {
                if nix::unistd::getppid() != parent {
                    // The soak itself is gone (interrupted): nobody will read the results.
                    std::process::exit(3);
                }
                if stop.exists() {
                    ctx.stop.store(true, Ordering::Release);
                }
                if beat % 10 == 0 || ctx.stop.load(Ordering::Acquire) {
                    let n = ctx.valid_sections.load(Ordering::Relaxed);
                    let _ = write_atomically(&progress, &n.to_string());
                }
                if ctx.stop.load(Ordering::Acquire) {
                    return;
                }
                beat += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };

    let mut tasks = Vec::new();
    for t in 0..args.tasks {
        let client = if t % 2 == 0 {
            direct.clone()
        } else {
            proxied.clone()
        };
        let seed = args
            .seed
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(((args.id * 1000 + t) as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93));
        let proxied = t % 2 == 1 && args.lock_url.is_none();
        tasks.push(tokio::spawn(task(ctx.clone(), client, proxied, t, seed)));
    }
    let operator = (args.operator_every_ms > 0).then(|| {
        let ctx = ctx.clone();
        let args = args.clone();
        let url = args.lock_url.clone().unwrap_or_else(|| direct_url.clone());
        tokio::spawn(async move {
            let client = connect(&url, &args).await;
            let forced = operate(&ctx, &client, &args).await;
            let _ = tokio::time::timeout(Duration::from_secs(10), client.shutdown()).await;
            forced
        })
    });
    let _ = watcher.await;

    // Every task must finish within the grace period.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.grace_secs);
    let mut unfinished = 0;
    for task in tasks {
        match tokio::time::timeout_at(deadline, task).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                eprintln!("worker {}: a task panicked: {e}", args.id);
                ctx.counters.add("task panicked", 1);
            }
            Err(_) => unfinished += 1,
        }
    }
    ctx.counters.add("tasks", args.tasks as u64);
    ctx.counters.add("tasks unfinished", unfinished);
    if let Some(operator) = operator {
        let forced = match tokio::time::timeout_at(deadline, operator).await {
            Ok(Ok(forced)) => forced,
            _ => {
                ctx.counters.add("tasks unfinished", 1);
                Vec::new()
            }
        };
        write_lines(&dir.join(format!("forced-{}", args.id)), &forced);
    }
    write_lines(
        &dir.join(format!("refusals-{}", args.id)),
        &ctx.refusals.lock(),
    );
    if unfinished == 0 {
        // The hashes name their owners; a leased permit's id does not (the parent checks those).
        let hashes: Vec<&str> = (0..ctx.names.len())
            .filter(|&n| kind_of(ctx.mixed, n) != NameKind::Leased)
            .map(|n| ctx.names[n])
            .collect();
        let strays = stray_holds(&direct, &hashes, &[direct.id(), proxied.id()]).await;
        ctx.counters.add("stray holds", strays);
    }

    write_lines(
        &dir.join(format!("history-{}", args.id)),
        &ctx.history.lock(),
    );
    let summary: String = ctx
        .counters
        .0
        .lock()
        .iter()
        .map(|(k, v)| format!("{k}\t{v}\n"))
        .collect();
    write_atomically(&dir.join(format!("summary-{}", args.id)), &summary)
        .expect("write the summary");

    for client in [direct, proxied] {
        match tokio::time::timeout(Duration::from_secs(10), client.shutdown()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("worker {}: shutdown: {e}", args.id),
            Err(_) => eprintln!("worker {}: shutdown took over 10 s", args.id),
        }
    }
    0
}

/// After every task released everything, no lock may stay held by this process beyond its
/// lease: a hold that stays is one nobody knows about (and the watchdog may renew it).
async fn stray_holds(client: &Client, names: &[&str], ids: &[&str]) -> u64 {
    // Longer than the longest fixed lease plus a watchdog lease: anything held that long
    // after the last release is kept alive.
    let bound = Duration::from_millis(MAX_FIXED_LEASE_MS) + client.watchdog_lease() * 2;
    let started = Instant::now();
    loop {
        let mut strays = Vec::new();
        for &name in names {
            match client
                .redis()
                .hgetall::<std::collections::HashMap<String, String>, _>(name)
                .await
            {
                Ok(fields) => strays.extend(
                    fields
                        .into_iter()
                        .filter(|(owner, _)| ids.iter().any(|id| owner.starts_with(id)))
                        .map(|(owner, count)| format!("{name}: {owner} = {count}")),
                ),
                Err(e) => strays.push(format!("{name}: cannot read: {e}")),
            }
        }
        if strays.is_empty() {
            return 0;
        }
        if started.elapsed() > bound {
            for s in &strays {
                eprintln!("stray hold after every task released: {s}");
            }
            return strays.len() as u64;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The longest fixed lease a task asks for.
const MAX_FIXED_LEASE_MS: u64 = 3000;

/// The calls a task mixes; `Re*` are nested holds in one task (outer/inner lease kind:
/// `w` watchdog, `f` fixed).
#[derive(Clone, Copy, Debug)]
pub enum Op {
    Lock,
    TryLock,
    TryLockFor,
    Leased,
    TryLeased,
    ReWw,
    ReWf,
    ReFw,
    ReFf,
    /// A future first polled inside the hold's scope and finished outside every scope after
    /// the hold was released (maybe handed on in memory): it tries the lock again.
    Escaped,
    /// The same, finished inside another hold's scope, polled there by a `FuturesUnordered`
    /// in a `select!` loop.
    Reparented,
    /// The hold's owner read from its guard, and named again with `with_owner` after the
    /// release: it tries the lock again.
    WithOwner,
}

/// Every call with its share of the rounds.
const WEIGHTS: [(Op, u32); 12] = [
    (Op::Lock, 20),
    (Op::TryLock, 14),
    (Op::TryLockFor, 14),
    (Op::Leased, 10),
    (Op::TryLeased, 10),
    (Op::ReWw, 10),
    (Op::ReWf, 8),
    (Op::ReFw, 7),
    (Op::ReFf, 7),
    (Op::Escaped, 3),
    (Op::Reparented, 3),
    (Op::WithOwner, 3),
];

/// The calls named in `list` (comma-separated labels, or `all`), with their weights.
pub fn parse_calls(list: &str) -> Result<Vec<(Op, u32)>, String> {
    if list == "all" {
        return Ok(WEIGHTS.to_vec());
    }
    let mut calls = Vec::new();
    for label in list.split(',').map(str::trim) {
        match WEIGHTS.iter().find(|(op, _)| op.label() == label) {
            Some(&call) => calls.push(call),
            None => {
                let known: Vec<&str> = WEIGHTS.iter().map(|(op, _)| op.label()).collect();
                return Err(format!(
                    "unknown call {label:?}; known: all, {}",
                    known.join(", ")
                ));
            }
        }
    }
    Ok(calls)
}

impl Op {
    fn pick(rng: &mut fastrand::Rng, calls: &[(Op, u32)]) -> Op {
        let total: u32 = calls.iter().map(|(_, w)| w).sum();
        let mut x = rng.u32(0..total);
        for &(op, w) in calls {
            if x < w {
                return op;
            }
            x -= w;
        }
        unreachable!()
    }

    fn label(self) -> &'static str {
        match self {
            Op::Lock => "lock",
            Op::TryLock => "try_lock",
            Op::TryLockFor => "try_lock_for",
            Op::Leased => "lock_with_lease",
            Op::TryLeased => "try_lock_with_lease",
            Op::ReWw => "reentrant:ww",
            Op::ReWf => "reentrant:wf",
            Op::ReFw => "reentrant:fw",
            Op::ReFf => "reentrant:ff",
            Op::Escaped => "escaped",
            Op::Reparented => "reparented",
            Op::WithOwner => "with_owner",
        }
    }
}

/// Mostly under 2 ms; sometimes up to 20 ms; rarely long enough to outlive a short fixed lease.
fn pick_hold(rng: &mut fastrand::Rng) -> Duration {
    match rng.u32(0..100) {
        0..=93 => Duration::from_micros(rng.u64(0..2_000)),
        94..=98 => Duration::from_millis(rng.u64(2..20)),
        _ => Duration::from_millis(rng.u64(50..400)),
    }
}

fn fixed_lease(rng: &mut fastrand::Rng, min_ms: u64, max_ms: u64) -> Duration {
    Duration::from_millis(rng.u64(min_ms..=max_ms))
}

async fn task(ctx: Arc<Ctx>, client: Client, proxied: bool, task: usize, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    while !ctx.stop.load(Ordering::Acquire) {
        let name = rng.usize(0..ctx.names.len());
        let lock = client.lock(ctx.names[name]);
        let hold = pick_hold(&mut rng);
        let run = Run {
            ctx: &ctx,
            client: &client,
            name,
            proxied,
            task,
        };
        if ctx.sabotage > 0.0 && rng.f64() < ctx.sabotage {
            // Self-test: a section that never took the lock, recorded as valid.
            ctx.counters.add("sabotaged sections", 1);
            run.section(hold, 0, "sabotage", "-", std::future::pending())
                .await;
            continue;
        }
        let op = Op::pick(&mut rng, &ctx.calls);
        let kind = kind_of(ctx.mixed, name);
        if kind != NameKind::Lock {
            run.other_kind(kind, op, hold, &mut rng).await;
            continue;
        }
        if matches!(op, Op::Escaped | Op::Reparented | Op::WithOwner) {
            run.identity_path(&lock, op, hold).await;
            continue;
        }
        let started = Instant::now();
        let acquired = match op {
            Op::Lock | Op::ReWw | Op::ReWf => lock.lock().await.map(Some),
            Op::Escaped | Op::Reparented | Op::WithOwner => unreachable!("taken above"),
            Op::TryLock => lock.try_lock().await,
            Op::TryLockFor => {
                lock.try_lock_for(Duration::from_millis(rng.u64(0..600)))
                    .await
            }
            Op::Leased => lock
                .lock_with_lease(fixed_lease(&mut rng, 200, MAX_FIXED_LEASE_MS))
                .await
                .map(Some),
            Op::TryLeased => {
                let wait = Duration::from_millis(rng.u64(0..600));
                lock.try_lock_with_lease(wait, fixed_lease(&mut rng, 200, MAX_FIXED_LEASE_MS))
                    .await
            }
            Op::ReFw | Op::ReFf => lock
                .lock_with_lease(fixed_lease(&mut rng, 500, MAX_FIXED_LEASE_MS))
                .await
                .map(Some),
        };
        let wait_ns = started.elapsed().as_nanos() as u64;
        let outer = match acquired {
            Ok(Some(guard)) => guard,
            Ok(None) => {
                ctx.counters.add("try missed", 1);
                continue;
            }
            Err(e) => {
                run.acquire_failed(op.label(), &e).await;
                continue;
            }
        };
        ctx.counters.add(format!("acquired: {}", op.label()), 1);
        if rng.bool() {
            run.check_hold_count(&lock, &outer).await;
        }
        match op {
            Op::ReWw | Op::ReWf | Op::ReFw | Op::ReFf => {
                run.nested(&lock, outer, op, hold, wait_ns, &mut rng).await
            }
            _ => {
                let at = run
                    .section(
                        hold,
                        wait_ns,
                        op.label(),
                        &field_of(&outer),
                        told_ago(outer.lost(), || outer.lost_at()),
                    )
                    .await;
                run.release(outer, &[at]).await;
            }
        }
    }
}

/// One round of one task.
struct Run<'a> {
    ctx: &'a Ctx,
    client: &'a Client,
    name: usize,
    proxied: bool,
    task: usize,
}

impl Run<'_> {
    /// A nested hold: re-enter, run a section under both holds, release the inner one, maybe
    /// run a second section under the outer hold alone, release the outer one.
    async fn nested(
        &self,
        lock: &Lock,
        outer: LockGuard,
        op: Op,
        hold: Duration,
        wait_ns: u64,
        rng: &mut fastrand::Rng,
    ) {
        // In the outer hold's scope: the same owner re-enters.
        let inner = match op {
            Op::ReWw | Op::ReFw => outer.run(|| lock.lock()).await,
            // A shorter fixed lease inside: it must not shorten the outer hold.
            _ => {
                let lease = fixed_lease(rng, 100, 1000);
                outer.run(|| lock.lock_with_lease(lease)).await
            }
        };
        let inner = inner.and_then(|inner| inner);
        let inner = match inner {
            Ok(inner) => inner,
            Err(e) => {
                self.refused(&e);
                self.ctx
                    .counters
                    .add(format!("re-enter error: {}", error_kind(&e)), 1);
                self.log(&format!("re-entering ({}) failed: {e}", op.label()));
                self.release(outer, &[]).await;
                return;
            }
        };
        let owner = field_of(&outer);
        // Valid while either guard says so: the holder may rely on either.
        // Told once both are lost: at the later of their instants.
        let both_lost = async {
            let (inner_ago, outer_ago) = tokio::join!(
                told_ago(inner.lost(), || inner.lost_at()),
                told_ago(outer.lost(), || outer.lost_at())
            );
            inner_ago.min(outer_ago)
        };
        let both = self
            .section(hold, wait_ns, op.label(), &owner, both_lost)
            .await;
        self.release(inner, &[both]).await;
        let mut under_outer = vec![both];
        if rng.bool() {
            let hold = pick_hold(rng);
            let label = format!("{}+outer", op.label());
            let told = told_ago(outer.lost(), || outer.lost_at());
            under_outer.push(self.section(hold, 0, &label, &owner, told).await);
        }
        self.release(outer, &under_outer).await;
    }

    /// An acquire failed: counted (a refusal as not replicated noted with its instant),
    /// logged, and a short pause (Redis may be down: do not spin).
    async fn acquire_failed(&self, label: &str, e: &Error) {
        self.refused(e);
        self.ctx
            .counters
            .add(format!("acquire error: {}", error_kind(e)), 1);
        self.log(&format!("{label} failed: {e}"));
        tokio::time::sleep(Duration::from_millis(fastrand::u64(5..50))).await;
    }

    /// Notes when a call refused as not replicated returned.
    fn refused(&self, e: &Error) {
        if matches!(e, Error::NotReplicated { .. }) {
            self.ctx.refusals.lock().push(mono_ns());
        }
    }

    /// After a hold is released — and maybe handed on in memory to another task of this
    /// process — what still names it may only ever get a hold of its own (invariant 16,
    /// docs/DESIGN.md): a future first polled inside the hold's scope and finished outside
    /// it (`Escaped`) or inside another hold's scope (`Reparented`), or the hold's owner read
    /// from its guard and named with `with_owner` (`WithOwner`). Whatever they get is a
    /// section of its own in the history, so re-entering another holder's hold is an overlap.
    async fn identity_path(&self, lock: &Lock, op: Op, hold: Duration) {
        let started = Instant::now();
        let guard = match lock.lock().await {
            Ok(guard) => guard,
            Err(e) => return self.acquire_failed(op.label(), &e).await,
        };
        let wait_ns = started.elapsed().as_nanos() as u64;
        self.ctx
            .counters
            .add(format!("acquired: {}", op.label()), 1);
        let label = op.label();
        if let Op::WithOwner = op {
            let owner = guard.owner();
            let told = told_ago(guard.lost(), || guard.lost_at());
            let at = self
                .section(hold, wait_ns, label, &field_of(&guard), told)
                .await;
            self.release(guard, &[at]).await;
            let again = lock.with_owner(owner).try_lock().await;
            return self.again(label, again).await;
        }
        // Another hold of this task's own (an uncontended side name), whose `run` future is
        // first polled inside `guard`'s scope and carried out of it.
        let side_name = format!("soak:side:{}:{}", self.ctx.id, self.task);
        let side = match self.client.lock(&side_name).lock().await {
            Ok(side) => Arc::new(side),
            Err(e) => {
                let at = self
                    .section(
                        hold,
                        wait_ns,
                        label,
                        &field_of(&guard),
                        told_ago(guard.lost(), || guard.lost_at()),
                    )
                    .await;
                self.release(guard, &[at]).await;
                return self
                    .acquire_failed(&format!("{label} (side hold)"), &e)
                    .await;
            }
        };
        let (go, went) = tokio::sync::oneshot::channel::<()>();
        let carried = {
            let (side, lock) = (side.clone(), lock.clone());
            guard.run(move || async move {
                let mut carried = Box::pin(async move {
                    side.run(|| async {
                        let _ = went.await;
                        lock.try_lock().await
                    })
                    .await
                });
                let first = std::future::poll_fn(|cx| {
                    std::task::Poll::Ready(std::future::Future::poll(carried.as_mut(), cx))
                })
                .await;
                first.is_pending().then_some(carried)
            })
        }
        .await;
        let told = told_ago(guard.lost(), || guard.lost_at());
        let at = self
            .section(hold, wait_ns, label, &field_of(&guard), told)
            .await;
        self.release(guard, &[at]).await;
        let _ = go.send(());
        let Ok(Some(carried)) = carried else {
            // The hold or the side hold was lost before the future could be carried out.
            self.ctx
                .counters
                .add(format!("{label}: not carried out"), 1);
            return self.release_side(side, &[]).await;
        };
        let again = if let Op::Escaped = op {
            // Polled outside every scope.
            carried.await
        } else {
            // Re-parented: polled inside another hold's scope, by a set in a `select!` loop.
            match self.client.lock(format!("{side_name}:2")).lock().await {
                Ok(other) => {
                    let mut set = futures::stream::FuturesUnordered::new();
                    set.push(carried);
                    let polled = other
                        .run(|| async {
                            use futures::StreamExt;
                            loop {
                                tokio::select! {
                                    Some(done) = set.next() => break done,
                                    _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                                }
                            }
                        })
                        .await;
                    self.release(other, &[]).await;
                    match polled {
                        Ok(again) => again,
                        Err(e) => Err(e),
                    }
                }
                Err(e) => {
                    drop(carried);
                    Err(e)
                }
            }
        };
        let again = again.and_then(|again| again);
        self.again(label, again).await;
        self.release_side(side, &[]).await;
    }

    /// What a stale identity's acquire got: a hold of its own runs a section (recorded like
    /// any other, so the checker sees it overlap another holder's if it was not its own).
    async fn again(&self, label: &str, again: redbaton::Result<Option<LockGuard>>) {
        match again {
            Ok(Some(again)) => {
                self.ctx
                    .counters
                    .add(format!("{label}: a hold of its own"), 1);
                let told = told_ago(again.lost(), || again.lost_at());
                let hold = pick_hold(&mut fastrand::Rng::new());
                let at = self
                    .section(hold, 0, &format!("{label}:again"), &field_of(&again), told)
                    .await;
                self.release(again, &[at]).await;
            }
            Ok(None) => self.ctx.counters.add(format!("{label}: refused"), 1),
            Err(e) => {
                self.refused(&e);
                self.ctx
                    .counters
                    .add(format!("{label}: error {}", error_kind(&e)), 1);
            }
        }
    }

    /// Releases a side hold kept in an `Arc` (the carried future has gone).
    async fn release_side(&self, side: Arc<LockGuard>, sections: &[usize]) {
        match Arc::into_inner(side) {
            Some(side) => self.release(side, sections).await,
            None => self.ctx.counters.add("side hold still shared", 1),
        }
    }

    /// The critical section, timed against `lost` (the holder's lost-lease signal): fence
    /// (INCR), read the counter, sleep `hold`, write it back through the compare-and-set;
    /// record it all.
    /// Returns where the record is in the history (see [`Run::release`]).
    async fn section(
        &self,
        hold: Duration,
        wait_ns: u64,
        op: &str,
        owner: &str,
        lost: impl std::future::Future<Output = Duration>,
    ) -> usize {
        let clock = || Duration::from_nanos(mono_ns());
        let ((fence, write, newest, start_ns, end_ns), lost_at) =
            watch_lost(self.fenced_write(hold), lost, clock).await;
        let lost_ns = lost_at.map(|at| at.as_nanos() as u64);
        if lost_ns.is_none() {
            self.ctx.valid_sections.fetch_add(1, Ordering::Relaxed);
        }
        let mut history = self.ctx.history.lock();
        history.push(Record {
            name: self.name,
            start_ns,
            end_ns,
            fence,
            lost_ns,
            write,
            newest,
            wait_ns,
            op: op.to_owned(),
            proxied: self.proxied,
            worker: self.ctx.id,
            task: self.task,
            owner: owner.to_owned(),
            gone: false,
        });
        history.len() - 1
    }

    /// Fence (INCR), read the counter, sleep `hold`, write it back through the
    /// compare-and-set. Returns the fence, the write's outcome, the newest fence the write
    /// saw, and when the section began and ended.
    async fn fenced_write(&self, hold: Duration) -> (Option<i64>, WriteOutcome, i64, u64, u64) {
        let redis = self.ctx.ledger.as_ref().unwrap_or(self.client.redis());
        let name = self.ctx.names[self.name];
        let start_ns = mono_ns();
        let mut newest = 0;
        // The fence, then the read: one pipeline on one connection, so Redis runs them in
        // this order, in one round trip.
        let pipeline = redis.pipeline();
        let _: Result<(), _> = pipeline.incr(fence_key(name)).await;
        let _: Result<(), _> = pipeline.hget(counter_key(name), "value").await;
        let mut replies = pipeline.try_all::<Value>().await.into_iter();
        let fence: Option<i64> = match replies.next() {
            Some(Ok(reply)) => reply.as_i64(),
            Some(Err(e)) => {
                self.side_error("incr", &e);
                None
            }
            None => None,
        };
        let read: Option<i64> = match (fence, replies.next()) {
            (Some(_), Some(Ok(reply))) => {
                reply.convert::<Option<i64>>().ok().map(|v| v.unwrap_or(0))
            }
            (Some(_), Some(Err(e))) => {
                self.side_error("read", &e);
                None
            }
            _ => None,
        };
        tokio::time::sleep(hold).await;
        let write = match (fence, read) {
            (Some(fence), Some(value)) => {
                let reply = redis
                    .eval::<Vec<i64>, _, _, _>(
                        CAS_SCRIPT,
                        vec![fence_key(name), counter_key(name)],
                        vec![Value::from(fence), Value::from(value + 1)],
                    )
                    .await;
                match reply {
                    Ok(reply) if reply.len() == 2 => {
                        newest = reply[1];
                        match reply[0] {
                            1 => WriteOutcome::Accepted,
                            0 => WriteOutcome::Rejected,
                            _ => WriteOutcome::Ahead,
                        }
                    }
                    Ok(reply) => panic!("unexpected counter script reply {reply:?}"),
                    Err(e) => {
                        self.side_error("write", &e);
                        WriteOutcome::Unknown
                    }
                }
            }
            _ => WriteOutcome::NotSent,
        };
        (fence, write, newest, start_ns, mono_ns())
    }

    /// A fresh acquire (this task held nothing on the name) must count exactly one hold: a
    /// higher count is a hold nobody knows about (a script that ran although its caller saw
    /// an error), which keeps the lock from everyone else while this task keeps re-entering it.
    ///
    /// A count of 2 that falls back to 1 is no phantom: an earlier acquire of the same task
    /// that timed out finished in the background, and its guard, dropped, is being released
    /// behind this acquire (both wait for the owner's turn). Allowed a few command timeouts.
    async fn check_hold_count(&self, lock: &Lock, guard: &LockGuard) {
        let Ok(count) = lock.hold_count().await else {
            return;
        };
        if count <= 1 || guard.is_lost() {
            return;
        }
        let started = Instant::now();
        let bound = self.client.config().command_timeout * 4;
        while started.elapsed() < bound && !guard.is_lost() {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if matches!(lock.hold_count().await, Ok(n) if n <= 1) {
                self.ctx
                    .counters
                    .add("late release of a timed-out acquire", 1);
                return;
            }
        }
        if !guard.is_lost() {
            self.ctx.counters.add("phantom hold count", 1);
            self.log(&format!("a fresh hold counts {count}"));
        }
    }

    /// A line in the worker's log, for tracing a violation back to its cause.
    fn log(&self, what: &str) {
        eprintln!(
            "mono {} ns: worker {} task {} ({}): {}: {what}",
            mono_ns(),
            self.ctx.id,
            self.task,
            if self.proxied { "proxied" } else { "direct" },
            self.ctx.names[self.name]
        );
    }

    fn side_error(&self, what: &str, e: &fred::error::Error) {
        let kind = if e.details().contains("LOADING") {
            "loading".to_owned()
        } else {
            format!("{:?}", e.kind())
        };
        self.ctx
            .counters
            .add(format!("section {what} error: {kind}"), 1);
    }

    /// Releases `guard`; the `sections` run under it are marked `gone` when the release
    /// found the hold gone before its holder was told (a force-unlock struck it).
    async fn release(&self, guard: LockGuard, sections: &[usize]) {
        let lost = guard.is_lost();
        self.settle_release(lost, guard.unlock().await, sections);
    }

    /// Counts how a release of a hold (`lost`: known lost before it) ended.
    fn settle_release(&self, lost: bool, outcome: redbaton::Result<()>, sections: &[usize]) {
        match outcome {
            Ok(()) => {}
            Err(Error::NotHeld { .. }) if lost => self.ctx.counters.add("unlock: lost", 1),
            Err(Error::NotHeld { .. }) => {
                let mut history = self.ctx.history.lock();
                for &at in sections {
                    history[at].gone = true;
                }
                self.ctx
                    .counters
                    .add("unlock: found the lock gone (not yet known lost)", 1)
            }
            Err(e) => {
                self.ctx
                    .counters
                    .add(format!("unlock error: {}", error_kind(&e)), 1);
                self.log(&format!("unlock failed: {e}"));
            }
        }
    }

    /// One round on a name of a kind other than `Lock` (a mixed soak): `op`'s acquire in that
    /// kind's terms (a nested call counts as its outer acquire), the section, the release.
    async fn other_kind(&self, kind: NameKind, op: Op, hold: Duration, rng: &mut fastrand::Rng) {
        let name = self.ctx.names[self.name];
        let op = match op {
            Op::ReWw | Op::ReWf | Op::Escaped | Op::Reparented | Op::WithOwner => Op::Lock,
            Op::ReFw | Op::ReFf => Op::Leased,
            op => op,
        };
        let wait = Duration::from_millis(rng.u64(0..600));
        let lease = fixed_lease(rng, 200, MAX_FIXED_LEASE_MS);
        let label = format!("{}:{}", kind.label(), op.label());
        let started = Instant::now();
        // The five acquire calls of a lock kind's handle.
        macro_rules! acquire {
            ($handle:expr) => {{
                let handle = $handle;
                match op {
                    Op::TryLock => handle.try_lock().await,
                    Op::TryLockFor => handle.try_lock_for(wait).await,
                    Op::Leased => handle.lock_with_lease(lease).await.map(Some),
                    Op::TryLeased => handle.try_lock_with_lease(wait, lease).await,
                    _ => handle.lock().await.map(Some),
                }
            }};
        }
        // The section under a hold, then its release.
        macro_rules! hold {
            ($acquired:expr, $release:ident) => {
                match $acquired {
                    Ok(Some(held)) => {
                        let wait_ns = started.elapsed().as_nanos() as u64;
                        self.ctx.counters.add(format!("acquired: {label}"), 1);
                        let lost = told_ago(held.lost(), || held.lost_at());
                        let owner = field_of(&held);
                        let at = self.section(hold, wait_ns, &label, &owner, lost).await;
                        let was_lost = held.is_lost();
                        self.settle_release(was_lost, held.$release().await, &[at]);
                    }
                    Ok(None) => self.ctx.counters.add("try missed", 1),
                    Err(e) => self.acquire_failed(&label, &e).await,
                }
            };
        }
        match kind {
            NameKind::Fair => hold!(acquire!(self.client.fair_lock(name)), unlock),
            NameKind::Fenced => hold!(acquire!(self.client.fenced_lock(name)), unlock),
            NameKind::Write => hold!(acquire!(self.client.read_write_lock(name).write()), unlock),
            NameKind::Leased => {
                let permits = self.client.leased_semaphore(name);
                let acquired = match op {
                    Op::TryLock => permits.try_acquire().await,
                    Op::TryLockFor => permits.try_acquire_for(wait).await,
                    Op::Leased => permits.acquire_with_lease(lease).await.map(Some),
                    Op::TryLeased => permits.try_acquire_with_lease(wait, lease).await,
                    _ => permits.acquire().await.map(Some),
                };
                hold!(acquired, release)
            }
            NameKind::Lock => unreachable!("a Lock's round is the task's own"),
        }
    }
}

/// The owner field of a guard's hold, read from its `Debug` form (`-` when it shows none):
/// reading `owner()` would give the owner out, and the hold would then never be handed on in
/// memory (invariant 16, docs/DESIGN.md).
fn field_of(guard: &impl std::fmt::Debug) -> String {
    let shown = format!("{guard:?}");
    shown
        .split("owner: \"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .filter(|field| !field.is_empty() && !field.contains(' '))
        .unwrap_or("-")
        .to_owned()
}

/// A force-unlock by the operator, `name sent_ns replied_ns` in `forced-<id>`: it struck the
/// name's hold at some instant between its send and its reply.
pub struct Forced {
    pub name: usize,
    pub sent_ns: u64,
    pub replied_ns: u64,
}

impl std::fmt::Display for Forced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} {}", self.name, self.sent_ns, self.replied_ns)
    }
}

impl std::str::FromStr for Forced {
    type Err = String;

    fn from_str(line: &str) -> Result<Self, Self::Err> {
        let bad = || format!("bad force-unlock line {line:?}");
        let f: Vec<u64> = line
            .split(' ')
            .map(|n| n.parse().map_err(|_| bad()))
            .collect::<Result<_, _>>()?;
        match f[..] {
            [name, sent_ns, replied_ns] => Ok(Forced {
                name: name as usize,
                sent_ns,
                replied_ns,
            }),
            _ => Err(bad()),
        }
    }
}

/// The operator, until the worker stops: about every `operator_every_ms`, force-unlocks a
/// `Lock` name (breaking whatever hold — or run of hand-offs in memory — it struck), then
/// takes it itself for a section of its own, which every other holder must exclude.
async fn operate(ctx: &Ctx, client: &Client, args: &WorkerArgs) -> Vec<Forced> {
    let mut rng = fastrand::Rng::with_seed(args.seed ^ 0x0FE2_A702);
    let locks: Vec<usize> = (0..ctx.names.len())
        .filter(|&n| kind_of(ctx.mixed, n) == NameKind::Lock)
        .collect();
    let mut forced = Vec::new();
    let every = args.operator_every_ms;
    while !ctx.stop.load(Ordering::Acquire) && !locks.is_empty() {
        tokio::time::sleep(Duration::from_millis(rng.u64(every / 2..=every * 3 / 2))).await;
        let name = locks[rng.usize(0..locks.len())];
        let lock = client.lock(ctx.names[name]);
        let sent_ns = mono_ns();
        match lock.force_unlock().await {
            Ok(true) => forced.push(Forced {
                name,
                sent_ns,
                replied_ns: mono_ns(),
            }),
            Ok(false) => ctx.counters.add("operator: force-unlock found it free", 1),
            Err(e) => {
                // It may have run: counted as a force all the same, for the checker.
                forced.push(Forced {
                    name,
                    sent_ns,
                    replied_ns: mono_ns(),
                });
                ctx.counters.add(
                    format!("operator: force-unlock error {}", error_kind(&e)),
                    1,
                );
            }
        }
        let run = Run {
            ctx,
            client,
            name,
            proxied: false,
            task: usize::MAX,
        };
        match lock.try_lock_for(Duration::from_millis(500)).await {
            Ok(Some(guard)) => {
                ctx.counters.add("acquired: operator", 1);
                let hold = Duration::from_millis(rng.u64(0..20));
                let told = told_ago(guard.lost(), || guard.lost_at());
                let at = run
                    .section(hold, 0, "operator", &field_of(&guard), told)
                    .await;
                run.release(guard, &[at]).await;
            }
            Ok(None) => ctx.counters.add("try missed", 1),
            Err(e) => run.acquire_failed("operator", &e).await,
        }
    }
    forced
}
