//! [`RedLock`]: one lock name on N independent Redis masters, held when a majority grants it
//! (the Redlock algorithm). See [`RedLock`] for the semantics.

use std::collections::HashSet;
use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

use crate::kinds::multilock::{acquire_one, release_all, Exclusive, MultiLockGuard, RedLockGuard};
use crate::{Error, Guard, Lock, Result};

/// Default bound on each node's try.
const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(200);
/// Default pause between attempts (randomised ± 50 %).
const DEFAULT_RETRY_DELAY: Duration = Duration::from_millis(200);

/// The same lock name on N independent Redis masters; held while a majority holds it.
///
/// ```no_run
/// # async fn run(nodes: Vec<redbaton::Client>) -> redbaton::Result<()> {
/// let redlock = redbaton::RedLock::new(nodes.iter().map(|c| c.lock("payments")).collect());
/// let guard = redlock.lock().await?;
/// tokio::select! {
///     _ = guard.lost() => eprintln!("lost the majority"),
///     _ = async { /* critical section */ } => guard.unlock().await?,
/// }
/// # Ok(()) }
/// ```
///
/// # The algorithm
///
/// One attempt:
///
/// 1. Note the start time; try the lock on **every** node at once, each try bounded by a
///    small per-node timeout ([`RedLock::node_timeout`], default 200 ms), so a node that is
///    down or slow costs that timeout, not its connect or command timeout.
/// 2. It succeeds when at least `N/2 + 1` nodes granted it **and** time is left: the validity
///    time is `lease − elapsed − drift`, with `drift = lease/100 + 2 ms` for clock-rate
///    differences between the nodes and this process. The lease is the fixed lease given, or
///    the shortest watchdog lease among the nodes' clients.
/// 3. Otherwise every grant is released again (on every node, concurrently) and — while the
///    caller's wait allows — the attempt is repeated after a random delay
///    ([`RedLock::retry_delay`] ± 50 %), so competing clients do not retry in lock step.
///
/// A try that times out is not left behind: each node's acquire is cancellation safe, so a
/// grant that arrives after its timeout is released by the node's client.
///
/// When fewer than a majority of nodes even *answer* (down, timed out, or an error reply),
/// the call returns that error instead of `None` — "busy" and "unreachable" stay distinct, as
/// with a single [`Lock`].
///
/// # Leases, the watchdog and loss
///
/// With the watchdog (methods without a lease) each node's hold is renewed by its own client's
/// watchdog, so the Redlock stays held on every node that granted it. The guard
/// ([`RedLockGuard`]) reports [`lost`](crate::MultiLockGuard::lost) when fewer than a majority
/// of its holds remain (expired, deleted, or not renewable for a whole lease). With a fixed
/// lease it is also lost once the validity time computed at acquisition has passed.
///
/// # Reentry
///
/// The lock on each node is reentrant for its owner, which is a hold's scope as for
/// [`Lock`](crate::Lock): inside the guard's [`run`](crate::MultiLockGuard::run) (or with
/// [`reenter`](crate::MultiLockGuard::reenter)) the Redlock is taken again at once (each
/// node's count goes up), and each hold is released on its own. Any other acquisition is a
/// new owner and waits.
///
/// # A node restarted empty
///
/// A node that crashes and restarts **without** its data forgets the hold; another client can
/// then win a majority with that node's help while the first still believes it holds the
/// lock. Redlock's answer is to keep a restarted node out for longer than the longest lease
/// (delayed restart), or to run the nodes with `appendonly yes` and `appendfsync always`. The
/// watchdog narrows the window: its next renewal finds the hold gone on the restarted node and
/// the guard reports lost if that leaves fewer than a majority.
///
/// # Differences from Redisson's `RedissonRedLock`
///
/// - Redisson tries the nodes one after another, each with a share of the wait time; redbaton
///   tries them in parallel with a per-node timeout, as the Redlock description asks, so one
///   attempt costs about one round trip (or the per-node timeout), not N of them.
/// - Redisson does not subtract a clock drift; redbaton does, as the Redlock description asks.
/// - Redisson's `unlock()` swallows every error; redbaton's reports an error when no node
///   could be reached and [`Error::NotHeld`] when the majority was already lost.
/// - Redisson deprecated `RedLock` in favour of a single lock with synchronous replication;
///   redbaton keeps it for deployments of independent masters, with the caveats above.
#[derive(Clone, Debug)]
pub struct RedLock<K: Exclusive = Lock> {
    locks: Vec<K>,
    node_timeout: Duration,
    retry_delay: Duration,
}

/// What one attempt got.
struct Attempt<K: Exclusive> {
    granted: Vec<Guard<K>>,
    /// Nodes that answered "held by another owner".
    busy: usize,
    /// The first error of a node that did not answer usefully.
    error: Option<Error>,
    started: Instant,
}

impl RedLock {
    /// A Redlock over `locks`: one per independent Redis master, normally the same name on
    /// each. An empty list, or two locks on the same key of the same client, makes every
    /// operation return [`Error::InvalidArgument`]. For locks of another kind, see
    /// [`of`](RedLock::of).
    pub fn new(locks: Vec<Lock>) -> RedLock {
        RedLock::of(locks)
    }
}

impl<K: Exclusive> RedLock<K> {
    /// A Redlock over `locks` of any one [`Exclusive`] kind (fair, fenced — each granted
    /// part's guard carries its own node's token — or write halves), as
    /// [`new`](RedLock::new) makes one over [`Lock`]s.
    pub fn of(locks: Vec<K>) -> RedLock<K> {
        RedLock {
            locks,
            node_timeout: DEFAULT_NODE_TIMEOUT,
            retry_delay: DEFAULT_RETRY_DELAY,
        }
    }

    /// Bounds each node's try (default 200 ms). Keep it small against the lease.
    pub fn node_timeout(mut self, timeout: Duration) -> RedLock<K> {
        self.node_timeout = timeout;
        self
    }

    /// The mean pause between attempts while waiting (default 200 ms, randomised ± 50 %).
    pub fn retry_delay(mut self, delay: Duration) -> RedLock<K> {
        self.retry_delay = delay;
        self
    }

    /// The parts, as given.
    pub fn locks(&self) -> &[K] {
        &self.locks
    }

    /// How many nodes must grant the lock: `N/2 + 1`.
    pub fn quorum(&self) -> usize {
        self.locks.len() / 2 + 1
    }

    /// Acquires a majority, waiting as long as it takes; the watchdogs keep the leases.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future at any await point leaves no hold behind: the nodes' attempts in
    /// flight are left as a dropped [`Lock::try_lock`] leaves them (see its section), the
    /// parts already granted are guards, dropped with it, that release their locks in the
    /// background, and between attempts nothing is held.
    #[must_use = "the guard holds the lock: dropping it at once releases it again"]
    pub async fn lock(&self) -> Result<RedLockGuard<K>> {
        let guard = self.acquire(None, None).await?;
        Ok(guard.expect("waiting without a deadline ends only in a guard or an error"))
    }

    /// Acquires a majority for a fixed `lease`, waiting as long as it takes.
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](Self::lock)'s.
    #[must_use = "the guard holds the lock: dropping it at once releases it again"]
    pub async fn lock_with_lease(&self, lease: Duration) -> Result<RedLockGuard<K>> {
        let guard = self.acquire(None, Some(lease)).await?;
        Ok(guard.expect("waiting without a deadline ends only in a guard or an error"))
    }

    /// One attempt: `None` when no majority granted it in time.
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](Self::lock)'s.
    #[must_use = "the guard holds the lock: dropping it at once releases it again"]
    pub async fn try_lock(&self) -> Result<Option<RedLockGuard<K>>> {
        self.acquire(Some(Duration::ZERO), None).await
    }

    /// Attempts until a majority grants it or `wait` runs out (`None`).
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](Self::lock)'s.
    #[must_use = "the guard holds the lock: dropping it at once releases it again"]
    pub async fn try_lock_for(&self, wait: Duration) -> Result<Option<RedLockGuard<K>>> {
        self.acquire(Some(wait), None).await
    }

    /// Attempts for up to `wait`, each for a fixed `lease`; the guard is valid for at most
    /// `lease − elapsed − drift` after its attempt started.
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](Self::lock)'s.
    #[must_use = "the guard holds the lock: dropping it at once releases it again"]
    pub async fn try_lock_with_lease(
        &self,
        wait: Duration,
        lease: Duration,
    ) -> Result<Option<RedLockGuard<K>>> {
        self.acquire(Some(wait), Some(lease)).await
    }

    /// Acquires a majority as [`lock`](Self::lock) does, runs the future `f` makes while
    /// holding it, releases it and returns the future's output — or [`Error::LeaseLost`] when
    /// the hold is lost first (fewer than a majority of parts still held, see
    /// [`MultiLockGuard::lost`]): the future is then dropped at the await point it reached. As
    /// [`Lock::run`], a failed release after the work is logged, not returned.
    ///
    /// ```no_run
    /// # async fn example(redlock: redbaton::RedLock) -> redbaton::Result<()> {
    /// # async fn rotate_keys() -> usize { 0 }
    /// let rotated = redlock.run(rotate_keys).await?;
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
        Fut: std::future::Future<Output = T>,
    {
        self.lock().await?.run_and_unlock(f).await
    }

    fn check(&self) -> Result<()> {
        if self.locks.is_empty() {
            return Err(Error::InvalidArgument(
                "a Redlock needs at least one lock".to_owned(),
            ));
        }
        let mut seen = HashSet::new();
        for lock in &self.locks {
            let named = lock.named();
            if !seen.insert((&*named.client.id, &*named.key)) {
                return Err(Error::InvalidArgument(format!(
                    "a Redlock got lock {:?} of one client twice; each node must count once",
                    lock.named().name()
                )));
            }
        }
        if self.node_timeout.is_zero() {
            return Err(Error::InvalidArgument(
                "a Redlock's node timeout must be positive".to_owned(),
            ));
        }
        Ok(())
    }

    /// The lease the nodes are asked for.
    fn lease(&self, lease: Option<Duration>) -> Duration {
        lease.unwrap_or_else(|| {
            self.locks
                .iter()
                .map(|l| l.named().client.holds.watchdog_lease())
                .min()
                .expect("checked non-empty")
        })
    }

    async fn acquire(
        &self,
        wait: Option<Duration>,
        lease: Option<Duration>,
    ) -> Result<Option<RedLockGuard<K>>> {
        self.check()?;
        if let Some(lease) = lease {
            crate::kinds::lease_millis(lease)?;
        }
        let lease_len = self.lease(lease);
        let drift = crate::engine::holds::drift(lease_len);
        let quorum = self.quorum();
        let deadline = wait.and_then(|w| Instant::now().checked_add(w));
        loop {
            let attempt = self.attempt(lease).await;
            let granted = attempt.granted.len();
            let validity = lease_len
                .checked_sub(attempt.started.elapsed())
                .and_then(|v| v.checked_sub(drift))
                .filter(|v| !v.is_zero());
            if granted >= quorum {
                if let Some(validity) = validity {
                    tracing::trace!(lock = %self.locks[0].named().name(), granted, ?validity, "Redlock acquired");
                    let guard = MultiLockGuard::new(
                        attempt.granted,
                        Some(quorum),
                        self.locks[0].named().name().to_owned(),
                    );
                    return Ok(Some(match lease {
                        Some(_) => guard.with_validity(attempt.started + lease_len - drift),
                        None => guard,
                    }));
                }
                tracing::debug!(lock = %self.locks[0].named().name(), granted, "Redlock majority came too late; releasing");
            }
            release_all(attempt.granted).await;
            if granted + attempt.busy < quorum {
                // Not even a majority answered: report why instead of waiting blind.
                return Err(attempt.error.unwrap_or_else(|| {
                    Error::Connection("fewer than a majority of Redlock nodes answered".into())
                }));
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(None);
            }
            let pause = self.jitter();
            let pause = match deadline {
                Some(d) => pause.min(d.saturating_duration_since(now)),
                None => pause,
            };
            tokio::time::sleep(pause).await;
        }
    }

    /// A random pause in `[retry_delay / 2, retry_delay * 3 / 2)`.
    fn jitter(&self) -> Duration {
        let base = self.retry_delay.as_millis().max(2) as u64;
        Duration::from_millis(rand::thread_rng().gen_range(base / 2..base + base / 2))
    }

    /// Tries every node at once, each bounded by the node timeout.
    async fn attempt(&self, lease: Option<Duration>) -> Attempt<K> {
        let started = Instant::now();
        let node_timeout = self.node_timeout;
        let tries = self.locks.iter().map(|lock| async move {
            let try_once = acquire_one(lock, Some(Duration::ZERO), lease);
            match tokio::time::timeout(node_timeout, try_once).await {
                Ok(result) => result,
                Err(_) => Err(Error::Timeout(node_timeout)),
            }
        });
        let results = futures::future::join_all(tries).await;
        let mut attempt = Attempt {
            granted: Vec::new(),
            busy: 0,
            error: None,
            started,
        };
        for (lock, result) in self.locks.iter().zip(results) {
            match result {
                Ok(Some(guard)) => attempt.granted.push(guard),
                Ok(None) => attempt.busy += 1,
                Err(e) => {
                    tracing::debug!(lock = %lock.named().name(), error = %e, "Redlock node did not grant");
                    attempt.error.get_or_insert(e);
                }
            }
        }
        attempt
    }
}
