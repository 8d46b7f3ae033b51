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
mod replication;
mod run;
mod send;
pub(crate) mod server;
mod subscriber;
mod user;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use fred::error::{Error as FredError, ErrorKind};
use fred::interfaces::ClientLike;
use fred::types::config::{Options, Server};
use fred::types::scripts::Script;
use fred::types::{FromValue, Value};
use parking_lot::RwLock;

use crate::config::ReplicaSync;
use crate::error::{is_rewrite, is_unblocked};
use crate::Error;
pub(crate) use composite::Composite;
use group::Groups;
use replication::{follow_replicas, Replication};
use run::Run;
pub(crate) use subscriber::Subscriber;
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
    use fred::types::{ClusterHash, CustomCommand};

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
