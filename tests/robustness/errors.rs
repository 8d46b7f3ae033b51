//! The fred 10.1 error texts redbaton's classification depends on (`src/error.rs`), each
//! provoked for real, both from a plain fred client configured like redbaton's and through the
//! public API. A fred upgrade that changes a text or the path that produces it fails here
//! instead of silently changing what redbaton re-sends.
//!
//! What fred 10.1 answers with `max_command_attempts = 1` (redbaton's setting):
//! - "Failed to route command." (`Unknown`): no connection to write on; never sent.
//! - "Too many failed write attempts." (`Unknown`): a command fred tried to write a second
//!   time — after a MOVED (did not run), but also one it moved from a broken connection into
//!   its retry buffer during a slot-map sync (may have run: see `tests/cluster/scripts_once.rs`).
//! - "Max attempts reached." (`Routing`): an ASK redirect; it also ends fred's router task,
//!   so the client never answers again.
//! - With `max_redirections = 0` both MOVED and ASK answer "Too many redirections."
//!   (`Routing`), the command did not run, and the client keeps working.

use testkit as support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use fred::types::config::TcpConfig;
use fred::types::scripts::Script;
use fred::types::{ClusterHash, CustomCommand};
use support::cluster::{cli, ProxyMode, RedisCluster};
use support::{eventually, RedisServer};

/// A fred builder set up as `src/client.rs` (`fred_builder`) sets up redbaton's: one write
/// attempt per command, a command timeout, and a reconnect policy. Keep the two in step; the
/// redirect tests below set `max_redirections` themselves.
fn like_redbaton(url: &str) -> Builder {
    let mut builder = Builder::from_config(Config::from_url(url).unwrap());
    builder
        .with_connection_config(|c| {
            c.connection_timeout = Duration::from_secs(5);
            c.internal_command_timeout = Duration::from_secs(5);
            c.max_command_attempts = 1;
            c.max_redirections = 0;
            c.tcp = TcpConfig {
                nodelay: Some(true),
                ..TcpConfig::default()
            };
        })
        .with_performance_config(|p| {
            p.default_command_timeout = Duration::from_secs(5);
            p.broadcast_channel_capacity = 4096;
        })
        .set_policy(ReconnectPolicy::new_exponential(0, 50, 300, 2));
    builder
}

/// [`like_redbaton`] with `redirections` allowed, whatever redbaton sets.
fn with_redirections(url: &str, redirections: u32) -> Builder {
    let mut builder = like_redbaton(url);
    builder.with_connection_config(|c| c.max_redirections = redirections);
    builder
}

async fn connected(builder: &Builder) -> fred::clients::Client {
    let client = builder.build().unwrap();
    client.init().await.unwrap();
    client
}

/// `(kind, text)` of an error, for assertions.
fn parts(e: &fred::error::Error) -> (ErrorKind, String) {
    (e.kind().clone(), e.details().to_owned())
}

fn slot(key: &str) -> u16 {
    fred::util::redis_keyslot(key.as_bytes())
}

/// Appends ARGV[1] to the list KEYS[1]: which calls ran is in the list.
const LOG_SCRIPT: &str = "redis.call('rpush', KEYS[1], ARGV[1]) return 1";

fn ran(port: u16, key: &str) -> Vec<String> {
    cli(port, &["lrange", key, "0", "-1"])
        .lines()
        .filter(|line| !line.is_empty())
        .map(str::to_owned)
        .collect()
}

// ---------------------------------------------------------------------------------------
// "Failed to route command."

/// Keeps 64 tasks sending commands on `client` and kills the server under them, until one
/// command meets fred between the dropped connection and the reconnection (bounded). Returns
/// every error seen.
async fn kill_under_load<T, F, Fut>(
    server: &mut RedisServer,
    send: F,
    done: impl Fn(&[T]) -> bool,
) -> Vec<T>
where
    T: Send + 'static,
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Option<T>> + Send,
{
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    // Up to 50 kills: under load the window between the dropped connection and the
    // reconnection is met less often (the loop ends at the first sighting).
    for round in 1..=50 {
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for _ in 0..64 {
            let (send, stop, seen) = (send.clone(), stop.clone(), seen.clone());
            tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::Acquire) {
                    if let Some(error) = send().await {
                        seen.lock().push(error);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        server.kill();
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.store(true, Ordering::Release);
        for task in tasks {
            tokio::time::timeout(Duration::from_secs(30), task)
                .await
                .expect("a sender hung")
                .unwrap();
        }
        server.restart();
        if done(&seen.lock()) {
            eprintln!("seen after {round} kill(s)");
            break;
        }
    }
    Arc::try_unwrap(seen).ok().unwrap().into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fred_fails_a_command_it_has_no_connection_for_with_failed_to_route() {
    let mut server = RedisServer::start();
    let client = connected(&like_redbaton(&server.url())).await;
    let sender = client.clone();
    let send = move || {
        let client = sender.clone();
        async move {
            let reply: Result<i64, fred::error::Error> = client.incr("n").await;
            reply.err().map(|e| parts(&e))
        }
    };
    let route_error = (ErrorKind::Unknown, "Failed to route command.".to_owned());
    let wanted = route_error.clone();
    let errors = kill_under_load(&mut server, send, move |seen| seen.contains(&wanted)).await;
    // redbaton matches this text (`error.rs`) to call the error a connection error.
    assert!(
        errors.contains(&route_error),
        "no command met fred without a connection: {:?}",
        errors
            .iter()
            .map(|(kind, text)| format!("{kind:?}: {text}"))
            .collect::<std::collections::BTreeSet<_>>()
    );
    let _ = client.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_calls_without_a_connection_fail_as_connection_errors() {
    let mut server = RedisServer::start();
    let client = redbaton::Client::builder()
        .url(server.url())
        .command_timeout(Duration::from_secs(2))
        .reconnect_max_delay(Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    let locker = client.clone();
    let send = move || {
        let client = locker.clone();
        async move {
            // Fresh names: each call is one run of the lock script, held or not.
            let name = format!("route:{}", fastrand::u64(..));
            // Half the calls are reads: the lock scripts go out in groups (one pipeline in
            // flight at a time), which seldom meet fred in the moment it has no connection;
            // a read is still sent alone, as every call was before.
            if fastrand::bool() {
                return client.lock(&name).is_locked().await.err();
            }
            match client.lock(&name).try_lock().await {
                Ok(Some(guard)) => {
                    drop(guard);
                    None
                }
                Ok(None) => None,
                Err(e) => Some(e),
            }
        }
    };
    let errors = kill_under_load(&mut server, send, |seen: &[redbaton::Error]| {
        seen.iter()
            .any(|e| e.to_string().contains("Failed to route command."))
    })
    .await;
    // Were fred's text to change, the error would fall through to `Error::Redis`.
    let wrong: Vec<_> = errors
        .iter()
        .filter(|e| {
            !matches!(
                e,
                redbaton::Error::Connection(_) | redbaton::Error::Timeout(_)
            )
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "{} not connection errors, e.g. {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(3)]
    );
    assert!(
        errors.iter().any(|e| matches!(e, redbaton::Error::Connection(m) if m.contains("Failed to route command."))),
        "no lock call met fred without a connection: {:?}",
        errors.iter().map(ToString::to_string).collect::<std::collections::BTreeSet<_>>()
    );
    client.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------------------
// Redirections: MOVED and ASK

/// A 3-primary cluster and the ports of two primaries: `from` serves `key`'s slot, `to`
/// does not.
fn cluster_with_a_slot_to_move(key: &str) -> (RedisCluster, u16, u16) {
    let cluster = RedisCluster::start(3, 0);
    let from = cluster.primary_for_slot(slot(key));
    let to = cluster
        .nodes
        .iter()
        .map(|n| n.port)
        .find(|p| *p != from)
        .unwrap();
    (cluster, from, to)
}

/// Moves `key`'s slot, with its keys when `keys` is not empty, from `from` to `to` in one go.
fn move_slot(cluster: &RedisCluster, key: &str, from: u16, to: u16, keys: &[&str]) {
    cluster.begin_migration(slot(key), from, to);
    if !keys.is_empty() {
        cluster.move_keys(slot(key), from, to);
    }
    cluster.finish_migration(slot(key), from, to);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fred_fails_a_moved_command_with_too_many_failed_write_attempts() {
    let key = "{moved}:log";
    let (cluster, from, to) = cluster_with_a_slot_to_move(key);
    let client = connected(&with_redirections(&cluster.url(), 5)).await;
    let script = Script::from_lua(LOG_SCRIPT);
    script.load(&client).await.unwrap();
    let _: i64 = script.evalsha(&client, key, "before").await.unwrap();
    move_slot(&cluster, key, from, to, &[key]);

    // The client's slot map is stale: the script goes to `from`, which answers MOVED.
    let moved: Result<i64, _> = script.evalsha(&client, key, "moved").await;
    assert_eq!(
        moved.map_err(|e| parts(&e)),
        Err((
            ErrorKind::Unknown,
            "Too many failed write attempts.".to_owned()
        ))
    );
    // fred re-read the slot map on the way: the next call reaches the new owner.
    let _: i64 = script.evalsha(&client, key, "after").await.unwrap();
    assert_eq!(
        ran(to, key),
        ["before", "after"],
        "the redirected call did not run"
    );
    let _ = client.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ask_ends_freds_router_when_one_write_attempt_is_allowed() {
    let key = "{ask}:log";
    let (cluster, from, to) = cluster_with_a_slot_to_move(key);
    let client = connected(&with_redirections(&cluster.url(), 5)).await;
    let script = Script::from_lua(LOG_SCRIPT);
    script.load(&client).await.unwrap();
    cluster.begin_migration(slot(key), from, to);

    // `from` does not have the key: it answers ASK. fred 10.1 (`process_ask`) sends ASKING
    // only while write attempts remain; with none left it fails the command — and returns
    // the error from its router task, which ends it.
    let asked: Result<i64, _> = script.evalsha(&client, key, "asked").await;
    assert_eq!(
        asked.map_err(|e| parts(&e)),
        Err((ErrorKind::Routing, "Max attempts reached.".to_owned()))
    );
    // Nothing routes commands any more, for any slot (they are cancelled or time out),
    // although the client still says it is connected.
    let other = "{elsewhere}:log";
    for attempt in ["later", "much later"] {
        let reply: Result<i64, _> = script.evalsha(&client, other, attempt).await;
        assert!(
            matches!(
                reply.as_ref().map_err(|e| e.kind().clone()),
                Err(ErrorKind::Canceled | ErrorKind::Timeout)
            ),
            "{attempt}: {reply:?}"
        );
    }
    assert_eq!(client.state(), ClientState::Connected);
    // The ASKed call did not run: finish the move and look on the slot's new owner.
    cluster.finish_migration(slot(key), from, to);
    assert!(ran(to, key).is_empty(), "{:?}", ran(to, key));
    // Not even the settled slot map brings it back.
    let reply: Result<i64, _> = script.evalsha(&client, key, "settled").await;
    assert!(reply.is_err(), "{reply:?}");
    let _ = client.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_redirections_allowed_moved_and_ask_fail_cleanly_and_did_not_run() {
    let key = "{zero}:log";
    let (cluster, from, to) = cluster_with_a_slot_to_move(key);
    let client = connected(&with_redirections(&cluster.url(), 0)).await;
    let script = Script::from_lua(LOG_SCRIPT);
    script.load(&client).await.unwrap();
    let _: i64 = script.evalsha(&client, key, "before").await.unwrap();
    let redirected = Err((ErrorKind::Routing, "Too many redirections.".to_owned()));

    cluster.begin_migration(slot(key), from, to);
    let missing = "{zero}:missing";
    let asked: Result<i64, _> = script.evalsha(&client, missing, "asked").await;
    assert_eq!(asked.map_err(|e| parts(&e)), redirected);
    // The router lives on.
    let _: i64 = script.evalsha(&client, key, "still").await.unwrap();

    cluster.move_keys(slot(key), from, to);
    cluster.finish_migration(slot(key), from, to);
    let moved: Result<i64, _> = script.evalsha(&client, key, "moved").await;
    assert_eq!(moved.map_err(|e| parts(&e)), redirected);
    let _: i64 = script.evalsha(&client, key, "after").await.unwrap();
    assert_eq!(ran(to, key), ["before", "still", "after"]);
    assert!(
        ran(to, missing).is_empty(),
        "the ASKed call ran: {:?}",
        ran(to, missing)
    );
    let _ = client.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_on_a_moved_slot_are_resent_to_its_new_owner() {
    let name = "moving:order";
    let (cluster, from, to) = cluster_with_a_slot_to_move(name);
    let holder = redbaton::Client::connect(&cluster.url()).await.unwrap();
    let taker = redbaton::Client::connect(&cluster.url()).await.unwrap();
    let held = holder.lock(name).lock().await.unwrap();
    let owner = held.owner().to_string();
    // Both clients keep their old slot map; the held lock moves with its slot.
    move_slot(&cluster, name, from, to, &[name]);
    assert_eq!(cli(to, &["hget", name, &owner]).trim(), "1");

    // A redirected lock script did not run: redbaton sends it again, to the new owner.
    assert!(
        taker.lock(name).try_lock().await.unwrap().is_none(),
        "still held, now on the new owner"
    );
    held.unlock().await.unwrap();
    assert_eq!(cli(to, &["exists", name]).trim(), "0");
    let other = "moving:{other}";
    let other_from = cluster.primary_for_slot(slot(other));
    let other_to = cluster
        .nodes
        .iter()
        .map(|n| n.port)
        .find(|p| *p != other_from)
        .unwrap();
    move_slot(&cluster, other, other_from, other_to, &[]);
    let guard = taker
        .lock(other)
        .try_lock()
        .await
        .unwrap()
        .expect("free, on its new owner");
    assert_eq!(
        cli(other_to, &["hget", other, &guard.owner().to_string()]).trim(),
        "1"
    );
    guard.unlock().await.unwrap();
    holder.shutdown().await.unwrap();
    taker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_on_a_migrating_slot_leaves_the_client_working() {
    let name = "migrating:order";
    let (cluster, from, to) = cluster_with_a_slot_to_move(name);
    let client = redbaton::Client::builder()
        .url(cluster.url())
        .command_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    cluster.begin_migration(slot(name), from, to);
    // `from` answers ASK: the lock is not there (nobody holds it). The call follows it to
    // `to`, behind `ASKING`.
    let guard = client.lock(name).try_lock().await.unwrap().expect("free");
    // Its release follows the same ASK and runs on `to` while the migration is open: its one
    // key is there (the channel is an argument, not a key).
    guard.unlock().await.unwrap();
    cluster.finish_migration(slot(name), from, to);
    let works = eventually(Duration::from_secs(10), || async {
        match client.lock("migrating:{unrelated}").try_lock().await {
            Ok(Some(guard)) => guard.unlock().await.is_ok(),
            _ => false,
        }
    })
    .await;
    assert!(works, "the client answers nothing after the ASK");
    let guard = client.lock(name).try_lock().await.unwrap().expect("free");
    guard.unlock().await.unwrap();
    client.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------------------
// "Too many failed write attempts." for a command that ran

/// fred 10.1 also answers "Too many failed write attempts." for a command that ran: one
/// in flight on a connection that a slot-map sync finds broken (`clustered::sync` →
/// `drop_broken_connections` → retry buffer → a second write, refused). The text alone thus
/// does not say "did not run". (The same race through redbaton: `tests/cluster/scripts_once.rs`,
/// `a_script_in_flight_when_a_cluster_resync_finds_its_connection_reset_runs_once`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fred_says_too_many_failed_write_attempts_for_a_script_that_ran() {
    if !support::servers::supports(support::servers::Feature::AnnouncedPortAtRunTime, None) {
        return;
    }
    let cluster = RedisCluster::start(3, 0);
    let proxies = cluster.announce_proxies().await;
    let proxy = |port: u16| proxies.iter().find(|p| p.port == port).unwrap();
    let key = "{resync}:log";
    let b = proxy(cluster.primary_for_slot(slot(key)));
    let a = proxies.iter().find(|p| p.port != b.port).unwrap();
    let c = proxies
        .iter()
        .find(|p| p.port != b.port && p.port != a.port)
        .unwrap();
    let on = |port: u16, prefix: &str| {
        (0..)
            .map(|i| format!("{{{prefix}{i}}}"))
            .find(|k| cluster.primary_for_slot(slot(k)) == port)
            .unwrap()
    };
    let key_on_a = on(a.port, "a");
    let slot_on_c = slot(&on(c.port, "c"));
    // A is the only seed node: fred asks A for the slot map.
    let client = connected(&like_redbaton(&format!(
        "redis-cluster://127.0.0.1:{}",
        a.port
    )))
    .await;
    let script = Script::from_lua(LOG_SCRIPT);
    script.load(&client).await.unwrap();
    let _: i64 = script.evalsha(&client, key, "before").await.unwrap();

    // The script runs on B; its reply is lost.
    b.set(ProxyMode::DropReplies);
    let (sender, sha) = (client.clone(), script.sha1().clone());
    let in_flight = tokio::spawn(async move {
        let reply: Result<i64, fred::error::Error> = sender.evalsha(sha, key, "once").await;
        reply
    });
    assert!(
        eventually(Duration::from_secs(10), || async {
            ran(b.node_port, key).len() == 2
        })
        .await,
        "the script ran on B"
    );
    // A MOVED from C makes fred sync its slot map; A holds the answer back.
    a.set(ProxyMode::HoldRequests);
    let seen = a.connections();
    let redis = client.clone();
    let moved = tokio::spawn(async move {
        let get = CustomCommand::new_static("GET", ClusterHash::Custom(slot_on_c), false);
        let reply: Result<Value, fred::error::Error> = redis.custom(get, vec![key_on_a]).await;
        reply
    });
    // fred opens a new connection to A for the slot map; A's proxy holds the request.
    let syncing = eventually(Duration::from_secs(10), || async { a.connections() > seen }).await;
    assert!(syncing, "fred asks A for the slot map");
    // B's connection is reset meanwhile; then the slot map arrives.
    b.set(ProxyMode::Open);
    b.reset().await;
    assert!(
        !moved.is_finished(),
        "the sync still waits for the slot map"
    );
    a.set(ProxyMode::Open);

    let reply = tokio::time::timeout(Duration::from_secs(20), in_flight)
        .await
        .expect("the call ends")
        .unwrap();
    assert_eq!(
        reply.map_err(|e| parts(&e)),
        Err((
            ErrorKind::Unknown,
            "Too many failed write attempts.".to_owned()
        ))
    );
    assert_eq!(ran(b.node_port, key), ["before", "once"], "and yet it ran");
    let moved = tokio::time::timeout(Duration::from_secs(20), moved)
        .await
        .expect("the GET ends")
        .unwrap();
    // Redirected; its text depends on `max_redirections` (see above).
    assert!(moved.is_err(), "{moved:?}");
    let _ = client.quit().await;
}

// ---------------------------------------------------------------------------------------
// A `WAIT` the server ends early

/// A `WAIT` ended by the server (a failover demoting the primary answers it with `UNBLOCKED
/// force unblock…`; `CLIENT UNBLOCK … ERROR` gives the same `UNBLOCKED` error on a lone
/// server) counts as unacknowledged, as one that timed out: the acquire is undone and retried
/// within its wait, never a hard `Error::Redis`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unblocked_wait_counts_as_unacknowledged() {
    let server = RedisServer::start();
    let client = redbaton::Client::builder()
        .url(server.url())
        .replica_sync(redbaton::ReplicaSync::Replicas {
            min: 1,
            timeout: Duration::from_secs(20),
        })
        .command_timeout(Duration::from_secs(30))
        .connect()
        .await
        .unwrap();
    let lock = client.lock("unblocked");
    let acquiring = tokio::spawn(async move { lock.try_lock_for(Duration::from_secs(3)).await });
    // Every `WAIT` the lock sends (no replica will ever acknowledge) is ended by the server.
    let port = server.port;
    let mut unblocked = 0;
    while !acquiring.is_finished() {
        let clients = support::cluster::cli(port, &["client", "list"]);
        for id in clients
            .lines()
            .filter(|l| l.contains("cmd=wait"))
            .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
        {
            if cli(port, &["client", "unblock", id, "error"]).trim() == "1" {
                unblocked += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let outcome = acquiring.await.unwrap();
    assert!(unblocked >= 1, "no WAIT was unblocked ({outcome:?})");
    assert!(
        matches!(
            outcome,
            Ok(None) | Err(redbaton::Error::NotReplicated { .. } | redbaton::Error::Timeout(_))
        ),
        "{outcome:?}"
    );
    // The unacknowledged acquires were undone.
    assert!(
        eventually(Duration::from_secs(10), || async {
            cli(port, &["exists", "unblocked"]).trim() == "0"
        })
        .await,
        "an unacknowledged acquire was left held"
    );
    client.shutdown().await.unwrap();
}

/// A refused connection is told in words, with the URL, not as fred's debug text of the I/O
/// error (`IO: Os { code: 111, kind: ConnectionRefused, … }`).
#[tokio::test]
async fn a_refused_connection_reads_as_a_sentence() {
    // A port nobody listens on: bound, then let go.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://127.0.0.1:{port}");
    let err = redbaton::Client::connect(&url).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("connection error: {url}: connection refused"),
        "{err:?}"
    );
}
