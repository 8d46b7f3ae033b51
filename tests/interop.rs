//! Interop with a third-party Redisson implementation: node-redisson (a Node.js port of
//! Redisson's RLock, pinned in interop/node/package-lock.json) and redbaton on the same
//! redis-server and lock names. `interop/node/driver.js` drives the port; its header lists the
//! port's deviations from Redisson and how the driver works around them, so what is tested
//! here is Redisson's protocol, not the port's bugs.
//!
//! Needs `node` and the pinned packages: `bash scripts/install-node.sh` (run by
//! `scripts/test.sh` and CI). Without them every test here fails, saying so.

use testkit as support;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fred::prelude::*;
use redbaton::Client;
use support::{eventually, numsub, RedisServer};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{oneshot, Mutex};

/// Well under every lease used below that is meant to outlast a wait: a waiter acquiring
/// within this was woken by a message, not by the lease ending.
const WOKEN_WITHIN: Duration = Duration::from_secs(3);

/// The wall clock in milliseconds, the clock the driver reports (`performance.timeOrigin +
/// performance.now()`).
fn now_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        * 1000.0
}

fn hex(name: &str) -> String {
    name.bytes().map(|b| format!("{b:02x}")).collect()
}

/// Writes past the test harness's output capture, so CI logs show the figures.
fn report(line: &str) {
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "interop: {line}");
}

/// interop/node, checked: `node` runs and the pinned node-redisson is installed.
fn driver_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|d| d.join("interop/node"))
        .find(|d| d.join("driver.js").is_file())
        .expect("interop/node/driver.js not found above CARGO_MANIFEST_DIR");
    let help = "run `bash scripts/install-node.sh` (installs node and npm from Debian's \
                packages when missing, then the pinned node-redisson with `npm ci`)";
    let node = std::process::Command::new("node").arg("--version").output();
    assert!(
        node.is_ok_and(|o| o.status.success()),
        "`node` is not installed: {help}"
    );
    let manifest = std::fs::read_to_string(dir.join("node_modules/node-redisson/package.json"))
        .unwrap_or_else(|_| panic!("node-redisson is not installed in {dir:?}: {help}"));
    assert!(
        manifest.contains("\"version\": \"1.0.4\""),
        "node-redisson in {dir:?} is not the pinned 1.0.4: {help}"
    );
    dir
}

type Reply = Result<Vec<String>, String>;

/// One `node driver.js serve` process: a node-redisson client (one uuid) whose "threads" are
/// decimal numbers chosen by the test.
struct Node {
    child: Child,
    stdin: Mutex<ChildStdin>,
    pending: Arc<std::sync::Mutex<HashMap<u64, oneshot::Sender<Reply>>>>,
    next: AtomicU64,
    /// The node-redisson client's uuid: owner fields are `<id>:<thread>`.
    id: String,
}

impl Node {
    async fn start(server: &RedisServer, watchdog: Option<Duration>) -> Arc<Node> {
        let dir = driver_dir();
        let mut cmd = Command::new("node");
        cmd.arg("driver.js")
            .args(["serve", "--port", &server.port.to_string()])
            .current_dir(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if let Some(w) = watchdog {
            cmd.args(["--watchdog", &w.as_millis().to_string()]);
        }
        let mut child = cmd.spawn().expect("spawn node");
        let stdin = child.stdin.take().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let ready = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .expect("driver.js did not start within 20 s")
            .unwrap()
            .expect("driver.js exited before it was ready");
        let id = ready
            .strip_prefix("ready ")
            .unwrap_or_else(|| panic!("unexpected first line from driver.js: {ready}"))
            .to_owned();
        let pending: Arc<std::sync::Mutex<HashMap<u64, oneshot::Sender<Reply>>>> =
            Default::default();
        let routes = pending.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let mut words = line.split(' ');
                let (Some(id), Some(status)) = (words.next(), words.next()) else {
                    continue;
                };
                let rest: Vec<String> = words.map(str::to_owned).collect();
                let reply = match status {
                    "ok" => Ok(rest),
                    _ => Err(rest.join(" ")),
                };
                if let Some(tx) = id
                    .parse()
                    .ok()
                    .and_then(|id| routes.lock().unwrap().remove(&id))
                {
                    let _ = tx.send(reply);
                }
            }
            // The process ended: every pending call fails (its sender is dropped).
            routes.lock().unwrap().clear();
        });
        Arc::new(Node {
            child,
            stdin: Mutex::new(stdin),
            pending,
            next: AtomicU64::new(1),
            id,
        })
    }

    async fn call(&self, command: String) -> Reply {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap().insert(id, tx);
        let mut stdin = self.stdin.lock().await;
        stdin
            .write_all(format!("{id} {command}\n").as_bytes())
            .await
            .map_err(|e| format!("write to driver.js: {e}"))?;
        stdin.flush().await.map_err(|e| e.to_string())?;
        drop(stdin);
        rx.await
            .map_err(|_| "driver.js exited".to_owned())
            .and_then(|r| r)
    }

    /// `lock()` / `lock(lease)` when `wait` is `None`, else `tryLock(wait, lease)`; a lease
    /// of `None` is the watchdog's. Returns whether it was acquired and when (ms).
    async fn lock(
        &self,
        thread: u32,
        name: &str,
        lease: Option<Duration>,
        wait: Option<Duration>,
    ) -> (bool, f64) {
        let ms = |d: Option<Duration>| d.map_or("-".to_owned(), |d| d.as_millis().to_string());
        let reply = self
            .call(format!(
                "lock {thread} {} {} {}",
                hex(name),
                ms(lease),
                ms(wait)
            ))
            .await
            .unwrap_or_else(|e| panic!("node lock {name:?}: {e}"));
        (reply[0] == "1", reply[1].parse().unwrap())
    }

    /// A waiting `lock()` (watchdog lease) in the background: resolves to when it acquired.
    fn spawn_lock(self: &Arc<Self>, thread: u32, name: &str) -> tokio::task::JoinHandle<f64> {
        let node = self.clone();
        let name = name.to_owned();
        tokio::spawn(async move {
            let (acquired, at) = node.lock(thread, &name, None, None).await;
            assert!(acquired);
            at
        })
    }

    /// `unlock()`; returns when it was called (ms).
    async fn unlock(&self, thread: u32, name: &str) -> f64 {
        let reply = self
            .call(format!("unlock {thread} {}", hex(name)))
            .await
            .unwrap_or_else(|e| panic!("node unlock {name:?}: {e}"));
        reply[0].parse().unwrap()
    }

    async fn force_unlock(&self, thread: u32, name: &str) -> bool {
        let reply = self
            .call(format!("force {thread} {}", hex(name)))
            .await
            .unwrap_or_else(|e| panic!("node forceUnlock {name:?}: {e}"));
        reply[0] == "1"
    }

    /// A round trip through the driver's event loop.
    async fn ping(&self) {
        self.call("ping".to_owned()).await.expect("node ping");
    }

    fn owner(&self, thread: u32) -> String {
        format!("{}:{thread}", self.id)
    }
}

async fn client(server: &RedisServer) -> Client {
    Client::connect(&server.url()).await.unwrap()
}

/// Waits until `channel` has exactly `n` subscribers.
async fn subscribers(raw: &fred::clients::Client, channel: &str, n: i64) {
    assert!(
        eventually(Duration::from_secs(15), || async {
            numsub(raw, channel).await == n
        })
        .await,
        "{channel}: expected {n} subscriber(s), have {}",
        numsub(raw, channel).await
    );
}

/// A node-redisson waiter parked on `name`'s channel (nobody else subscribed): waits until
/// its SUBSCRIBE has reached the server and the driver's event loop has turned once after
/// that (so the port, which registers its listener after the SUBSCRIBE reply, is listening).
async fn node_waiter(
    raw: &fred::clients::Client,
    node: &Arc<Node>,
    thread: u32,
    lock: &redbaton::Lock,
) -> tokio::task::JoinHandle<f64> {
    subscribers(raw, lock.channel(), 0).await;
    let waiter = node.spawn_lock(thread, lock.name());
    subscribers(raw, lock.channel(), 1).await;
    node.ping().await;
    waiter
}

/// A redbaton waiter parked on `lock` (nobody else subscribed to its channel): resolves to
/// when it acquired (ms) and its guard.
async fn rust_waiter(
    raw: &fred::clients::Client,
    lock: redbaton::Lock,
) -> tokio::task::JoinHandle<(f64, redbaton::LockGuard)> {
    subscribers(raw, lock.channel(), 0).await;
    let channel = lock.channel().to_owned();
    let waiter = tokio::spawn(async move {
        let guard = lock.lock().await.unwrap();
        (now_ms(), guard)
    });
    subscribers(raw, &channel, 1).await;
    waiter
}

async fn within<T>(what: &str, limit: Duration, task: tokio::task::JoinHandle<T>) -> T {
    tokio::time::timeout(limit, task)
        .await
        .unwrap_or_else(|_| panic!("{what}: not done within {limit:?}"))
        .unwrap()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mixed_counter_has_no_overlaps() {
    const NODE_WORKERS: usize = 3;
    const RUST_CLIENTS: usize = 2;
    const TASKS_PER_CLIENT: usize = 2;
    const ITERATIONS: usize = 30;
    let server = RedisServer::start();
    let raw = server.raw().await;
    let dir = driver_dir();
    let name = "interop:{counter}:é";
    let prefix = "counter";
    let mut workers = Vec::new();
    for thread in 0..NODE_WORKERS {
        let child = Command::new("node")
            .current_dir(&dir)
            .arg("driver.js")
            .args(["counter", "--port", &server.port.to_string()])
            .args(["--name", &hex(name), "--thread", &thread.to_string()])
            .args(["--iterations", &ITERATIONS.to_string(), "--prefix", prefix])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn node");
        workers.push(tokio::spawn(async move {
            tokio::time::timeout(Duration::from_secs(45), child.wait_with_output())
                .await
                .expect("a node counter worker ran for over 45 s")
                .unwrap()
        }));
    }
    // Start once every node worker is connected, so that both sides contend.
    assert!(
        eventually(Duration::from_secs(30), || async {
            let ready: Option<i64> = raw.get(format!("{prefix}:ready")).await.unwrap();
            ready == Some(NODE_WORKERS as i64)
        })
        .await,
        "node counter workers did not connect"
    );
    let mut tasks = Vec::new();
    for _ in 0..RUST_CLIENTS {
        let client = client(&server).await;
        for _ in 0..TASKS_PER_CLIENT {
            let lock = client.lock(name);
            let raw = server.raw().await;
            tasks.push(tokio::spawn(async move {
                for _ in 0..ITERATIONS {
                    let guard = lock.lock().await.unwrap();
                    let inside: i64 = raw.incr(format!("{prefix}:inside")).await.unwrap();
                    if inside != 1 {
                        let _: i64 = raw.incr(format!("{prefix}:overlaps")).await.unwrap();
                    }
                    let _: i64 = raw.rpush(format!("{prefix}:order"), "R").await.unwrap();
                    let value: Option<i64> = raw.get(format!("{prefix}:count")).await.unwrap();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    let _: () = raw
                        .set(
                            format!("{prefix}:count"),
                            value.unwrap_or(0) + 1,
                            None,
                            None,
                            false,
                        )
                        .await
                        .unwrap();
                    let _: i64 = raw.decr(format!("{prefix}:inside")).await.unwrap();
                    guard.unlock().await.unwrap();
                }
            }));
        }
    }
    for task in tasks {
        within("a redbaton counter task", Duration::from_secs(45), task).await;
    }
    for worker in workers {
        let out = worker.await.unwrap();
        assert!(
            out.status.success(),
            "node counter worker: {:?}",
            out.status
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(stdout.trim(), format!("done {ITERATIONS}"));
    }
    let total = (NODE_WORKERS + RUST_CLIENTS * TASKS_PER_CLIENT) * ITERATIONS;
    let count: Option<i64> = raw.get(format!("{prefix}:count")).await.unwrap();
    let overlaps: Option<i64> = raw.get(format!("{prefix}:overlaps")).await.unwrap();
    assert_eq!(overlaps.unwrap_or(0), 0, "critical sections overlapped");
    assert_eq!(count, Some(total as i64), "lost increments");
    let exists: i64 = raw.exists(name).await.unwrap();
    assert_eq!(exists, 0, "the lock is free at the end");
    // The lock passed between the implementations, both ways.
    let order: Vec<String> = raw.lrange(format!("{prefix}:order"), 0, -1).await.unwrap();
    assert_eq!(order.len(), total);
    let handovers = |from: &str, to: &str| {
        order
            .windows(2)
            .filter(|w| w[0] == from && w[1] == to)
            .count()
    };
    let (to_rust, to_node) = (handovers("N", "R"), handovers("R", "N"));
    assert!(
        to_rust > 0 && to_node > 0,
        "no hand-over between the implementations: {order:?}"
    );
    report(&format!(
        "mixed counter: {total} increments ({NODE_WORKERS} node-redisson workers, {} redbaton \
         tasks), 0 overlaps, {to_rust} hand-overs node->redbaton, {to_node} redbaton->node",
        RUST_CLIENTS * TASKS_PER_CLIENT
    ));
}

/// Waiter on one side, release on the other, both ways; each wake-up well before the holder's
/// lease could have ended it. Reports the release→acquire latencies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wake_ups_both_ways() {
    const ROUNDS: usize = 12;
    let server = RedisServer::start();
    let raw = server.raw().await;
    let node = Node::start(&server, None).await;
    let holder = client(&server).await;
    let waiters = client(&server).await;
    let mut to_node = Vec::new();
    let mut to_rust = Vec::new();
    for round in 0..ROUNDS {
        // redbaton releases, node-redisson waits. A fresh name each round: the port's timer of
        // a finished wait UNSUBSCRIBEs its channel later (driver.js, deviation 3).
        let lock = holder.lock(format!("wake:to-node:{round}"));
        let guard = lock.lock().await.unwrap();
        let waiter = node_waiter(&raw, &node, 1, &lock).await;
        assert!(!waiter.is_finished(), "node-redisson waited while held");
        let released = now_ms();
        guard.unlock().await.unwrap();
        let acquired = within("node-redisson waiter", WOKEN_WITHIN, waiter).await;
        to_node.push(acquired - released);
        node.unlock(1, lock.name()).await;

        // node-redisson releases, redbaton waits.
        let name = format!("wake:to-rust:{round}");
        assert!(node.lock(2, &name, None, None).await.0);
        let waiter = rust_waiter(&raw, waiters.lock(&name)).await;
        assert!(!waiter.is_finished(), "redbaton waited while held");
        let released = node.unlock(2, &name).await;
        let (acquired, guard) = within("redbaton waiter", WOKEN_WITHIN, waiter).await;
        to_rust.push(acquired - released);
        guard.unlock().await.unwrap();
    }
    for (what, mut ms) in [
        ("redbaton release -> node-redisson waiter", to_node),
        ("node-redisson release -> redbaton waiter", to_rust),
    ] {
        ms.sort_by(f64::total_cmp);
        report(&format!(
            "wake-up {what}: p50 {:.2} ms, p90 {:.2} ms, max {:.2} ms ({ROUNDS} rounds)",
            percentile(&ms, 0.5),
            percentile(&ms, 0.9),
            ms[ms.len() - 1]
        ));
    }
    holder.shutdown().await.unwrap();
    waiters.shutdown().await.unwrap();
}

/// A lock held re-entrantly by one side blocks the other until every hold is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentry_both_ways() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let node = Node::start(&server, None).await;
    let rust = client(&server).await;

    // node-redisson holds twice; redbaton is kept out until the second unlock.
    let lock = rust.lock("reentry:node-holds");
    let name = lock.name().to_owned();
    assert!(node.lock(1, &name, None, None).await.0);
    assert!(node.lock(1, &name, None, None).await.0);
    let count: Option<i64> = raw.hget(&name, node.owner(1)).await.unwrap();
    assert_eq!(count, Some(2));
    assert!(lock.try_lock().await.unwrap().is_none());
    node.unlock(1, &name).await;
    let count: Option<i64> = raw.hget(&name, node.owner(1)).await.unwrap();
    assert_eq!(count, Some(1), "one hold left");
    assert!(lock.try_lock().await.unwrap().is_none(), "still held once");
    let waiter = rust_waiter(&raw, lock.clone()).await;
    assert!(!waiter.is_finished());
    node.unlock(1, &name).await;
    let (_, guard) = within("redbaton waiter", WOKEN_WITHIN, waiter).await;
    guard.unlock().await.unwrap();

    // redbaton holds twice (one task); node-redisson is kept out until both are released.
    let lock = rust.lock("reentry:rust-holds");
    let name = lock.name().to_owned();
    let outer = lock.lock().await.unwrap();
    let inner = outer.reenter().await.unwrap();
    let owner = outer.owner().to_string();
    let count: Option<i64> = raw.hget(&name, &owner).await.unwrap();
    assert_eq!(count, Some(2));
    assert!(!node.lock(1, &name, None, Some(Duration::ZERO)).await.0);
    let waiter = node_waiter(&raw, &node, 2, &lock).await;
    inner.unlock().await.unwrap();
    // The partial release kept the lock: only redbaton's field, count 1.
    let fields: HashMap<String, i64> = raw.hgetall(&name).await.unwrap();
    assert_eq!(fields, HashMap::from([(owner, 1)]));
    assert!(!node.lock(1, &name, None, Some(Duration::ZERO)).await.0);
    assert!(
        !waiter.is_finished(),
        "a partial release does not let node-redisson in"
    );
    outer.unlock().await.unwrap();
    within("node-redisson waiter", WOKEN_WITHIN, waiter).await;
    let fields: HashMap<String, i64> = raw.hgetall(&name).await.unwrap();
    assert_eq!(fields, HashMap::from([(node.owner(2), 1)]));
    node.unlock(2, &name).await;
    rust.shutdown().await.unwrap();
}

/// A force-unlock from either side deletes the lock and wakes a waiter of the other side
/// long before the holder's 60 s lease would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_unlock_from_each_side_wakes_the_other() {
    let lease = Duration::from_secs(60);
    let server = RedisServer::start();
    let raw = server.raw().await;
    let node = Node::start(&server, None).await;
    let holder = client(&server).await;
    let waiters = client(&server).await;

    // node-redisson forces; a redbaton waiter wakes.
    let name = "force:by-node";
    let guard = holder.lock(name).lock_with_lease(lease).await.unwrap();
    let waiter = rust_waiter(&raw, waiters.lock(name)).await;
    assert!(node.force_unlock(9, name).await, "the lock existed");
    let (_, taken) = within("redbaton waiter", WOKEN_WITHIN, waiter).await;
    assert!(guard.unlock().await.is_err(), "the forced-out hold is gone");
    taken.unlock().await.unwrap();

    // redbaton forces; a node-redisson waiter wakes.
    let lock = holder.lock("force:by-rust");
    assert!(node.lock(1, lock.name(), Some(lease), None).await.0);
    let waiter = node_waiter(&raw, &node, 2, &lock).await;
    assert!(lock.force_unlock().await.unwrap(), "the lock existed");
    within("node-redisson waiter", WOKEN_WITHIN, waiter).await;
    let fields: HashMap<String, i64> = raw.hgetall(lock.name()).await.unwrap();
    assert_eq!(fields, HashMap::from([(node.owner(2), 1)]));
    node.unlock(2, lock.name()).await;
    holder.shutdown().await.unwrap();
    waiters.shutdown().await.unwrap();
}

/// kill -9 of a node-redisson process holding the lock with its watchdog: its lease ends and
/// a parked redbaton waiter takes the lock (no unlock message ever comes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_node_holder_expires_for_redbaton() {
    let watchdog = Duration::from_secs(2);
    let server = RedisServer::start();
    let raw = server.raw().await;
    let node = Node::start(&server, Some(watchdog)).await;
    let rust = client(&server).await;
    let lock = rust.lock("dead:node");
    assert!(node.lock(1, lock.name(), None, None).await.0);
    // The port's watchdog renews (every 2/3 s here): the key outlives its first lease.
    let taken = tokio::time::Instant::now();
    let renewed = eventually(Duration::from_secs(10), || async {
        let pttl: i64 = raw.pttl(lock.name()).await.unwrap();
        taken.elapsed() > watchdog + Duration::from_millis(500) && pttl > 0
    })
    .await;
    assert!(renewed, "node-redisson's watchdog renews the lease");
    let waiter = rust_waiter(&raw, lock.clone()).await;
    let mut node = Arc::into_inner(node).expect("no other handle");
    let count: Option<i64> = raw.hget(lock.name(), node.owner(1)).await.unwrap();
    assert_eq!(count, Some(1), "held by node-redisson when killed");
    assert!(!waiter.is_finished());
    node.child.start_kill().unwrap(); // SIGKILL
    node.child.wait().await.unwrap();
    let killed = now_ms();
    let (acquired, guard) = within(
        "redbaton waiter after the holder was killed",
        watchdog + Duration::from_secs(8),
        waiter,
    )
    .await;
    report(&format!(
        "killed node-redisson holder (watchdog {watchdog:?}): redbaton acquired {:.0} ms after the kill",
        acquired - killed
    ));
    guard.unlock().await.unwrap();
    rust.shutdown().await.unwrap();
}

/// The environment variable that makes this test binary a redbaton holder process (see
/// `killed_redbaton_holder_expires_for_node`): `<redis url> <hex name>`.
const HOLDER_ENV: &str = "REDBATON_INTEROP_HOLDER";

/// kill -9 of a process holding the lock through redbaton's watchdog: its lease ends and a
/// parked node-redisson waiter takes the lock. The holder is this test binary run again with
/// [`HOLDER_ENV`] set, running only this test.
#[test]
fn killed_redbaton_holder_expires_for_node() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    if let Ok(spec) = std::env::var(HOLDER_ENV) {
        return runtime.block_on(hold_until_killed(spec));
    }
    runtime.block_on(async {
        let watchdog = Duration::from_secs(2);
        let server = RedisServer::start();
        let raw = server.raw().await;
        let node = Node::start(&server, None).await;
        let name = "dead:rust:{ü}";
        let mut holder = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "killed_redbaton_holder_expires_for_node"])
            .args(["--nocapture", "--test-threads", "1"])
            .env(HOLDER_ENV, format!("{} {}", server.url(), hex(name)))
            .env("REDBATON_INTEROP_WATCHDOG_MS", watchdog.as_millis().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(holder.stdout.take().unwrap()).lines();
        let owner = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(line) = lines.next_line().await.unwrap() {
                // The harness's "test ... " may precede it on the same line.
                if let Some((_, owner)) = line.split_once("held ") {
                    return owner.trim().to_owned();
                }
            }
            panic!("the holder process exited before it held the lock");
        })
        .await
        .expect("the holder process did not take the lock within 30 s");
        let lock = client(&server).await.lock(name);
        let waiter = node_waiter(&raw, &node, 1, &lock).await;
        // Renewed by the holder's watchdog past its first lease, the waiter still waiting.
        let taken = tokio::time::Instant::now();
        let renewed = eventually(Duration::from_secs(10), || async {
            let pttl: i64 = raw.pttl(name).await.unwrap();
            taken.elapsed() > watchdog + Duration::from_millis(500) && pttl > 0
        })
        .await;
        assert!(renewed, "redbaton's watchdog renews the lease");
        let count: Option<i64> = raw.hget(name, &owner).await.unwrap();
        assert_eq!(count, Some(1), "held by the redbaton process when killed");
        assert!(!waiter.is_finished());
        holder.start_kill().unwrap(); // SIGKILL
        holder.wait().await.unwrap();
        let killed = now_ms();
        let acquired = within(
            "node-redisson waiter after the holder was killed",
            watchdog + Duration::from_secs(8),
            waiter,
        )
        .await;
        report(&format!(
            "killed redbaton holder (watchdog {watchdog:?}): node-redisson acquired {:.0} ms after the kill",
            acquired - killed
        ));
        let fields: HashMap<String, i64> = raw.hgetall(name).await.unwrap();
        assert_eq!(fields, HashMap::from([(node.owner(1), 1)]));
        node.unlock(1, name).await;
    });
}

/// The holder process: takes the lock with a short watchdog lease, says `held <owner>` on
/// stdout and waits to be killed (for at most 60 s).
async fn hold_until_killed(spec: String) {
    use std::io::Write;
    let (url, name) = spec.split_once(' ').expect("<url> <hex name>");
    let name: Vec<u8> = (0..name.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&name[i..i + 2], 16).unwrap())
        .collect();
    let watchdog: u64 = std::env::var("REDBATON_INTEROP_WATCHDOG_MS")
        .unwrap()
        .parse()
        .unwrap();
    let client = Client::builder()
        .url(url)
        .watchdog_lease(Duration::from_millis(watchdog))
        .connect()
        .await
        .unwrap();
    let guard = client
        .lock(String::from_utf8(name).unwrap())
        .lock()
        .await
        .unwrap();
    // Past the harness's capture: the parent reads this line.
    let mut out = std::io::stdout().lock();
    writeln!(out, "\nheld {}", guard.owner()).unwrap();
    out.flush().unwrap();
    drop(out);
    tokio::time::sleep(Duration::from_secs(60)).await;
    panic!("the holder process was not killed within 60 s");
}

/// Names with braces (where Redisson's rule and the port's differ: driver.js, deviation 1) and
/// Unicode: same key, same owner fields, same channel, wake-ups both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_with_braces_and_unicode() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let node = Node::start(&server, None).await;
    let holder = client(&server).await;
    let waiters = client(&server).await;
    let names = [
        "a{b}c",
        "order:{42}:x",
        "{tag}:x",
        "}{",
        "{",
        "锁:ключ:🔒",
        "{ünï}:cødé",
        "with space",
    ];
    for name in names {
        let lock = waiters.lock(name);
        // node-redisson holds: the key is the name itself, the field `<uuid>:<thread>`.
        assert!(node.lock(1, name, None, None).await.0, "{name}");
        let fields: HashMap<String, i64> = raw.hgetall(name).await.unwrap();
        assert_eq!(fields, HashMap::from([(node.owner(1), 1)]), "{name}");
        assert!(
            holder.lock(name).try_lock().await.unwrap().is_none(),
            "{name}"
        );
        // Its unlock message reaches redbaton's channel.
        let waiter = rust_waiter(&raw, lock.clone()).await;
        node.unlock(1, name).await;
        let (_, guard) = within(name, WOKEN_WITHIN, waiter).await;
        // redbaton holds; node-redisson is kept out, listens on the same channel, and is
        // woken by redbaton's release.
        assert!(
            !node.lock(2, name, None, Some(Duration::ZERO)).await.0,
            "{name}"
        );
        let waiter = node_waiter(&raw, &node, 2, &lock).await;
        guard.unlock().await.unwrap();
        within(name, WOKEN_WITHIN, waiter).await;
        node.unlock(2, name).await;
        let exists: i64 = raw.exists(name).await.unwrap();
        assert_eq!(exists, 0, "{name}");
    }
    holder.shutdown().await.unwrap();
    waiters.shutdown().await.unwrap();
}

/// A lock held by node-redisson with its own default owner field (`<client uuid>:<lock
/// uuid>`, not Redisson's `<uuid>:<thread>`): `state()` lists the field as it is, redbaton is
/// kept out, and a force-unlock frees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_with_node_redissons_own_owner_field_is_inspected_and_broken() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let node = Node::start(&server, None).await;
    let rust = client(&server).await;
    let lock = rust.lock("node:own-owner");
    let reply = node
        .call(format!("lock - {} - -", hex(lock.name())))
        .await
        .expect("node lock");
    assert_eq!(reply[0], "1");
    let fields: HashMap<String, i64> = raw.hgetall(lock.name()).await.unwrap();
    let (field, count) = fields.into_iter().next().expect("held");
    let (client_id, holder) = field.split_once(':').unwrap();
    assert_eq!(client_id, node.id);
    assert!(
        holder.parse::<u64>().is_err(),
        "the port's own format: {field}"
    );
    let state = lock.state().await.expect("a lock held by node-redisson");
    let holds: Vec<_> = state
        .owners
        .iter()
        .map(|h| (h.owner.to_string(), h.count))
        .collect();
    assert_eq!(holds, vec![(field.clone(), count as u64)]);
    assert!(lock.try_lock().await.unwrap().is_none());
    assert!(lock.force_unlock().await.unwrap());
    assert!(!lock.is_locked().await.unwrap());
    rust.shutdown().await.unwrap();
}
