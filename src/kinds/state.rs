//! [`LockState`]: what Redis says about one lock right now (the tool's `status`).

use std::time::Duration;

use fred::interfaces::{ClientLike, ClusterInterface};
use fred::types::{ClusterHash, CustomCommand, Value};

use crate::conn::{lua_script, LuaScript};
use crate::kinds::Kind;
use crate::{Error, Lock, PubSubMode, Result};

lua_script!(STATE, "lock/state.lua");

/// Scripts of this module, loaded at connect.
pub(crate) static SCRIPTS: &[&LuaScript] = &[&STATE];

/// A lock's owners, remaining lease and waiting subscribers, read at one moment.
///
/// The owners and the lease are read atomically (one script); the subscriber count is read
/// right after, with `PUBSUB NUMSUB` (or `PUBSUB SHARDNUMSUB` in sharded mode).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockState {
    /// Each holder's owner field (`<client uuid>:<number>`) with its reentry count, sorted by
    /// field. Empty when the lock is free.
    pub owners: Vec<(String, u64)>,
    /// The lease left; `None` when the lock is free.
    pub ttl: Option<Duration>,
    /// How many subscriber connections listen on the lock's channel. A redbaton or Redisson
    /// process with waiters holds one subscription per lock, however many tasks wait in it.
    /// On a cluster with classic pub/sub a subscriber may sit on any node, so every primary
    /// is asked and the counts are added up; with sharded pub/sub the channel's shard is.
    pub subscribers: u64,
}

impl LockState {
    /// Whether anyone holds the lock.
    pub fn is_locked(&self) -> bool {
        !self.owners.is_empty()
    }

    /// The sum of all owners' reentry counts.
    pub fn hold_count(&self) -> u64 {
        self.owners.iter().map(|(_, n)| n).sum()
    }
}

impl Lock {
    /// Reads the lock's owners with their counts, its remaining lease and the number of
    /// subscriber connections on its channel.
    ///
    /// A key that is not a lock (another type, or a hash without an expiry) is refused with
    /// [`Error::WrongType`].
    ///
    /// ```no_run
    /// # async fn run(lock: redbaton::Lock) -> redbaton::Result<()> {
    /// let state = lock.state().await?;
    /// for (owner, count) in &state.owners {
    ///     println!("{owner} holds it {count} time(s); {:?} left", state.ttl);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn state(&self) -> Result<LockState> {
        let named = self.named();
        named.check()?;
        let conn = &named.client.conn;
        let reply: Vec<Value> = conn
            .eval(&STATE, &[&named.key], Vec::new())
            .await
            .map_err(|e| named.error(&e))?;
        let malformed = || Error::Redis(format!("unexpected state reply for {:?}", named.name()));
        let pttl = reply
            .first()
            .and_then(Value::as_i64)
            .ok_or_else(malformed)?;
        let mut owners = Vec::new();
        let ttl = if pttl == -2 {
            None
        } else {
            let Some(Value::Array(fields)) = reply.get(1) else {
                return Err(malformed());
            };
            for pair in fields.chunks(2) {
                let [field, count] = pair else {
                    return Err(malformed());
                };
                let field = field.as_string().ok_or_else(malformed)?;
                let count = count.as_i64().unwrap_or(0).max(0) as u64;
                owners.push((field, count));
            }
            owners.sort();
            Some(Duration::from_millis(pttl.max(0) as u64))
        };
        let subscribers = self.subscribers().await.map_err(|e| named.error(&e))?;
        Ok(LockState {
            owners,
            ttl,
            subscribers,
        })
    }

    /// Subscriber connections on the lock's channel, across the nodes that can hold them.
    async fn subscribers(&self) -> std::result::Result<u64, fred::error::Error> {
        let named = self.named();
        let redis = named.client.conn.redis();
        let channel = self.channel();
        let numsub = |command: &'static str, hash: ClusterHash| async move {
            let reply: Vec<Value> = redis
                .custom(
                    CustomCommand::new_static("PUBSUB", hash, false),
                    vec![command, channel],
                )
                .await?;
            Ok::<u64, fred::error::Error>(
                reply.get(1).and_then(Value::as_i64).unwrap_or(0).max(0) as u64
            )
        };
        match named.client.config.pubsub {
            PubSubMode::Sharded => {
                let slot = fred::util::redis_keyslot(channel.as_bytes());
                numsub("SHARDNUMSUB", ClusterHash::Custom(slot)).await
            }
            PubSubMode::Classic if redis.is_clustered() => {
                // A classic subscription lives on whichever node its connection chose.
                let nodes = redis
                    .cached_cluster_state()
                    .map(|state| state.unique_primary_nodes())
                    .unwrap_or_default();
                let mut total = 0;
                for node in nodes {
                    let reply: Vec<Value> = redis
                        .with_cluster_node(node)
                        .custom(
                            CustomCommand::new_static("PUBSUB", None, false),
                            vec!["NUMSUB", channel],
                        )
                        .await?;
                    total += reply.get(1).and_then(Value::as_i64).unwrap_or(0).max(0) as u64;
                }
                Ok(total)
            }
            PubSubMode::Classic => numsub("NUMSUB", ClusterHash::Random).await,
        }
    }
}
