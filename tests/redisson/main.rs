//! Java Redisson itself in the loop: every kind shared between the real Redisson
//! (`interop/java`, a driver of Redisson's own jar) and redbaton on the same server and names,
//! both ways — exclusion, wake-ups by the unlock message (not by the lease), re-entry and
//! inspection read the same from both sides, force-unlock from either side, fencing tokens,
//! a fair lock's queue order, both watchdogs, an unlock by the wrong side — on a single node
//! and on a cluster with classic and with sharded pub/sub (Redisson's
//! `shardedSubscriptionMode` set to match).
//!
//! Redisson's version is `$REDBATON_REDISSON_VERSION` (4.7.0 by default; 3.52.0 is the other
//! line built). The tests named `core_*` are the exclusion, wake-up and re-entry set that CI
//! also runs against 3.52.0. Needs java and the driver: `bash scripts/install-java-peer.sh`
//! (run by `scripts/test.sh` and CI); without them every test here fails, saying so.

use testkit as support;

// The lock family's erased handles (`Family`, `Held`); its conformance suite runs elsewhere.
#[allow(unused_imports, unused_macros)]
use testkit::family;

mod cluster;
mod fair;
mod fenced;
mod locks;
mod multi;
mod peer;
mod rwlock;
mod semaphores;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fred::prelude::*;
use fred::types::CustomCommand;
use redbaton::{Client, PubSubMode};

use peer::Java;
use support::cluster::RedisCluster;
use support::{eventually, script_calls, RedisServer};

/// The watchdog lease of both sides unless a test says otherwise (Redisson's default): a
/// waiter that acquires within [`WOKEN_WITHIN`] of the release was woken by the message.
const LEASE: Duration = Duration::from_secs(30);

/// Far under [`LEASE`] (and under every fixed lease a test holds while it waits): a wake-up this
/// quick after the release came from the unlock message, not from a lease ending.
const WOKEN_WITHIN: Duration = Duration::from_secs(3);

/// The wall clock in ms: the clock the Java driver stamps its replies with.
fn now_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        * 1000.0
}

/// Writes past the test harness's output capture, so CI logs show the figures.
fn report(line: &str) {
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "redisson: {line}");
}

/// `task`, which must finish within `limit`.
async fn within<T>(what: &str, limit: Duration, task: tokio::task::JoinHandle<T>) -> T {
    tokio::time::timeout(limit, task)
        .await
        .unwrap_or_else(|_| panic!("{what}: not done within {limit:?}"))
        .unwrap()
}

/// `acquire` in a task of its own, parked on a channel under `channel` where nobody listened
/// before (see [`Env::parked`]): resolves to when it acquired (ms) and what it got.
async fn parked_task<T: Send + 'static>(
    env: &Env,
    channel: &str,
    acquire: impl std::future::Future<Output = T> + Send + 'static,
) -> tokio::task::JoinHandle<(f64, T)> {
    env.no_subscribers(channel).await;
    let before = env.scripts().await;
    let waiter = tokio::spawn(async move {
        let got = acquire.await;
        (now_ms(), got)
    });
    env.parked(channel, before).await;
    waiter
}

/// A Java call made by `spawn` (a waiting acquire), parked on a channel under `channel` where
/// nobody listened before.
async fn parked_java(
    env: &Env,
    channel: &str,
    spawn: impl FnOnce() -> tokio::task::JoinHandle<peer::Reply>,
) -> tokio::task::JoinHandle<peer::Reply> {
    env.no_subscribers(channel).await;
    let before = env.scripts().await;
    let waiter = spawn();
    env.parked(channel, before).await;
    waiter
}

/// When a Java acquire running in the background returned (ms); it must succeed.
async fn java_acquired(
    what: &str,
    limit: Duration,
    waiter: tokio::task::JoinHandle<peer::Reply>,
) -> f64 {
    within(what, limit, waiter)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e:?}"))
        .t1
}

/// Where the locks live.
enum Servers {
    Single(RedisServer),
    Cluster(RedisCluster),
}

/// A topology with its servers, and how each side reaches it.
pub struct Env {
    servers: Servers,
    /// The pub/sub mode of both sides.
    pub mode: PubSubMode,
    /// Keys, through a client that follows the cluster's slots.
    pub raw: fred::clients::Client,
    /// Every primary (the lone server on a single node), for subscriber and script counts.
    nodes: Vec<fred::clients::Client>,
    /// The Java driver's connection options.
    java_args: Vec<String>,
}

impl Env {
    /// One redis-server.
    pub async fn single() -> Env {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let java_args = vec!["--nodes".into(), format!("127.0.0.1:{}", server.port)];
        Env {
            nodes: vec![raw.clone()],
            raw,
            servers: Servers::Single(server),
            mode: PubSubMode::Classic,
            java_args,
        }
    }

    /// A cluster of three primaries (no replicas: replica acknowledgements are not what is
    /// tested here), both sides in pub/sub mode `mode`.
    pub async fn cluster(mode: PubSubMode) -> Env {
        let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3, 0))
            .await
            .unwrap();
        let raw = Builder::from_config(fred::prelude::Config::from_url(&cluster.url()).unwrap())
            .build()
            .unwrap();
        raw.init().await.unwrap();
        let mut nodes = Vec::new();
        for node in &cluster.nodes {
            nodes.push(node.raw().await);
        }
        let ports: Vec<String> = cluster
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let sharded = if mode == PubSubMode::Sharded {
            "on"
        } else {
            "off"
        };
        let java_args = vec![
            "--nodes".into(),
            ports.join(","),
            "--cluster".into(),
            "--sharded".into(),
            sharded.into(),
        ];
        Env {
            servers: Servers::Cluster(cluster),
            mode,
            raw,
            nodes,
            java_args,
        }
    }

    fn url(&self) -> String {
        match &self.servers {
            Servers::Single(server) => server.url(),
            Servers::Cluster(cluster) => cluster.url(),
        }
    }

    /// A redbaton client with the watchdog lease [`LEASE`].
    pub async fn rust(&self) -> Client {
        self.rust_with(LEASE).await
    }

    /// A redbaton client with the watchdog lease `lease`.
    pub async fn rust_with(&self, lease: Duration) -> Client {
        Client::builder()
            .url(self.url())
            .pubsub(self.mode)
            .watchdog_lease(lease)
            .connect()
            .await
            .unwrap()
    }

    /// A Java Redisson client whose `lockWatchdogTimeout` is [`LEASE`].
    pub async fn java(&self) -> Arc<Java> {
        self.java_with(LEASE).await
    }

    /// A Java Redisson client whose `lockWatchdogTimeout` is `lease`.
    pub async fn java_with(&self, lease: Duration) -> Arc<Java> {
        let java = Java::start(&self.java_args, lease).await;
        let expected = support::java_peer::redisson_version();
        assert_eq!(java.version, expected, "the driver runs another Redisson");
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| report(&format!("Java Redisson {} (interop/java)", java.version)));
        java
    }

    /// Script calls run so far, on every node.
    pub async fn scripts(&self) -> u64 {
        let mut sum = 0;
        for node in &self.nodes {
            sum += script_calls(node).await;
        }
        sum
    }

    /// Subscribers on every node of the channels that start with `prefix` (a fair lock's
    /// waiters each have a channel of their own under its prefix): classic, then sharded.
    pub async fn subscribers_by_kind(&self, prefix: &str) -> (i64, i64) {
        let pattern = format!("{}*", glob_escape(prefix));
        let mut sums = [0, 0];
        // A server without sharded pub/sub (Redis 6.2) has no shard subscribers to count.
        let sharded = support::servers::server()
            .lacks(support::servers::Feature::ShardedPubSub)
            .is_none();
        let kinds = [("CHANNELS", "NUMSUB"), ("SHARDCHANNELS", "SHARDNUMSUB")];
        for node in &self.nodes {
            for (sum, (list, count)) in sums.iter_mut().zip(kinds).take(1 + sharded as usize) {
                let channels: Vec<String> = node
                    .custom(
                        CustomCommand::new_static("PUBSUB", None, false),
                        vec![list, pattern.as_str()],
                    )
                    .await
                    .unwrap();
                for channel in channels {
                    let reply: Vec<Value> = node
                        .custom(
                            CustomCommand::new_static("PUBSUB", None, false),
                            vec![count, channel.as_str()],
                        )
                        .await
                        .unwrap();
                    *sum += reply.get(1).and_then(Value::as_i64).unwrap_or(0);
                }
            }
        }
        (sums[0], sums[1])
    }

    /// Subscribers of the channels under `prefix`, classic and sharded.
    pub async fn subscribers(&self, prefix: &str) -> i64 {
        let (classic, sharded) = self.subscribers_by_kind(prefix).await;
        classic + sharded
    }

    /// Waits until nobody listens on the channels under `prefix` (a waiter that acquired
    /// unsubscribes soon after), bounded at 15 s.
    pub async fn no_subscribers(&self, prefix: &str) {
        let none = eventually(Duration::from_secs(15), || async {
            self.subscribers(prefix).await == 0
        })
        .await;
        assert!(none, "{prefix}: still subscribed to after 15 s");
    }

    /// Waits (bounded at 20 s) until a waiter that started after the servers had run
    /// `scripts_before` scripts is parked on a channel under `prefix`, where nobody listened
    /// before: subscribed, and both of its attempts made (the first, and the one after the
    /// subscription was confirmed; Redisson and redbaton both re-try once subscribed). A
    /// release after this reaches it only by its message. Another client's renewal may count as
    /// one of the two attempts: that only makes a run weaker.
    pub async fn parked(&self, prefix: &str, scripts_before: u64) {
        let parked = eventually(Duration::from_secs(20), || async {
            self.subscribers(prefix).await >= 1 && self.scripts().await >= scripts_before + 2
        })
        .await;
        assert!(
            parked,
            "the waiter never parked on {prefix}: {} subscribers, {} scripts since it started",
            self.subscribers(prefix).await,
            self.scripts().await - scripts_before
        );
        // Both sides in the mode of the test: a waiter in the other one would never hear.
        let (classic, sharded) = self.subscribers_by_kind(prefix).await;
        let wrong = if self.mode == PubSubMode::Sharded {
            classic
        } else {
            sharded
        };
        assert_eq!(
            wrong, 0,
            "{prefix}: a waiter subscribed in the other pub/sub mode than {:?}",
            self.mode
        );
    }

    /// A lock's hash as field → count.
    pub async fn fields(&self, key: &str) -> std::collections::HashMap<String, String> {
        self.raw.hgetall(key).await.unwrap()
    }
}

/// `text` as a Redis glob pattern that matches it alone.
fn glob_escape(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}
