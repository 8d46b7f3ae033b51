//! [`Conn`]: the command connection as lock kinds, guards and the watchdog see it — the fred
//! client, the command timeout, error mapping, replica sync, the two ways a Lua script is run,
//! and reads of a lock's keys.
//!
//! Every script is run by EVALSHA and reloaded transparently on NOSCRIPT (a restart, `SCRIPT
//! FLUSH` or a failover empties the server's cache; a NOSCRIPT reply means the script did not
//! run, so the retry can never apply a step twice). What a cluster refuses before running it
//! did not run either, and it is sent again the way Redis asks, scripts and reads alike, until
//! the command timeout has passed: after MOVED (a failover, a finished migration) to the
//! slot's new owner; after ASK (the slot is migrating and the keys have left) to the importing
//! node, behind `ASKING` on the same connection; after TRYAGAIN (the slot is migrating and
//! some of the keys have left) after a short pause. Beyond that, scripts come in two sorts:
//!
//! - **idempotent** ones (reads, renewals, force-unlock): bounded by the command timeout,
//!   also re-sent after a write fred refused, since running one twice changes nothing;
//! - **counted** ones (acquire, release): never re-sent blind. [`Conn::call`] gives the caller
//!   the round trip itself, with no timeout of fred's: a caller that stops waiting hands it to
//!   a task that awaits the real reply, so the outcome of every call that reached Redis is
//!   learnt. Only a connection that broke with the call in flight leaves it unknown
//!   ([`Failed::MaybeRan`]); the engine then settles the owner's count.
//!
//! Scripts that change a lock go out in groups ([`group`]): those issued while an
//! earlier group is in flight leave together. With replica sync (see [`ReplicaSync`]), a group
//! is followed by one `WAIT` back to back — the same connection, and on a cluster the node that
//! owns the keys' slot, since `WAIT` only counts the writes of the connection that sends it.
//! A group's scripts of one slot travel as one call of a [`Composite`] script.

mod composite;
mod group;
mod pubsub;
mod user;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Weak};
use std::time::Duration;

use tokio::time::Instant;

use fred::error::{Error as FredError, ErrorKind};
use fred::interfaces::{ClientLike, ClusterInterface};
use fred::types::config::{Options, Server};
use fred::types::scripts::Script;
use fred::types::{ClusterHash, CustomCommand, FromValue, InfoKind, Value};
use parking_lot::RwLock;

use crate::config::{ReplicaSync, AUTO_REPLICA_TIMEOUT};
use crate::error::{is_noscript, is_redirect, is_rewrite, is_tryagain, is_unblocked};
use crate::Error;
pub(crate) use composite::Composite;
use group::Groups;
pub(crate) use user::UserRedis;

/// A Lua script of the crate: its text, compiled into the binary, and its SHA1.
pub(crate) type LuaScript = LazyLock<Script>;

/// Defines a `static` [`LuaScript`] from a file under `lua/`.
///
/// The scripts declare real keys only; channels are arguments. While a cluster slot migrates,
/// Redis refuses (TRYAGAIN) a script whose declared keys are partly absent, and a channel never
/// exists as a key: declared, it held every release back until the migration ended. Publishing
/// to an undeclared channel is allowed (`PUBLISH` has no key; `SPUBLISH`'s channel is in the
/// key's slot, which the name rules ensure). Real keys stay declared, even where only a prefix
/// of theirs can be: a script that touches an undeclared key absent from a migrating node
/// fails half-way ("non local key").
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

/// The longest pause between two sends of a script the cluster refused (TRYAGAIN, or a
/// redirection whose target is not known yet).
const REFUSED_PAUSE_MAX: Duration = Duration::from_millis(200);

/// How often [`ReplicaSync::Auto`] re-reads how many replicas each primary has.
const REPLICA_SCAN: Duration = Duration::from_secs(1);

/// Why a counted call produced no usable reply.
#[derive(Debug)]
pub(crate) enum Failed {
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

/// Whether a counted call's write waits for the replicas' acknowledgement (where replica
/// sync asks for one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Replicas {
    /// Followed by `WAIT` where replica sync asks for it: what every call that counts does.
    Await,
    /// No `WAIT`: for a release that undoes an acquire which did not count. Nobody acts on
    /// that release's acknowledgement (the replicas get it in order with the acquire, or the
    /// acquire's lease ends it), and awaiting one would make a refusal cost a second
    /// acknowledgement timeout.
    Skip,
}

/// The round trip of a counted script: `'static`, so it can outlive its caller.
pub(crate) type Call = Pin<Box<dyn Future<Output = Result<Value, Failed>> + Send>>;

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
pub(crate) struct Wait {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
}

/// The command connection, shared by everything of one client.
pub(crate) struct Conn {
    redis: fred::clients::Client,
    clustered: bool,
    command_timeout: Duration,
    publish: &'static str,
    runtime: tokio::runtime::Handle,
    closed: AtomicBool,
    /// Shared with each counted call's `'static` round trip: one reference count per call.
    replication: Arc<Replication>,
    /// The group-commit write path of the scripts that change a lock.
    groups: Arc<Groups>,
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
    /// The `WAIT` a change of the keys in `slot` (`None`: not clustered) needs, if any; made
    /// on `asking` (the node importing the slot) when set, else on the slot's owner.
    fn wait_for(
        &self,
        redis: &fred::clients::Client,
        slot: Option<u16>,
        asking: Option<&Server>,
    ) -> Option<Wait> {
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
                let node = asking.cloned().or_else(|| {
                    slot.and_then(|slot| {
                        redis
                            .cached_cluster_state()
                            .and_then(|state| state.get_server(slot).cloned())
                    })
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
    /// replicas first and keeps following them. A group's scripts that `composite` holds
    /// travel in its calls.
    pub(crate) async fn start(
        redis: fred::clients::Client,
        command_timeout: Duration,
        publish: &'static str,
        sync: ReplicaSync,
        composite: &'static Composite,
    ) -> Arc<Conn> {
        let redis_clustered = redis.is_clustered();
        let runtime = tokio::runtime::Handle::current();
        let groups = Groups::new(redis.clone(), runtime.clone(), composite);
        let conn = Arc::new(Conn {
            clustered: redis_clustered,
            redis,
            command_timeout,
            publish,
            runtime,
            closed: AtomicBool::new(false),
            replication: Arc::new(Replication {
                sync,
                replicas: RwLock::new(HashMap::new()),
                any_replicas: AtomicBool::new(false),
            }),
            groups,
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

    /// Closes the connection (errors are the caller's to log).
    pub(crate) async fn quit(&self) -> Result<(), FredError> {
        self.redis.quit().await
    }

    /// Where the client connects, as its settings say, without asking a server: the database,
    /// the Sentinel service name (empty for other deployments), and `host:port` of every
    /// server its URL names (lower-case host).
    pub(crate) fn endpoints(&self) -> (u8, String, Vec<(String, u16)>) {
        use fred::types::config::ServerConfig;
        let config = self.redis.client_config();
        let endpoint = |s: &Server| (s.host.to_lowercase(), s.port);
        let (service, endpoints) = match &config.server {
            ServerConfig::Centralized { server } => (String::new(), vec![endpoint(server)]),
            ServerConfig::Clustered { hosts, .. } => {
                (String::new(), hosts.iter().map(endpoint).collect())
            }
            ServerConfig::Sentinel {
                hosts,
                service_name,
                ..
            } => (service_name.clone(), hosts.iter().map(endpoint).collect()),
            // Unix sockets (a fred feature redbaton does not enable): never matched.
            #[allow(unreachable_patterns)]
            _ => (String::new(), Vec::new()),
        };
        (config.database.unwrap_or(0), service, endpoints)
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

    /// Loads `scripts`, and the composite the groups use, on every primary, so first uses
    /// skip the NOSCRIPT round trip.
    pub(crate) async fn load(&self, scripts: &[&LuaScript]) -> Result<(), FredError> {
        for script in scripts {
            script.load(&self.redis).await?;
        }
        self.groups.composite().script.load(&self.redis).await
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

    /// Runs the read-only command `name` on `key` (then `args`): bounded by the command
    /// timeout, and sent again where the cluster refused it, as a script is.
    pub(crate) async fn read<R: FromValue>(
        &self,
        name: &'static str,
        key: &str,
        args: Vec<Value>,
    ) -> Result<R, FredError> {
        let mut command = Vec::with_capacity(1 + args.len());
        command.push(Value::from(key));
        command.extend(args);
        let run = Run {
            redis: &self.redis,
            replication: &self.replication,
            groups: &self.groups,
            name,
            script: None,
            command,
            slot: self.slot(&[key]),
            options: Options::default(),
            synced: false,
            idempotent: true,
            retry_for: self.command_timeout,
        };
        run.send().await?.reply.convert()
    }

    async fn eval_with(
        &self,
        script: &'static LuaScript,
        keys: &[&str],
        args: Vec<Value>,
        synced: bool,
    ) -> Result<(Value, Ack), FredError> {
        let run = Run {
            redis: &self.redis,
            replication: &self.replication,
            groups: &self.groups,
            name: "EVALSHA",
            script: Some(script),
            command: evalsha_args(script, keys, args),
            slot: self.slot(keys),
            options: Options::default(),
            synced,
            idempotent: true,
            retry_for: self.command_timeout,
        };
        let sent = run.send().await?;
        let ack = match (sent.wait, sent.waited) {
            (Some(wait), Some(Ok(acked))) if acked < wait.replicas => Ack::Short {
                acked,
                wanted: wait.replicas,
            },
            // A `WAIT` a failover unblocked learnt nothing: not acknowledged.
            (Some(wait), Some(Err(e))) if is_unblocked(&e) => Ack::Short {
                acked: 0,
                wanted: wait.replicas,
            },
            (Some(_), Some(Err(e))) => return Err(e),
            (Some(_), _) => Ack::Acked,
            (None, _) => Ack::NotAsked,
        };
        Ok((sent.reply, ack))
    }

    /// The round trip of a counted script, without a timeout: the caller bounds its wait and
    /// hands the call on if it stops waiting. Sent again only when Redis refused it before
    /// running it (NOSCRIPT, MOVED, ASK, TRYAGAIN; see the module's page), for up to a command
    /// timeout; never re-sent otherwise. Followed by `WAIT` where replica sync asks for it.
    pub(crate) fn call(&self, script: &'static LuaScript, keys: &[&str], args: Vec<Value>) -> Call {
        self.call_with(script, keys, args, Replicas::Await)
    }

    /// [`call`](Conn::call), followed by `WAIT` only if `replicas` says so.
    pub(crate) fn call_with(
        &self,
        script: &'static LuaScript,
        keys: &[&str],
        args: Vec<Value>,
        replicas: Replicas,
    ) -> Call {
        let command = evalsha_args(script, keys, args);
        // The slot, not the key, is what routing and `WAIT` need: no copy of the key is kept.
        let slot = self.slot(keys);
        let replication = self.replication.clone();
        let groups = self.groups.clone();
        let redis = self.redis.clone();
        let retry_for = self.command_timeout;
        let synced = replicas == Replicas::Await;
        Box::pin(async move {
            // No timeout of fred's: a timed-out command that was still queued would be
            // skipped, and one already written would have its reply thrown away; either way
            // its outcome would be lost. Waiting is the caller's to bound.
            let run = Run {
                redis: &redis,
                replication: &replication,
                groups: &groups,
                name: "EVALSHA",
                script: Some(script),
                command,
                slot,
                options: Options {
                    timeout: Some(Duration::ZERO),
                    ..Options::default()
                },
                synced,
                idempotent: false,
                retry_for,
            };
            let sent = run.send().await.map_err(classify)?;
            let Some(wait) = sent.wait else {
                return Ok(sent.reply);
            };
            let reply = sent.reply;
            match sent.waited {
                Some(Ok(acked)) if acked >= wait.replicas => Ok(reply),
                Some(Ok(acked)) => Err(Failed::Unreplicated {
                    reply,
                    acked,
                    wanted: wait.replicas,
                    wait_error: None,
                }),
                // A failover (or `CLIENT UNBLOCK`) ended the `WAIT`: nothing was learnt about
                // the replicas, so it counts as not acknowledged, like a `WAIT` that timed out.
                Some(Err(e)) if is_unblocked(&e) => {
                    tracing::debug!(error = %e, "WAIT unblocked after a lock script; not acknowledged");
                    Err(Failed::Unreplicated {
                        reply,
                        acked: 0,
                        wanted: wait.replicas,
                        wait_error: None,
                    })
                }
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
                    counts.insert(node, online_replicas(&info));
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

/// The replicas an `INFO replication` reply lists as `state=online`: those that can
/// acknowledge a `WAIT`. `connected_slaves` also counts replicas still in a full resync
/// (`wait_bgsave`, `send_bulk`), which acknowledge nothing until it ends — waiting for one
/// would refuse every acquire on a healthy primary meanwhile (as `min-replicas-to-write`, which
/// counts the same way, would not).
fn online_replicas(info: &str) -> u32 {
    let replica_line = |line: &&str| {
        line.strip_prefix("slave")
            .and_then(|rest| rest.split_once(':'))
            .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    let online = |line: &str| line.split(',').any(|field| field.trim() == "state=online");
    info.lines()
        .filter(replica_line)
        .filter(|l| online(l))
        .count() as u32
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

/// One command to run (a script's `EVALSHA`, or a read): everything its sends need.
struct Run<'a> {
    redis: &'a fred::clients::Client,
    replication: &'a Replication,
    /// Where a script that changes a lock goes (see `synced`).
    groups: &'a Arc<Groups>,
    /// `EVALSHA`, or the command read.
    name: &'static str,
    /// The script `EVALSHA` runs, reloaded on NOSCRIPT.
    script: Option<&'static LuaScript>,
    /// The command's arguments.
    command: Vec<Value>,
    slot: Option<u16>,
    options: Options,
    /// Whether a `WAIT` follows where replica sync asks for one: such a command changes a
    /// lock, and goes in a group (see [`group`]) unless it must follow `ASKING`.
    synced: bool,
    /// Whether a write fred refused (which may follow a run) may be sent again.
    idempotent: bool,
    /// How long refusals are answered by sending again.
    retry_for: Duration,
}

/// A command's reply, and its `WAIT`'s, if one was sent.
struct Sent {
    reply: Value,
    wait: Option<Wait>,
    waited: Option<Result<u32, FredError>>,
}

impl Run<'_> {
    /// Sends the command until Redis runs it, refuses it for good, or `retry_for` has passed.
    async fn send(&self) -> Result<Sent, FredError> {
        let give_up_at = Instant::now() + self.retry_for;
        let mut reloaded = false;
        let mut refusals = 0;
        // The node importing the slot, while Redis answers ASK.
        let mut asking: Option<Server> = None;
        loop {
            let wait = self
                .synced
                .then(|| {
                    self.replication
                        .wait_for(self.redis, self.slot, asking.as_ref())
                })
                .flatten();
            // An idempotent command's sends share its one command timeout (a counted call has
            // none of fred's: its caller bounds it).
            let options = if self.idempotent {
                Options {
                    timeout: Some(
                        give_up_at
                            .saturating_duration_since(Instant::now())
                            .max(Duration::from_millis(1)),
                    ),
                    ..self.options.clone()
                }
            } else {
                self.options.clone()
            };
            let (reply, waited) =
                if self.synced && asking.is_none() {
                    let grouped = self.groups.send(self.slot, self.command.clone(), wait);
                    match options.timeout.filter(|t| !t.is_zero()) {
                        // The group goes on without this caller: only its wait is bounded.
                        Some(timeout) => tokio::time::timeout(timeout, grouped)
                            .await
                            .unwrap_or_else(|_| {
                                let e = FredError::new(ErrorKind::Timeout, "Request timed out.");
                                (Err(e), None)
                            }),
                        None => grouped.await,
                    }
                } else {
                    send(
                        self.redis,
                        &options,
                        self.name,
                        self.slot,
                        self.command.clone(),
                        wait,
                        asking.as_ref(),
                    )
                    .await
                };
            let err = match reply {
                Ok(reply) => {
                    return Ok(Sent {
                        reply,
                        wait,
                        waited,
                    })
                }
                Err(err) => err,
            };
            if let Some(script) = self.script.filter(|_| is_noscript(&err) && !reloaded) {
                reloaded = true;
                tracing::debug!("script cache lost; loading the script again");
                crate::metrics::script_reloaded();
                // Boxed, as the redirection's look-up below: rare paths whose fred futures
                // would otherwise size every call's future (see `send`).
                Box::pin(script.load(self.redis)).await?;
                continue;
            }
            let redirected = is_redirect(&err);
            let refused = redirected || is_tryagain(&err) || (self.idempotent && is_rewrite(&err));
            if !refused || Instant::now() >= give_up_at {
                return Err(err);
            }
            refusals += 1;
            if redirected {
                // MOVED or ASK (fred tells neither apart, and re-read the slot map after
                // MOVED): the slot's owner says whether the slot is migrating, and where.
                let was_asking = asking.is_some();
                asking = match self.slot {
                    Some(slot) => Box::pin(importing_node(self.redis, slot)).await,
                    None => None,
                };
                tracing::debug!(
                    refusals,
                    ?asking,
                    "script redirected by the cluster; sending again"
                );
                if asking.is_some() && !was_asking {
                    // Where the keys went is known: no reason to wait.
                    continue;
                }
            } else {
                tracing::debug!(refusals, error = %err, "script refused before it ran; sending again");
            }
            // While a slot migrates or a failover settles, the nodes may disagree for a while:
            // sends spaced by a growing pause ride it out without flooding them.
            let pause = (Duration::from_millis(10) * 2u32.saturating_pow(refusals.min(8)))
                .min(REFUSED_PAUSE_MAX)
                .min(give_up_at.saturating_duration_since(Instant::now()));
            tokio::time::sleep(pause).await;
        }
    }
}

/// The node importing `slot`, when its owner (as fred routes it) says the slot is migrating
/// there; `None` when it is not migrating, or the node is not one fred routes to (a primary
/// serving no slot yet: the script is then sent again after a pause until the migration ends).
async fn importing_node(redis: &fred::clients::Client, slot: u16) -> Option<Server> {
    let nodes: String = redis
        .custom(
            CustomCommand::new_static("CLUSTER", ClusterHash::Custom(slot), false),
            vec!["NODES"],
        )
        .await
        .map_err(|e| tracing::debug!(error = %e, "CLUSTER NODES failed"))
        .ok()?;
    let target = migrating_to(&nodes, slot)?;
    let state = redis.cached_cluster_state()?;
    let server = state
        .slots()
        .iter()
        .find(|range| &*range.id == target)
        .map(|range| range.primary.clone());
    server
}

/// In `CLUSTER NODES` as its owner answers it, the id of the node `slot` migrates to: the
/// owner's own line carries `[<slot>->-<id>]`.
fn migrating_to(nodes: &str, slot: u16) -> Option<&str> {
    let myself = nodes.lines().find(|line| {
        line.split(' ')
            .nth(2)
            .is_some_and(|flags| flags.split(',').any(|f| f == "myself"))
    })?;
    let marker = format!("[{slot}->-");
    myself
        .split(' ')
        .find_map(|field| field.strip_prefix(marker.as_str())?.strip_suffix(']'))
}

/// Sends `name` (an EVALSHA, or a read) with `command` as its arguments and `options`, followed by `WAIT` when `wait` is set, back to
/// back on the same connection: the script's reply, and the number of replicas `WAIT`
/// reported. With `asking`, all go to that node after `ASKING`, in one pipeline so that no
/// other command can come between `ASKING` and the script.
///
/// Boxed: a fred command future is several KiB, and inline it would make every future that
/// may send alone (`Conn::call`'s, boxed per call) that large even when its script travels in
/// a group's task instead; under many concurrent calls that heap churn, freed and trimmed by
/// malloc and faulted in again, cost more CPU than the rest of the library.
pub(crate) fn send<'a>(
    redis: &'a fred::clients::Client,
    options: &'a Options,
    name: &'static str,
    slot: Option<u16>,
    command: Vec<Value>,
    wait: Option<Wait>,
    asking: Option<&'a Server>,
) -> Pin<Box<dyn Future<Output = group::Outcome> + Send + 'a>> {
    Box::pin(send_now(redis, options, name, slot, command, wait, asking))
}

/// [`send`]'s work.
async fn send_now(
    redis: &fred::clients::Client,
    options: &Options,
    name: &'static str,
    slot: Option<u16>,
    command: Vec<Value>,
    wait: Option<Wait>,
    asking: Option<&Server>,
) -> group::Outcome {
    // Any node when not clustered.
    let hash = slot.map_or(ClusterHash::Random, ClusterHash::Custom);
    let first = CustomCommand::new_static(name, hash.clone(), false);
    if let Some(node) = asking {
        let options = Options {
            cluster_node: Some(node.clone()),
            ..options.clone()
        };
        let pipeline = redis.pipeline();
        let queued = pipeline.with_options(&options);
        let asking_command = CustomCommand::new_static("ASKING", hash.clone(), false);
        let mut queue = vec![
            queued.custom::<(), Value>(asking_command, vec![]).await,
            queued.custom::<(), Value>(first, command).await,
        ];
        if let Some(wait) = wait {
            let (wait_command, wait_args) = wait_command(hash.clone(), wait);
            queue.push(queued.custom::<(), Value>(wait_command, wait_args).await);
        }
        if let Some(Err(e)) = queue.into_iter().find(Result::is_err) {
            return (Err(e), None);
        }
        let mut replies = pipeline.try_all::<Value>().await.into_iter();
        let reply = match (replies.next(), replies.next()) {
            (Some(Err(e)), _) => Err(e),
            (Some(Ok(_)), Some(reply)) => reply,
            _ => Err(FredError::new(
                ErrorKind::Protocol,
                "no reply to the script",
            )),
        };
        return (
            reply,
            wait.map(|_| {
                acked(replies.next().unwrap_or_else(|| {
                    Err(FredError::new(ErrorKind::Protocol, "no reply to WAIT"))
                }))
            }),
        );
    }
    let Some(wait) = wait else {
        let reply = redis
            .with_options(options)
            .custom::<Value, Value>(first, command)
            .await;
        return (reply, None);
    };
    let (wait_command, wait_args) = wait_command(hash, wait);
    // Both go to the router in this order (each future enqueues its command on its first
    // poll, and `join!` polls in order), so they share the node's connection back to back;
    // fred never re-sends either (one attempt), so `WAIT` cannot overtake the script.
    // Boxed: two fred command futures inline would double every send's box, WAIT or not.
    let client = redis.with_options(options);
    let (reply, waited) = Box::pin(async {
        tokio::join!(
            client.custom::<Value, Value>(first, command),
            client.custom::<Value, Value>(wait_command, wait_args),
        )
    })
    .await;
    (reply, Some(acked(waited)))
}

/// `WAIT` for `wait`, routed by `hash`.
pub(crate) fn wait_command(hash: ClusterHash, wait: Wait) -> (CustomCommand, Vec<Value>) {
    (
        CustomCommand::new_static("WAIT", hash, false),
        vec![
            Value::from(i64::from(wait.replicas)),
            Value::from(wait.timeout.as_millis() as i64),
        ],
    )
}

/// The number of replicas a `WAIT` reply reports.
pub(crate) fn acked(waited: Result<Value, FredError>) -> Result<u32, FredError> {
    waited.and_then(|v| {
        v.as_i64()
            .map(|n| n.max(0) as u32)
            .ok_or_else(|| FredError::new(ErrorKind::Parse, "WAIT replied no number"))
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_online_replicas_count() {
        let info = "# Replication\r\nrole:master\r\nconnected_slaves:3\r\n\
                    slave0:ip=127.0.0.1,port=7001,state=online,offset=42,lag=0\r\n\
                    slave1:ip=127.0.0.1,port=7002,state=wait_bgsave,offset=0,lag=0\r\n\
                    slave2:ip=127.0.0.1,port=7003,state=send_bulk,offset=0,lag=1\r\n\
                    slave_read_repl_offset:42\r\nmaster_repl_offset:42\r\n";
        assert_eq!(online_replicas(info), 1);
        assert_eq!(online_replicas("role:master\r\nconnected_slaves:0\r\n"), 0);
    }

    // Any script serves; one of the lock's own, so the test needs no module above this one.
    lua_script!(ACQUIRE, "lock/acquire.lua");

    /// Every counted call boxes its future, one per script sent, and under many concurrent
    /// calls their size is heap churn that malloc trims and faults in again: that future
    /// must not carry a fred command future inline (the send boxes its own, only while it
    /// sends), nor the `WAIT` pair's.
    #[tokio::test]
    async fn a_counted_call_carries_no_fred_command_inline() {
        let redis = fred::clients::Client::new(Default::default(), None, None, None);
        static COMPOSITE: LazyLock<Composite> = LazyLock::new(|| Composite::new(&[&ACQUIRE]));
        let conn = Conn::start(
            redis.clone(),
            Duration::from_secs(1),
            "PUBLISH",
            ReplicaSync::Off,
            &COMPOSITE,
        )
        .await;
        let call = conn.call(&ACQUIRE, &["k"], vec![Value::from(1)]);
        let command = CustomCommand::new_static("EVALSHA", ClusterHash::Random, false);
        let one = redis.custom::<Value, Value>(command, vec![]);
        assert!(
            std::mem::size_of_val(&*call) < std::mem::size_of_val(&one),
            "a counted call's future is {} bytes, one fred command's {}",
            std::mem::size_of_val(&*call),
            std::mem::size_of_val(&one)
        );
    }
}
