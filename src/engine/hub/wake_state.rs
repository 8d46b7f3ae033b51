//! The wake-up accounting of one waiter group of the hub (see [`crate::engine::hub`]): who is woken by
//! a message, a wake-up passed on, or a departure, and what a parked waiter takes.
//!
//! Kept apart from the hub's subscription plumbing so that it can be explored as a state
//! machine: its counters are a [`Word`], the process's atomics in the library and a model
//! checker's in the model tests below, which run waiters, releasers and quitters against it
//! under many interleavings and check that wake-ups are neither lost nor doubled.

use std::future::Future;
use std::sync::atomic::Ordering;

use tokio::sync::Notify;

/// What a message on a channel means for its waiters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wake {
    /// A lock channel: `0` (unlock) wakes one waiter of each group, `1` (a read/write lock's
    /// write-unlock) wakes all of them, and `-<ms>` (a read/write lock's read unlock that
    /// brought the lock's expiry down to `ms` milliseconds) wakes all of them once `ms` have
    /// passed: they parked until the later expiry they had read, and the lock may be free
    /// from then on. Redisson's waiters ignore that last one (every number but 0 and 1).
    Lock,
    /// A semaphore channel: the message is a number of permits, and wakes that many waiters
    /// of each group. A woken waiter that cannot use the permits (it asks for more) passes
    /// its wake-up on to the waiters that have not looked since the message.
    Permits,
}

/// An atomic counter: the state the group's waiters and the hub's dispatcher share without a
/// lock. The model tests swap in one whose every access is a scheduling point.
pub(crate) trait Word: Send + Sync + 'static {
    /// A counter starting at `value`.
    fn new(value: usize) -> Self;
    /// Its value.
    fn load(&self, order: Ordering) -> usize;
    /// Adds `value` (wrapping); returns the value before.
    fn fetch_add(&self, value: usize, order: Ordering) -> usize;
    /// Subtracts `value` (wrapping); returns the value before.
    fn fetch_sub(&self, value: usize, order: Ordering) -> usize;
    /// Applies `f` atomically while it returns a new value; returns the value before.
    fn fetch_update(
        &self,
        set: Ordering,
        fetch: Ordering,
        f: impl FnMut(usize) -> Option<usize>,
    ) -> Result<usize, usize>;
}

/// Implements [`Word`] by delegating to an atomic type with the standard library's methods.
macro_rules! atomic_word {
    ($atomic:ty) => {
        impl $crate::engine::hub::wake_state::Word for $atomic {
            fn new(value: usize) -> Self {
                <$atomic>::new(value)
            }
            fn load(&self, order: ::std::sync::atomic::Ordering) -> usize {
                <$atomic>::load(self, order)
            }
            fn fetch_add(&self, value: usize, order: ::std::sync::atomic::Ordering) -> usize {
                <$atomic>::fetch_add(self, value, order)
            }
            fn fetch_sub(&self, value: usize, order: ::std::sync::atomic::Ordering) -> usize {
                <$atomic>::fetch_sub(self, value, order)
            }
            fn fetch_update(
                &self,
                set: ::std::sync::atomic::Ordering,
                fetch: ::std::sync::atomic::Ordering,
                f: impl FnMut(usize) -> Option<usize>,
            ) -> Result<usize, usize> {
                <$atomic>::fetch_update(self, set, fetch, f)
            }
        }
    };
}

atomic_word!(std::sync::atomic::AtomicUsize);
// The model tests' atomics, which the checker schedules.
#[cfg(test)]
atomic_word!(shuttle::sync::atomic::AtomicUsize);

/// The wake-ups of one group: its waiters, what they park on, and what a message left them.
pub(crate) struct Wakes<W: Word = std::sync::atomic::AtomicUsize> {
    /// Waiters registered; changed only under the channel's `groups` lock (registration and
    /// departure), read by the dispatcher to cap what a message leaves pending.
    waiters: W,
    /// The wake-up primitive they park on (FIFO for `notify_one`).
    notify: Notify,
    /// [`Wake::Permits`]: wake-ups delivered and not yet taken by a waiter, at most one per
    /// registered waiter. `Notify` keeps at most one wake-up for a waiter that is not parked
    /// yet (still busy with its attempt when the message came), so `n` wake-ups would
    /// collapse into one; they are counted here instead.
    pending: W,
    /// [`Wake::Permits`]: the messages delivered so far (wrapping). A waiter notes it before
    /// each look and takes no wake-up until it moves: what it saw is no news to it. So a
    /// wake-up passed on by a waiter that could not use it goes to one that has not looked,
    /// never back and forth between two that cannot use it.
    messages: W,
}

impl<W: Word> Wakes<W> {
    /// A group with `waiters` registered and no news.
    pub(crate) fn new(waiters: usize) -> Self {
        Wakes {
            waiters: W::new(waiters),
            notify: Notify::new(),
            pending: W::new(0),
            messages: W::new(0),
        }
    }

    /// A waiter registers (under the channel's `groups` lock).
    pub(crate) fn join(&self) {
        self.waiters.fetch_add(1, Ordering::AcqRel);
    }

    /// A waiter leaves (under the channel's `groups` lock); returns how many are left.
    pub(crate) fn leave(&self) -> usize {
        let left = self.waiters.fetch_sub(1, Ordering::AcqRel) - 1;
        self.trim_pending(left);
        left
    }

    /// Drops the wake-ups beyond `most`: beyond the waiters registered they would only cause
    /// spurious re-checks. Returns how many are pending now.
    fn trim_pending(&self, most: usize) -> usize {
        match self
            .pending
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| {
                (p > most).then_some(most)
            }) {
            Ok(_) => most,
            Err(p) => p,
        }
    }

    /// The messages delivered so far (wrapping): noted before each look, so that on a
    /// [`Wake::Permits`] channel the waiter takes no wake-up about what it saw.
    pub(crate) fn messages(&self) -> u32 {
        // Truncated: compared only for equality, and wrapping either way.
        self.messages.load(Ordering::Acquire) as u32
    }

    /// Parks until a message wakes this waiter; `seen` is [`messages`](Self::messages) as the
    /// waiter noted it before it last looked ([`Wake::Permits`] only).
    ///
    /// Not an `async fn`: a parked waiter keeps this future, and as an `async fn` it would
    /// keep its arguments twice (as passed, and as bound), 8 bytes more.
    #[allow(clippy::manual_async_fn)]
    pub(crate) fn wait(&self, wake: Wake, seen: u32) -> impl Future<Output = ()> + Send + '_ {
        async move {
            if wake == Wake::Lock {
                return self.notify.notified().await;
            }
            loop {
                let mut notified = std::pin::pin!(self.notify.notified());
                // Registered before the check: a wake-up counted after it notifies this one.
                notified.as_mut().enable();
                if self.messages() != seen && self.take_pending() {
                    return;
                }
                notified.await;
            }
        }
    }

    /// [`Wake::Lock`]'s unlock message: wakes the first waiter in line, or the next one to
    /// park if none is parked.
    pub(crate) fn wake_one(&self) {
        self.notify.notify_one();
    }

    /// Wakes every waiter: the parked ones, and one still busy with its attempt.
    pub(crate) fn wake_all(&self) {
        self.notify.notify_waiters();
        self.notify.notify_one();
    }

    /// Wakes the parked waiters only, to see news that is not a wake-up (a refused
    /// subscription).
    pub(crate) fn wake_parked(&self) {
        self.notify.notify_waiters();
    }

    /// Takes one pending wake-up, if any.
    fn take_pending(&self) -> bool {
        self.pending
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| p.checked_sub(1))
            .is_ok()
    }

    /// Adds up to `n` wake-ups, capped at one per registered waiter; returns how many are
    /// pending now.
    fn add_pending(&self, n: u64) -> usize {
        let cap = || self.waiters.load(Ordering::Acquire).max(1);
        let waiters = cap();
        let _ = self
            .pending
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| {
                let room = waiters.saturating_sub(p) as u64;
                Some(p + n.min(room) as usize)
            });
        // Capped again: a waiter that left after the count was read, and trimmed before the
        // wake-ups were added, would leave them beyond the cap (found by the model below).
        self.trim_pending(cap())
    }

    /// Hands a wake-up on to the next waiter that may use it.
    pub(crate) fn pass_on(&self, wake: Wake) {
        match wake {
            Wake::Lock => self.notify.notify_one(),
            Wake::Permits => {
                self.add_pending(1);
                // Every parked waiter, not the first in line: that one may have looked since
                // the message, and would leave the wake-up to the others without telling
                // them. Those that looked go back to sleep without a round trip.
                self.notify.notify_waiters();
            }
        }
    }

    /// A message: `permits` wake-ups for the waiters, all of whom it is news to.
    pub(crate) fn permits_released(&self, permits: u64) {
        self.messages.fetch_add(1, Ordering::AcqRel);
        let pending = self.add_pending(permits);
        // Wake-ups left by earlier messages count too: every waiter may take one now.
        for _ in 0..permits.min(pending as u64) {
            self.notify.notify_one();
        }
    }

    /// Wake-ups pending now.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }
}

/// The wake-up one waiter took and has not used yet. Kept with the waiter's registration,
/// not by its wait loop, so that however the waiter leaves (dropped while the re-check it was
/// woken for is in flight included) the wake-up goes on to the next waiter; and here, beside
/// the group's accounting, so that the model tests below pass wake-ups on by the same rule.
///
/// Only its own waiter touches it (its wait loop, and the registration's drop): an atomic only
/// because a parked waiter's future borrows it across awaits and must be `Send`.
#[derive(Default)]
pub(crate) struct TakenWakeUp(std::sync::atomic::AtomicBool);

impl TakenWakeUp {
    /// A message woke the waiter: it holds the wake-up until it uses it or passes it on.
    pub(crate) fn take(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether the waiter holds a wake-up it has not used yet.
    pub(crate) fn held(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// The waiter's look used the wake-up it held, if any.
    pub(crate) fn used(&self) {
        self.0.store(false, Ordering::Relaxed);
    }

    /// Hands the wake-up the waiter holds, if any, to the group's next waiter: it will not use
    /// it. Returns whether there was one.
    pub(crate) fn pass_on<W: Word>(&self, wakes: &Wakes<W>, wake: Wake) -> bool {
        let held = self.0.swap(false, Ordering::Relaxed);
        if held {
            wakes.pass_on(wake);
        }
        held
    }
}

/// Model tests: the group's wake-ups under interleavings chosen by a model checker (see
/// [`crate::engine::model`]). Every access to a counter is a point where another task may run; a
/// wake-up lost leaves a waiter parked with nobody left to wake it, which the checker reports
/// as a deadlock.
#[cfg(test)]
mod model {
    use super::*;
    use crate::engine::model::explore;
    use shuttle::future::{block_on, spawn};
    use shuttle::sync::atomic::{AtomicBool, AtomicUsize};
    use std::sync::Arc;

    type ModelWakes = Wakes<AtomicUsize>;

    /// A semaphore's waiters on one group: each needs some permits, tries, and parks until a
    /// message; whoever holds permits releases them with a message. The first `quitters` give
    /// up once woken (their deadline came with the wake-up) and pass it on. Every other waiter
    /// must get its permits (none left parked) — but one that needs more than all `held` can
    /// never get them, and may wait on — and no more wake-ups are taken than messages and
    /// passes gave.
    fn permits_scenario(needs: &'static [usize], quitters: usize, held: usize) {
        // One more waiter is registered, busy with its first attempt throughout: the group
        // stays (the hub drops a group with no waiter left, and what it counted with it).
        let wakes = Arc::new(ModelWakes::new(needs.len() + 1));
        let free = Arc::new(AtomicUsize::new(0));
        // Wake-ups given (permits in messages, wake-ups passed on) and taken.
        let given = Arc::new(AtomicUsize::new(0));
        let taken = Arc::new(AtomicUsize::new(0));
        let release = {
            let (wakes, free, given) = (wakes.clone(), free.clone(), given.clone());
            move |n: usize| {
                // As the release script: the permits are back before the message is sent.
                free.fetch_add(n, Ordering::SeqCst);
                given.fetch_add(n, Ordering::SeqCst);
                wakes.permits_released(n as u64);
            }
        };
        let mut tasks = Vec::new();
        // Registered to the end: the busy one, and those that need more than there is.
        let mut left = 1;
        for (i, &need) in needs.iter().enumerate() {
            let quits = i < quitters;
            let (wakes, free, given, taken, release) = (
                wakes.clone(),
                free.clone(),
                given.clone(),
                taken.clone(),
                release.clone(),
            );
            let task = spawn(async move {
                let woken = TakenWakeUp::default();
                loop {
                    let seen = wakes.messages();
                    let got = free
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |f| f.checked_sub(need));
                    match got {
                        Ok(_) => break,
                        // As the wait loop: woken for permits too few for it, it passes the
                        // wake-up on to a smaller request.
                        Err(f) if f > 0 => {
                            if woken.pass_on(&wakes, Wake::Permits) {
                                given.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                        // None free: taken by another, whose release will wake.
                        Err(_) => woken.used(),
                    }
                    wakes.wait(Wake::Permits, seen).await;
                    taken.fetch_add(1, Ordering::SeqCst);
                    woken.take();
                    if quits {
                        // As the registration's drop: the wake-up goes on, then the waiter.
                        assert!(woken.pass_on(&wakes, Wake::Permits));
                        given.fetch_add(1, Ordering::SeqCst);
                        wakes.leave();
                        return;
                    }
                }
                // Acquired: its registration goes, then it releases what it took.
                wakes.leave();
                release(need);
            });
            if need <= held {
                tasks.push(task);
            } else {
                left += 1;
            }
        }
        tasks.push(spawn(async move { release(held) }));
        block_on(async {
            for task in tasks {
                task.await.unwrap();
            }
        });
        assert!(
            taken.load(Ordering::SeqCst) <= given.load(Ordering::SeqCst),
            "a wake-up was taken twice: {} taken, {} given",
            taken.load(Ordering::SeqCst),
            given.load(Ordering::SeqCst)
        );
        assert!(
            wakes.pending() <= left,
            "{} wake-ups pending for the {left} waiters left",
            wakes.pending()
        );
    }

    #[test]
    fn permits_wake_ups_are_neither_lost_nor_doubled() {
        explore(|| permits_scenario(&[1, 1, 1], 0, 2));
    }

    #[test]
    fn a_wake_up_too_small_for_its_waiter_reaches_a_smaller_request() {
        // The two-permit waiter may be woken first by one permit: it must pass it on.
        explore(|| permits_scenario(&[2, 1, 1], 0, 2));
    }

    #[test]
    fn a_wake_up_too_small_for_its_waiter_is_not_kept_from_a_request_it_fits() {
        // One permit, one wake-up: if it reaches the two-permit waiter first, only its pass
        // gets it to the one-permit waiter (above, the other acquirers' releases would).
        explore(|| permits_scenario(&[2, 1], 0, 1));
    }

    #[test]
    fn a_waiter_that_gives_up_once_woken_passes_the_permits_on() {
        explore(|| permits_scenario(&[1, 1, 1], 1, 1));
    }

    /// A lock's waiters on one group: each tries, parks until the unlock message, and once it
    /// holds the lock releases it with one. `quitters` of them, once woken, give up instead of
    /// trying and pass the wake-up on. Every other waiter must get the lock.
    fn lock_scenario(waiters: usize, quitters: usize) {
        let wakes = Arc::new(ModelWakes::new(waiters + quitters));
        let held = Arc::new(AtomicBool::new(true));
        let mut tasks = Vec::new();
        for i in 0..waiters + quitters {
            let (wakes, held) = (wakes.clone(), held.clone());
            let quits = i < quitters;
            tasks.push(spawn(async move {
                let woken = TakenWakeUp::default();
                loop {
                    if !quits && !held.swap(true, Ordering::SeqCst) {
                        break;
                    }
                    // Busy: held by another, whose release will wake.
                    woken.used();
                    wakes.wait(Wake::Lock, 0).await;
                    woken.take();
                    if quits {
                        // Woken, it leaves: the wake-up may have been the one meant for all.
                        assert!(woken.pass_on(&wakes, Wake::Lock));
                        wakes.leave();
                        return;
                    }
                }
                wakes.leave();
                held.store(false, Ordering::SeqCst);
                wakes.wake_one();
            }));
        }
        let (wakes, holder) = (wakes.clone(), held.clone());
        tasks.push(spawn(async move {
            holder.store(false, Ordering::SeqCst);
            wakes.wake_one();
        }));
        block_on(async {
            for task in tasks {
                task.await.unwrap();
            }
        });
    }

    #[test]
    fn lock_wake_ups_are_not_lost_when_a_woken_waiter_gives_up() {
        explore(|| lock_scenario(2, 1));
    }
}
