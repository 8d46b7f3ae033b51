//! The baton queue's state machine (see [`crate::engine::baton`]): each parked waiter's entry, and the
//! transitions a releaser (claim, withdraw, hand) and the waiter (park, start an attempt,
//! wait for the outcome, leave) make on it.
//!
//! Pure: the caller keeps it under one lock and makes each transition in one critical
//! section, so the library's queue and the model tests below (which explore interleavings of
//! waiters and releasers with a model checker) run the same transitions. `G` is what a
//! releaser hands over: a guard in the library, a token in the model.

use std::collections::VecDeque;
use std::task::{Poll, Waker};

use crate::engine::holds::Lease;

/// Who a waiter is, for a pass: what the releaser needs to write its hold.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Baton {
    /// The waiting task's owner number in its client. Only tasks are passed the lock: a
    /// waiter with an explicit owner field (possibly another client's) tries for itself.
    pub(crate) task: u64,
    /// The lease the waiter asked for.
    pub(crate) lease: Lease,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    /// Attempting (or not parked yet): not to be claimed.
    Busy,
    /// Parked: a releaser may claim it.
    Parked,
    /// Claimed by a releaser whose pass is in flight.
    Claimed,
    /// The lock was passed to it; what was handed over waits in `handed`.
    Handed,
}

/// One waiter's entry.
struct Entry<G> {
    id: u64,
    baton: Baton,
    state: State,
    /// What was handed over and not taken yet.
    handed: Option<G>,
    /// Woken when a releaser acts on the entry.
    waker: Option<Waker>,
}

/// The entries of one key's waiters, in the order they joined (so sorted by id).
pub(crate) struct Entries<G> {
    queue: VecDeque<Entry<G>>,
    next_id: u64,
}

impl<G> Default for Entries<G> {
    fn default() -> Self {
        Entries {
            queue: VecDeque::new(),
            next_id: 0,
        }
    }
}

impl<G> Entries<G> {
    /// Where waiter `id` is in the queue, if still there.
    fn position(&self, id: u64) -> Option<usize> {
        match self.queue.front() {
            // A waiter served in turn is first in line.
            Some(e) if e.id == id => Some(0),
            _ => self.queue.binary_search_by_key(&id, |e| e.id).ok(),
        }
    }

    fn get(&mut self, id: u64) -> Option<&mut Entry<G>> {
        let at = self.position(id)?;
        self.queue.get_mut(at)
    }

    /// A waiter joins last, busy (its first re-check is still to come); returns its id.
    pub(crate) fn join(&mut self, baton: Baton) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.queue.push_back(Entry {
            id,
            baton,
            state: State::Busy,
            handed: None,
            waker: None,
        });
        id
    }

    #[cfg(any(test, feature = "test-hooks"))]
    /// How many waiters are parked (claimable).
    pub(crate) fn parked(&self) -> usize {
        self.queue
            .iter()
            .filter(|e| e.state == State::Parked)
            .count()
    }

    /// A releaser claims the first parked waiter: its id and baton. It keeps its place, so a
    /// withdrawn claim leaves it first in line; waiters busy with an attempt are skipped.
    pub(crate) fn claim(&mut self) -> Option<(u64, Baton)> {
        let entry = self.queue.iter_mut().find(|e| e.state == State::Parked)?;
        // Not woken: it has nothing to do until the pass's outcome.
        entry.state = State::Claimed;
        Some((entry.id, entry.baton))
    }

    /// The claim on `id` is withdrawn (the lock was not passed): it parks on.
    pub(crate) fn withdraw(&mut self, id: u64) {
        if let Some(entry) = self.get(id) {
            entry.state = State::Parked;
            wake(entry);
        }
    }

    /// The lock was passed to claimed waiter `id`: `handed` waits for it. Given back if the
    /// waiter has left meanwhile.
    pub(crate) fn hand(&mut self, id: u64, handed: G) -> Result<(), G> {
        let Some(entry) = self.get(id) else {
            return Err(handed);
        };
        entry.state = State::Handed;
        entry.handed = Some(handed);
        wake(entry);
        Ok(())
    }

    /// Waiter `id` parks: a releaser may now claim it.
    pub(crate) fn park(&mut self, id: u64) {
        if let Some(entry) = self.get(id) {
            if entry.state == State::Busy {
                entry.state = State::Parked;
            }
        }
    }

    /// Waiter `id` is about to try for the lock itself: ready with what was handed to it if
    /// the lock was passed to it (`None`: go ahead and try), pending while a claim on it is in
    /// flight (`waker` is woken on its outcome). Never ready with `None` while claimed: a
    /// waiter is never both passed the lock and trying for it.
    pub(crate) fn start_attempt(&mut self, id: u64, waker: &Waker) -> Poll<Option<G>> {
        let Some(entry) = self.get(id) else {
            return Poll::Ready(None);
        };
        match entry.state {
            State::Busy => Poll::Ready(None),
            State::Parked => {
                entry.state = State::Busy;
                Poll::Ready(None)
            }
            State::Handed => {
                // What it could not take would come back here: it tries on its own.
                entry.state = State::Busy;
                Poll::Ready(entry.handed.take())
            }
            State::Claimed => {
                entry.waker = Some(waker.clone());
                Poll::Pending
            }
        }
    }

    /// Whether the lock was handed to waiter `id`; if not, `waker` is woken when a releaser
    /// acts on it.
    pub(crate) fn acted(&mut self, id: u64, waker: &Waker) -> Poll<()> {
        match self.get(id) {
            Some(entry) if entry.state == State::Handed => Poll::Ready(()),
            Some(entry) => {
                entry.waker = Some(waker.clone());
                Poll::Pending
            }
            None => Poll::Pending,
        }
    }

    /// Waiter `id` leaves the queue: returns what was handed to it and not taken, for the
    /// caller to drop outside its lock.
    pub(crate) fn leave(&mut self, id: u64) -> Option<G> {
        let at = self.position(id)?;
        self.queue.remove(at).and_then(|e| e.handed)
    }
}

fn wake<G>(entry: &mut Entry<G>) {
    if let Some(waker) = entry.waker.take() {
        waker.wake();
    }
}

/// Model tests: waiters and releasers of one lock, with the baton pass, under interleavings
/// chosen by a model checker (see [`crate::engine::model`]). The waiters follow the wait loop's steps
/// (re-check through [`Entries::start_attempt`], try, park, wait for a pass or the unlock
/// message); a releaser claims the first parked waiter and either passes it the lock or, having
/// found another client waiting, releases it the ordinary way. The lock in Redis is its holder.
#[cfg(test)]
mod model {
    use super::*;
    use crate::engine::hub::wake_state::{TakenWakeUp, Wake, Wakes};
    use crate::engine::model::explore;
    use shuttle::future::{block_on, spawn};
    use shuttle::sync::atomic::AtomicUsize;
    use shuttle::sync::Mutex;
    use std::future::{poll_fn, Future};
    use std::pin::pin;
    use std::sync::Arc;

    /// The queue, and which waiters a releaser has claimed (changed in the same critical
    /// sections as the entries, so it is what the releasers believe at every transition).
    struct Queue {
        entries: Entries<usize>,
        claimed: Vec<bool>,
    }

    struct World {
        queue: Mutex<Queue>,
        /// The lock's holder in Redis: a waiter's number, or the first holder's.
        holder: Mutex<Option<usize>>,
        wakes: Wakes<AtomicUsize>,
        /// Whether releaser `n` finds another client waiting (no pass).
        another_client: fn(usize) -> bool,
    }

    impl World {
        /// Ends `me`'s hold: passes the lock to the first parked waiter, or releases it with
        /// the unlock message. A pass to a waiter that left is released in turn, as the
        /// guard's drop does.
        async fn release(&self, mut me: usize) {
            loop {
                {
                    let mut holder = self.holder.lock().unwrap();
                    assert_eq!(*holder, Some(me), "a hold ended twice: released and passed");
                    let claim = {
                        let mut queue = self.queue.lock().unwrap();
                        let claim = queue.entries.claim();
                        if let Some((_, baton)) = claim {
                            queue.claimed[baton.task as usize] = true;
                        }
                        claim
                    };
                    let Some((id, baton)) = claim else {
                        *holder = None;
                        drop(holder);
                        self.wakes.wake_one();
                        return;
                    };
                    let next = baton.task as usize;
                    if (self.another_client)(me) {
                        // The script releases and publishes; then the claim is withdrawn.
                        *holder = None;
                        drop(holder);
                        self.wakes.wake_one();
                        let mut queue = self.queue.lock().unwrap();
                        queue.claimed[next] = false;
                        queue.entries.withdraw(id);
                        return;
                    }
                    // The script writes the waiter's hold; then it is handed over.
                    *holder = Some(next);
                    drop(holder);
                    let handed = {
                        let mut queue = self.queue.lock().unwrap();
                        queue.claimed[next] = false;
                        queue.entries.hand(id, next)
                    };
                    match handed {
                        Ok(()) => return,
                        // It left: the hold passed to it is released at once.
                        Err(task) => me = task,
                    }
                }
            }
        }

        /// Waiter `me`: until it holds the lock, or, if it `quits`, until its first wake-up
        /// (or the pass), after which it leaves as a cancelled waiter does.
        async fn wait(&self, me: usize, quits: bool) {
            let id = self.queue.lock().unwrap().entries.join(Baton {
                task: me as u64,
                lease: Lease::Watchdog,
            });
            // The wake-up it took and has not used, as the wait loop keeps it.
            let taken = TakenWakeUp::default();
            loop {
                let handed = poll_fn(|cx| {
                    let mut queue = self.queue.lock().unwrap();
                    let started = queue.entries.start_attempt(id, cx.waker());
                    if let Poll::Ready(None) = started {
                        assert!(!queue.claimed[me], "a claimed waiter is attempting");
                    }
                    started
                })
                .await;
                let got = match handed {
                    Some(task) => {
                        assert_eq!(task, me, "handed another waiter's hold");
                        true
                    }
                    None => {
                        let mut holder = self.holder.lock().unwrap();
                        holder.is_none() && holder.replace(me).is_none()
                    }
                };
                // Its look used the wake-up: the lock is its, or held by one whose release wakes.
                taken.used();
                if got {
                    assert_eq!(*self.holder.lock().unwrap(), Some(me), "two holders");
                    break;
                }
                self.queue.lock().unwrap().entries.park(id);
                // Biased, as the wait loop's select: a pass first, then the message.
                let mut message = pin!(self.wakes.wait(Wake::Lock, 0));
                let woken = poll_fn(|cx| {
                    let acted = self.queue.lock().unwrap().entries.acted(id, cx.waker());
                    if acted.is_ready() {
                        return Poll::Ready(false);
                    }
                    message.as_mut().poll(cx).map(|()| true)
                })
                .await;
                if woken {
                    taken.take();
                }
                if quits {
                    // As the registration's drop: a wake-up taken goes on, then the waiter.
                    taken.pass_on(&self.wakes, Wake::Lock);
                    let handed = self.queue.lock().unwrap().entries.leave(id);
                    self.wakes.leave();
                    if let Some(task) = handed {
                        self.release(task).await;
                    }
                    return;
                }
            }
            let left = self.queue.lock().unwrap().entries.leave(id);
            assert!(left.is_none(), "a pass left behind");
            self.wakes.leave();
            // Held: released at once.
            self.release(me).await;
        }
    }

    /// `waiters` waiters (the first `quitters` of them give up once woken) and a first holder
    /// numbered `waiters`; every release by a holder for which `another_client` says so finds
    /// another client waiting. All but the quitters must get the lock, one at a time, the lock
    /// must end free, and no waiter may attempt while claimed.
    fn scenario(waiters: usize, quitters: usize, another_client: fn(usize) -> bool) {
        let world = Arc::new(World {
            queue: Mutex::new(Queue {
                entries: Entries::default(),
                claimed: vec![false; waiters],
            }),
            holder: Mutex::new(Some(waiters)),
            wakes: Wakes::new(waiters),
            another_client,
        });
        let mut tasks = Vec::new();
        for me in 0..waiters {
            let world = world.clone();
            tasks.push(spawn(async move { world.wait(me, me < quitters).await }));
        }
        let first = world.clone();
        tasks.push(spawn(async move { first.release(waiters).await }));
        block_on(async {
            for task in tasks {
                task.await.unwrap();
            }
        });
        assert_eq!(
            *world.holder.lock().unwrap(),
            None,
            "a hold nobody knows about"
        );
    }

    #[test]
    fn passes_reach_every_waiter_and_a_claimed_waiter_never_attempts() {
        explore(|| scenario(3, 0, |_| false));
    }

    #[test]
    fn a_withdrawn_claim_leaves_the_waiter_to_the_unlock_message() {
        // Every other release finds another client waiting: claimed, withdrawn, published.
        explore(|| scenario(3, 0, |me| me % 2 == 1));
    }

    #[test]
    fn a_waiter_that_leaves_claimed_or_handed_leaves_no_hold_behind() {
        explore(|| scenario(3, 1, |me| me == 2));
    }
}
