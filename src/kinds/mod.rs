//! The family: every kind — the locks and the two semaphores — is one file here, beside
//! [`LockState`](state::LockState), a lock's inspection. A kind supplies only what differs
//! between kinds — through [`Kind`]: its acquire script and how to read the reply, its release
//! and renewal ([`HoldOps`](crate::engine::holds::HoldOps)), the channel its waiters listen on, and
//! what a waiter does when it gives up.
//! The wait loop ([`crate::engine::acquire`]), the guard ([`crate::Guard`]), the hub, the holds
//! registry and the watchdog are shared by all of them.

use std::time::Duration;

use fred::types::Value;

use crate::config::{MAX_LEASE, MIN_LEASE};
use crate::conn::LuaScript;
use crate::{Error, Result};
// The kinds take the engine's vocabulary from here with the rest of what they share.
pub(crate) use crate::engine::kind::{hooks::Hooks, prefix_name, suffix_name, Kind, Named, Reply};

pub(crate) mod fair_lock;
pub(crate) mod fenced_lock;
pub(crate) mod leased_semaphore;
pub(crate) mod lock;
pub(crate) mod multilock;
pub(crate) mod redlock;
pub(crate) mod rwlock;
pub(crate) mod semaphore;
pub(crate) mod state;

/// Every script of every kind, loaded at connect: the family's list, so the client that loads
/// them need not know which kind has which.
pub(crate) fn scripts() -> Vec<&'static LuaScript> {
    [
        lock::SCRIPTS,
        fenced_lock::SCRIPTS,
        fair_lock::SCRIPTS,
        rwlock::SCRIPTS,
        state::SCRIPTS,
        semaphore::SCRIPTS,
        leased_semaphore::SCRIPTS,
    ]
    .concat()
}

/// Reads the `{1, count}` / `{0, pttl}` reply shared by the hash-based acquire scripts;
/// `extra` reads what follows an acquired reply's count.
pub(crate) fn decode_counted<E>(
    named: &Named,
    reply: Value,
    extra: impl FnOnce(&[Value]) -> Option<E>,
) -> Result<Reply<E>> {
    let malformed = || Error::Redis(format!("unexpected acquire reply for {:?}", named.name()));
    let Value::Array(parts) = reply else {
        return Err(malformed());
    };
    let number = |i: usize| parts.get(i).and_then(Value::as_i64).ok_or_else(malformed);
    match number(0)? {
        1 => Ok(Reply::Acquired {
            count: number(1)?,
            extra: extra(&parts[2..]).ok_or_else(malformed)?,
        }),
        _ => match number(1)? {
            pttl if pttl >= 0 => Ok(Reply::Held(pttl as u64)),
            _ => Err(named.no_expiry()),
        },
    }
}

/// Converts a lease to the milliseconds Redis takes, refusing what it cannot take.
pub(crate) fn lease_millis(lease: Duration) -> Result<i64> {
    if lease < MIN_LEASE {
        return Err(Error::InvalidArgument(format!(
            "lease {lease:?} is shorter than {MIN_LEASE:?}: too short to be known valid \
             once its round trip and the clock-drift allowance are counted"
        )));
    }
    if lease > MAX_LEASE {
        return Err(Error::InvalidArgument(format!(
            "lease {lease:?} is longer than Redis accepts ({MAX_LEASE:?})"
        )));
    }
    Ok(lease.as_millis() as i64)
}

/// The acquire methods every lock kind has, and `run` on top of them, documented once.
///
/// The acquire methods are `#[must_use]`: a guard dropped at once releases the lock again.
/// (The lint cannot see through `?` into an `Option`: `lock.try_lock().await?;` drops its
/// guard without a warning.)
macro_rules! acquire_methods {
    ($kind:ty) => {
        /// Acquires the lock, waiting as long as it takes; the watchdog keeps the lease until
        /// the guard is released.
        ///
        /// # Cancel safety
        ///
        /// Dropping the future at any await point leaves no new hold of this owner and no
        /// subscription behind, but it may take a moment to get there:
        ///
        /// - Dropped while parked (waiting for an unlock message), the waiter leaves the lock's
        ///   channel — the client unsubscribes when it was the channel's last waiter — and a
        ///   wake-up sent to it and not yet taken goes to the next waiter in this process.
        /// - Dropped while an acquire round trip is in flight, the round trip is finished in a
        ///   background task, since the script may run on the server anyway; a hold it took
        ///   is released at once, and that release wakes the next waiter. Others may so see
        ///   the lock held for about a round trip after the cancellation — for up to its lease
        ///   if Redis cannot be reached at that moment (the watchdog never renews such a hold).
        ///   A round trip that outlasts the command timeout is treated the same way, and the
        ///   call returns [`Error::Timeout`]($crate::Error::Timeout).
        /// - As with tokio's `Mutex::lock`, a dropped call loses its place: a kind that
        ///   queues its waiters ([`FairLock`]($crate::FairLock)) removes the waiter's entry in
        ///   the background, and a new call queues at the back.
        #[must_use = "the guard holds the lock: dropping it at once releases the lock again"]
        pub async fn lock(&self) -> $crate::Result<$crate::Guard<$kind>> {
            let guard =
                $crate::engine::acquire::acquire(self, None, $crate::engine::holds::Lease::Watchdog).await?;
            Ok(guard.expect("waiting without a deadline ends only in a guard or an error"))
        }

        /// Acquires the lock for a fixed `lease`, waiting as long as it takes. The lease is
        /// never renewed: past it the lock expires, and the guard reports
        /// [`lost`]($crate::Guard::lost).
        ///
        /// # Cancel safety
        ///
        /// As [`lock`](Self::lock)'s: a hold a dropped call took is released at once in the
        /// background, or ends with the fixed lease.
        #[must_use = "the guard holds the lock: dropping it at once releases the lock again"]
        pub async fn lock_with_lease(
            &self,
            lease: std::time::Duration,
        ) -> $crate::Result<$crate::Guard<$kind>> {
            let lease = $crate::engine::holds::Lease::Fixed($crate::kinds::lease_millis(lease)?);
            let guard = $crate::engine::acquire::acquire(self, None, lease).await?;
            Ok(guard.expect("waiting without a deadline ends only in a guard or an error"))
        }

        /// One attempt, no waiting: `None` when it is held elsewhere.
        ///
        /// # Cancel safety
        ///
        /// As [`lock`](Self::lock)'s (it never parks, so only the round trip can be in
        /// flight): a hold a dropped call took is released at once in the background.
        #[must_use = "the guard holds the lock: dropping it at once releases the lock again"]
        pub async fn try_lock(&self) -> $crate::Result<Option<$crate::Guard<$kind>>> {
            $crate::engine::acquire::acquire(
                self,
                Some(std::time::Duration::ZERO),
                $crate::engine::holds::Lease::Watchdog,
            )
            .await
        }

        /// Waits up to `wait` for the lock: `None` when the wait ran out. `Duration::MAX`
        /// waits forever; `Duration::ZERO` is [`try_lock`](Self::try_lock).
        ///
        /// # Cancel safety
        ///
        /// As [`lock`](Self::lock)'s. Running out of `wait` is not a cancellation: a round
        /// trip in flight at the deadline is awaited, and its hold returned.
        #[must_use = "the guard holds the lock: dropping it at once releases the lock again"]
        pub async fn try_lock_for(
            &self,
            wait: std::time::Duration,
        ) -> $crate::Result<Option<$crate::Guard<$kind>>> {
            $crate::engine::acquire::acquire(self, Some(wait), $crate::engine::holds::Lease::Watchdog).await
        }

        /// Waits up to `wait` for the lock, taken for a fixed `lease` (never renewed).
        ///
        /// # Cancel safety
        ///
        /// As [`lock_with_lease`](Self::lock_with_lease)'s and
        /// [`try_lock_for`](Self::try_lock_for)'s.
        #[must_use = "the guard holds the lock: dropping it at once releases the lock again"]
        pub async fn try_lock_with_lease(
            &self,
            wait: std::time::Duration,
            lease: std::time::Duration,
        ) -> $crate::Result<Option<$crate::Guard<$kind>>> {
            let lease = $crate::engine::holds::Lease::Fixed($crate::kinds::lease_millis(lease)?);
            $crate::engine::acquire::acquire(self, Some(wait), lease).await
        }

        /// Acquires the lock as [`lock`](Self::lock) does, runs the future `f` makes while
        /// holding it, releases the lock and returns the future's output.
        ///
        /// If the lease is lost before the future completes, the future is dropped at the
        /// await point it reached, the work stops there, and `run` returns
        /// [`Error::LeaseLost`]($crate::Error::LeaseLost). This is
        /// [`Guard::run`]($crate::Guard::run) between `lock()` and
        /// [`unlock()`]($crate::Guard::unlock); the future runs in the calling task, inside
        /// the hold's scope, so an acquire of this lock made while it is polled re-enters (a
        /// sibling future polled beside it does not: it is another owner).
        ///
        /// An acquire error is returned, and `f` is not called. A release that fails once the
        /// future completed does not cost its output: the output is returned, the failure is
        /// logged (at `warn`; at `debug` when the hold was already lost, so nothing was left
        /// to release), and the release goes on as `unlock()`'s does — retried in the
        /// background while Redis is unreachable, else left to the lease (the watchdog stops
        /// renewing the hold either way); dropping a guard does the same. To see release
        /// errors, to use the guard in the work (a fenced token), or to acquire another way
        /// (a bounded wait, a fixed lease), acquire yourself, call `Guard::run` and unlock.
        ///
        /// ```no_run
        #[doc = concat!("# async fn example(lock: redbaton::", stringify!($kind), ") -> redbaton::Result<()> {")]
        /// # async fn settle_invoices() -> u32 { 0 }
        /// match lock.run(|| async { settle_invoices().await }).await {
        ///     Ok(settled) => println!("settled {settled} invoices"),
        ///     Err(redbaton::Error::LeaseLost { .. }) => eprintln!("lease lost; stopped midway"),
        ///     Err(e) => return Err(e),
        /// }
        /// # Ok(()) }
        /// ```
        ///
        /// # Cancel safety
        ///
        /// Dropped while acquiring, as [`lock`](Self::lock)'s. Dropped while the work runs,
        /// the work's future is dropped at its current await point and the guard with it,
        /// which releases the lock in the background. Dropped while releasing, the release
        /// finishes in the background, as [`unlock`]($crate::Guard::unlock)'s does.
        pub async fn run<F, Fut, T>(&self, f: F) -> $crate::Result<T>
        where
            F: FnOnce() -> Fut,
            Fut: std::future::Future<Output = T>,
        {
            self.lock().await?.run_and_unlock(f).await
        }
    };
}
pub(crate) use acquire_methods;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_are_checked() {
        assert!(lease_millis(Duration::ZERO).is_err());
        assert!(lease_millis(Duration::from_micros(999)).is_err());
        assert!(lease_millis(MIN_LEASE - Duration::from_micros(1)).is_err());
        assert_eq!(lease_millis(MIN_LEASE).unwrap(), 10);
        assert!(lease_millis(Duration::MAX).is_err());
        assert!(lease_millis(MAX_LEASE).is_ok());
    }
}
