//! The baton pass: a lock released by its last hold goes straight to the next task of the
//! same client parked on it, in the release's own round trip.
//!
//! An ordinary release deletes the lock and publishes an unlock message; a parked waiter is
//! woken and tries again — a second round trip, in which the releaser (or anyone) may take
//! the lock first. With the pass, the release script instead writes the next waiter's owner
//! field with its lease, atomically, and the releasing client hands that waiter its guard
//! locally: one round trip, no message, no window for barging. Local waiters are served in
//! the order they parked.
//!
//! Fairness across clients comes first: the script passes only while nothing but this
//! client's own subscriber listens on the lock's channel (anyone else subscribed may be
//! waiting), and a lock passes at most [`Config::baton_passes`](crate::Config::baton_passes)
//! times in a row before an ordinary release. On a cluster with classic pub/sub the
//! subscriber count is the key's node's only, so that bound is what serves waiters subscribed
//! through other nodes.
//!
//! Each parked waiter that can take a pass has a [`Baton`] in its key's [`Queue`]. Its state
//! decides who acts: the releaser *claims* a parked waiter's baton before it sends the pass,
//! and a waiter *starts an attempt* only from the parked state — so a waiter is never both
//! given the lock and trying for it. A claimed waiter waits for the outcome: the lock handed
//! over, or the claim withdrawn (another client was waiting, the call failed). A waiter that
//! leaves while claimed or handed (timeout, cancellation) leaves its hold to be released at
//! once, by the releaser or by the hold's own drop — never a hold nobody knows about.

use std::any::Any;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::holds::Lease;

/// Attempting (or not parked yet): not to be claimed.
const BUSY: u8 = 0;
/// Parked: a releaser may claim it.
const PARKED: u8 = 1;
/// Claimed by a releaser whose pass is in flight.
const CLAIMED: u8 = 2;
/// The lock was passed to it; its guard waits in `handed`.
const HANDED: u8 = 3;
/// The waiter left.
const GONE: u8 = 4;

/// One parked waiter's place in its key's queue: who it is, and what it was handed.
pub(crate) struct Baton {
    state: AtomicU8,
    /// The waiting task's owner number in its client. Only tasks are passed the lock: a
    /// waiter with an explicit owner field (possibly another client's) tries for itself.
    task: u64,
    lease: Lease,
    /// The guard handed over (a `Guard<K>` of the waiter's kind), set before `HANDED`.
    handed: Mutex<Option<Box<dyn Any + Send>>>,
    changed: Notify,
}

impl Baton {
    /// A baton for a waiter about to make its first re-check (so not claimable yet).
    pub(crate) fn new(task: u64, lease: Lease) -> Arc<Baton> {
        Arc::new(Baton {
            state: AtomicU8::new(BUSY),
            task,
            lease,
            handed: Mutex::new(None),
            changed: Notify::new(),
        })
    }

    /// The waiting task's owner number.
    pub(crate) fn task(&self) -> u64 {
        self.task
    }

    /// The lease the waiter asked for.
    pub(crate) fn lease(&self) -> Lease {
        self.lease
    }

    /// The waiter parks: a releaser may now claim it.
    pub(crate) fn park(&self) {
        let _ = self
            .state
            .compare_exchange(BUSY, PARKED, Ordering::AcqRel, Ordering::Acquire);
    }

    /// The waiter is about to try for the lock itself. Returns the guard if the lock was
    /// passed to it meanwhile (waiting out a pass in flight first); `None`: go ahead.
    pub(crate) async fn start_attempt(&self) -> Option<Box<dyn Any + Send>> {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            match self
                .state
                .compare_exchange(PARKED, BUSY, Ordering::AcqRel, Ordering::Acquire)
            {
                // Parked, or already trying, or (passed a guard it could not take) on its own.
                Ok(_) | Err(BUSY) | Err(GONE) => return None,
                Err(HANDED) => {
                    self.state.store(GONE, Ordering::Release);
                    return self.handed.lock().take();
                }
                // Claimed: the releaser's pass is in flight; its outcome is one round trip
                // away (and the releaser bounds it).
                Err(_) => changed.await,
            }
        }
    }

    /// Resolves when a releaser has acted on this baton (handed the lock, or withdrew).
    pub(crate) async fn acted(&self) {
        let changed = self.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if matches!(self.state.load(Ordering::Acquire), PARKED | BUSY) {
            changed.await;
        }
    }

    /// The releaser's claim, from the parked state only.
    fn claim(&self) -> bool {
        self.state
            .compare_exchange(PARKED, CLAIMED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// The releaser gives up its claim (the lock was not passed): the waiter parks on.
    pub(crate) fn withdraw(&self) {
        let _ = self
            .state
            .compare_exchange(CLAIMED, PARKED, Ordering::AcqRel, Ordering::Acquire);
        self.changed.notify_one();
    }

    /// The releaser hands the passed lock's guard over. Returns it if the waiter has left
    /// meanwhile: the caller then drops it, which releases the hold.
    pub(crate) fn hand(&self, guard: Box<dyn Any + Send>) -> Option<Box<dyn Any + Send>> {
        *self.handed.lock() = Some(guard);
        match self
            .state
            .compare_exchange(CLAIMED, HANDED, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {
                self.changed.notify_one();
                None
            }
            Err(_) => self.handed.lock().take(),
        }
    }

    /// The waiter leaves (acquired by itself, gave up, or was dropped). A guard handed to it
    /// and not taken is dropped here — its hold is released at once.
    fn leave(&self) {
        if self.state.swap(GONE, Ordering::AcqRel) == HANDED {
            let unclaimed = self.handed.lock().take();
            drop(unclaimed);
        }
    }
}

/// The batons of one key's parked waiters, in the order they parked.
#[derive(Default)]
pub(crate) struct Queue {
    batons: Mutex<VecDeque<Arc<Baton>>>,
}

impl Queue {
    /// Places `baton` last; it leaves the queue when the returned ticket is dropped.
    pub(crate) fn join(&self, baton: Arc<Baton>) -> Ticket<'_> {
        self.batons.lock().push_back(baton.clone());
        Ticket { queue: self, baton }
    }

    /// How many of its waiters are parked (claimable) now.
    pub(crate) fn parked(&self) -> usize {
        let batons = self.batons.lock();
        batons
            .iter()
            .filter(|b| b.state.load(Ordering::Acquire) == PARKED)
            .count()
    }

    /// Claims the first parked waiter. It keeps its place until it leaves, so a withdrawn
    /// claim leaves it first in line; waiters busy with an attempt of their own are skipped.
    pub(crate) fn claim(&self) -> Option<Arc<Baton>> {
        let batons = self.batons.lock();
        batons.iter().find(|b| b.claim()).cloned()
    }
}

/// A waiter's place in a [`Queue`]; dropping it leaves the queue.
pub(crate) struct Ticket<'q> {
    queue: &'q Queue,
    baton: Arc<Baton>,
}

impl Ticket<'_> {
    pub(crate) fn baton(&self) -> &Baton {
        &self.baton
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        self.baton.leave();
        let mut batons = self.queue.batons.lock();
        // A waiter served in turn is first in line.
        if batons.front().is_some_and(|b| Arc::ptr_eq(b, &self.baton)) {
            batons.pop_front();
        } else {
            batons.retain(|b| !Arc::ptr_eq(b, &self.baton));
        }
    }
}
