//! [`Lock`]: Redisson's `RLock` — a reentrant lock on one Redis hash.

use std::sync::Arc;
use std::time::Duration;

use fred::types::Value;
use futures::future::BoxFuture;

use crate::conn::{lua_script, Ack, Call, Conn, Replicas};
use crate::engine::client_inner::ClientInner;
use crate::engine::holds::{HoldOps, Renewal};
use crate::engine::hub::Wake;
use crate::kinds::{acquire_methods, decode_counted, prefix_name, Hooks, Kind, Named, Reply};
use crate::owner::Owner;
use crate::Result;

lua_script!(ACQUIRE, "lock/acquire.lua");
lua_script!(RELEASE, "lock/release.lua");
lua_script!(FORCE_UNLOCK, "lock/force_unlock.lua");
lua_script!(RENEW, "lock/renew.lua");
lua_script!(PASS, "lock/pass.lua");
lua_script!(LISTENERS, "lock/listeners.lua");

/// Prefix of every lock channel (Redisson's `redisson_lock__channel`).
pub(crate) const CHANNEL_PREFIX: &str = "redisson_lock__channel";

/// The unlock message Redisson publishes when a lock is released (`UNLOCK_MESSAGE`).
pub(crate) const UNLOCK_MESSAGE: &str = "0";

/// A reentrant distributed lock on one name. Cheap to clone; `Send + Sync`.
///
/// Made by [`Client::lock`](crate::Client::lock).
///
/// # Semantics
///
/// A lock is a Redis hash at the lock's key (its name, after the client's key prefix) whose
/// one field is the holder's owner id `<client uuid>:<owner number>` and whose value is the
/// holder's reentry count — Redisson's `RLock` layout, so Java services using Redisson and
/// Rust services using redbaton exclude (and wake) each other on the same names.
///
/// # One holder means one holder
///
/// Every acquisition is a new owner (a fresh number from the client, see [`Owner`]) unless it
/// is made inside a hold's *scope* — the future given to [`run`](Lock::run) or
/// [`Guard::run`](crate::Guard::run), or explicitly with
/// [`Guard::reenter`](crate::Guard::reenter) — and each re-entry must be released. The owner
/// is **not** the tokio task: futures polled together in one task exclude each other like
/// separate tasks. The [crate docs](crate#one-holder-means-one-holder) explain the rule, with
/// an example. A re-entry never shortens the lock's expiry, whatever lease it asks for: a hold
/// ends with the longest lease among the owner's holds.
///
/// Waiting costs Redis almost nothing: a waiter subscribes to the lock's channel through the
/// client's shared subscriber, re-checks once, and parks until an unlock message wakes it —
/// or until the lock's remaining lease (PTTL) runs out, so a lost message costs at most one
/// lease, never a hang. Between tasks of one client the lock is handed on without a message
/// at all: a release by the last hold hands the hold itself to the task that parked first, in
/// memory (the same owner field, lease and validity: that task's guard reports the field Redis
/// has as its [`owner`](crate::Guard::owner)), or passes it in the release's script when the
/// hold cannot serve the waiter's lease — while no other process is known to wait, and a
/// bounded number of times in a row ([`Config::baton_passes`](crate::Config::baton_passes)).
///
/// # Cancellation safety
///
/// Every acquiring method is cancellation safe: dropping its future at any point leaves no
/// lock held and no subscription behind. An acquire round trip dropped in flight — or one
/// whose reply is later than the command timeout — is finished in a spawned task, and if it
/// took the lock, the hold is released again at once. A waiter that was woken and then gives
/// up hands its wake-up to the next waiter. Each method's *Cancel safety* section says what
/// happens at each of its await points.
///
/// # Work that must stop when the lock is lost
///
/// [`run`](Lock::run) holds the lock around an async closure and drops the closure's future
/// as soon as the lease is known lost, returning [`Error::LeaseLost`](crate::Error::LeaseLost);
/// [`Guard::run`](crate::Guard::run) does the same for a guard acquired another way.
///
/// # Example
///
/// ```no_run
/// # async fn run() -> redbaton::Result<()> {
/// use std::time::Duration;
/// let client = redbaton::Client::connect("redis://127.0.0.1:6379").await?;
/// let lock = client.lock("order:42");
///
/// let outer = lock.lock().await?;          // waits as long as it takes
/// let inner = outer.reenter().await?;      // the same owner: re-enters, never waits
/// let count = outer.run(|| lock.hold_count()).await??; // asked inside the hold's scope
/// assert_eq!(count, 2);
/// inner.unlock().await?;
/// outer.unlock().await?;
///
/// match lock.try_lock_for(Duration::from_millis(200)).await? {
///     Some(guard) => guard.unlock().await?,
///     None => println!("busy"),
/// }
/// # client.shutdown().await }
/// ```
#[derive(Clone)]
pub struct Lock {
    inner: Arc<HashLock>,
    owner: Option<Arc<str>>,
}

/// A lock on Redisson's RLock hash: what [`Lock`] is, and what the other kinds on that hash
/// (fenced, fair) build on.
pub(crate) struct HashLock {
    pub(crate) named: Named,
    pub(crate) channel: Arc<str>,
    /// The kind that made it, as metrics label its holds.
    pub(crate) kind: &'static str,
}

impl HashLock {
    pub(crate) fn new(client: Arc<ClientInner>, name: &str, kind: &'static str) -> HashLock {
        let named = Named::new(client, name);
        let channel = prefix_name(CHANNEL_PREFIX, &named.key);
        HashLock {
            named,
            channel,
            kind,
        }
    }

    /// The reentry count of `owner` (the enclosing hold's owner when `None`).
    pub(crate) async fn hold_count(&self, owner: Option<&Arc<str>>) -> Result<u32> {
        let named = &self.named;
        named.check()?;
        let Some(field) = named.owner_field(owner) else {
            return Ok(0); // a new owner holds nothing
        };
        let count: Option<i64> = named
            .client
            .conn
            .read("HGET", &named.key, vec![Value::from(&*field)])
            .await
            .map_err(|e| named.error(&e))?;
        Ok(count.unwrap_or(0).clamp(0, i64::from(u32::MAX)) as u32)
    }

    pub(crate) async fn is_locked(&self) -> Result<bool> {
        let named = &self.named;
        named.check()?;
        let exists: i64 = named
            .client
            .conn
            .read("EXISTS", &named.key, vec![])
            .await
            .map_err(|e| named.error(&e))?;
        Ok(exists > 0)
    }

    pub(crate) async fn is_held_by(&self, owner: Option<&Arc<str>>) -> Result<bool> {
        let named = &self.named;
        named.check()?;
        let Some(field) = named.owner_field(owner) else {
            return Ok(false);
        };
        named
            .client
            .conn
            .read("HEXISTS", &named.key, vec![Value::from(&*field)])
            .await
            .map_err(|e| named.error(&e))
    }

    pub(crate) async fn remaining_ttl(&self) -> Result<Option<Duration>> {
        let named = &self.named;
        named.check()?;
        match named.pttl().await? {
            -2 => Ok(None),
            ms if ms >= 0 => Ok(Some(Duration::from_millis(ms as u64))),
            _ => Err(named.no_expiry()),
        }
    }

    pub(crate) async fn force_unlock(&self) -> Result<bool> {
        let named = &self.named;
        named.check()?;
        let conn = &named.client.conn;
        let args = vec![
            Value::from_static_str(UNLOCK_MESSAGE),
            Value::from_static_str(conn.publish_command()),
            Value::from(&*self.channel),
        ];
        let (deleted, ack): (i64, Ack) = conn
            .eval_synced(&FORCE_UNLOCK, &[&*named.key], args)
            .await
            .map_err(|e| named.error(&e))?;
        if deleted == 1 {
            tracing::info!(lock = %named.name(), "force-unlocked");
        }
        ack.check()?;
        Ok(deleted == 1)
    }

    /// The owner `owner` names, or the enclosing hold's.
    pub(crate) fn owner(&self, owner: Option<&Arc<str>>) -> Option<Owner> {
        self.named.owner(owner)
    }
}

/// The methods of a kind on the RLock hash (a `Clone` handle with `self.owner: Option<Arc<str>>`
/// whose `hash()` is its `HashLock`), documented once; `$channel_doc` says what its
/// `channel()` is.
macro_rules! hash_lock_methods {
    ($channel_doc:literal) => {
        /// The lock's name as given.
        pub fn name(&self) -> &str {
            &self.hash().named.name()
        }

        /// The Redis key of the lock (the name after the client's key prefix).
        pub fn key(&self) -> &str {
            &self.hash().named.key
        }

        #[doc = $channel_doc]
        pub fn channel(&self) -> &str {
            &self.hash().channel
        }

        /// This handle acting as an explicit `owner`: every acquisition through it is that
        /// owner's, wherever it runs.
        ///
        /// Use it to hand a hold over on purpose — to re-enter, from another task or process,
        /// a hold whose owner was passed on (the command-line tool's `REDBATON_OWNER`).
        pub fn with_owner(&self, owner: $crate::Owner) -> Self {
            Self {
                owner: Some(owner.to_string().into()),
                ..self.clone()
            }
        }

        /// The owner this handle acts as right now: its explicit owner, else the owner of
        /// the hold of this lock whose scope the caller runs in (see
        /// [`Guard::run`]($crate::Guard::run)); `None` outside every such scope, where an
        /// acquisition is a new owner.
        pub fn owner(&self) -> Option<$crate::Owner> {
            self.hash().owner(self.owner.as_ref())
        }

        /// The reentry count of [`owner`](Self::owner) (0 when it does not hold the lock, or
        /// there is none).
        pub async fn hold_count(&self) -> $crate::Result<u32> {
            self.hash().hold_count(self.owner.as_ref()).await
        }

        /// Whether anyone holds the lock.
        pub async fn is_locked(&self) -> $crate::Result<bool> {
            self.hash().is_locked().await
        }

        /// Whether [`owner`](Self::owner) holds the lock: with no explicit owner, whether the
        /// caller runs inside the scope of a hold of it that Redis still has.
        pub async fn is_held_in_scope(&self) -> $crate::Result<bool> {
            self.hash().is_held_by(self.owner.as_ref()).await
        }

        /// How long the lock's lease has left; `None` when it is not locked.
        pub async fn remaining_ttl(&self) -> $crate::Result<Option<std::time::Duration>> {
            self.hash().remaining_ttl().await
        }
    };
}
pub(crate) use hash_lock_methods;

impl Lock {
    /// Waits until the lock is free — held by nobody — **without taking it**: the other half
    /// of a single-flight (stampede) guard. One caller takes the lock and computes; the rest
    /// wait here, and the one unlock message that frees the lock wakes them all together,
    /// instead of each taking the lock in turn.
    ///
    /// It reads the lock's expiry once; while the lock is held it subscribes to the lock's
    /// channel (through the client's shared subscriber) and parks until the release's unlock
    /// message, a reconnect, or the holder's remaining lease — so a lost message costs at
    /// most that lease. Hand-offs between holders (a hold passed to the next waiter) do not
    /// free the lock, and wake nobody here. "Free" is a moment: another caller may take the
    /// lock right after.
    ///
    /// # Cancel safety
    ///
    /// Nothing is taken; dropping the future leaves no subscription behind.
    ///
    /// ```no_run
    /// # async fn run(client: redbaton::Client) -> redbaton::Result<()> {
    /// # async fn compute() -> String { String::new() }
    /// # async fn store(_: &str) {}
    /// # async fn cached() -> Option<String> { None }
    /// use std::time::Duration;
    /// let lock = client.lock("report:42:refresh");
    /// let report = match lock.try_lock().await? {
    ///     Some(guard) => {
    ///         let fresh = compute().await; // one caller computes ...
    ///         store(&fresh).await;
    ///         guard.unlock().await?; // ... and its unlock wakes every waiter at once
    ///         Some(fresh)
    ///     }
    ///     None => {
    ///         // the rest wait for it, bounded, then read what it stored
    ///         lock.wait_until_free_for(Duration::from_secs(10)).await?;
    ///         cached().await
    ///     }
    /// };
    /// # let _ = report; Ok(()) }
    /// ```
    pub async fn wait_until_free(&self) -> Result<()> {
        crate::engine::free::until_free(self, None).await.map(drop)
    }

    /// [`wait_until_free`](Self::wait_until_free), for at most `wait`: `true` once the lock
    /// is free, `false` when the wait ran out first (`Duration::ZERO` looks once).
    pub async fn wait_until_free_for(&self, wait: Duration) -> Result<bool> {
        crate::engine::free::until_free(self, Some(wait)).await
    }

    pub(crate) fn new(client: Arc<ClientInner>, name: &str) -> Lock {
        Lock {
            inner: Arc::new(HashLock::new(client, name, Self::KIND)),
            owner: None,
        }
    }

    fn hash(&self) -> &HashLock {
        &self.inner
    }

    acquire_methods!(Lock);
    hash_lock_methods!("The channel its unlock messages travel on.");

    /// Deletes the lock whoever holds it and wakes its waiters: `true` when it was held.
    /// The holder's guard then reports [`lost`](crate::Guard::lost). A key that is not a lock
    /// is refused with [`Error::WrongType`](crate::Error::WrongType), never deleted.
    pub async fn force_unlock(&self) -> Result<bool> {
        self.hash().force_unlock().await
    }

    /// How many tasks of this client are parked on this lock such that its release would be
    /// passed to one of them (see [`Config::baton_passes`](crate::Config::baton_passes)).
    /// For tests and diagnostics; not part of the stable API.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn passable_waiters(&self) -> usize {
        let named = &self.inner.named;
        named.client.hub.passable(&self.inner.channel, &named.key)
    }

    /// Whether an unlock message on this lock's channel reaches this client now: a waiter's
    /// subscription is confirmed and the subscriber connection has not dropped since. For
    /// tests and diagnostics; not part of the stable API.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn hears_unlocks(&self) -> bool {
        let named = &self.inner.named;
        named.client.hub.listening(&self.inner.channel, &named.key)
    }

    /// Whether this client's releases of this lock are ordinary ones for now, because
    /// another client was found waiting on it. For tests and diagnostics; not part of the
    /// stable API.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn other_clients_wait(&self) -> bool {
        let named = &self.inner.named;
        named
            .client
            .hub
            .other_clients_wait(&self.inner.channel, &named.key)
    }
}

impl Kind for Lock {
    const KIND: &'static str = "lock";
}

#[allow(private_interfaces)] // the hooks name crate-private types: sealed on purpose
impl Hooks for Lock {
    type Extra = ();

    fn named(&self) -> &Named {
        &self.inner.named
    }

    fn explicit_owner(&self) -> Option<&Arc<str>> {
        self.owner.as_ref()
    }

    fn channel(&self, _field: &Arc<str>) -> (Arc<str>, Wake) {
        (self.inner.channel.clone(), Wake::Lock)
    }

    fn acquire(&self, conn: &Conn, field: &str, lease_ms: i64, _waits: bool) -> Call {
        let args = vec![Value::from(lease_ms), Value::from(field)];
        conn.call(&ACQUIRE, &[&self.inner.named.key], args)
    }

    fn decode(&self, reply: Value) -> Result<Reply<()>> {
        decode_counted(self.named(), reply, |_| Some(()))
    }

    fn ops(&self) -> Arc<dyn HoldOps> {
        self.inner.clone()
    }

    const PASSES: bool = true;

    fn listeners(&self, conn: &Arc<Conn>) -> Option<BoxFuture<'static, Result<i64>>> {
        let inner = self.inner.clone();
        let conn = conn.clone();
        Some(Box::pin(async move {
            let named = &inner.named;
            let args = vec![
                Value::from(count_subscribers(&conn)),
                Value::from(&*inner.channel),
            ];
            conn.eval(&LISTENERS, &[&*named.key], args)
                .await
                .map_err(|e| named.error(&e))
        }))
    }

    fn pass(&self, conn: &Conn, field: &str, next: &str, lease_ms: i64) -> Option<(Call, ())> {
        let count_subscribers = count_subscribers(conn);
        let args = vec![
            Value::from(field),
            Value::from(next),
            Value::from(lease_ms),
            // This client's own subscriber, listening for the waiter being passed the lock.
            Value::from(1),
            Value::from(count_subscribers),
            Value::from_static_str(UNLOCK_MESSAGE),
            Value::from_static_str(conn.publish_command()),
            Value::from(&*self.inner.channel),
        ];
        Some((conn.call(&PASS, &[&*self.inner.named.key], args), ()))
    }
}

/// The command that counts a channel's subscribers where `conn` publishes.
fn count_subscribers(conn: &Conn) -> &'static str {
    match conn.publish_command() {
        "SPUBLISH" => "SHARDNUMSUB",
        _ => "NUMSUB",
    }
}

impl HoldOps for HashLock {
    fn name(&self) -> &str {
        self.named.name()
    }

    fn kind(&self) -> &'static str {
        self.kind
    }

    fn release(&self, conn: &Conn, field: &str, max: u32, keep: u32, replicas: Replicas) -> Call {
        let args = vec![
            Value::from(field),
            Value::from(i64::from(max)),
            Value::from(i64::from(keep)),
            Value::from_static_str(UNLOCK_MESSAGE),
            Value::from_static_str(conn.publish_command()),
            Value::from(&*self.channel),
        ];
        conn.call_with(&RELEASE, &[&*self.named.key], args, replicas)
    }

    fn renewal(&self) -> Renewal {
        &RENEW
    }
}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock")
            .field("name", &self.inner.named.name())
            .field("owner", &self.owner)
            .finish()
    }
}

/// Scripts of this kind, loaded at connect.
pub(crate) static SCRIPTS: &[&crate::conn::LuaScript] =
    &[&ACQUIRE, &RELEASE, &FORCE_UNLOCK, &RENEW, &PASS, &LISTENERS];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_names_follow_redisson() {
        assert_eq!(
            &*prefix_name(CHANNEL_PREFIX, "order:42"),
            "redisson_lock__channel:{order:42}"
        );
        assert_eq!(
            &*prefix_name(CHANNEL_PREFIX, "{user}:a"),
            "redisson_lock__channel:{user}:a"
        );
    }
}
