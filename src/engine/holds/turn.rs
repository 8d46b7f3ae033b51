//! The turn on one hold ([`Turn`]): the only counted call of one owner on one lock in flight,
//! and what that call's reply does to the hold — registering a guard, a fresh generation, a
//! hand-off in memory, a forgotten guard before a release.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::entry::{valid_until, Entry, Holder};
use super::{Holds, Lease, Loss, NEXT_GENERATION};

/// The turn on one entry: the only counted call of this owner on this lock in flight. Freed
/// on drop; an entry left idle is removed.
pub(crate) struct Turn {
    pub(super) holds: Arc<Holds>,
    pub(super) entry: Arc<Entry>,
}

/// What [`Turn::hand_on`] came to.
pub(crate) enum HandOn {
    /// Handed on: the new guard's hold.
    Handed(Registered),
    /// The run of hand-offs lasted its time: release the ordinary way.
    RunOver,
    /// Not this hold (lost, re-entered, or its validity too short for the waiter): the
    /// release takes its ordinary path.
    NotLocal,
}

/// What an acquire's reply did to the registry.
pub(crate) struct Registered {
    pub(crate) entry: Arc<Entry>,
    pub(crate) generation: u64,
}

impl Turn {
    pub(crate) fn entry(&self) -> &Arc<Entry> {
        &self.entry
    }

    /// Registers one more guard after an acquire sent at `sent_at` whose reply gave the
    /// owner's new `count` (1 for a fresh hold).
    pub(crate) fn acquired(&self, count: i64, lease: Lease, sent_at: Instant) -> Registered {
        self.register(count, lease, sent_at, 0)
    }

    /// Whether an acquire sent at `sent_at` with `lease`, whose reply gave the owner's new
    /// `count`, would register a hold already lost by the local clock: its validity ended
    /// before the reply came (a server that paused past the lease). Such a hold is released,
    /// never handed out (invariant 18, docs/DESIGN.md).
    pub(crate) fn ended_before_reply(&self, count: i64, lease: Lease, sent_at: Instant) -> bool {
        let until = valid_until(sent_at, lease.duration(self.holds.watchdog_lease));
        let now = Instant::now();
        if now < until {
            return false;
        }
        let state = self.entry.state.lock();
        // A re-entry of a live hold keeps that hold's validity.
        count <= 1 || !state.live(state.generation)
    }

    /// Registers the guard of a hold a baton pass sent at `sent_at` wrote: the `passes`-th
    /// pass in a row.
    pub(crate) fn passed(&self, lease: Lease, sent_at: Instant, passes: u32) -> Registered {
        self.register(1, lease, sent_at, passes)
    }

    /// How many baton passes in a row led to the current hold.
    pub(crate) fn passes(&self) -> u32 {
        self.entry.state.lock().passes
    }

    /// Whether the guard of `generation` about to be released is the hold's last, and the
    /// hold is live: its release ends the hold, unless it is handed on.
    pub(crate) fn last_guard(&self, generation: u64) -> bool {
        let state = self.entry.state.lock();
        state.live(generation) && state.guards == 1
    }

    /// The local hand-off (see [`crate::engine::baton`]): the last guard of `generation`, taken with
    /// `lease`, becomes a guard taken with `next` by a waiter of this client — the same hold
    /// in Redis (field, count 1, expiry, generation, validity), one more in its run. Refused
    /// unless the hold is live and will stay valid for what the waiter needs: half the
    /// watchdog lease (a renewal is due well before then), or a fixed lease's whole length;
    /// and refused once the run has lasted `run_for` since its first local hand-off, or when
    /// an unlock message was heard on the lock's channel (`unlock_heard`) since Redis last
    /// confirmed the hold.
    pub(crate) fn hand_on(
        &self,
        generation: u64,
        lease: Lease,
        next: Lease,
        run_for: Duration,
        unlock_heard: Option<Instant>,
    ) -> HandOn {
        let now = Instant::now();
        let needed = match next {
            Lease::Watchdog => self.holds.watchdog_lease / 2,
            Lease::Fixed(_) => next.duration(self.holds.watchdog_lease),
        };
        let mut state = self.entry.state.lock();
        if !state.live(generation) || state.guards != 1 || state.given_out {
            return HandOn::NotLocal;
        }
        if unlock_heard.is_some_and(|heard| heard > state.confirmed_at) {
            // Redis may have dropped the hold since it last said it had it (a force-unlock
            // publishes on the channel): the pass script asks it.
            return HandOn::NotLocal;
        }
        let since = *state.local_since.get_or_insert(now);
        if now.saturating_duration_since(since) >= run_for {
            return HandOn::RunOver;
        }
        if state.valid_until.saturating_duration_since(now) <= needed {
            return HandOn::NotLocal;
        }
        state.watchdog_guards = state
            .watchdog_guards
            .saturating_sub(u32::from(lease == Lease::Watchdog));
        state.watchdog_guards += u32::from(next == Lease::Watchdog);
        state.passes += 1;
        // A new holder, whose owner nobody outside has been given yet.
        state.given_out = false;
        HandOn::Handed(Registered {
            entry: self.entry.clone(),
            generation,
        })
    }

    /// [`acquired`](Turn::acquired); a fresh hold was reached through `passes` passes in a
    /// row, while a re-entry keeps its hold's run.
    fn register(&self, count: i64, lease: Lease, sent_at: Instant, passes: u32) -> Registered {
        let lease_len = lease.duration(self.holds.watchdog_lease);
        let until = valid_until(sent_at, lease_len);
        let entry = &self.entry;
        let mut stale = None;
        let (generation, was_held) = {
            let mut state = entry.state.lock();
            let was_held = state.held();
            let live = state.live(state.generation);
            if count <= 1 || !live {
                // A fresh hold: whatever was registered before is over, even if nobody had
                // noticed yet; its guards must never release this one.
                if state.guards > 0 && state.lost.is_none() {
                    stale = Some(state.generation);
                }
                // Only guards ask, so a hold with none left costs no clock read here.
                if state.guards > 0 {
                    let ended = state
                        .ended_at(state.generation)
                        .unwrap_or_else(Instant::now);
                    state.replaced = Some(ended);
                }
                state.generation = NEXT_GENERATION.fetch_add(1, Ordering::Relaxed);
                state.guards = 0;
                state.watchdog_guards = 0;
                state.lost = None;
                state.valid_until = until;
                state.passes = passes;
                state.local_since = None;
                state.given_out = false;
                state.doubted = false;
                state.confirmed_at = sent_at;
            }
            state.guards += 1;
            state.watchdog_guards += u32::from(lease == Lease::Watchdog);
            // Under the lock this takes anyway: the guard is kept where it is registered (a
            // passed guard's waiter notes itself on adoption).
            state.holder = Some(Holder::current());
            state.valid_until = state.valid_until.max(until);
            state.confirmed_at = state.confirmed_at.max(sent_at);
            (state.generation, was_held)
        };
        entry.metrics.held(was_held, true);
        if let Some(old) = stale {
            entry.metrics.lost(Loss::Replaced.cause());
            tracing::warn!(key = %entry.key, owner = %entry.field, generation = old, "lock lease lost: the lock was taken afresh by the same owner");
            entry.lost_notify.notify_waiters();
        }
        Registered {
            entry: entry.clone(),
            generation,
        }
    }

    /// An acquire whose hold will not be registered (it is released again at once) replied
    /// `count`: a fresh hold (1) means whatever was registered before is over.
    pub(crate) fn note_count(&self, count: i64) {
        if count > 1 {
            return;
        }
        let generation = {
            let state = self.entry.state.lock();
            if state.guards == 0 {
                return;
            }
            state.generation
        };
        self.entry.mark_lost(generation, Loss::Replaced);
    }

    /// Forgets one guard of `generation` before its release is sent, so no renewal can
    /// outlive the release. Returns the guards of the generation that remain, or `None` when
    /// the hold is lost (then nothing must be sent: the owner may hold the lock anew).
    pub(crate) fn forget_guard(&self, generation: u64, lease: Lease) -> Option<u32> {
        let mut state = self.entry.state.lock();
        if state.generation != generation {
            return None;
        }
        let was_held = state.held();
        state.guards = state.guards.saturating_sub(1);
        if lease == Lease::Watchdog {
            state.watchdog_guards = state.watchdog_guards.saturating_sub(1);
        }
        let left = state.live(generation).then_some(state.guards);
        let held = state.held();
        drop(state);
        self.entry.metrics.held(was_held, held);
        left
    }

    /// How many holds this client accounts for on the entry (its live guards).
    pub(crate) fn accounted(&self) -> u32 {
        let state = self.entry.state.lock();
        if state.live(state.generation) {
            state.guards
        } else {
            0
        }
    }

    /// Marks the current hold lost.
    pub(crate) fn lose(&self, loss: Loss) {
        let generation = self.entry.state.lock().generation;
        self.entry.mark_lost(generation, loss);
    }

    /// The guards registered now, and marks the hold lost (client shutdown).
    pub(crate) fn end(&self, loss: Loss) -> u32 {
        let (generation, guards) = {
            let state = self.entry.state.lock();
            (state.generation, state.guards)
        };
        self.entry.mark_lost(generation, loss);
        guards
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let wake = self.entry.state.lock().turn.free();
        if wake {
            self.entry.turn_free.notify_one();
        } else {
            self.holds.remove_if_idle(&self.entry);
        }
    }
}
