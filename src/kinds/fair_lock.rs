//! [`FairLock`]: Redisson's `RFairLock` — the reentrant lock, served first come, first served.

use std::sync::Arc;
use std::time::Duration;

use fred::types::Value;

use crate::conn::{lua_script, Ack, Call, Conn, LuaScript, Replicas};
use crate::engine::client_inner::ClientInner;
use crate::engine::holds::{HoldOps, Renewal};
use crate::engine::hub::Wake;
use crate::kinds::lock::{hash_lock_methods, HashLock, RENEW, UNLOCK_MESSAGE};
use crate::kinds::{acquire_methods, decode_counted, prefix_name, Hooks, Kind, Named, Reply};
use crate::{Guard, Result};

lua_script!(ACQUIRE, "fair/acquire.lua");
lua_script!(RELEASE, "fair/release.lua");
lua_script!(GIVE_UP, "fair/give_up.lua");
lua_script!(FORCE_UNLOCK, "fair/force_unlock.lua");

/// Scripts of this kind, loaded at connect (renewal is the plain lock's).
pub(crate) static SCRIPTS: &[&LuaScript] = &[&ACQUIRE, &RELEASE, &GIVE_UP, &FORCE_UNLOCK];

/// Prefix of the queue list's key (Redisson's `redisson_lock_queue`).
const QUEUE_PREFIX: &str = "redisson_lock_queue";

/// Prefix of the timeout zset's key (Redisson's `redisson_lock_timeout`).
const TIMEOUT_PREFIX: &str = "redisson_lock_timeout";

/// A reentrant lock that is handed out **in the order it was asked for**, across every
/// process: nobody starves. Made by [`Client::fair_lock`](crate::Client::fair_lock).
///
/// It is a [`Lock`](crate::Lock) in everything else: the same five acquire methods,
/// re-entry inside a hold's scope (every other acquisition is a new owner; an explicit
/// [`Owner`](crate::Owner) names one), the watchdog, [`Guard::lost`], the same cancellation safety.
///
/// ```no_run
/// # async fn run() -> redbaton::Result<()> {
/// use std::time::Duration;
/// let client = redbaton::Client::builder()
///     .url("redis://127.0.0.1:6379")
///     .fair_lock_wait(Duration::from_secs(60)) // a dead waiter blocks its turn for at most 60 s
///     .connect()
///     .await?;
/// let deploys = client.fair_lock("deploy:prod");
///
/// // Queued behind the deploys that asked first; served in turn.
/// let guard = deploys.lock().await?;
/// // ... deploy ...
/// guard.unlock().await?;
///
/// // Give up after ten minutes in the queue: the place is left at once.
/// match deploys.try_lock_for(Duration::from_secs(600)).await? {
///     Some(guard) => guard.unlock().await?,
///     None => eprintln!("still busy after 10 minutes"),
/// }
/// # client.shutdown().await }
/// ```
///
/// # Order
///
/// A waiter that is refused joins a queue in Redis; the lock goes to the queue's head only
/// (a waiter arriving while others queue never jumps ahead, not even with
/// [`try_lock`](FairLock::try_lock), which never queues). On release, only the head is
/// woken, on its own channel. A waiter that stops waiting — its wait ran out, its future was
/// dropped, an error ended it — leaves the queue at once (in a background task, after any
/// call of it still in flight), and if it was next for a free lock, the new head is woken.
///
/// # Dead waiters and the wait time
///
/// A queued waiter has a **timeout**: its predecessor's, plus its own wait (the call's wait,
/// at most [`Config::fair_lock_wait`](crate::Config::fair_lock_wait), 5 minutes by default;
/// that setting for calls without a deadline). A head whose timeout passed is dropped from
/// the queue by the next fair-lock script any client runs. So a waiter whose process died
/// blocks the queue for at most its wait once its turn comes; and a live waiter still queued
/// past its timeout (a holder kept the lock longer than the queue expected) loses its place
/// and queues again at the back — keep `fair_lock_wait` well above how long the lock is held.
///
/// # Clocks
///
/// The timeouts are absolute epoch milliseconds (Redisson's wire format). redbaton's
/// scripts take "now" from the **server's** clock (`TIME`), so all redbaton clients agree
/// whatever their own clocks say. Redisson computes it from each Java client's **own wall
/// clock**, both when it writes a timeout and when it purges stale heads; a score is an
/// absolute deadline whoever wrote it, so this stays compatible, but a Java client whose
/// clock is off the server's by *d* misjudges the queue by *d*: running ahead, it drops live
/// heads *d* early (they queue again at the back, losing their turn); running behind, it
/// keeps a dead head *d* longer. When Java services share a fair lock, keep their clocks
/// synchronised with the Redis server's (NTP) well within `fair_lock_wait`. (After a
/// failover, the new primary's clock is the one that counts.)
///
/// Two calls waiting as one explicit owner ([`with_owner`](FairLock::with_owner)) share one
/// place in the queue: when one of them gives up, the place is gone for both (the other
/// queues again at the back on its next try).
///
/// # Wire format
///
/// Redisson's `RFairLock`: the RLock hash of [`Lock`](crate::Lock) at the key; the list
/// `redisson_lock_queue:{name}` of queued owner fields, head first; the zset
/// `redisson_lock_timeout:{name}` of their timeouts; each waiter listening on
/// `redisson_lock__channel:{name}:<owner field>`, where a release publishes `0` to the head.
/// Java services using Redisson's fair lock share the queue with redbaton. A `FairLock` and a
/// plain [`Lock`](crate::Lock) on one name exclude each other, but a plain lock ignores the
/// queue and its waiters hear nothing from a fair release (and vice versa) — do not mix them
/// on one name.
#[derive(Clone)]
pub struct FairLock {
    inner: Arc<Inner>,
    owner: Option<Arc<str>>,
    waiting: Waiting,
}

/// How one acquire call queues (see [`Kind::waiting`]).
#[derive(Clone, Copy, Debug)]
struct Waiting {
    /// The wait it queues with, and gives up with.
    wait_ms: i64,
    /// It waits, so it queues when refused, and leaves the queue when it gives up.
    queues: bool,
}

struct Inner {
    hash: HashLock,
    queue: Arc<str>,
    timeouts: Arc<str>,
}

/// A hold of a [`FairLock`].
pub type FairGuard = Guard<FairLock>;

impl FairLock {
    pub(crate) fn new(client: Arc<ClientInner>, name: &str) -> FairLock {
        let wait_ms = client.config.fair_lock_wait.as_millis() as i64;
        let hash = HashLock::new(client, name, Self::KIND);
        let queue = prefix_name(QUEUE_PREFIX, &hash.named.key);
        let timeouts = prefix_name(TIMEOUT_PREFIX, &hash.named.key);
        FairLock {
            inner: Arc::new(Inner {
                hash,
                queue,
                timeouts,
            }),
            owner: None,
            waiting: Waiting {
                wait_ms,
                queues: true,
            },
        }
    }

    fn hash(&self) -> &HashLock {
        &self.inner.hash
    }

    acquire_methods!(FairLock);
    hash_lock_methods!(
        "The prefix of every waiter's channel (`redisson_lock__channel:{key}`, the plain \
         lock's channel); a waiter listens on `<prefix>:<owner field>` (see \
         [`waiter_channel`](FairLock::waiter_channel)). Nothing is published on the prefix \
         itself."
    );

    /// The key of the queue list (`redisson_lock_queue:{key}`).
    pub fn queue_key(&self) -> &str {
        &self.inner.queue
    }

    /// The key of the timeout zset (`redisson_lock_timeout:{key}`).
    pub fn timeout_key(&self) -> &str {
        &self.inner.timeouts
    }

    /// The id of the client this handle belongs to (the first part of its owners' fields).
    /// For tests and diagnostics; not part of the stable API.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn client_id(&self) -> &str {
        &self.named().client.id
    }

    /// The channel this handle's [`owner`](Self::owner) listens on while it waits
    /// (`redisson_lock__channel:{key}:<owner field>`): a release publishes `0` there when
    /// this owner is at the head of the queue. `None` when the handle has no owner yet (an
    /// acquisition outside every hold's scope is a new owner, with a channel of its own).
    pub fn waiter_channel(&self) -> Option<String> {
        let field = self.named().owner_field(self.owner.as_ref())?;
        Some(format!("{}:{field}", self.hash().channel))
    }

    /// The owner fields queued for the lock, the next to be served first. Heads whose
    /// timeout passed are listed until the next fair-lock script drops them.
    pub async fn queued(&self) -> Result<Vec<String>> {
        let named = self.named();
        named.check()?;
        named
            .client
            .conn
            .read("LRANGE", &self.inner.queue, vec![0.into(), (-1).into()])
            .await
            .map_err(|e| named.error(&e))
    }

    /// Deletes the lock whoever holds it and wakes the head of the queue: `true` when it was
    /// held. The queue stays. The holder's guard then reports [`lost`](Guard::lost). A key
    /// that is not a lock is refused with [`Error::WrongType`](crate::Error::WrongType),
    /// never deleted.
    pub async fn force_unlock(&self) -> Result<bool> {
        let named = self.named();
        named.check()?;
        let conn = &named.client.conn;
        let args = vec![
            Value::from_static_str(UNLOCK_MESSAGE),
            Value::from_static_str(conn.publish_command()),
            Value::from(&*self.inner.hash.channel),
        ];
        let (deleted, ack): (i64, Ack) = conn
            .eval_synced(&FORCE_UNLOCK, &self.inner.keys(), args)
            .await
            .map_err(|e| named.error(&e))?;
        if deleted == 1 {
            tracing::info!(lock = %named.name(), "force-unlocked");
        }
        ack.check()?;
        Ok(deleted == 1)
    }
}

impl Inner {
    /// The hash, the queue and the timeouts: the keys of every script (the channel prefix
    /// goes as an argument).
    fn keys(&self) -> [&str; 3] {
        [&self.hash.named.key, &self.queue, &self.timeouts]
    }
}

impl Kind for FairLock {
    const KIND: &'static str = "fair_lock";
}

#[allow(private_interfaces)] // the hooks name crate-private types: sealed on purpose
impl Hooks for FairLock {
    type Extra = ();

    fn named(&self) -> &Named {
        &self.inner.hash.named
    }

    fn explicit_owner(&self) -> Option<&Arc<str>> {
        self.owner.as_ref()
    }

    fn channel(&self, field: &Arc<str>) -> (Arc<str>, Wake) {
        let channel = format!("{}:{field}", self.inner.hash.channel);
        (channel.into(), Wake::Lock)
    }

    fn acquire(&self, conn: &Conn, field: &str, lease_ms: i64, waits: bool) -> Call {
        let named = self.named();
        // While the lock is free for a waiter ahead, park at most a watchdog lease: that one
        // may take it and die without a release, and nobody would tell this waiter.
        let poll_ms = named.client.holds.watchdog_lease().as_millis() as i64;
        let args = vec![
            Value::from(lease_ms),
            Value::from(field),
            Value::from(self.waiting.wait_ms),
            Value::from(if waits { "1" } else { "0" }),
            Value::from(poll_ms),
        ];
        let inner = &self.inner;
        let keys = [&*named.key, &*inner.queue, &*inner.timeouts];
        conn.call(&ACQUIRE, &keys, args)
    }

    fn decode(&self, reply: Value) -> Result<Reply<()>> {
        decode_counted(self.named(), reply, |_| Some(()))
    }

    fn ops(&self) -> Arc<dyn HoldOps> {
        self.inner.clone()
    }

    fn give_up(&self, conn: &Conn, field: &str) -> Option<Call> {
        if !self.waiting.queues {
            return None;
        }
        let args = vec![
            Value::from(field),
            Value::from(self.waiting.wait_ms),
            Value::from_static_str(UNLOCK_MESSAGE),
            Value::from_static_str(conn.publish_command()),
            Value::from(&*self.inner.hash.channel),
        ];
        Some(conn.call(&GIVE_UP, &self.inner.keys(), args))
    }

    fn waiting(&self, wait: Option<Duration>) -> Self {
        let default_ms = self.named().client.config.fair_lock_wait.as_millis() as i64;
        // A call's own wait (Redisson queues a timed tryLock with it), but never more than
        // the setting: a dead waiter's place must not outlast that.
        let waiting = match wait {
            Some(Duration::ZERO) => Waiting {
                wait_ms: default_ms,
                queues: false,
            },
            Some(wait) => Waiting {
                wait_ms: i64::try_from(wait.as_millis())
                    .unwrap_or(i64::MAX)
                    .clamp(1, default_ms),
                queues: true,
            },
            None => Waiting {
                wait_ms: default_ms,
                queues: true,
            },
        };
        FairLock {
            inner: self.inner.clone(),
            owner: self.owner.clone(),
            waiting,
        }
    }
}

impl HoldOps for Inner {
    fn name(&self) -> &str {
        self.hash.named.name()
    }

    fn kind(&self) -> &'static str {
        self.hash.kind
    }

    fn release(&self, conn: &Conn, field: &str, max: u32, keep: u32, replicas: Replicas) -> Call {
        let args = vec![
            Value::from(field),
            Value::from(i64::from(max)),
            Value::from(i64::from(keep)),
            Value::from_static_str(UNLOCK_MESSAGE),
            Value::from_static_str(conn.publish_command()),
            Value::from(&*self.hash.channel),
        ];
        conn.call_with(&RELEASE, &self.keys(), args, replicas)
    }

    fn renewal(&self) -> Renewal {
        // The hash is the plain lock's: so is its renewal (batched with plain locks).
        &RENEW
    }
}

impl std::fmt::Debug for FairLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FairLock")
            .field("name", &self.inner.hash.named.name())
            .field("owner", &self.owner)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helper_keys_follow_redisson() {
        assert_eq!(
            &*prefix_name(QUEUE_PREFIX, "deploy"),
            "redisson_lock_queue:{deploy}"
        );
        assert_eq!(
            &*prefix_name(TIMEOUT_PREFIX, "{app}:deploy"),
            "redisson_lock_timeout:{app}:deploy"
        );
    }
}
