//! [`Lock`]: a reentrant distributed lock on one Redis key, and its acquire loop.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use fred::interfaces::{HashesInterface, KeysInterface};
use tokio::time::Instant;
use tracing::Instrument;

use crate::client::ClientInner;
use crate::config::MAX_LEASE;
use crate::guard::LockGuard;
use crate::owner::{current_owner_number, Owner};
use crate::watchdog::Lease;
use crate::{Error, Result};

/// The longest lock name accepted.
pub const MAX_NAME_LEN: usize = 64 * 1024;

/// How long a parked waiter pauses before retrying after a connection error or timeout.
const RETRY_AFTER_ERROR_MS: u64 = 200;

/// Prefix of every lock channel (Redisson's `redisson_lock__channel`).
const CHANNEL_PREFIX: &str = "redisson_lock__channel";

/// The channel unlock messages of `key` travel on: the key in braces, so both hash to the
/// same cluster slot — unless the key already has a `{`, whose hash tag then already decides
/// (Redisson's `prefixName`).
pub(crate) fn channel_name(key: &str) -> String {
    if key.contains('{') {
        format!("{CHANNEL_PREFIX}:{key}")
    } else {
        format!("{CHANNEL_PREFIX}:{{{key}}}")
    }
}

/// Converts a lease to the milliseconds Redis takes, refusing what it cannot take.
pub(crate) fn lease_millis(lease: Duration) -> Result<i64> {
    if lease < Duration::from_millis(1) {
        return Err(Error::InvalidArgument(format!(
            "lease {lease:?} is shorter than 1 ms"
        )));
    }
    if lease > MAX_LEASE {
        return Err(Error::InvalidArgument(format!(
            "lease {lease:?} is longer than Redis accepts ({MAX_LEASE:?})"
        )));
    }
    Ok(lease.as_millis() as i64)
}

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
/// The owner number is the current tokio task's id (see [`Owner`]): nested `lock()` calls in
/// one task re-enter and must each be released; other tasks, in this process or another, wait.
///
/// Waiting costs Redis almost nothing: a waiter subscribes to the lock's channel through the
/// client's shared subscriber, re-checks once, and parks until an unlock message wakes it —
/// or until the lock's remaining lease (PTTL) runs out, so a lost message costs at most one
/// lease, never a hang.
///
/// # Cancellation safety
///
/// Every acquiring method is cancellation safe: dropping its future at any point leaves no
/// lock held and no subscription behind. An acquire round trip dropped in flight is finished
/// in a spawned task, and if it took the lock, the hold is released again at once. A waiter
/// that was woken and then gives up hands its wake-up to the next waiter.
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
/// let inner = lock.lock().await?;          // same task: re-enters
/// assert_eq!(lock.hold_count().await?, 2);
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
    shared: Arc<Shared>,
    owner: Option<Arc<str>>,
}

pub(crate) struct Shared {
    pub(crate) client: Arc<ClientInner>,
    pub(crate) name: String,
    pub(crate) key: Arc<str>,
    pub(crate) channel: Arc<str>,
    invalid: Option<String>,
}

/// Outcome of one acquire round trip.
enum Attempt {
    Acquired(LockGuard),
    /// Held by another owner for this many more milliseconds.
    Held(u64),
}

impl Lock {
    pub(crate) fn new(client: Arc<ClientInner>, name: &str) -> Lock {
        let invalid = if name.is_empty() {
            Some("lock name is empty".to_owned())
        } else if name.len() > MAX_NAME_LEN {
            Some(format!(
                "lock name is {} bytes long; the limit is {MAX_NAME_LEN}",
                name.len()
            ))
        } else {
            None
        };
        let key = format!("{}{name}", client.config.key_prefix);
        let channel = channel_name(&key);
        Lock {
            shared: Arc::new(Shared {
                client,
                name: name.to_owned(),
                key: key.into(),
                channel: channel.into(),
                invalid,
            }),
            owner: None,
        }
    }

    /// The lock's name as given.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The Redis key of the lock (the name after the client's key prefix).
    pub fn key(&self) -> &str {
        &self.shared.key
    }

    /// The channel its unlock messages travel on.
    pub fn channel(&self) -> &str {
        &self.shared.channel
    }

    /// This handle acting as an explicit `owner` instead of the current task.
    ///
    /// Use it to release in another task than the one that locked, or to re-enter a hold
    /// that another process passed on (the command-line tool's `REDBATON_OWNER`).
    pub fn with_owner(&self, owner: Owner) -> Lock {
        Lock {
            shared: self.shared.clone(),
            owner: Some(owner.to_string().into()),
        }
    }

    /// The owner this handle acts as right now.
    pub fn owner(&self) -> Owner {
        match &self.owner {
            Some(field) => field
                .parse()
                .expect("explicit owners are parsed on the way in"),
            None => Owner::new(&self.shared.client.id, current_owner_number()),
        }
    }

    fn owner_field(&self) -> Arc<str> {
        match &self.owner {
            Some(field) => field.clone(),
            None => format!("{}:{}", self.shared.client.id, current_owner_number()).into(),
        }
    }

    pub(crate) fn check(&self) -> Result<()> {
        if self.shared.client.is_closed() {
            return Err(Error::ShutDown);
        }
        match &self.shared.invalid {
            Some(why) => Err(Error::InvalidArgument(why.clone())),
            None => Ok(()),
        }
    }

    fn error(&self, err: fred::error::Error) -> Error {
        self.shared.client.error(err, &self.shared.name)
    }

    /// Acquires the lock, waiting as long as it takes; the watchdog keeps the lease until the
    /// guard is released.
    pub async fn lock(&self) -> Result<LockGuard> {
        let guard = self.acquire(None, Lease::Watchdog).await?;
        Ok(guard.expect("waiting without a deadline ends only in a guard or an error"))
    }

    /// Acquires the lock for a fixed `lease`, waiting as long as it takes. The lease is never
    /// renewed: past it the lock expires, and the guard reports [`lost`](LockGuard::lost).
    pub async fn lock_with_lease(&self, lease: Duration) -> Result<LockGuard> {
        let lease = Lease::Fixed(lease_millis(lease)?);
        let guard = self.acquire(None, lease).await?;
        Ok(guard.expect("waiting without a deadline ends only in a guard or an error"))
    }

    /// One attempt, no waiting: `None` when another owner holds the lock.
    pub async fn try_lock(&self) -> Result<Option<LockGuard>> {
        self.acquire(Some(Duration::ZERO), Lease::Watchdog).await
    }

    /// Waits up to `wait` for the lock: `None` when the wait ran out. `Duration::MAX` waits
    /// forever; `Duration::ZERO` is [`try_lock`](Lock::try_lock).
    pub async fn try_lock_for(&self, wait: Duration) -> Result<Option<LockGuard>> {
        self.acquire(Some(wait), Lease::Watchdog).await
    }

    /// Waits up to `wait` for the lock, taken for a fixed `lease` (never renewed).
    pub async fn try_lock_with_lease(
        &self,
        wait: Duration,
        lease: Duration,
    ) -> Result<Option<LockGuard>> {
        let lease = Lease::Fixed(lease_millis(lease)?);
        self.acquire(Some(wait), lease).await
    }

    /// The acquire loop shared by every public method. `wait` None = no deadline.
    async fn acquire(&self, wait: Option<Duration>, lease: Lease) -> Result<Option<LockGuard>> {
        self.check()?;
        let owner = self.owner_field();
        let span = tracing::trace_span!("acquire", lock = %self.shared.name, owner = %owner);
        self.acquire_as(owner, wait, lease).instrument(span).await
    }

    async fn acquire_as(
        &self,
        owner: Arc<str>,
        wait: Option<Duration>,
        lease: Lease,
    ) -> Result<Option<LockGuard>> {
        let client = &self.shared.client;
        let start = Instant::now();
        // Instant + Duration::MAX would overflow: such a wait has no deadline.
        let deadline = wait.and_then(|w| start.checked_add(w));

        // If the channel is already subscribed and confirmed before the first attempt, any
        // unlock after that attempt reaches this process: the re-check can be skipped.
        let early = client.hub.confirmed_channel(&self.shared.channel);
        let mut generation = client.hub.generation();
        generation.borrow_and_update();

        let mut held_for = match self.attempt(&owner, lease).await? {
            Attempt::Acquired(guard) => return Ok(Some(guard)),
            Attempt::Held(pttl) => pttl,
        };
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(None);
        }

        let subscription = client.hub.subscribe(&self.shared.channel);
        let skip_recheck = early
            .as_ref()
            .is_some_and(|ch| Arc::ptr_eq(ch, subscription.channel()))
            && !generation.has_changed().unwrap_or(true);
        if !skip_recheck {
            // Bounded like any wait: a subscriber that is down costs at most the PTTL.
            let bound = park_time(held_for, deadline);
            tokio::select! {
                _ = subscription.channel().confirmed() => {}
                _ = tokio::time::sleep(bound) => {
                    tracing::debug!(lock = %self.shared.name, "subscription not confirmed in time");
                }
            }
        }
        tracing::trace!(lock = %self.shared.name, pttl = held_for, "waiting");

        let mut recheck = !skip_recheck;
        let mut woken = false;
        let mut failing_since: Option<Instant> = None;
        loop {
            if recheck {
                generation.borrow_and_update();
                match self.attempt(&owner, lease).await {
                    Ok(Attempt::Acquired(guard)) => {
                        if woken {
                            tracing::debug!(lock = %self.shared.name, waited = ?start.elapsed(), "acquired after wake-up");
                        }
                        return Ok(Some(guard));
                    }
                    Ok(Attempt::Held(pttl)) => {
                        held_for = pttl;
                        failing_since = None;
                    }
                    Err(e) if e.is_transient() => {
                        // Parked waiters ride out a restart or failover, within a bound.
                        if woken {
                            subscription.pass_on();
                        }
                        let since = *failing_since.get_or_insert_with(Instant::now);
                        if since.elapsed() > client.watchdog.lease() {
                            return Err(e);
                        }
                        tracing::debug!(lock = %self.shared.name, error = %e, "retrying after error");
                        held_for = RETRY_AFTER_ERROR_MS;
                    }
                    Err(e) => {
                        if woken {
                            subscription.pass_on();
                        }
                        return Err(e);
                    }
                }
            }
            recheck = true;
            woken = false;
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(None);
            }
            let bound = park_time(held_for, deadline);
            tokio::select! {
                biased;
                _ = subscription.notified() => woken = true,
                _ = generation.changed() => {}
                _ = tokio::time::sleep(bound) => {}
            }
            if client.is_closed() {
                return Err(Error::ShutDown);
            }
            if woken && deadline.is_some_and(|d| Instant::now() >= d) {
                subscription.pass_on();
                return Ok(None);
            }
        }
    }

    /// One run of the lock script. If the caller is cancelled while the round trip is in
    /// flight, the round trip is finished in a task of its own, which releases the lock if
    /// the script took it — never a hold nobody knows about. (Run inline rather than always
    /// spawned: a spawn and a channel hop cost two task wake-ups on every attempt.)
    async fn attempt(&self, owner: &Arc<str>, lease: Lease) -> Result<Attempt> {
        let lock = self.clone();
        let owner = owner.clone();
        let round_trip = async move {
            let client = &lock.shared.client;
            let lease_ms = lease.millis(client.watchdog.lease());
            let sent_at = Instant::now();
            let reply = client
                .scripts
                .lock(&client.redis, &lock.shared.key, &owner, lease_ms)
                .await;
            match reply {
                Ok(None) => {
                    let guard = LockGuard::new(lock.clone(), owner, lease, sent_at);
                    if client.is_closed() {
                        let _ = guard.unlock().await;
                        Err(Error::ShutDown)
                    } else {
                        tracing::trace!(lock = %lock.shared.name, "acquired");
                        Ok(Attempt::Acquired(guard))
                    }
                }
                Ok(Some(pttl)) if pttl >= 0 => Ok(Attempt::Held(pttl as u64)),
                Ok(Some(_)) => Err(Error::WrongType {
                    name: lock.shared.name.clone(),
                    detail: "a hash without the expiry every lock has".to_owned(),
                }),
                Err(e) => Err(lock.error(e)),
            }
        };
        FinishOnDrop {
            round_trip: Some(Box::pin(round_trip)),
            lock: self.clone(),
        }
        .await
    }

    /// This owner's reentry count (0 when it does not hold the lock).
    pub async fn hold_count(&self) -> Result<u32> {
        self.check()?;
        let client = &self.shared.client;
        let count: Option<i64> = client
            .redis
            .hget(&*self.shared.key, &*self.owner_field())
            .await
            .map_err(|e| self.error(e))?;
        Ok(count.unwrap_or(0).clamp(0, i64::from(u32::MAX)) as u32)
    }

    /// Whether anyone holds the lock.
    pub async fn is_locked(&self) -> Result<bool> {
        self.check()?;
        let exists: i64 = self
            .shared
            .client
            .redis
            .exists(&*self.shared.key)
            .await
            .map_err(|e| self.error(e))?;
        Ok(exists > 0)
    }

    /// Whether this owner (by default the current task) holds the lock.
    pub async fn is_held_by_current_task(&self) -> Result<bool> {
        self.check()?;
        self.shared
            .client
            .redis
            .hexists(&*self.shared.key, &*self.owner_field())
            .await
            .map_err(|e| self.error(e))
    }

    /// How long the lock's lease has left; `None` when it is not locked.
    pub async fn remaining_ttl(&self) -> Result<Option<Duration>> {
        self.check()?;
        let pttl: i64 = self
            .shared
            .client
            .redis
            .pttl(&*self.shared.key)
            .await
            .map_err(|e| self.error(e))?;
        match pttl {
            -2 => Ok(None),
            ms if ms >= 0 => Ok(Some(Duration::from_millis(ms as u64))),
            _ => Err(Error::WrongType {
                name: self.shared.name.clone(),
                detail: "a key without the expiry every lock has".to_owned(),
            }),
        }
    }

    /// Deletes the lock whoever holds it and wakes its waiters: `true` when it was held.
    /// The holder's guard then reports [`lost`](LockGuard::lost). A key that is not a lock is
    /// refused with [`Error::WrongType`], never deleted.
    pub async fn force_unlock(&self) -> Result<bool> {
        self.check()?;
        let client = &self.shared.client;
        let deleted = client
            .scripts
            .force_unlock(
                &client.redis,
                &self.shared.key,
                &self.shared.channel,
                client.publish_command(),
            )
            .await
            .map_err(|e| self.error(e))?;
        if deleted {
            tracing::info!(lock = %self.shared.name, "force-unlocked");
        }
        Ok(deleted)
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }
}

/// An acquire round trip that, if dropped before it finished, is finished in a spawned task
/// that releases the lock should the script have taken it.
struct FinishOnDrop<F: Future<Output = Result<Attempt>> + Send + 'static> {
    round_trip: Option<Pin<Box<F>>>,
    lock: Lock,
}

impl<F: Future<Output = Result<Attempt>> + Send + 'static> Future for FinishOnDrop<F> {
    type Output = Result<Attempt>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(round_trip) = self.round_trip.as_mut() else {
            return Poll::Ready(Err(Error::ShutDown));
        };
        let outcome = ready!(round_trip.as_mut().poll(cx));
        self.round_trip = None;
        Poll::Ready(outcome)
    }
}

impl<F: Future<Output = Result<Attempt>> + Send + 'static> Drop for FinishOnDrop<F> {
    fn drop(&mut self) {
        let Some(round_trip) = self.round_trip.take() else {
            return;
        };
        let lock = self.lock.clone();
        let runtime = lock.shared.client.runtime.clone();
        runtime.spawn(async move {
            if let Ok(Attempt::Acquired(guard)) = round_trip.await {
                tracing::debug!(lock = %lock.shared.name, "acquire cancelled after the lock was taken; releasing");
                if let Err(e) = guard.unlock().await {
                    tracing::warn!(lock = %lock.shared.name, error = %e, "could not release a cancelled acquire; it expires with its lease");
                }
            }
        });
    }
}

/// How long a waiter parks: the holder's remaining lease, capped by the caller's deadline.
fn park_time(held_for_ms: u64, deadline: Option<Instant>) -> Duration {
    let lease_left = Duration::from_millis(held_for_ms.max(1));
    match deadline {
        Some(d) => lease_left.min(d.saturating_duration_since(Instant::now())),
        None => lease_left,
    }
}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock")
            .field("name", &self.shared.name)
            .field("owner", &self.owner)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_names_follow_redisson() {
        assert_eq!(
            channel_name("order:42"),
            "redisson_lock__channel:{order:42}"
        );
        assert_eq!(channel_name("{user}:a"), "redisson_lock__channel:{user}:a");
    }

    #[test]
    fn leases_are_checked() {
        assert!(lease_millis(Duration::ZERO).is_err());
        assert!(lease_millis(Duration::from_micros(999)).is_err());
        assert_eq!(lease_millis(Duration::from_millis(1)).unwrap(), 1);
        assert!(lease_millis(Duration::MAX).is_err());
        assert!(lease_millis(MAX_LEASE).is_ok());
    }
}
