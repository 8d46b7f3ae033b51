//! [`LockState`]: what Redis says about one lock right now (the tool's `status`).

use std::time::Duration;

use fred::interfaces::ClientLike;
use fred::types::{ClusterHash, CustomCommand, Value};

use crate::{Error, Lock, PubSubMode, Result};

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
        self.check()?;
        let shared = self.shared();
        let client = &shared.client;
        let reply = client
            .scripts
            .state(&client.redis, &shared.key)
            .await
            .map_err(|e| client.error(e, &shared.name))?;
        let malformed = || Error::Redis(format!("unexpected state reply for {:?}", shared.name));
        let pttl = reply
            .first()
            .and_then(Value::as_i64)
            .ok_or_else(malformed)?;
        let mut owners = Vec::new();
        let ttl = if pttl == -2 {
            None
        } else {
            let fields = reply.get(1).cloned().ok_or_else(malformed)?;
            let Value::Array(fields) = fields else {
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

        let (command, slot) = match client.config.pubsub {
            PubSubMode::Classic => ("NUMSUB", ClusterHash::Random),
            PubSubMode::Sharded => (
                "SHARDNUMSUB",
                ClusterHash::Custom(fred::util::redis_keyslot(shared.channel.as_bytes())),
            ),
        };
        let numsub: Vec<Value> = client
            .redis
            .custom(
                CustomCommand::new_static("PUBSUB", slot, false),
                vec![command, &*shared.channel],
            )
            .await
            .map_err(|e| client.error(e, &shared.name))?;
        let subscribers = numsub.get(1).and_then(Value::as_i64).unwrap_or(0).max(0) as u64;
        Ok(LockState {
            owners,
            ttl,
            subscribers,
        })
    }
}
