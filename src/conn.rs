//! [`Conn`]: the command connection as lock kinds, guards and the watchdog see it — the fred
//! client, the command timeout, error mapping, replica sync, and the two ways a Lua script is
//! run.
//!
//! Every script is run by EVALSHA and reloaded transparently on NOSCRIPT (a restart, `SCRIPT
//! FLUSH` or a failover empties the server's cache; a NOSCRIPT reply means the script did not
//! run, so the retry can never apply a step twice). A cluster redirection (MOVED, ASK) also
//! means it did not run, and it is re-sent to the slot's new owner. Beyond that, scripts come
//! in two sorts:
//!
//! - **idempotent** ones (reads, renewals, force-unlock): bounded by the command timeout,
//!   re-sent after any redirection, since running one twice changes nothing;
//! - **counted** ones (acquire, release): never re-sent blind. [`Conn::call`] gives the caller
//!   the round trip itself, with no timeout of fred's: a caller that stops waiting hands it to
//!   a task that awaits the real reply, so the outcome of every call that reached Redis is
//!   learnt. Only a connection that broke with the call in flight leaves it unknown
//!   ([`Failed::MaybeRan`]); the engine then settles the owner's count.
//!
//! With replica sync (see [`ReplicaSync`]), a script that changes a lock is followed by `WAIT`
//! in the same pipeline — one round trip, the same connection, and on a cluster the node that
//! owns the key's slot, since `WAIT` only counts the writes of the connection that sends it.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Weak};
use std::time::Duration;

use fred::error::{Error as FredError, ErrorKind};
use fred::interfaces::{ClientLike, ClusterInterface};
use fred::types::config::{Options, Server};
use fred::types::scripts::Script;
use fred::types::{ClusterHash, CustomCommand, FromValue, InfoKind, Value};
use parking_lot::RwLock;

use crate::config::{ReplicaSync, AUTO_REPLICA_TIMEOUT};
use crate::error::{is_noscript, is_redirect, is_rewrite};
use crate::Error;

/// A Lua script of the crate: its text, compiled into the binary, and its SHA1.
pub(crate) type LuaScript = LazyLock<Script>;

/// Defines a `static` [`LuaScript`] from a file under `lua/`.
macro_rules! lua_script {
    ($name:ident, $path:literal) => {
        pub(crate) static $name: $crate::conn::LuaScript = std::sync::LazyLock::new(|| {
            fred::types::scripts::Script::from_lua(include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/lua/",
                $path
            )))
        });
    };
}
pub(crate) use lua_script;

/// How often a script redirected by the cluster is re-sent.
const REDIRECT_RESENDS: u32 = 3;

/// How often [`ReplicaSync::Auto`] re-reads how many replicas each primary has.
const REPLICA_SCAN: Duration = Duration::from_secs(1);

/// Why a counted call produced no usable reply.
#[derive(Debug)]
pub enum Failed {
    /// The script certainly did not run: the server refused it before running it (an error
    /// reply), or it was never sent.
    NotRun(FredError),
    /// The connection broke (or fred refused a second write) with the call in flight: the
    /// script may have run.
    MaybeRan(FredError),
    /// The script ran on the primary, but fewer replicas than required acknowledged it.
    Unreplicated {
        /// The script's reply.
        reply: Value,
        /// Replicas that acknowledged.
        acked: u32,
        /// Replicas required.
        wanted: u32,
        /// `WAIT` itself failed (an ACL refusing it, say).
        wait_error: Option<FredError>,
    },
}

impl Failed {
    /// The error to report for this failure on the lock `name`.
    pub(crate) fn to_error(&self, conn: &Conn, name: &str) -> Error {
        match self {
            Failed::NotRun(e) | Failed::MaybeRan(e) => conn.error(e, name),
            Failed::Unreplicated {
                wait_error: Some(e),
                ..
            } => conn.error(e, name),
            Failed::Unreplicated { acked, wanted, .. } => Error::NotReplicated {
                acked: *acked,
                wanted: *wanted,
            },
        }
    }
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failed::NotRun(e) => write!(f, "not run: {e}"),
            Failed::MaybeRan(e) => write!(f, "outcome unknown: {e}"),
            Failed::Unreplicated {
                acked,
                wanted,
                wait_error,
                ..
            } => match wait_error {
                Some(e) => write!(f, "WAIT failed: {e}"),
                None => write!(f, "{acked} of {wanted} replica(s) acknowledged"),
            },
        }
    }
}

/// The round trip of a counted script: `'static`, so it can outlive its caller.
pub type Call = Pin<Box<dyn Future<Output = Result<Value, Failed>> + Send>>;

/// What an idempotent script's `WAIT` said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ack {
    /// No `WAIT` was needed.
    NotAsked,
    /// Enough replicas acknowledged.
    Acked,
    /// Fewer than `wanted` did.
    Short { acked: u32, wanted: u32 },
}

impl Ack {
    /// `Err(NotReplicated)` when too few replicas acknowledged.
    pub(crate) fn check(self) -> Result<(), Error> {
        match self {
            Ack::Short { acked, wanted } => Err(Error::NotReplicated { acked, wanted }),
            _ => Ok(()),
        }
    }
}

/// How many replicas to wait for, for how long.
#[derive(Clone, Copy)]
struct Wait {
    replicas: u32,
    timeout: Duration,
}

/// The command connection, shared by everything of one client.
pub struct Conn {
    redis: fred::clients::Client,
    clustered: bool,
    command_timeout: Duration,
    publish: &'static str,
    runtime: tokio::runtime::Handle,
    closed: AtomicBool,
    /// Shared with each counted call's `'static` round trip: one reference count per call.
    replication: Arc<Replication>,
}

/// What `WAIT`, if any, follows a script that changes a lock. Decided again for every send:
/// after a redirection or a failover the slot's primary, and so its replicas, may differ.
struct Replication {
    sync: ReplicaSync,
    /// Connected replicas per primary ([`ReplicaSync::Auto`]); `None` is the one node of a
    /// client that is not clustered.
    replicas: RwLock<HashMap<Option<Server>, u32>>,
    /// Whether any primary in `replicas` has a replica: when none has, [`ReplicaSync::Auto`]
    /// costs one atomic load per call (no lock, no slot lookup).
    any_replicas: AtomicBool,
}

impl Replication {
    /// The `WAIT` a change of the keys in `slot` (`None`: not clustered) needs, if any.
    fn wait_for(&self, redis: &fred::clients::Client, slot: Option<u16>) -> Option<Wait> {
        match self.sync {
            ReplicaSync::Off => None,
            ReplicaSync::Replicas { min, timeout } => Some(Wait {
                replicas: min,
                timeout,
            }),
            ReplicaSync::Auto => {
                if !self.any_replicas.load(Ordering::Acquire) {
                    return None;
                }
                let node = slot.and_then(|slot| {
                    redis
                        .cached_cluster_state()
                        .and_then(|state| state.get_server(slot).cloned())
                });
                // A primary not counted yet (just promoted) is taken as having none until the
                // next count: `Auto` never blocks a connection on a replica it has not seen.
                let connected = self.replicas.read().get(&node).copied().unwrap_or(0);
                (connected > 0).then_some(Wait {
                    replicas: 1,
                    timeout: AUTO_REPLICA_TIMEOUT,
                })
            }
        }
    }
}

impl Conn {
    /// A connection over `redis`; with [`ReplicaSync::Auto`] it learns the primaries'
    /// replicas first and keeps following them.
    pub(crate) async fn start(
        redis: fred::clients::Client,
        command_timeout: Duration,
        publish: &'static str,
        sync: ReplicaSync,
    ) -> Arc<Conn> {
        let redis_clustered = redis.is_clustered();
        let conn = Arc::new(Conn {
            clustered: redis_clustered,
            redis,
            command_timeout,
            publish,
            runtime: tokio::runtime::Handle::current(),
            closed: AtomicBool::new(false),
            replication: Arc::new(Replication {
                sync,
                replicas: RwLock::new(HashMap::new()),
                any_replicas: AtomicBool::new(false),
            }),
        });
        if conn.replication.sync == ReplicaSync::Auto {
            conn.count_replicas().await;
            tokio::spawn(follow_replicas(Arc::downgrade(&conn)));
        }
        conn
    }

    /// The fred client.
    pub(crate) fn redis(&self) -> &fred::clients::Client {
        &self.redis
    }

    /// The longest one round trip may take.
    pub(crate) fn command_timeout(&self) -> Duration {
        self.command_timeout
    }

    /// The runtime the client was made in (drop handlers spawn their clean-up there).
    pub(crate) fn runtime(&self) -> &tokio::runtime::Handle {
        &self.runtime
    }

    /// Whether the client was shut down: it takes no new work.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Marks the client shut down; `true` if it was not already.
    pub(crate) fn close(&self) -> bool {
        !self.closed.swap(true, Ordering::AcqRel)
    }

    /// `PUBLISH` or `SPUBLISH`, as the client's pub/sub mode wants.
    pub(crate) fn publish_command(&self) -> &'static str {
        self.publish
    }

    /// Whether the server is a cluster.
    pub(crate) fn is_clustered(&self) -> bool {
        self.clustered
    }

    /// Maps a fred error met on the lock `name`.
    pub(crate) fn error(&self, err: &FredError, name: &str) -> Error {
        Error::from_redis(err, name, self.command_timeout)
    }

    /// Loads `scripts` on every primary, so first uses skip the NOSCRIPT round trip.
    pub(crate) async fn load(&self, scripts: &[&LuaScript]) -> Result<(), FredError> {
        for script in scripts {
            script.load(&self.redis).await?;
        }
        Ok(())
    }

    /// Runs a read-only script: bounded by the command timeout, reloaded on NOSCRIPT and
    /// re-sent after a cluster redirection.
    pub(crate) async fn eval<R: FromValue>(
        &self,
        script: &'static LuaScript,
        keys: &[&str],
        args: Vec<Value>,
    ) -> Result<R, FredError> {
        self.eval_with(script, keys, args, false).await?.0.convert()
    }

    /// Runs an idempotent script that changes a lock, followed by `WAIT` where replica sync
    /// asks for it: the reply, and whether the replicas acknowledged it.
    pub(crate) async fn eval_synced<R: FromValue>(
        &self,
        script: &'static LuaScript,
        keys: &[&str],
        args: Vec<Value>,
    ) -> Result<(R, Ack), FredError> {
        let (reply, ack) = self.eval_with(script, keys, args, true).await?;
        Ok((reply.convert()?, ack))
    }

    async fn eval_with(
        &self,
        script: &'static LuaScript,
        keys: &[&str],
        args: Vec<Value>,
        synced: bool,
    ) -> Result<(Value, Ack), FredError> {
        let command = evalsha_args(script, keys, args);
        let slot = self.slot(keys);
        let hash = route(slot);
        let mut reloaded = false;
        let mut resends = 0;
        loop {
            let timed = Options::default();
            let wait = synced
                .then(|| self.replication.wait_for(&self.redis, slot))
                .flatten();
            let (reply, waited) = send(&self.redis, &timed, &hash, command.clone(), wait).await;
            match reply {
                Err(e) if is_noscript(&e) && !reloaded => {
                    reloaded = true;
                    tracing::debug!("script cache lost; loading the script again");
                    crate::metrics::script_reloaded();
                    script.load(&self.redis).await?;
                }
                Err(e) if (is_redirect(&e) || is_rewrite(&e)) && resends < REDIRECT_RESENDS => {
                    resends += 1;
                    redirect_pause(resends).await;
                }
                Err(e) => return Err(e),
                Ok(reply) => {
                    let ack = match (wait, waited) {
                        (Some(wait), Some(Ok(acked))) if acked < wait.replicas => Ack::Short {
                            acked,
                            wanted: wait.replicas,
                        },
                        (Some(_), Some(Err(e))) => return Err(e),
                        (Some(_), _) => Ack::Acked,
                        (None, _) => Ack::NotAsked,
                    };
                    return Ok((reply, ack));
                }
            }
        }
    }

    /// The round trip of a counted script, without a timeout: the caller bounds its wait and
    /// hands the call on if it stops waiting. Reloaded on NOSCRIPT and re-sent after a
    /// redirection (neither ran); never re-sent otherwise. Followed by `WAIT` where replica
    /// sync asks for it.
    pub(crate) fn call(&self, script: &'static LuaScript, keys: &[&str], args: Vec<Value>) -> Call {
        let command = evalsha_args(script, keys, args);
        // The slot, not the key, is what routing and `WAIT` need: no copy of the key is kept.
        let slot = self.slot(keys);
        let hash = route(slot);
        let replication = self.replication.clone();
        // No timeout of fred's: a timed-out command that was still queued would be skipped,
        // and one already written would have its reply thrown away; either way its outcome
        // would be lost. Waiting is the caller's to bound.
        let redis = self.redis.clone();
        Box::pin(async move {
            let untimed = Options {
                timeout: Some(Duration::ZERO),
                ..Options::default()
            };
            let mut reloaded = false;
            let mut resends = 0;
            loop {
                let wait = replication.wait_for(&redis, slot);
                let (reply, waited) = send(&redis, &untimed, &hash, command.clone(), wait).await;
                match reply {
                    Err(e) if is_noscript(&e) && !reloaded => {
                        reloaded = true;
                        tracing::debug!("script cache lost; loading the script again");
                        crate::metrics::script_reloaded();
                        script.load(&redis).await.map_err(classify)?;
                    }
                    // Redirected, so not run: the slot's new owner gets it.
                    Err(e) if is_redirect(&e) && resends < REDIRECT_RESENDS => {
                        resends += 1;
                        redirect_pause(resends).await;
                    }
                    Err(e) => return Err(classify(e)),
                    Ok(reply) => {
                        let Some(wait) = wait else { return Ok(reply) };
                        return match waited {
                            Some(Ok(acked)) if acked >= wait.replicas => Ok(reply),
                            Some(Ok(acked)) => Err(Failed::Unreplicated {
                                reply,
                                acked,
                                wanted: wait.replicas,
                                wait_error: None,
                            }),
                            Some(Err(e)) => {
                                tracing::warn!(error = %e, "WAIT failed after a lock script; it does not count as replicated");
                                Err(Failed::Unreplicated {
                                    reply,
                                    acked: 0,
                                    wanted: wait.replicas,
                                    wait_error: Some(e),
                                })
                            }
                            None => Err(Failed::Unreplicated {
                                reply,
                                acked: 0,
                                wanted: wait.replicas,
                                wait_error: None,
                            }),
                        };
                    }
                }
            }
        })
    }

    /// The cluster slot of a command on `keys` (its first key's); `None` when not clustered.
    fn slot(&self, keys: &[&str]) -> Option<u16> {
        match keys.first() {
            Some(key) if self.clustered => Some(fred::util::redis_keyslot(key.as_bytes())),
            _ => None,
        }
    }

    /// Re-reads how many replicas each primary has (`INFO replication`).
    async fn count_replicas(&self) {
        let nodes: Vec<Option<Server>> = if self.clustered {
            self.redis
                .cached_cluster_state()
                .map(|state| state.unique_primary_nodes().into_iter().map(Some).collect())
                .unwrap_or_default()
        } else {
            vec![None]
        };
        let connected = self.redis.active_connections();
        let mut counts = HashMap::with_capacity(nodes.len());
        for node in nodes {
            // Only primaries fred is connected to: a command addressed to a node it has no
            // connection to (killed, not yet dropped from its slot map) makes fred restart
            // every connection of the client. A node not asked keeps its last count.
            if let Some(server) = node.as_ref().filter(|n| !connected.contains(n)) {
                tracing::trace!(?server, "not connected: its replica count stays as it was");
                if let Some(known) = self.replication.replicas.read().get(&node) {
                    counts.insert(node, *known);
                }
                continue;
            }
            let info = match &node {
                Some(server) => {
                    self.redis
                        .with_cluster_node(server.clone())
                        .info::<String>(Some(InfoKind::Replication))
                        .await
                }
                None => self.redis.info::<String>(Some(InfoKind::Replication)).await,
            };
            match info {
                Ok(info) => {
                    let connected = info
                        .lines()
                        .find_map(|l| l.strip_prefix("connected_slaves:"))
                        .and_then(|n| n.trim().parse().ok())
                        .unwrap_or(0);
                    counts.insert(node, connected);
                }
                Err(e) => {
                    // Keep what was known: a node that is briefly away keeps its replicas.
                    tracing::debug!(?node, error = %e, "could not read the replication state");
                    if let Some(known) = self.replication.replicas.read().get(&node) {
                        counts.insert(node, *known);
                    }
                }
            }
        }
        let any = counts.values().any(|&n| n > 0);
        *self.replication.replicas.write() = counts;
        self.replication.any_replicas.store(any, Ordering::Release);
    }
}

/// Keeps [`Conn::replicas`] current while the connection lives.
async fn follow_replicas(conn: Weak<Conn>) {
    loop {
        tokio::time::sleep(REPLICA_SCAN).await;
        let Some(conn) = conn.upgrade() else { break };
        if conn.is_closed() {
            break;
        }
        conn.count_replicas().await;
    }
}

/// Sends `command` (an EVALSHA) with `options`, followed by `WAIT` when
/// `wait` is set, back to back on the same connection: the script's reply, and the number of
/// replicas `WAIT` reported.
async fn send(
    redis: &fred::clients::Client,
    options: &Options,
    hash: &ClusterHash,
    command: Vec<Value>,
    wait: Option<Wait>,
) -> (Result<Value, FredError>, Option<Result<u32, FredError>>) {
    let evalsha = CustomCommand::new_static("EVALSHA", hash.clone(), false);
    let Some(wait) = wait else {
        let reply = redis
            .with_options(options)
            .custom::<Value, Value>(evalsha, command)
            .await;
        return (reply, None);
    };
    let wait_args = vec![
        Value::from(i64::from(wait.replicas)),
        Value::from(wait.timeout.as_millis() as i64),
    ];
    let wait_command = CustomCommand::new_static("WAIT", hash.clone(), false);
    // Both go to the router in this order (each future enqueues its command on its first
    // poll, and `join!` polls in order), so they share the node's connection back to back;
    // fred never re-sends either (one attempt), so `WAIT` cannot overtake the script.
    let client = redis.with_options(options);
    let (reply, waited) = tokio::join!(
        client.custom::<Value, Value>(evalsha, command),
        client.custom::<Value, Value>(wait_command, wait_args),
    );
    let acked = Some(waited.and_then(|v| {
        v.as_i64()
            .map(|n| n.max(0) as u32)
            .ok_or_else(|| FredError::new(ErrorKind::Parse, "WAIT replied no number"))
    }));
    (reply, acked)
}

/// Where a command in `slot` goes (any node when not clustered).
fn route(slot: Option<u16>) -> ClusterHash {
    slot.map_or(ClusterHash::Random, ClusterHash::Custom)
}

/// Before re-sending a redirected script: while a failover settles, the nodes may briefly
/// disagree about a slot's owner; a few re-sends, spaced a little, ride that out.
async fn redirect_pause(resends: u32) {
    tracing::debug!(resends, "script redirected by the cluster; re-sending");
    if resends > 1 {
        tokio::time::sleep(Duration::from_millis(50 * u64::from(resends))).await;
    }
}

/// `EVALSHA sha numkeys key... arg...` as arguments.
fn evalsha_args(script: &LuaScript, keys: &[&str], args: Vec<Value>) -> Vec<Value> {
    let mut command = Vec::with_capacity(2 + keys.len() + args.len());
    command.push(Value::from(script.sha1().clone()));
    command.push(Value::from(keys.len() as i64));
    command.extend(keys.iter().map(|k| Value::from(*k)));
    command.extend(args);
    command
}

/// Sorts a counted call's error by whether the script may have run.
fn classify(err: FredError) -> Failed {
    // A second write fred refused may follow a run (see `is_rewrite`).
    let maybe = is_rewrite(&err)
        || matches!(
            err.kind(),
            ErrorKind::IO | ErrorKind::Canceled | ErrorKind::Timeout | ErrorKind::Protocol
        );
    if maybe {
        Failed::MaybeRan(err)
    } else {
        Failed::NotRun(err)
    }
}
