//! redbaton's test kit, shared by the test crates (`use testkit as support;`), the examples,
//! the soak and the benches: real `redis-server` processes on free loopback ports, stopped on
//! drop (single nodes here; [`sentinel`], [`cluster`], [`tls`] certificates), the fault
//! [`proxy`], the mutual-exclusion [`history`] checker, the Redisson peers ([`java_peer`], the
//! real Java Redisson; [`redisson_peer`], a Lua stand-in), the lock [`family`]'s suite, and
//! which server binary runs ([`servers`], chosen by `REDBATON_TEST_SERVER`, skips logged),
//! and the catalog of every kind ([`kinds`]).
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fred::prelude::*;
use fred::types::{CustomCommand, InfoKind};

/// A `redis-server` child process on a free loopback port, killed on drop.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    dir: PathBuf,
    extra: Vec<String>,
    /// Which server binary runs (the one `REDBATON_TEST_SERVER` names, unless chosen).
    pub server: &'static servers::TestServer,
}

/// A watchdog lease for tests whose holds must be renewed several times: short enough to
/// outlive twice in a test, long enough (renewed every 667 ms) that a renewal a loaded machine
/// delays by a second does not lose the hold.
pub const RENEWED_LEASE: Duration = Duration::from_secs(2);

/// Checks a semaphore's history of holds `(from, to, permits)` — `from` after the permits
/// were surely taken, `to` before they were given back, so any overlap seen really happened:
/// the permits held at any instant never exceed `limit`. Returns the most held at once (a
/// caller asserts it reached `limit`, or its run proved nothing).
pub fn max_held(history: &[(Instant, Instant, i64)], limit: i64) -> i64 {
    let mut events: Vec<(Instant, i64)> = Vec::new();
    for (from, to, permits) in history {
        assert!(from <= to);
        events.push((*from, *permits));
        events.push((*to, -permits));
    }
    // At one instant, releases before acquires: touching intervals do not overlap.
    events.sort_by_key(|(at, delta)| (*at, *delta));
    let (mut held, mut most) = (0, 0);
    for (at, delta) in events {
        held += delta;
        assert!(
            held <= limit,
            "{held} permits held at once at {at:?}; the limit is {limit}"
        );
        most = most.max(held);
    }
    most
}

/// A free TCP port on 127.0.0.1 (bound and released; the server binds it next).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind an ephemeral port")
        .local_addr()
        .unwrap()
        .port()
}

/// A directory under the system's temporary one that no other server of any test process
/// has: named by the process and a counter, never by a port (a port freed by one server can be
/// handed to the next, and two servers sharing a directory would share `nodes.conf`, and one's
/// removal would pull the other's files away).
pub fn fresh_dir(prefix: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("{prefix}-{}-{n}", std::process::id()))
}

// When a server this process started is ready (its pid in `INFO server`, and `PING` answered):
// one rule for the kit, the CLI's demo server, the examples and the soak. Its home is the CLI,
// which is published and must carry it; the kit mounts the same file.
#[path = "../../cli/src/ready.rs"]
mod ready;
pub use ready::served_by;

impl RedisServer {
    /// Starts a server with persistence off.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra `--option value` arguments.
    pub fn start_with(extra: &[&str]) -> Self {
        Self::start_as(servers::server(), extra)
    }

    /// Starts `server` (whatever `REDBATON_TEST_SERVER` says: the benchmark runs each in turn)
    /// with extra `--option value` arguments.
    pub fn start_as(server: &'static servers::TestServer, extra: &[&str]) -> Self {
        // A cluster node also listens on its port + 10000 (the cluster bus), so its port must
        // leave room for that: redis-server refuses ports above 55535 in cluster mode.
        let clustered = extra.contains(&"--cluster-enabled");
        // Its bus port is checked too: on a loaded machine with thousands of client
        // connections, port + 10000 is often some connection's local port, and redis-server
        // then exits at once.
        Self::start_on_as(server, extra, || loop {
            let port = free_port();
            if !clustered
                || (port <= 55535 && TcpListener::bind(("127.0.0.1", port + 10000)).is_ok())
            {
                return port;
            }
        })
    }

    /// Starts a server on the first port from `port` it can listen on (a port taken between
    /// `free_port` and the server's bind is met on loaded machines; the next one is tried).
    /// Each attempt has a directory of its own: a failed attempt's directory is removed with
    /// it, and a cluster node's `nodes.conf` must not be one a failed attempt left.
    pub fn start_on(extra: &[&str], port: impl FnMut() -> u16) -> Self {
        Self::start_on_as(servers::server(), extra, port)
    }

    fn start_on_as(
        which: &'static servers::TestServer,
        extra: &[&str],
        mut port: impl FnMut() -> u16,
    ) -> Self {
        let mut last_log = String::new();
        for _ in 0..20 {
            let mut server = RedisServer {
                port: port(),
                child: None,
                dir: fresh_dir("redbaton-test"),
                extra: extra.iter().map(|s| s.to_string()).collect(),
                server: which,
            };
            std::fs::create_dir_all(&server.dir).unwrap();
            if server.spawn() {
                return server;
            }
            last_log = std::fs::read_to_string(server.log_path()).unwrap_or_default();
        }
        let tail: Vec<&str> = last_log.lines().rev().take(5).collect();
        panic!(
            "could not start {} (is it installed?); its log ends: {tail:?}",
            which.server_bin.display()
        );
    }

    /// Whether the server's own log, past its first `from` bytes, says it listens. Not a
    /// connection to the port: a port `free_port` released can be taken by another test's
    /// server before this one binds it, and then this one exits while the other answers in its
    /// place. The log is in this server's own directory, and unlike a command it needs no
    /// password.
    fn says_ready(&self, from: u64) -> bool {
        use std::io::{Read, Seek};
        let Ok(mut log) = std::fs::File::open(self.log_path()) else {
            return false;
        };
        let mut text = String::new();
        log.seek(std::io::SeekFrom::Start(from)).is_ok()
            && log.read_to_string(&mut text).is_ok()
            && text.contains("Ready to accept connections")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join(format!("redis-{}.log", self.port))
    }

    fn spawn(&mut self) -> bool {
        let mut cmd = Command::new(&self.server.server_bin);
        cmd.args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--dir", self.dir.to_str().unwrap()])
            .arg("--logfile")
            .arg(self.log_path())
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // A restart on the same port appends to the same log: only what this process writes
        // counts.
        let logged_before = std::fs::metadata(self.log_path()).map_or(0, |m| m.len());
        let child = cmd.spawn().unwrap_or_else(|e| {
            panic!(
                "spawn {} ({e}): is it installed?",
                cmd.get_program().to_string_lossy()
            )
        });
        self.child = Some(child);
        // Generous: on a loaded machine a server has been seen to take over 10 s to listen.
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(|c| c.try_wait()) {
                self.child = None;
                return false; // exited: port taken, try another
            }
            if self.says_ready(logged_before) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        false
    }

    /// `redis://127.0.0.1:<port>` (`valkey://…` on Valkey).
    pub fn url(&self) -> String {
        format!("{}://127.0.0.1:{}", self.server.scheme(), self.port)
    }

    /// The server's process id, while it runs (to stop it with `SIGSTOP`, say).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the server (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills and restarts on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        let start = Instant::now();
        while !self.spawn() {
            assert!(start.elapsed() < Duration::from_secs(10), "restart failed");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A plain fred client for raw commands in assertions.
    pub async fn raw(&self) -> fred::clients::Client {
        let client = Builder::from_config(Config::from_url(&self.url()).unwrap())
            .build()
            .unwrap();
        client.init().await.unwrap();
        client
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `INFO commandstats` as (command name → calls), e.g. `"evalsha" → 12`.
pub async fn command_calls(raw: &fred::clients::Client) -> std::collections::HashMap<String, u64> {
    let info: String = raw.info(Some(InfoKind::CommandStats)).await.unwrap();
    info.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("cmdstat_")?;
            let (name, stats) = rest.split_once(':')?;
            let calls = stats
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

/// Calls of `command|subcommand` (e.g. `script|load`) in `calls`, from [`command_calls`].
/// A server without per-subcommand counts (Redis 6.2) counts them under the command alone
/// (`script`): its count, of every subcommand, is returned there, an upper bound.
pub fn subcommand_calls(calls: &std::collections::HashMap<String, u64>, name: &str) -> u64 {
    let counted_as = if servers::server()
        .lacks(servers::Feature::SubcommandStats)
        .is_some()
    {
        name.split('|').next().unwrap_or(name)
    } else {
        name
    };
    calls.get(counted_as).copied().unwrap_or(0)
}

/// The pub/sub modes a test runs in on this server: classic, and sharded where the server has
/// it (where not, the sharded half is reported skipped, by [`servers::supports`]).
pub fn pubsub_modes() -> Vec<redbaton::PubSubMode> {
    let mut modes = vec![redbaton::PubSubMode::Classic];
    if servers::supports(servers::Feature::ShardedPubSub, Some("its sharded half")) {
        modes.push(redbaton::PubSubMode::Sharded);
    }
    modes
}

/// Script calls the server has run so far (`EVALSHA` and `EVAL`): every acquire attempt,
/// release and renewal is one.
pub async fn script_calls(raw: &fred::clients::Client) -> u64 {
    let calls = command_calls(raw).await;
    ["evalsha", "eval"]
        .iter()
        .map(|c| calls.get(*c).copied().unwrap_or(0))
        .sum()
}

/// Commands the server has run so far that could renew a hold: scripts and expiry commands
/// (`INFO commandstats` counts those run inside scripts too).
async fn renewing_calls(raw: &fred::clients::Client) -> u64 {
    let calls = command_calls(raw).await;
    [
        "evalsha",
        "eval",
        "fcall",
        "pexpire",
        "expire",
        "pexpireat",
        "expireat",
    ]
    .iter()
    .map(|c| calls.get(*c).copied().unwrap_or(0))
    .sum()
}

/// Writes a hold of `owner` on `name` by hand, as if it were still held, and checks over a
/// whole `lease` (three renewal periods) that nobody renews it: the server runs no script and
/// sets no expiry, and the PTTL only goes down. (A renewal never shortens an expiry, so the
/// PTTL alone would not show one.) The TTL written is ten leases, so a loaded machine's slow
/// reads cannot let the key expire under the check.
pub async fn assert_never_renewed(
    raw: &fred::clients::Client,
    name: &str,
    owner: &str,
    lease: Duration,
) {
    let ttl_ms = 10 * lease.as_millis() as i64;
    let _: () = raw.hset(name, (owner, 1)).await.unwrap();
    let _: () = raw.pexpire(name, ttl_ms, None).await.unwrap();
    let calls = renewing_calls(raw).await;
    let mut last = i64::MAX;
    let until = Instant::now() + lease;
    loop {
        let done = Instant::now() >= until;
        let pttl: i64 = raw.pttl(name).await.unwrap();
        assert!(
            pttl > 0 && pttl <= last,
            "PTTL {pttl} ms after {last} ms (written as {ttl_ms} ms)"
        );
        last = pttl;
        if done {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        calls,
        renewing_calls(raw).await,
        "no script ran and no expiry was set"
    );
    let _: i64 = raw.del(name).await.unwrap();
}

/// Subscribers of `channel` across all clients (`PUBSUB NUMSUB`).
pub async fn numsub(raw: &fred::clients::Client, channel: &str) -> i64 {
    let reply: Vec<Value> = raw
        .custom(
            CustomCommand::new_static("PUBSUB", None, false),
            vec!["NUMSUB", channel],
        )
        .await
        .unwrap();
    reply.get(1).and_then(|v| v.as_i64()).unwrap_or(-1)
}

/// Waits (bounded by 20 s) until a waiter that started after the server had run
/// `scripts_before` scripts is parked on `channel`, a channel its client was not subscribed
/// to: the engine tries once, subscribes, and tries again once the subscription is confirmed,
/// so both attempts having run means it is subscribed and found nothing to take. A release
/// after this reaches it only by its message (or by a recheck the test has turned off);
/// released earlier, its own re-check would take the permit and the test would prove nothing.
/// A renewal of another hold may count as one of the two: it only makes that run weaker.
pub async fn parked_fresh(raw: &fred::clients::Client, channel: &str, scripts_before: u64) {
    parked_fresh_across(std::slice::from_ref(raw), raw, channel, scripts_before).await
}

/// [`parked_fresh`] on a cluster: the waiter's subscription may be on any of `nodes` (classic
/// pub/sub subscribes on one node of the client's choice; their counts are summed), its
/// scripts run on `scripts_on`, the node serving its key.
pub async fn parked_fresh_across(
    nodes: &[fred::clients::Client],
    scripts_on: &fred::clients::Client,
    channel: &str,
    scripts_before: u64,
) {
    let subscribers = || async {
        let mut sum = 0;
        for node in nodes {
            sum += numsub(node, channel).await.max(0);
        }
        sum
    };
    let parked = eventually(Duration::from_secs(20), || async {
        subscribers().await >= 1 && script_calls(scripts_on).await >= scripts_before + 2
    })
    .await;
    assert!(
        parked,
        "the waiter never parked on {channel}: {} subscribers, {} scripts since it started",
        subscribers().await,
        script_calls(scripts_on).await - scripts_before
    );
}

/// `PUBSUB SHARDNUMSUB channel` on a single server: its shard subscribers.
pub async fn shard_numsub(raw: &fred::clients::Client, channel: &str) -> i64 {
    let reply: Vec<Value> = raw
        .custom(
            CustomCommand::new_static("PUBSUB", None, false),
            vec!["SHARDNUMSUB", channel],
        )
        .await
        .unwrap();
    reply.get(1).and_then(|v| v.as_i64()).unwrap_or(-1)
}

/// Spawns a task that waits for `lock`, notes when it got it (tokio's clock, which tests may
/// pause), and releases it at once.
pub fn spawn_waiter(lock: redbaton::Lock) -> tokio::task::JoinHandle<tokio::time::Instant> {
    tokio::spawn(async move {
        let guard = lock.lock().await.unwrap();
        let acquired_at = tokio::time::Instant::now();
        guard.unlock().await.unwrap();
        acquired_at
    })
}

/// With `guard` held, `waiter` cannot take the lock; it parks, and releasing `guard` wakes it
/// well before the 30 s default lease — only the unlock message on the channel can do that.
/// `what` names the case in failure messages.
pub async fn assert_release_wakes(guard: redbaton::LockGuard, waiter: redbaton::Lock, what: &str) {
    assert!(
        waiter.try_lock().await.unwrap().is_none(),
        "{what}: excluded while held"
    );
    let waiting = spawn_waiter(waiter);
    tokio::time::sleep(Duration::from_millis(150)).await;
    let released = tokio::time::Instant::now();
    guard.unlock().await.unwrap();
    let woke = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .unwrap()
        .unwrap();
    assert!(
        woke.duration_since(released) < Duration::from_secs(2),
        "{what}: woken by the unlock message, not by the lease"
    );
}

/// Polls `cond` until true or `timeout`; returns whether it became true.
pub async fn eventually<F, Fut>(timeout: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if cond().await {
            return true;
        }
        if start.elapsed() > timeout {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The names among `names` still held after a few seconds: a release in flight lands within
/// moments, a leaked hold stays for its lease.
pub async fn still_held(
    raw: &fred::clients::Client,
    names: impl IntoIterator<Item = String>,
) -> Vec<String> {
    let mut held = Vec::new();
    for name in names {
        let released = eventually(Duration::from_secs(5), || async {
            raw.exists::<i64, _>(&name).await.unwrap() == 0
        })
        .await;
        if !released {
            held.push(name);
        }
    }
    held
}

pub mod captured;
pub mod child;
pub mod cluster;
pub mod family;
pub mod history;
pub mod java_peer;
pub mod kinds;
pub mod monitor;
pub mod passing;
pub mod proxy;
pub mod redisson_peer;
pub mod sentinel;
pub mod servers;
pub mod tls;

/// Runs a raw command (`CLIENT PAUSE`, `SCRIPT FLUSH`, ...) and returns its reply.
pub async fn command(raw: &fred::clients::Client, name: &'static str, args: Vec<String>) -> Value {
    raw.custom(CustomCommand::new_static(name, None, false), args)
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Closes every pub/sub connection the server has (`CLIENT KILL TYPE pubsub`): the
/// subscriber of each client must reconnect and resubscribe.
pub async fn kill_pubsub_connections(raw: &fred::clients::Client) {
    let _ = command(
        raw,
        "CLIENT",
        vec!["KILL".into(), "TYPE".into(), "pubsub".into()],
    )
    .await;
}

/// Calls of `command` (as counted by [`command_calls`]) once that count has stopped changing
/// for `quiet`: everything in flight has reached the server. Panics when it is still changing
/// after `timeout`.
pub async fn settled_calls(
    raw: &fred::clients::Client,
    command: &str,
    quiet: Duration,
    timeout: Duration,
) -> u64 {
    let count =
        |calls: std::collections::HashMap<String, u64>| calls.get(command).copied().unwrap_or(0);
    let start = Instant::now();
    let mut last = count(command_calls(raw).await);
    let mut unchanged_since = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = count(command_calls(raw).await);
        if now != last {
            last = now;
            unchanged_since = Instant::now();
        } else if unchanged_since.elapsed() >= quiet {
            return last;
        }
        assert!(
            start.elapsed() < timeout,
            "{command} calls still changing after {timeout:?}"
        );
    }
}
