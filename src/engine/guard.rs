//! [`Guard`]: proof of one hold of a lock, released on drop.

use std::future::Future;
use std::sync::Arc;

use tokio::time::Instant;

use crate::engine::call::Finish;
use crate::engine::holds::{Entry, Lease, Registered};
use crate::engine::kind::Kind;
use crate::engine::release::release;
use crate::owner::Owner;
use crate::{Error, Result};

/// One hold of a lock of kind `K` — [`LockGuard`](crate::LockGuard) for a [`Lock`](crate::Lock).
/// Release it with [`unlock`](Guard::unlock); dropping it releases it too, in a background
/// task (logged at `debug`).
///
/// A guard is `Send + 'static`: it can move into a spawned task and be released there — the
/// release acts as the owner that acquired it, wherever it runs.
///
/// A guard is one hold of one owner. Code that must take the same lock again while holding it
/// (re-entry) does so in the hold's scope — [`run`](Guard::run) polls a future inside it — or
/// with [`reenter`](Guard::reenter); any other acquire is another owner and waits for this
/// hold, even in the same task (as with `tokio::sync::Mutex`).
///
/// While the guard lives, the lock may still be *lost*: a fixed lease ran out, another client
/// force-unlocked it, or the watchdog could not renew it for a whole lease (Redis unreachable).
/// [`lost`](Guard::lost) resolves when that happens, so work can stop before it writes:
///
/// ```no_run
/// # async fn run(lock: redbaton::Lock) -> redbaton::Result<()> {
/// # async fn work() {}
/// let guard = lock.lock().await?;
/// tokio::select! {
///     _ = guard.lost() => eprintln!("lease lost; abandoning the work"),
///     _ = work() => guard.unlock().await?,
/// }
/// # Ok(()) }
/// ```
#[must_use = "dropping the guard releases the lock at once; bind it (`let _guard = ...`) for as long as the lock must be held"]
pub struct Guard<K: Kind> {
    kind: K,
    hold: Hold,
    extra: K::Extra,
    released: bool,
}

/// What releasing needs, movable into a background task.
#[derive(Clone)]
pub(crate) struct Hold {
    pub(crate) field: Arc<str>,
    pub(crate) entry: Arc<Entry>,
    pub(crate) generation: u64,
    pub(crate) lease: Lease,
    /// Where a fixed lease ends by the local clock.
    expires: Option<Instant>,
}

impl<K: Kind> Guard<K> {
    pub(crate) fn new(
        kind: K,
        field: Arc<str>,
        registered: Registered,
        lease: Lease,
        sent_at: Instant,
        extra: K::Extra,
    ) -> Self {
        let expires = match lease {
            Lease::Watchdog => None,
            Lease::Fixed(ms) => sent_at.checked_add(std::time::Duration::from_millis(ms as u64)),
        };
        Guard {
            kind,
            hold: Hold {
                field,
                entry: registered.entry,
                generation: registered.generation,
                lease,
                expires,
            },
            extra,
            released: false,
        }
    }

    /// This guard, as a handle of the waiter it was passed to: the same lock, that waiter's
    /// own handle (its explicit owner, if any).
    pub(crate) fn adopt(mut self, kind: K) -> Self {
        self.kind = kind;
        self.hold.entry.held_here();
        self
    }

    /// Releases this hold. With reentry, the lock stays held until every hold is released.
    ///
    /// Returns [`Error::NotHeld`] when the lock was lost meanwhile (expired, force-unlocked,
    /// renewal failed): then no release is sent, since the same owner may hold the lock anew.
    /// (A read/write lock's hold can outlive its lease in Redis, kept alive by other holds on
    /// its hash: what is left of the lost hold is then removed in the background, and only
    /// that — the holds its owner took anew stay.)
    ///
    /// If Redis does not confirm the release within the command timeout, or the connection
    /// fails, the error is returned, and the release goes on in the background: it is retried
    /// until Redis answers (or, past a few command timeouts, the lease is left to end it). The
    /// watchdog stops renewing this hold either way.
    ///
    /// # Cancel safety
    ///
    /// Calling `unlock` gives the hold up whether or not its future is awaited to the end.
    /// Dropped before its first poll, the future drops the guard, which releases the hold in
    /// the background; dropped later, with the release round trip in flight, the round trip
    /// is finished in a background task (the script may already have run on the server). No
    /// outcome is lost, but a dropped caller does not learn of an error: it is logged at
    /// `debug`, and the lease ends a hold that could not be released.
    pub async fn unlock(mut self) -> Result<()> {
        self.released = true;
        let conn = self.kind.named().client.conn.clone();
        let release = release(self.kind.clone(), self.hold.clone(), self.extra);
        Finish::new(release, &conn).await
    }

    /// Resolves when the lease is lost. Never resolves while the lock is held.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only watches.
    pub async fn lost(&self) {
        let hold_lost = self.hold.entry.lost(self.hold.generation);
        match self.hold.expires {
            Some(at) => {
                tokio::select! {
                    _ = hold_lost => {}
                    _ = tokio::time::sleep_until(at) => {}
                }
            }
            None => hold_lost.await,
        }
    }

    /// Runs the future `f` makes while this hold lasts, and returns its output — or
    /// [`Error::LeaseLost`] if the lease is lost first: the future is then dropped at the await
    /// point it reached, so the work stops there. When the lease is already lost, `f` is not
    /// called.
    ///
    /// This is the helper for a guard acquired in any way (a bounded wait, a fixed lease); a
    /// lock's own `run` ([`Lock::run`](crate::Lock::run)) acquires and releases around it. The
    /// guard is not released here: unlock it afterwards, and see its errors there.
    ///
    /// The future runs in the task awaiting `run` — it is not spawned, so it need not be
    /// `Send` or `'static`, and may borrow the guard (a fenced token, say). It runs inside this
    /// hold's *scope*: an acquire of the same lock made while it is polled re-enters this hold
    /// (and, on a read/write lock, a read under the write half is the downgrade), while a
    /// sibling future polled beside it (`join!`, `select!`) is another owner and waits. A
    /// loss is checked before each poll of the future, so a future that completes once the
    /// loss is known is not reported as done. The client learns of a loss on the server only at
    /// the next renewal, though (see [`Error::LeaseLost`]).
    ///
    /// ```no_run
    /// # async fn example(lock: redbaton::Lock) -> redbaton::Result<()> {
    /// use std::time::Duration;
    /// # async fn rebuild_index() -> usize { 0 }
    /// if let Some(guard) = lock.try_lock_for(Duration::from_secs(2)).await? {
    ///     match guard.run(rebuild_index).await {
    ///         Ok(entries) => println!("rebuilt {entries} entries"),
    ///         Err(redbaton::Error::LeaseLost { .. }) => eprintln!("lease lost; rebuild cancelled"),
    ///         Err(e) => return Err(e),
    ///     }
    ///     guard.unlock().await?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Dropping the `run` future drops `f`'s future at its current await point, as cancelling
    /// any future does, and nothing else: the guard is untouched and still holds the lock.
    pub async fn run<F, Fut, T>(&self, f: F) -> Result<T>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
    {
        let scoped = || self.scoped(f());
        until_lost(
            self.is_lost(),
            self.lost(),
            scoped,
            self.kind.named().name(),
        )
        .await
    }

    /// Takes this lock again as this hold's owner: a nested hold on the same owner field (its
    /// count goes up by one; each hold is released on its own), with this hold's kind of
    /// lease. It never waits: [`Error::NotHeld`] when this hold is lost (the lock may be
    /// someone else's by now).
    ///
    /// This is the explicit form of re-entry, for code that keeps guards rather than running
    /// closures: inside [`run`](Guard::run) an ordinary acquire of the same lock re-enters too.
    /// Without either, a second acquire is a new owner and waits for this hold, as with
    /// `tokio::sync::Mutex`, which is not re-entrant at all.
    ///
    /// ```no_run
    /// # async fn example(lock: redbaton::Lock) -> redbaton::Result<()> {
    /// let outer = lock.lock().await?;
    /// let inner = outer.reenter().await?; // hold count 2, one owner
    /// inner.unlock().await?;
    /// outer.unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// As a `try_lock`'s: a nested hold a dropped call took is released at once in the
    /// background.
    #[must_use = "the guard holds the lock: dropping it at once releases the lock again"]
    pub async fn reenter(&self) -> Result<Guard<K>> {
        let not_held = || Error::NotHeld {
            name: self.kind.named().name().to_owned(),
        };
        if self.is_lost() {
            return Err(not_held());
        }
        let zero = Some(std::time::Duration::ZERO);
        let again = crate::engine::acquire::acquire(&self.kind, zero, self.hold.lease);
        self.scoped(again).await?.ok_or_else(not_held)
    }

    /// `future`, polled inside this hold's scope: an acquire of the same lock made while it
    /// is polled re-enters this hold. A hold of an explicit owner of another client has no
    /// scope (its own handle re-enters it).
    fn scoped<F: Future>(&self, future: F) -> impl Future<Output = F::Output> {
        crate::engine::scope::within(self.scope(), future)
    }

    /// This hold as a scope names it, if it has one (see [`scoped`](Guard::scoped)).
    pub(crate) fn scope(&self) -> Option<crate::engine::scope::Scoped> {
        let named = self.kind.named();
        let number = self.own_number()?;
        Some((named.client.id.clone(), named.key.clone(), number))
    }

    /// This hold's owner number when its owner is this client's own.
    fn own_number(&self) -> Option<u64> {
        let owner = self.kind.owner_part(&self.hold.field);
        let id = &self.kind.named().client.id;
        owner.strip_prefix(&**id)?.strip_prefix(':')?.parse().ok()
    }

    /// A lock's `run` once acquired: [`run`](Guard::run), then release.
    pub(crate) async fn run_and_unlock<F, Fut, T>(self, f: F) -> Result<T>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
    {
        let outcome = self.run(f).await;
        let name = self.kind.named().name().to_owned();
        release_after(outcome, self.unlock(), &name).await
    }

    /// When the lease was lost: `None` while it is valid; once lost, the instant it stopped
    /// being known valid by this process — the end of its validity by the local monotonic
    /// clock (the last acknowledged acquire or renewal's *send* time plus its lease, less 1 % of
    /// the lease + 2 ms for the clocks' rates, so never later than the expiry Redis set), or
    /// the moment Redis's word that it was gone arrived, whichever came first.
    ///
    /// [`lost()`](Guard::lost) resolves at that instant or, as any wake-up, a little after
    /// it: this is the instant to log, or to compare with what other holders did.
    ///
    /// ```no_run
    /// # async fn example(guard: redbaton::LockGuard) {
    /// guard.lost().await;
    /// if let Some(at) = guard.lost_at() {
    ///     eprintln!("lease lost {:?} ago", at.elapsed());
    /// }
    /// # }
    /// ```
    pub fn lost_at(&self) -> Option<std::time::Instant> {
        let expired = self.hold.expires.filter(|at| Instant::now() >= *at);
        let ended = self.hold.entry.ended_at(self.hold.generation);
        match (expired, ended) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
        .map(Instant::into_std)
    }

    /// Whether the lease is lost (by Redis's word or by the local clock).
    pub fn is_lost(&self) -> bool {
        self.hold.expires.is_some_and(|at| Instant::now() >= at)
            || self.hold.entry.is_lost(self.hold.generation)
    }

    /// The owner this hold belongs to (`<client uuid>:<number>`, the hash field in Redis).
    ///
    /// Whoever has the owner can re-enter this hold (with
    /// [`with_owner`](crate::Lock::with_owner)), in this process or another, so once it is
    /// read, this hold's release passes the lock on with a write under the next holder's own
    /// owner, never in memory under this one's (see [`Lock`](crate::Lock)).
    pub fn owner(&self) -> Owner {
        self.hold.entry.give_out(self.hold.generation);
        self.kind
            .owner_part(&self.hold.field)
            .parse()
            .expect("owner fields are always well-formed")
    }

    /// The lock this guard holds.
    pub fn lock(&self) -> &K {
        &self.kind
    }

    pub(crate) fn extra(&self) -> K::Extra {
        self.extra
    }

    /// The hold's field in Redis.
    pub(crate) fn field(&self) -> &str {
        &self.hold.field
    }
}

/// Runs `f`'s future until it completes or `lost` resolves (a guard's `run`). The loss is
/// polled first, so work is not credited with a completion after the loss was known; `f` is
/// not called at all when `already_lost`.
pub(crate) async fn until_lost<F, Fut, T>(
    already_lost: bool,
    lost: impl Future<Output = ()>,
    f: F,
    name: &str,
) -> Result<T>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = T>,
{
    let lease_lost = || Error::LeaseLost {
        name: name.to_owned(),
    };
    if already_lost {
        return Err(lease_lost());
    }
    let work = f();
    tokio::select! {
        biased;
        () = lost => Err(lease_lost()),
        value = work => Ok(value),
    }
}

/// The end of a lock's `run`: awaits `unlock` (the guard's release) and returns `outcome`
/// unchanged. A failed release is logged, not returned — the work is done, and its output
/// must not be lost to a release error — and goes on in the background as `unlock`'s does.
/// A hold already lost is logged at `debug` only: nothing was left to release.
pub(crate) async fn release_after<T>(
    outcome: Result<T>,
    unlock: impl Future<Output = Result<()>>,
    name: &str,
) -> Result<T> {
    match unlock.await {
        Ok(()) => {}
        Err(e @ Error::NotHeld { .. }) => {
            tracing::debug!(lock = %name, error = %e, "run: the hold was lost before its release");
        }
        Err(e) => {
            tracing::warn!(lock = %name, error = %e, "run: releasing the lock after the work failed; it goes on in the background or the lease ends it");
        }
    }
    outcome
}

impl<K: Kind> Drop for Guard<K> {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let name = self.kind.named().name().to_owned();
        tracing::debug!(lock = %name, "guard dropped without unlock(); releasing in the background");
        let kind = self.kind.clone();
        let (hold, extra) = (self.hold.clone(), self.extra);
        let runtime = kind.named().client.conn.runtime().clone();
        runtime.spawn(async move {
            match release(kind, hold, extra).await {
                Ok(()) | Err(Error::NotHeld { .. }) => {}
                Err(e) => tracing::debug!(lock = %name, error = %e, "background release"),
            }
        });
    }
}

impl<K: Kind> std::fmt::Debug for Guard<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("lock", &self.kind.named().name())
            .field("owner", &self.hold.field)
            .field("lost", &self.is_lost())
            .finish()
    }
}
