//! [`ReadWriteLock`]: Redisson's `RReadWriteLock` — many readers or one writer, on one hash.
//!
//! A read/write lock is one Redis hash at the lock's key, shared by both halves:
//!
//! | field | value |
//! | --- | --- |
//! | `mode` | `read` or `write` |
//! | `<client uuid>:<n>` | a reader's reentry count |
//! | `<client uuid>:<n>:write` | the writer's reentry count |
//!
//! Every read hold also has a *timeout key*, `{name}:<uuid>:<n>:rwlock_timeout:<i>` for the
//! owner's i-th hold (`<name>:<uuid>:<n>:rwlock_timeout:<i>` when the name has a `{`), a string
//! expiring with that hold's lease. The hash expires with the longest lease it protects; when
//! a reader leaves, the hash's expiry falls back to the longest timeout key left, so a dead
//! reader stops blocking writers once its own lease ends. Both halves wait on the channel
//! `redisson_rwlock:{name}`: a write unlock publishes `1` (every waiter retries: all readers may
//! get in), the read unlock that frees the lock publishes `0` (one waiter per process retries).
//! This is Redisson's layout, key for key and message for message, so Java services using
//! Redisson and Rust services using redbaton share read/write locks by name. Two messages are
//! added, both harmless to Redisson's waiters: a downgrade publishes `1` too (readers may get
//! in), and a read unlock that brings the hash's expiry down publishes it negated, `-<ms>`
//! (Redisson ignores every number but `0` and `1`), so waiters parked until the old expiry
//! retry when the remaining lease really ends instead.

use std::sync::Arc;

use fred::types::Value;

use crate::conn::{lua_script, Call, Conn, LuaScript, Replicas};
use crate::engine::client_inner::ClientInner;
use crate::engine::holds::{HoldOps, Renewal};
use crate::engine::hub::Wake;
use crate::kinds::lock::RENEW;
use crate::kinds::{acquire_methods, decode_counted, Hooks, Kind, Named, Reply};
use crate::owner::Owner;
use crate::{Error, Guard, Result};

mod hooks;

lua_script!(READ_ACQUIRE, "rwlock/read_acquire.lua");
lua_script!(READ_RELEASE, "rwlock/read_release.lua");
lua_script!(READ_RENEW, "rwlock/read_renew.lua");
lua_script!(WRITE_ACQUIRE, "rwlock/write_acquire.lua");
lua_script!(WRITE_RELEASE, "rwlock/write_release.lua");
lua_script!(FORCE_UNLOCK, "rwlock/force_unlock.lua");
lua_script!(STATE, "rwlock/state.lua");

/// Scripts of this kind, loaded at connect (the write renewal is the RLock's).
pub(crate) static SCRIPTS: &[&LuaScript] = &[
    &READ_ACQUIRE,
    &READ_RELEASE,
    &READ_RENEW,
    &WRITE_ACQUIRE,
    &WRITE_RELEASE,
    &FORCE_UNLOCK,
    &STATE,
];

/// Prefix of the channel (Redisson's `redisson_rwlock`).
const CHANNEL_PREFIX: &str = "redisson_rwlock";
/// What the read unlock that frees the lock publishes (Redisson's `UNLOCK_MESSAGE`).
const READ_UNLOCK_MESSAGE: &str = "0";
/// What the write unlock publishes (Redisson's `READ_UNLOCK_MESSAGE`: readers may all enter).
const WRITE_UNLOCK_MESSAGE: &str = "1";
/// The writer field's suffix (`<client uuid>:<number>:write`); [`LockState`] reads it too.
///
/// [`LockState`]: crate::LockState
pub(crate) const WRITE_SUFFIX: &str = ":write";

/// A distributed read/write lock: many readers at once, or one writer. Made by
/// [`Client::read_write_lock`](crate::Client::read_write_lock); cheap to clone, `Send + Sync`.
///
/// [`read`](ReadWriteLock::read) and [`write`](ReadWriteLock::write) give its two halves,
/// each a lock with the five acquire methods of [`Lock`](crate::Lock) and a guard with the same
/// behaviour (`unlock`, release on drop, [`lost`](crate::Guard::lost)).
///
/// # Semantics
///
/// Redisson's `RReadWriteLock`, across processes. Unlike `tokio::sync::RwLock`, which queues
/// readers and writers in arrival order so that a waiting writer holds back the readers that
/// come after it, this lock has **no queue and no writer preference**: a read is granted
/// whenever nobody writes, even while a writer waits, so a steady stream of readers can starve
/// a writer for as long as it lasts (a writer gets in only in a moment with no reader at all).
/// Where that matters, keep read holds short and give a writer's wait a bound
/// ([`try_lock_for`](WriteLock::try_lock_for)) with something to do when it runs out.
///
/// - **Many readers or one writer.** A read hold is granted while nobody writes; the write hold
///   only while nobody reads or writes.
/// - **Reentrant on both sides, per owner**, as for [`Lock`](crate::Lock): every acquisition
///   outside a hold's scope is a new owner (see [`Owner`]); inside the scope of a hold — the
///   future run by the guard's [`run`](crate::Guard::run) or the half's `run` — a
///   `read().lock()` or `write().lock()` of the same lock re-enters, as does the guard's
///   [`reenter`](crate::Guard::reenter). Every hold is released on its own.
/// - **A writer may read**: inside its write hold's scope it takes read holds. Those holds
///   outlive its write unlock: the lock is then *downgraded* to read mode, held by the former
///   writer's read holds, and waiting readers are woken and get in (Redisson publishes nothing
///   there; its readers wait until their lease-bounded wait ends).
/// - **A reader cannot upgrade.** A read hold blocks every writer, its own owner included.
///   A waiting write acquire inside a read hold's scope fails at once with
///   [`Error::WouldDeadlock`] instead of waiting for ever on itself, and a write `try_lock()`
///   there is `Ok(None)`. Release the read holds first.
/// - **Wake-ups**: a write unlock wakes every waiter of each process (readers then all get
///   in), the last reader's unlock wakes one.
/// - **Leases** as for [`Lock`](crate::Lock): the watchdog renews watchdog holds (for a read
///   hold: its timeout keys and the hash, as Redisson's read renewal does); a fixed lease
///   ends the hold. Each read hold has its own timeout key, so a reader that died stops
///   counting once its lease ends, even while other readers keep the hash alive. All holds
///   share the hash's expiry, so a hold whose lease ended can still be in the hash (a writer's
///   own read hold keeps its write field alive): releasing its guard (`unlock`, or dropping
///   it) then removes what is left of it, and only that, and wakes the waiters it let in.
///   When a read unlock brings the expiry down to a shorter lease that remains, waiters learn
///   the new expiry and retry when it comes, not at the one they read before.
///
/// A [`Lock`](crate::Lock) on the same name is a different Redis layout: it is never written
/// to by this lock's scripts (it counts as held), but do not mix the two on one name.
///
/// # Cancellation safety
///
/// As for [`Lock`](crate::Lock): every acquiring method is cancellation safe — dropping its
/// future at any point leaves no hold and no subscription behind — and a dropped guard is
/// released in the background. Client shutdown releases every read and write hold still held.
///
/// # Example
///
/// ```no_run
/// # async fn run(client: redbaton::Client) -> redbaton::Result<()> {
/// use std::time::Duration;
/// let rw = client.read_write_lock("catalog");
///
/// // Many readers at once (here two tasks of this process).
/// let (a, b) = tokio::join!(
///     tokio::spawn({ let rw = rw.clone(); async move { rw.read().lock().await } }),
///     tokio::spawn({ let rw = rw.clone(); async move { rw.read().lock().await } }),
/// );
/// let (a, b) = (a.unwrap()?, b.unwrap()?);
///
/// // A writer waits until both are released (here: gives up after 100 ms).
/// assert!(rw.write().try_lock_for(Duration::from_millis(100)).await?.is_none());
/// a.unlock().await?;
/// b.unlock().await?;
///
/// let write = rw.write().lock().await?;
/// // The writer may also read, inside its hold's scope...
/// let read = write.run(|| async { rw.read().lock().await }).await??;
/// write.unlock().await?; // ...and keeps reading: downgraded
/// assert!(rw.read().is_locked().await?);
/// read.unlock().await?;
///
/// let reading = rw.read().lock().await?;
/// // A reader cannot upgrade: this fails at once instead of waiting for ever on itself.
/// let upgrade = reading.run(|| async { rw.write().lock().await.map(drop) }).await?;
/// assert!(matches!(upgrade, Err(redbaton::Error::WouldDeadlock { .. })));
/// reading.unlock().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ReadWriteLock {
    read: Arc<ReadHalf>,
    write: Arc<WriteHalf>,
}

/// What both halves share: the name, key, channel and key prefix of the timeout keys.
struct Base {
    named: Named,
    channel: Arc<str>,
    /// `{key}`, or the key itself when it has a `{`: owner f's hold i has the timeout key
    /// `<timeout_base>:<f>:rwlock_timeout:<i>`.
    timeout_base: Arc<str>,
}

impl Base {
    /// The timeout-key prefix of reader field `field` (Redisson's `suffixName(name, field)` +
    /// `:rwlock_timeout`).
    fn timeout_prefix(&self, field: &str) -> String {
        format!("{}:{field}:rwlock_timeout", self.timeout_base)
    }

    /// The mode, the hash's length, and the owner's read and write counts, atomically.
    async fn state(&self, owner: &str) -> Result<(String, i64, i64, i64)> {
        let named = &self.named;
        named.check()?;
        let args = vec![
            Value::from(owner),
            Value::from(format!("{owner}{WRITE_SUFFIX}")),
        ];
        let reply: Vec<Value> = named
            .client
            .conn
            .eval(&STATE, &[&named.key], args)
            .await
            .map_err(|e| named.error(&e))?;
        let malformed = || Error::Redis(format!("unexpected state reply for {:?}", named.name()));
        let number = |i: usize| reply.get(i).and_then(Value::as_i64).ok_or_else(malformed);
        let mode = reply
            .first()
            .and_then(Value::as_string)
            .ok_or_else(malformed)?;
        Ok((mode, number(1)?, number(2)?, number(3)?))
    }

    async fn force_unlock(&self, mode: &str, message: &str) -> Result<bool> {
        let named = &self.named;
        named.check()?;
        let conn = &named.client.conn;
        let args = vec![
            Value::from(mode),
            Value::from(message),
            Value::from_static_str(conn.publish_command()),
            Value::from(&*self.channel),
        ];
        let deleted: i64 = conn
            .eval(&FORCE_UNLOCK, &[&*named.key], args)
            .await
            .map_err(|e| named.error(&e))?;
        if deleted == 1 {
            tracing::info!(lock = %named.name(), mode, "force-unlocked");
        }
        Ok(deleted == 1)
    }

    /// The reentry counts of `owner` (else the enclosing hold's owner): read and write, both
    /// 0 when there is no such owner.
    async fn counts(&self, owner: Option<&Arc<str>>) -> Result<(i64, i64)> {
        let Some(field) = self.named.owner_field(owner) else {
            self.named.check()?;
            return Ok((0, 0));
        };
        let (_, _, reads, writes) = self.state(&field).await?;
        Ok((reads, writes))
    }
}

/// The key prefix of a lock's timeout keys: `{key}`, or the key itself when it has a `{`
/// (Redisson's `suffixName` without the suffix).
fn timeout_base(key: &str) -> String {
    if key.contains('{') {
        key.to_owned()
    } else {
        format!("{{{key}}}")
    }
}

/// The read half's release and renewal.
struct ReadHalf(Arc<Base>);

/// The write half's release and renewal.
struct WriteHalf(Arc<Base>);

/// The read half of a [`ReadWriteLock`]: shared holds.
#[derive(Clone)]
pub struct ReadLock {
    half: Arc<ReadHalf>,
    owner: Option<Arc<str>>,
}

/// The write half of a [`ReadWriteLock`]: the exclusive hold.
#[derive(Clone)]
pub struct WriteLock {
    half: Arc<WriteHalf>,
    owner: Option<Arc<str>>,
}

/// A read hold of a [`ReadWriteLock`].
pub type ReadGuard = Guard<ReadLock>;

/// The write hold of a [`ReadWriteLock`].
pub type WriteGuard = Guard<WriteLock>;

impl ReadWriteLock {
    pub(crate) fn new(client: Arc<ClientInner>, name: &str) -> ReadWriteLock {
        let named = Named::new(client, name);
        let channel = crate::kinds::prefix_name(CHANNEL_PREFIX, &named.key);
        let timeout_base = timeout_base(&named.key).into();
        let base = Arc::new(Base {
            named,
            channel,
            timeout_base,
        });
        ReadWriteLock {
            read: Arc::new(ReadHalf(base.clone())),
            write: Arc::new(WriteHalf(base)),
        }
    }

    /// Waits until the lock is free — no reader and no writer — **without taking it**: the
    /// waiting side of a single-flight guard whose computing side takes the write half. The
    /// unlock message that frees the lock (the writer's, or the last reader's) wakes every
    /// waiter at once; see [`Lock::wait_until_free`](crate::Lock::wait_until_free) for the
    /// recipe and its limits.
    ///
    /// # Cancel safety
    ///
    /// Nothing is taken; dropping the future leaves no subscription behind.
    pub async fn wait_until_free(&self) -> Result<()> {
        crate::engine::free::until_free(&self.read(), None)
            .await
            .map(drop)
    }

    /// [`wait_until_free`](Self::wait_until_free), for at most `wait`: `true` once the lock
    /// is free, `false` when the wait ran out first.
    pub async fn wait_until_free_for(&self, wait: std::time::Duration) -> Result<bool> {
        crate::engine::free::until_free(&self.read(), Some(wait)).await
    }

    /// The read half: shared holds, excluded by a writer.
    pub fn read(&self) -> ReadLock {
        ReadLock {
            half: self.read.clone(),
            owner: None,
        }
    }

    /// The write half: the exclusive hold.
    pub fn write(&self) -> WriteLock {
        WriteLock {
            half: self.write.clone(),
            owner: None,
        }
    }

    /// The lock's name as given.
    pub fn name(&self) -> &str {
        self.read.0.named.name()
    }

    /// The Redis key of the lock's hash (the name after the client's key prefix).
    pub fn key(&self) -> &str {
        &self.read.0.named.key
    }

    /// The channel both halves' unlock messages travel on (`redisson_rwlock:{name}`).
    pub fn channel(&self) -> &str {
        &self.read.0.channel
    }
}

/// The methods both halves have (`self.half.0: Arc<Base>`, `self.owner`), documented once.
macro_rules! half_methods {
    () => {
        /// The lock's name as given.
        pub fn name(&self) -> &str {
            &self.half.0.named.name()
        }

        /// The Redis key of the lock's hash (the name after the client's key prefix).
        pub fn key(&self) -> &str {
            &self.half.0.named.key
        }

        /// The channel both halves' unlock messages travel on (`redisson_rwlock:{name}`).
        pub fn channel(&self) -> &str {
            &self.half.0.channel
        }

        /// This handle acting as an explicit `owner`: every acquisition through it is that
        /// owner's, wherever it runs (to re-enter, from another task or process, a hold whose
        /// owner was passed on).
        pub fn with_owner(&self, owner: Owner) -> Self {
            Self {
                half: self.half.clone(),
                owner: Some(owner.to_string().into()),
            }
        }

        /// The owner this handle acts as right now: its explicit owner, else the owner of
        /// the hold of this lock (either half) whose scope the caller runs in (see
        /// [`Guard::run`](crate::Guard::run)); `None` outside every such scope, where an
        /// acquisition is a new owner.
        pub fn owner(&self) -> Option<Owner> {
            self.half.0.named.owner(self.owner.as_ref())
        }

        /// Whether [`owner`](Self::owner) holds this half: with no explicit owner, whether
        /// the caller runs inside the scope of a hold of this lock that holds it.
        pub async fn is_held_in_scope(&self) -> Result<bool> {
            Ok(self.hold_count().await? > 0)
        }
    };
}

impl ReadLock {
    acquire_methods!(ReadLock);
    half_methods!();

    /// The read reentry count of [`owner`](Self::owner) (0 when it holds no read hold, or
    /// there is none).
    pub async fn hold_count(&self) -> Result<u32> {
        let (reads, _) = self.half.0.counts(self.owner.as_ref()).await?;
        Ok(reads.clamp(0, i64::from(u32::MAX)) as u32)
    }

    /// Whether the lock is held for reading (Redisson's meaning): in read mode, or in write
    /// mode with read holds of the writer besides its write hold.
    pub async fn is_locked(&self) -> Result<bool> {
        let base = &self.half.0;
        let (mode, len, _, _) = base.state("").await?;
        Ok(mode == "read" || (mode == "write" && len > 2))
    }

    /// Deletes the lock if it is in read mode, whoever holds it, and wakes its waiters
    /// (message `0`): `true` when it was deleted. A lock in write mode is left alone (as
    /// Redisson's read-lock `forceUnlock`). The holders' guards then report
    /// [`lost`](crate::Guard::lost). A key that is not a lock is refused with
    /// [`Error::WrongType`], never deleted.
    pub async fn force_unlock(&self) -> Result<bool> {
        self.half.0.force_unlock("read", READ_UNLOCK_MESSAGE).await
    }
}

impl WriteLock {
    acquire_methods!(WriteLock);
    half_methods!();

    /// The write reentry count of [`owner`](Self::owner) (0 when it does not hold the write
    /// lock, or there is none).
    pub async fn hold_count(&self) -> Result<u32> {
        let (_, writes) = self.half.0.counts(self.owner.as_ref()).await?;
        Ok(writes.clamp(0, i64::from(u32::MAX)) as u32)
    }

    /// Whether the lock is held for writing (in write mode).
    pub async fn is_locked(&self) -> Result<bool> {
        let base = &self.half.0;
        let (mode, _, _, _) = base.state("").await?;
        Ok(mode == "write")
    }

    /// Deletes the lock if it is in write mode, whoever holds it, and wakes every waiter
    /// (message `1`): `true` when it was deleted. A lock in read mode is left alone (as
    /// Redisson's write-lock `forceUnlock`). A key that is not a lock is refused with
    /// [`Error::WrongType`], never deleted.
    pub async fn force_unlock(&self) -> Result<bool> {
        self.half
            .0
            .force_unlock("write", WRITE_UNLOCK_MESSAGE)
            .await
    }
}

impl std::fmt::Debug for ReadWriteLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadWriteLock")
            .field("name", &self.read.0.named.name())
            .finish()
    }
}

impl std::fmt::Debug for ReadLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadLock")
            .field("name", &self.half.0.named.name())
            .field("owner", &self.owner)
            .finish()
    }
}

impl std::fmt::Debug for WriteLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteLock")
            .field("name", &self.half.0.named.name())
            .field("owner", &self.owner)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn suffix_name(name: &str, suffix: &str) -> String {
        // Redisson's suffixName, restated for the check below.
        if name.contains('{') {
            format!("{name}:{suffix}")
        } else {
            format!("{{{name}}}:{suffix}")
        }
    }

    #[test]
    fn timeout_keys_follow_suffix_name() {
        assert_eq!(timeout_base("catalog"), "{catalog}");
        assert_eq!(timeout_base("{user}:a"), "{user}:a");
        for name in ["catalog", "{user}:a", "a:{b}:c", "x{"] {
            assert_eq!(
                format!("{}:u-1:7:rwlock_timeout", timeout_base(name)),
                format!("{}:rwlock_timeout", suffix_name(name, "u-1:7"))
            );
        }
    }

    #[test]
    fn public_types_move_between_tasks() {
        fn send_static<T: Send + 'static>() {}
        fn sync<T: Sync>() {}
        send_static::<ReadGuard>();
        send_static::<WriteGuard>();
        send_static::<ReadWriteLock>();
        sync::<ReadWriteLock>();
        sync::<ReadLock>();
        sync::<WriteLock>();
    }
}
