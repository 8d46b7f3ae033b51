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
//! times in a row before an ordinary release — counted with the hold in the client's registry
//! ([`crate::holds`]), so the guard released last, re-entered or not, knows the run. A release
//! that found another client waiting makes the next few releases of that key ordinary ones
//! without asking: that client most likely still waits. On a cluster with classic pub/sub
//! the subscriber count is the key's node's only, so the bound on passes in a row is what
//! serves waiters subscribed through other nodes.
//!
//! Each parked waiter that can take a pass has an entry in its key's [`Queue`] — a plain
//! record in one shared deque, not an allocation of its own (10,000 parked waiters must not
//! mean 10,000 small allocations made in the middle of their round trips' buffers), and the
//! waiter's task waker to wake it by. The entry's state decides who acts: the releaser *claims* a parked waiter's baton before it sends the pass,
//! and a waiter *starts an attempt* only from the parked state — so a waiter is never both
//! given the lock and trying for it. A claimed waiter waits for the outcome: the lock handed
//! over, or the claim withdrawn (another client was waiting, the call failed). A waiter that
//! leaves while claimed or handed (timeout, cancellation) leaves its hold to be released at
//! once, by the releaser or by the hold's own drop — never a hold nobody knows about.

use std::any::Any;
use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Poll, Waker};

use parking_lot::Mutex;

use crate::holds::Lease;

/// Releases of a key made the ordinary way, without a claim, after a pass found another
/// client waiting: that client most likely still waits (it is served by the unlock message,
/// and so is everyone here), so passing is not worth its costs meanwhile — a claimed waiter
/// sits out the release's round trip, and the script counts the channel's subscribers.
const ORDINARY_AFTER_ANOTHER_CLIENT: u32 = 8;

/// Who a waiter is, for a pass: what the releaser needs to write its hold.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Baton {
    /// The waiting task's owner number in its client. Only tasks are passed the lock: a
    /// waiter with an explicit owner field (possibly another client's) tries for itself.
    pub(crate) task: u64,
    /// The lease the waiter asked for.
    pub(crate) lease: Lease,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    /// Attempting (or not parked yet): not to be claimed.
    Busy,
    /// Parked: a releaser may claim it.
    Parked,
    /// Claimed by a releaser whose pass is in flight.
    Claimed,
    /// The lock was passed to it; its guard waits in `handed`.
    Handed,
}

/// One waiter's entry.
struct Entry {
    id: u64,
    baton: Baton,
    state: State,
    /// The guard handed over (a `Guard<K>` of the waiter's kind).
    handed: Option<Box<dyn Any + Send>>,
    /// Woken when a releaser acts on the entry.
    waker: Option<Waker>,
}

#[derive(Default)]
struct Entries {
    /// In the order the waiters joined, so sorted by id.
    queue: VecDeque<Entry>,
    next_id: u64,
}

impl Entries {
    /// Where waiter `id` is in the queue, if still there.
    fn position(&self, id: u64) -> Option<usize> {
        match self.queue.front() {
            // A waiter served in turn is first in line.
            Some(e) if e.id == id => Some(0),
            _ => self.queue.binary_search_by_key(&id, |e| e.id).ok(),
        }
    }

    fn get(&mut self, id: u64) -> Option<&mut Entry> {
        let at = self.position(id)?;
        self.queue.get_mut(at)
    }
}

/// The entries of one key's waiters that a release can pass the lock to, in the order they
/// joined.
#[derive(Default)]
pub(crate) struct Queue {
    entries: Mutex<Entries>,
    /// Releases still to make without a claim (see [`ORDINARY_AFTER_ANOTHER_CLIENT`]).
    ordinary: AtomicU32,
}

impl Queue {
    /// Places a waiter last, busy (its first re-check is still to come); it leaves the queue
    /// when the returned ticket is dropped.
    pub(crate) fn join(&self, baton: Baton) -> Ticket<'_> {
        let mut entries = self.entries.lock();
        let id = entries.next_id;
        entries.next_id += 1;
        entries.queue.push_back(Entry {
            id,
            baton,
            state: State::Busy,
            handed: None,
            waker: None,
        });
        Ticket { queue: self, id }
    }

    /// How many of its waiters are parked (claimable) now.
    pub(crate) fn parked(&self) -> usize {
        let entries = self.entries.lock();
        entries
            .queue
            .iter()
            .filter(|e| e.state == State::Parked)
            .count()
    }

    /// Claims the first parked waiter. It keeps its place until it leaves, so a withdrawn
    /// claim leaves it first in line; waiters busy with an attempt of their own are skipped.
    pub(crate) fn claim(self: &Arc<Self>) -> Option<Claim> {
        let skip = |n: u32| n.checked_sub(1);
        if self.ordinary.fetch_update(Relaxed, Relaxed, skip).is_ok() {
            return None;
        }
        let mut entries = self.entries.lock();
        let entry = entries
            .queue
            .iter_mut()
            .find(|e| e.state == State::Parked)?;
        // Not woken: it has nothing to do until the pass's outcome.
        entry.state = State::Claimed;
        Some(Claim {
            queue: self.clone(),
            id: entry.id,
            baton: entry.baton,
        })
    }
}

fn wake(entry: &mut Entry) {
    if let Some(waker) = entry.waker.take() {
        waker.wake();
    }
}

/// A releaser's claim on a parked waiter.
pub(crate) struct Claim {
    queue: Arc<Queue>,
    id: u64,
    baton: Baton,
}

impl Claim {
    /// Who the waiter is.
    pub(crate) fn baton(&self) -> Baton {
        self.baton
    }

    /// The lock was not passed: the waiter parks on (an ordinary release wakes it as any
    /// waiter).
    pub(crate) fn withdraw(self) {
        let mut entries = self.queue.entries.lock();
        if let Some(entry) = entries.get(self.id) {
            entry.state = State::Parked;
            wake(entry);
        }
    }

    /// Not passed: another client was found waiting, and the release was an ordinary one.
    /// The next few releases are ordinary too.
    pub(crate) fn another_client_waits(self) {
        self.queue
            .ordinary
            .store(ORDINARY_AFTER_ANOTHER_CLIENT, Relaxed);
        self.withdraw();
    }

    /// Hands the passed lock's guard over. Returns it if the waiter has left meanwhile: the
    /// caller then drops it, which releases the hold.
    pub(crate) fn hand(self, guard: Box<dyn Any + Send>) -> Option<Box<dyn Any + Send>> {
        let mut entries = self.queue.entries.lock();
        let Some(entry) = entries.get(self.id) else {
            return Some(guard);
        };
        entry.state = State::Handed;
        entry.handed = Some(guard);
        wake(entry);
        None
    }
}

/// A waiter's place in a [`Queue`]; dropping it leaves the queue, and drops a guard handed
/// to it and not taken — which releases that hold at once.
pub(crate) struct Ticket<'q> {
    queue: &'q Queue,
    id: u64,
}

impl Ticket<'_> {
    /// The waiter parks: a releaser may now claim it.
    pub(crate) fn park(&self) {
        let mut entries = self.queue.entries.lock();
        if let Some(entry) = entries.get(self.id) {
            if entry.state == State::Busy {
                entry.state = State::Parked;
            }
        }
    }

    /// The waiter is about to try for the lock itself. Returns the guard if the lock was
    /// passed to it meanwhile (waiting out a pass in flight first: its outcome is one round
    /// trip away, and the releaser bounds it — a caller whose deadline comes first drops the
    /// ticket instead, leaving whatever the pass wrote to the releaser); `None`: go ahead.
    pub(crate) async fn start_attempt(&self) -> Option<Box<dyn Any + Send>> {
        poll_fn(|cx| {
            let mut entries = self.queue.entries.lock();
            let Some(entry) = entries.get(self.id) else {
                return Poll::Ready(None);
            };
            match entry.state {
                State::Busy => Poll::Ready(None),
                State::Parked => {
                    entry.state = State::Busy;
                    Poll::Ready(None)
                }
                State::Handed => {
                    // A guard it could not take would come back here: it tries on its own.
                    entry.state = State::Busy;
                    Poll::Ready(entry.handed.take())
                }
                State::Claimed => {
                    entry.waker = Some(cx.waker().clone());
                    Poll::Pending
                }
            }
        })
        .await
    }

    /// Resolves when a releaser has handed this waiter the lock. A claim alone does not end
    /// the wait: an unlock message may still come to it (the pass found another client
    /// waiting and published), and it is this waiter's to consume.
    pub(crate) async fn acted(&self) {
        poll_fn(|cx| {
            let mut entries = self.queue.entries.lock();
            match entries.get(self.id) {
                Some(entry) if entry.state == State::Handed => Poll::Ready(()),
                Some(entry) => {
                    entry.waker = Some(cx.waker().clone());
                    Poll::Pending
                }
                None => Poll::Pending,
            }
        })
        .await
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        let unclaimed = {
            let mut entries = self.queue.entries.lock();
            let at = entries.position(self.id);
            at.and_then(|at| entries.queue.remove(at))
                .and_then(|e| e.handed)
        };
        // Dropped outside the lock: the guard's drop spawns its release.
        drop(unclaimed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::pin;
    use std::task::Context;

    /// A waiter of `queue`, parked.
    fn parked_waiter(queue: &Queue) -> Ticket<'_> {
        let ticket = queue.join(Baton {
            task: 1,
            lease: Lease::Watchdog,
        });
        ticket.park();
        ticket
    }

    fn is_pending(future: impl std::future::Future) -> bool {
        let mut future = pin!(future);
        future
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_pending()
    }

    #[test]
    fn a_claimed_waiter_leaves_its_wait_only_when_handed_the_lock() {
        // While claimed, the waiter must stay in its wait: an unlock message reaching it then
        // (the pass found another client and published) is its to consume. Leaving as if
        // passed would drop that wake-up onto a second waiter, and both would try.
        let queue = Arc::new(Queue::default());
        let ticket = parked_waiter(&queue);
        let claim = queue.claim().expect("a parked waiter is claimable");
        assert!(is_pending(ticket.acted()), "claimed, not handed");
        claim.withdraw();
        assert!(is_pending(ticket.acted()), "withdrawn: parked on");

        let claim = queue.claim().expect("first in line again");
        assert!(
            claim.hand(Box::new(())).is_none(),
            "the waiter is still there"
        );
        assert!(!is_pending(ticket.acted()), "handed");
    }

    #[test]
    fn after_another_client_was_found_waiting_releases_are_ordinary_for_a_while() {
        // The pass script found another client subscribed and released the ordinary way:
        // that client is likely still waiting, so the next releases skip the claim (a claimed
        // waiter sits out the round trip) and the subscriber count, until a few went by.
        let queue = Arc::new(Queue::default());
        let _waiter = parked_waiter(&queue);
        queue.claim().unwrap().another_client_waits();
        for release in 0..ORDINARY_AFTER_ANOTHER_CLIENT {
            assert!(
                queue.claim().is_none(),
                "release {release} is an ordinary one"
            );
        }
        assert!(
            queue.claim().is_some(),
            "then the waiter is claimable again"
        );
    }
}
