//! [`MultiLock`]: several locks taken all-or-nothing, and [`MultiLockGuard`], the guard it and
//! [`RedLock`](crate::RedLock) hand out. See [`MultiLock`] for the semantics.

use std::future::Future;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;

use crate::engine::guard::{release_after, until_lost};
use crate::engine::holds::Lease;
use crate::engine::kind::Kind;
use crate::{Error, FairLock, FencedLock, Guard, Lock, Result, WriteLock};

/// A lock kind whose hold is exclusive (one owner at a time), so it can be a part of a
/// [`MultiLock`] or a [`RedLock`](crate::RedLock): [`Lock`], [`FairLock`], [`FencedLock`]
/// (each part's guard carries its own token) and a read/write lock's [`WriteLock`]. Sealed,
/// as [`Kind`] is.
///
/// ```no_run
/// # async fn run(a: redbaton::Client, b: redbaton::Client) -> redbaton::Result<()> {
/// let writes = redbaton::MultiLock::of(vec![
///     a.read_write_lock("catalog").write(),
///     b.read_write_lock("prices").write(),
/// ]);
/// let guard = writes.lock().await?;
/// // ... rewrite both while no one reads either ...
/// guard.unlock().await?;
/// # Ok(()) }
/// ```
pub trait Exclusive: Kind {}

impl Exclusive for Lock {}
impl Exclusive for FairLock {}
impl Exclusive for FencedLock {}
impl Exclusive for WriteLock {}

/// Several locks of one exclusive kind ([`Lock`]s unless said otherwise: see [`Exclusive`])
/// taken all-or-nothing and released together.
///
/// ```no_run
/// # async fn run(a: redbaton::Client, b: redbaton::Client) -> redbaton::Result<()> {
/// let both = redbaton::MultiLock::new(vec![a.lock("account:1"), b.lock("account:2")]);
/// let guard = both.lock().await?;
/// // ... move money between the two accounts ...
/// guard.unlock().await?;
/// # Ok(()) }
/// ```
///
/// A multi-lock is a client-side composition of ordinary locks — any mix of names and
/// clients, so of Redis servers too. It adds nothing to Redis: each part is a plain
/// Redisson-compatible lock of its kind, renewed by its own client's watchdog and released by
/// its own guard. [`MultiLock::new`] takes [`Lock`]s; [`MultiLock::of`] takes the parts of
/// another [`Exclusive`] kind (all of one kind).
///
/// # How it acquires
///
/// It never *waits* while it holds a part. It waits for one part (the first, at the start),
/// then tries every other part once without waiting. When one of them is busy, it releases
/// everything it took and waits for *that* part, holding nothing, then tries the rest again.
/// Two multi-locks over the same parts in different orders therefore cannot deadlock each
/// other, and a waiter costs Redis no more than a single lock's waiter (it parks on the busy
/// part's unlock channel).
///
/// # Reentry
///
/// Each part is reentrant for its owner, which is a hold's scope as for [`Lock`]: inside the
/// guard's [`run`](MultiLockGuard::run) (or with [`reenter`](MultiLockGuard::reenter)) the
/// multi-lock, or any of its parts, is taken again at once; every hold is released on its
/// own. Any other acquisition is a new owner and waits.
///
/// # Differences from Redisson's `RedissonMultiLock`
///
/// - Redisson walks the locks in order and, while holding the first ones, waits for the next
///   with the remaining wait time; redbaton never waits while holding (see above), so
///   competing multi-locks make progress instead of timing out against each other.
/// - With a fixed lease Redisson takes each part with a lease of twice the wait time and
///   shortens them all to the lease at the end (`PEXPIRE`). redbaton takes each part with the
///   lease itself, so the first part taken is the first to expire; the multi-lock counts as
///   lost as soon as any part is lost, and [`MultiLockGuard::lost`] says so.
/// - `unlock()` releases every part and then reports the first error, where Redisson stops at
///   the first failure.
///
/// # The same lock twice
///
/// Two parts must not be the same lock: taken as two owners (through two clients, or with
/// [`Lock::with_owner`]) each part would shut the other out for ever, and through one owner
/// the second would merely re-enter the first. A multi-lock whose list names one lock twice
/// returns [`Error::InvalidArgument`] from every operation, before anything is sent.
///
/// Two parts count as the same lock when they have the same key (name after the client's
/// key prefix) in the same database and their clients' URLs name a common server: the same
/// `host:port` as written (a cluster or Sentinel URL names several; any one in common
/// suffices, and Sentinel URLs must also name the same service). Nothing is looked up, so one
/// server reached under two different host names (`localhost` and `127.0.0.1`) is not
/// recognised — name a server the same way in every client.
#[derive(Clone, Debug)]
pub struct MultiLock<K: Exclusive = Lock> {
    locks: Vec<K>,
    /// Why every operation is refused (the list is empty or names one lock twice).
    invalid: Option<String>,
}

impl MultiLock {
    /// A multi-lock over `locks` (in any order, from any clients). An empty list, or one that
    /// names the same lock twice (see [`MultiLock`]), makes every operation return
    /// [`Error::InvalidArgument`]. For parts of another kind, see [`of`](MultiLock::of).
    pub fn new(locks: Vec<Lock>) -> MultiLock {
        MultiLock::of(locks)
    }
}

impl<K: Exclusive> MultiLock<K> {
    /// A multi-lock over `locks` of any one [`Exclusive`] kind, as [`new`](MultiLock::new)
    /// makes one over [`Lock`]s.
    pub fn of(locks: Vec<K>) -> MultiLock<K> {
        let invalid = refusal(&locks);
        MultiLock { locks, invalid }
    }

    /// The parts, as given.
    pub fn locks(&self) -> &[K] {
        &self.locks
    }

    /// Acquires every part, waiting as long as it takes; each part's client watchdog keeps
    /// its lease.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future at any await point leaves no hold behind: the parts already taken
    /// are guards, dropped with it, that release their locks in the background; the part
    /// being acquired is left as a dropped [`Lock::lock`] leaves it (see its section); a
    /// release of parts in flight (a busy part makes the others go) finishes in the
    /// background as [`Guard::unlock`](crate::Guard::unlock)'s does.
    #[must_use = "the guard holds the locks: dropping it at once releases them again"]
    pub async fn lock(&self) -> Result<MultiLockGuard<K>> {
        let guard = self.acquire(None, None).await?;
        Ok(guard.expect("waiting without a deadline ends only in a guard or an error"))
    }

    /// Acquires every part for a fixed `lease` (never renewed), waiting as long as it takes.
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](Self::lock)'s.
    #[must_use = "the guard holds the locks: dropping it at once releases them again"]
    pub async fn lock_with_lease(&self, lease: Duration) -> Result<MultiLockGuard<K>> {
        let guard = self.acquire(None, Some(lease)).await?;
        Ok(guard.expect("waiting without a deadline ends only in a guard or an error"))
    }

    /// One attempt on every part, no waiting: `None` when any part is held by another owner.
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](Self::lock)'s.
    #[must_use = "the guard holds the locks: dropping it at once releases them again"]
    pub async fn try_lock(&self) -> Result<Option<MultiLockGuard<K>>> {
        self.acquire(Some(Duration::ZERO), None).await
    }

    /// Waits up to `wait` for all parts: `None` when the wait ran out (nothing is held then).
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](Self::lock)'s.
    #[must_use = "the guard holds the locks: dropping it at once releases them again"]
    pub async fn try_lock_for(&self, wait: Duration) -> Result<Option<MultiLockGuard<K>>> {
        self.acquire(Some(wait), None).await
    }

    /// Waits up to `wait` for all parts, each taken for a fixed `lease` (never renewed).
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](Self::lock)'s.
    #[must_use = "the guard holds the locks: dropping it at once releases them again"]
    pub async fn try_lock_with_lease(
        &self,
        wait: Duration,
        lease: Duration,
    ) -> Result<Option<MultiLockGuard<K>>> {
        self.acquire(Some(wait), Some(lease)).await
    }

    /// Acquires every part as [`lock`](Self::lock) does, runs the future `f` makes while
    /// holding them, releases them and returns the future's output — or
    /// [`Error::LeaseLost`] when the hold is lost first (any part lost, see
    /// [`MultiLockGuard::lost`]): the future is then dropped at the await point it reached.
    /// As [`Lock::run`], a failed release after the work is logged, not returned.
    ///
    /// ```no_run
    /// # async fn example(both: redbaton::MultiLock) -> redbaton::Result<()> {
    /// # async fn transfer() {}
    /// both.run(transfer).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// As [`Lock::run`]'s: acquiring as [`lock`](Self::lock)'s, then the work's future and
    /// the guard are dropped, which releases every part in the background.
    pub async fn run<F, Fut, T>(&self, f: F) -> Result<T>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
    {
        self.lock().await?.run_and_unlock(f).await
    }

    fn description(&self) -> String {
        let names: Vec<&str> = self.locks.iter().map(|l| l.named().name()).collect();
        names.join(",")
    }

    async fn acquire(
        &self,
        wait: Option<Duration>,
        lease: Option<Duration>,
    ) -> Result<Option<MultiLockGuard<K>>> {
        if let Some(why) = &self.invalid {
            return Err(Error::InvalidArgument(why.clone()));
        }
        if let Some(lease) = lease {
            crate::kinds::lease_millis(lease)?;
        }
        let deadline = wait.and_then(|w| Instant::now().checked_add(w));
        let remaining = || deadline.map(|d| d.saturating_duration_since(Instant::now()));
        // The part to wait for, holding nothing.
        let mut first = 0;
        loop {
            let Some(head) = acquire_one(&self.locks[first], remaining(), lease).await? else {
                return Ok(None);
            };
            let mut held = vec![(first, head)];
            let mut busy = None;
            for (i, lock) in self.locks.iter().enumerate() {
                if i == first {
                    continue;
                }
                match acquire_one(lock, Some(Duration::ZERO), lease).await {
                    Ok(Some(guard)) => held.push((i, guard)),
                    Ok(None) => {
                        busy = Some(i);
                        break;
                    }
                    Err(e) => {
                        release_all(held.into_iter().map(|(_, g)| g).collect()).await;
                        return Err(e);
                    }
                }
            }
            match busy {
                None => {
                    held.sort_by_key(|(i, _)| *i);
                    let guards = held.into_iter().map(|(_, g)| g).collect();
                    return Ok(Some(MultiLockGuard::new(guards, None, self.description())));
                }
                Some(i) => {
                    tracing::trace!(lock = %self.locks[i].named().name(), "multi-lock part busy; releasing the others and waiting for it");
                    release_all(held.into_iter().map(|(_, g)| g).collect()).await;
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Ok(None);
                    }
                    first = i;
                }
            }
        }
    }
}

/// Where a part's lock lives, as far as the clients' settings tell without asking a server.
struct Place<'a> {
    key: &'a str,
    database: u8,
    /// The Sentinel service name; empty for other deployments.
    service: String,
    /// `host:port` of every server the client's URL names (lower-case host).
    endpoints: Vec<(String, u16)>,
}

impl<'a> Place<'a> {
    fn of<K: Kind>(lock: &'a K) -> Place<'a> {
        let named = lock.named();
        let (database, service, endpoints) = named.client.conn.endpoints();
        Place {
            key: &named.key,
            database,
            service,
            endpoints,
        }
    }

    fn same_lock(&self, other: &Place<'_>) -> bool {
        self.key == other.key
            && self.database == other.database
            && self.service == other.service
            && self.endpoints.iter().any(|e| other.endpoints.contains(e))
    }
}

/// Why a multi-lock over `locks` must refuse every operation, if it must.
fn refusal<K: Kind>(locks: &[K]) -> Option<String> {
    if locks.is_empty() {
        return Some("a multi-lock needs at least one lock".to_owned());
    }
    let places: Vec<Place<'_>> = locks.iter().map(Place::of).collect();
    for (i, a) in places.iter().enumerate() {
        if let Some(j) = places[i + 1..].iter().position(|b| a.same_lock(b)) {
            return Some(format!(
                "a multi-lock got lock {:?} twice (parts {} and {}: same key on the same \
                 server); each lock may appear once",
                locks[i].named().name(),
                i,
                i + 1 + j
            ));
        }
    }
    None
}

/// One part, acquired as its kind's own methods do. `wait` None = no deadline; `lease` None =
/// the watchdog.
pub(crate) async fn acquire_one<K: Kind>(
    lock: &K,
    wait: Option<Duration>,
    lease: Option<Duration>,
) -> Result<Option<Guard<K>>> {
    let lease = match lease {
        Some(lease) => Lease::Fixed(crate::kinds::lease_millis(lease)?),
        None => Lease::Watchdog,
    };
    crate::engine::acquire::acquire(lock, wait, lease).await
}

/// Releases every guard concurrently; returns each outcome in order.
pub(crate) async fn release_all<K: Kind>(guards: Vec<Guard<K>>) -> Vec<Result<()>> {
    futures::future::join_all(guards.into_iter().map(Guard::unlock)).await
}

/// The holds of a [`MultiLock`] or a [`RedLock`](crate::RedLock). Release it with
/// [`unlock`](MultiLockGuard::unlock); dropping it releases every part in the background.
///
/// It is *lost* when too few parts are still held — for a multi-lock any lost part, for a
/// Redlock fewer than a majority — or, for a Redlock with a fixed lease, when its validity
/// time ran out.
#[must_use = "dropping the guard releases the locks at once; bind it (`let _guard = ...`) for as long as they must be held"]
pub struct MultiLockGuard<K: Exclusive = Lock> {
    guards: Vec<Guard<K>>,
    /// How many parts must stay held.
    quorum: usize,
    /// Past this the hold is not trusted whatever the parts say (Redlock validity).
    valid_until: Option<Instant>,
    description: String,
}

/// The guard a [`RedLock`](crate::RedLock) hands out.
pub type RedLockGuard<K = Lock> = MultiLockGuard<K>;

impl<K: Exclusive> MultiLockGuard<K> {
    /// All of `guards` must stay held (`quorum` None) or at least `quorum` of them.
    pub(crate) fn new(
        guards: Vec<Guard<K>>,
        quorum: Option<usize>,
        description: String,
    ) -> MultiLockGuard<K> {
        let quorum = quorum.unwrap_or(guards.len());
        MultiLockGuard {
            guards,
            quorum,
            valid_until: None,
            description,
        }
    }

    pub(crate) fn with_validity(mut self, valid_until: Instant) -> MultiLockGuard<K> {
        self.valid_until = Some(valid_until);
        self
    }

    /// The guards of the parts this hold took (for a Redlock, those on the nodes that
    /// granted it).
    pub fn guards(&self) -> &[Guard<K>] {
        &self.guards
    }

    /// Whether the hold is lost: too few parts remain held, or its validity time ran out.
    pub fn is_lost(&self) -> bool {
        if self.valid_until.is_some_and(|v| Instant::now() >= v) {
            return true;
        }
        let alive = self.guards.iter().filter(|g| !g.is_lost()).count();
        alive < self.quorum
    }

    /// Resolves when the hold is lost. Never resolves while it is held.
    pub async fn lost(&self) {
        let parts_lost = async {
            let mut lost: FuturesUnordered<_> = self.guards.iter().map(|g| g.lost()).collect();
            let mut alive = self.guards.len();
            while alive >= self.quorum {
                if lost.next().await.is_none() {
                    // No parts at all: nothing can be lost any more.
                    std::future::pending::<()>().await;
                }
                alive -= 1;
            }
        };
        match self.valid_until {
            Some(until) => {
                tokio::select! {
                    _ = parts_lost => {}
                    _ = tokio::time::sleep_until(until) => {}
                }
            }
            None => parts_lost.await,
        }
    }

    /// Runs the future `f` makes while this hold lasts, and returns its output — or
    /// [`Error::LeaseLost`] if the hold is lost first (see [`lost`](Self::lost)): the future
    /// is then dropped at the await point it reached. As [`Guard::run`](crate::Guard::run):
    /// the future runs inside the scope of every part's hold (an acquire of a part, or of the
    /// multi-lock, re-enters), and the guard stays held; unlock it afterwards.
    ///
    /// # Cancel safety
    ///
    /// Dropping the `run` future drops `f`'s future and nothing else.
    pub async fn run<F, Fut, T>(&self, f: F) -> Result<T>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
    {
        let scopes: Vec<_> = self.guards.iter().filter_map(Guard::scope).collect();
        let scoped = || crate::engine::scope::within(scopes, f());
        until_lost(self.is_lost(), self.lost(), scoped, &self.description).await
    }

    /// Takes every part again as its hold's owner (see [`Guard::reenter`](crate::Guard::reenter)): a nested hold
    /// that never waits, released on its own. [`Error::NotHeld`] when this hold is lost (the
    /// parts re-entered meanwhile are released again in the background).
    ///
    /// # Cancel safety
    ///
    /// As [`Guard::reenter`](crate::Guard::reenter)'s, part by part.
    #[must_use = "the guard holds the locks: dropping it at once releases them again"]
    pub async fn reenter(&self) -> Result<MultiLockGuard<K>> {
        let not_held = || Error::NotHeld {
            name: self.description.clone(),
        };
        if self.is_lost() {
            return Err(not_held());
        }
        let again = futures::future::join_all(
            self.guards
                .iter()
                .filter(|g| !g.is_lost())
                .map(|g| g.reenter()),
        )
        .await;
        let guards: Vec<Guard<K>> = again.into_iter().filter_map(|g| g.ok()).collect();
        if guards.len() < self.quorum {
            return Err(not_held());
        }
        Ok(MultiLockGuard {
            guards,
            quorum: self.quorum,
            valid_until: self.valid_until,
            description: self.description.clone(),
        })
    }

    /// A multi-lock's or Redlock's `run` once acquired: [`run`](Self::run), then release.
    pub(crate) async fn run_and_unlock<F, Fut, T>(self, f: F) -> Result<T>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
    {
        let outcome = self.run(f).await;
        let name = self.description.clone();
        release_after(outcome, self.unlock(), &name).await
    }

    /// Releases every part (concurrently).
    ///
    /// Returns [`Error::NotHeld`] when the hold was already lost (the parts still held are
    /// released all the same). Otherwise a multi-lock reports the first error of any part; a
    /// Redlock succeeds when its parts were released or already gone, and reports an error only
    /// when no part could be released at all (its leases then expire on their own).
    pub async fn unlock(mut self) -> Result<()> {
        let was_lost = self.is_lost();
        let guards = std::mem::take(&mut self.guards);
        let count = guards.len();
        let results = release_all(guards).await;
        if was_lost {
            return Err(Error::NotHeld {
                name: self.description.clone(),
            });
        }
        let all_required = self.quorum == count;
        let mut first_error = None;
        let mut released = 0;
        for result in results {
            match result {
                Ok(()) => released += 1,
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            None => Ok(()),
            Some(e) if all_required || released == 0 => Err(e),
            Some(e) => {
                tracing::debug!(lock = %self.description, error = %e, "a Redlock part could not be released; it expires with its lease");
                Ok(())
            }
        }
    }
}

impl<K: Exclusive> std::fmt::Debug for MultiLockGuard<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiLockGuard")
            .field("locks", &self.description)
            .field("parts", &self.guards.len())
            .field("quorum", &self.quorum)
            .field("lost", &self.is_lost())
            .finish()
    }
}
