//! [`FencedLock`]: Redisson's `RFencedLock` — the reentrant lock plus a fencing token.

use std::sync::Arc;

use fred::types::Value;

use crate::conn::{lua_script, Call, Conn, LuaScript};
use crate::engine::client_inner::ClientInner;
use crate::engine::holds::HoldOps;
use crate::engine::hub::Wake;
use crate::kinds::lock::{hash_lock_methods, HashLock};
use crate::kinds::{acquire_methods, decode_counted, prefix_name, Hooks, Kind, Named, Reply};
use crate::{Guard, Result};

lua_script!(ACQUIRE, "fenced/acquire.lua");

/// Scripts of this kind, loaded at connect.
pub(crate) static SCRIPTS: &[&LuaScript] = &[&ACQUIRE];

/// Prefix of the token counter's key (Redisson's `redisson_lock_token`).
const TOKEN_PREFIX: &str = "redisson_lock_token";

/// A reentrant lock whose every acquisition hands out a **fencing token**: a number that is
/// larger than that of every acquisition before it. Made by
/// [`Client::fenced_lock`](crate::Client::fenced_lock).
///
/// A lease cannot stop a holder that paused (a GC pause, a stalled network) from writing
/// after its lease ended and another holder got in. A token can: the protected resource
/// remembers the highest token it has seen and refuses writes that carry a lower one.
///
/// ```no_run
/// use std::time::Duration;
/// use redbaton::fred::{self, interfaces::LuaInterface}; // fred 10, re-exported: no version to match
///
/// /// The store's side (here a Redis script): write only with a token at least as high as the
/// /// highest one seen. Any store that can compare and set works.
/// const GUARDED_WRITE: &str = "
///     local highest = tonumber(redis.call('get', KEYS[1]) or '0')
///     if tonumber(ARGV[1]) < highest then return 0 end
///     redis.call('set', KEYS[1], ARGV[1])
///     redis.call('set', KEYS[2], ARGV[2])
///     return 1";
///
/// async fn write(store: &fred::clients::Client, token: u64, value: &str) -> bool {
///     let keys = vec!["store:invoice:7:token", "store:invoice:7"];
///     let args = vec![token.to_string(), value.to_owned()];
///     store.eval::<i64, _, _, _>(GUARDED_WRITE, keys, args).await.is_ok_and(|n| n == 1)
/// }
///
/// #[tokio::main]
/// async fn main() -> redbaton::Result<()> {
///     let a = redbaton::Client::connect("redis://127.0.0.1:6379").await?;
///     let b = redbaton::Client::connect("redis://127.0.0.1:6379").await?;
///     let store = a.redis();
///
///     let first = a.fenced_lock("invoice:7").lock_with_lease(Duration::from_millis(500)).await?;
///     assert!(write(store, first.token(), "draft by A").await);
///     // A pauses past its lease; B gets the lock, with a higher token.
///     let second = b.fenced_lock("invoice:7").lock().await?;
///     assert!(second.token() > first.token());
///     assert!(write(store, second.token(), "final by B").await);
///     // A resumes and writes as if it still held the lock: the store refuses the stale token.
///     assert!(!write(store, first.token(), "late write by A").await);
///     assert!(first.is_lost()); // its guard knew: check `lost()` before writing
///     second.unlock().await?;
///     a.shutdown().await?;
///     b.shutdown().await
/// }
/// ```
///
/// # Wire format
///
/// Redisson's `RFencedLock`: the RLock hash, channel and unlock of [`Lock`](crate::Lock),
/// plus the string counter `redisson_lock_token:{name}` (no expiry), incremented by every
/// successful acquire, re-entries included; a refused attempt never increments it. (For a
/// name that already contains `{`, the counter is `redisson_lock_token:name`: the name's own
/// hash tag keeps it in the lock's cluster slot.) A `FencedLock` and a [`Lock`](crate::Lock)
/// on one name are one lock: they exclude and wake each other, and one owner holding both
/// re-enters. Deleting the counter (Redisson's `delete()` does) restarts the tokens: never do
/// it while the protected resource remembers tokens. A counter that is not a non-negative
/// integer is refused with [`Error::WrongType`](crate::Error::WrongType) before anything is
/// taken.
///
/// # ACL
///
/// Besides what a [`Lock`](crate::Lock) user needs, the counter's key pattern
/// (`~redisson_lock_token:*`), `+incr` and `+get` (the acquire script reads and increments the
/// counter; [`token`](FencedLock::token) is a `GET`).
#[derive(Clone)]
pub struct FencedLock {
    inner: Arc<Inner>,
    owner: Option<Arc<str>>,
}

struct Inner {
    hash: Arc<HashLock>,
    token_key: Arc<str>,
}

/// A hold of a [`FencedLock`], with its token.
pub type FencedGuard = Guard<FencedLock>;

impl FencedLock {
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
    /// See [`Lock::wait_until_free`](crate::Lock::wait_until_free) for the recipe.
    pub async fn wait_until_free(&self) -> Result<()> {
        crate::engine::free::until_free(self, None).await.map(drop)
    }

    /// [`wait_until_free`](Self::wait_until_free), for at most `wait`: `true` once the lock
    /// is free, `false` when the wait ran out first.
    pub async fn wait_until_free_for(&self, wait: std::time::Duration) -> Result<bool> {
        crate::engine::free::until_free(self, Some(wait)).await
    }

    pub(crate) fn new(client: Arc<ClientInner>, name: &str) -> FencedLock {
        let hash = HashLock::new(client, name, Self::KIND);
        let token_key = prefix_name(TOKEN_PREFIX, &hash.named.key);
        FencedLock {
            inner: Arc::new(Inner {
                hash: Arc::new(hash),
                token_key,
            }),
            owner: None,
        }
    }

    fn hash(&self) -> &HashLock {
        &self.inner.hash
    }

    acquire_methods!(FencedLock);
    hash_lock_methods!("The channel its unlock messages travel on.");

    /// Deletes the lock whoever holds it and wakes its waiters: `true` when it was held. The
    /// token counter stays, so tokens keep increasing. The holder's guard then reports
    /// [`lost`](crate::Guard::lost). A key that is not a lock is refused with
    /// [`Error::WrongType`](crate::Error::WrongType), never deleted.
    pub async fn force_unlock(&self) -> Result<bool> {
        self.hash().force_unlock().await
    }

    /// The latest token handed out on this name (by any holder, in any process), `None`
    /// before the first. A counter that is not a number is an error
    /// ([`Error::WrongType`](crate::Error::WrongType) for another Redis type).
    pub async fn token(&self) -> Result<Option<u64>> {
        let named = self.named();
        named.check()?;
        let token: Option<u64> = named
            .client
            .conn
            .read("GET", &self.inner.token_key, vec![])
            .await
            .map_err(|e| named.error(&e))?;
        Ok(token)
    }
}

impl Guard<FencedLock> {
    /// This acquisition's fencing token: larger than every token handed out before it on
    /// this name.
    pub fn token(&self) -> u64 {
        self.extra()
    }
}

impl Kind for FencedLock {
    const KIND: &'static str = "fenced_lock";
}

#[allow(private_interfaces)] // the hooks name crate-private types: sealed on purpose
impl Hooks for FencedLock {
    type Extra = u64;

    fn named(&self) -> &Named {
        &self.inner.hash.named
    }

    fn explicit_owner(&self) -> Option<&Arc<str>> {
        self.owner.as_ref()
    }

    fn channel(&self, _field: &Arc<str>) -> (Arc<str>, Wake) {
        (self.inner.hash.channel.clone(), Wake::Lock)
    }

    fn acquire(&self, conn: &Conn, field: &str, lease_ms: i64, _waits: bool) -> Call {
        let args = vec![Value::from(lease_ms), Value::from(field)];
        let keys = [&*self.inner.hash.named.key, &*self.inner.token_key];
        conn.call(&ACQUIRE, &keys, args)
    }

    fn decode(&self, reply: Value) -> Result<Reply<u64>> {
        // Only a real token (≥ 1) counts as acquired (Redisson's `{-1, -1}` for a hash without
        // an expiry is not). The script refuses a counter that could yield anything else before
        // it takes a hold, so this is a last line of defence.
        decode_counted(self.named(), reply, |rest| {
            rest.first()
                .and_then(Value::as_i64)
                .filter(|t| *t >= 1)
                .map(|t| t as u64)
        })
    }

    fn ops(&self) -> Arc<dyn HoldOps> {
        self.inner.hash.clone()
    }
}

impl std::fmt::Debug for FencedLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedLock")
            .field("name", &self.inner.hash.named.name())
            .field("owner", &self.owner)
            .finish()
    }
}
