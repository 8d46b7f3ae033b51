//! One owner's hold on one lock ([`Entry`]): its generation, its guards, its validity by the
//! local clock and its lost signal, and what the in-memory hand-off needs to know of it.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::turn_state::TurnState;
use super::{HoldOps, Loss};
use crate::metrics::HoldMetrics;

/// One owner's hold on one lock, and the turn of calls changing it.
pub(crate) struct Entry {
    pub(crate) key: Arc<str>,
    pub(crate) field: Arc<str>,
    /// Only this client writes the field (its id is the client's): an unknown outcome can be
    /// settled by trimming the count to what this client accounts for.
    pub(super) own: bool,
    /// Release and renewal for this entry (the kind that created it).
    pub(crate) ops: Arc<dyn HoldOps>,
    pub(super) state: Mutex<State>,
    /// Wakes the next task waiting for the turn.
    pub(super) turn_free: Notify,
    /// Wakes guards when the hold is lost.
    pub(super) lost_notify: Notify,
    pub(super) metrics: HoldMetrics,
}

pub(super) struct State {
    /// Who has the turn, and how many wait for it.
    pub(super) turn: TurnState,
    pub(super) generation: u64,
    /// Guards of the current generation.
    pub(super) guards: u32,
    /// Of which taken with the watchdog lease.
    pub(super) watchdog_guards: u32,
    pub(super) valid_until: Instant,
    /// When the current generation was found lost: when it stopped being known valid (the
    /// moment Redis's word came, or its validity's end if that was earlier).
    pub(super) lost: Option<Instant>,
    /// When the generation this one replaced stopped being known valid, if guards of it were
    /// left: for their [`ended_at`](Entry::ended_at).
    pub(super) replaced: Option<Instant>,
    /// Where the latest guard of the hold was taken (for the warning about a nested acquire
    /// outside a hold's scope).
    pub(super) holder: Option<Holder>,
    /// How many baton passes in a row led to the current generation (0: its owner took the
    /// lock itself). Kept with the hold, not with a guard: re-entry adds guards to the same
    /// hold, and whichever of them is released last must see the run (see [`crate::engine::baton`]).
    /// Local hand-offs count here too: they keep the hold, and so its run.
    pub(super) passes: u32,
    /// When the current generation was first handed on in memory: the start of its run of
    /// local hand-offs, which a time bound ends (see [`crate::engine::baton`]).
    pub(super) local_since: Option<Instant>,
    /// The current holder's owner was given out (read from its guard or its lock handle, or
    /// named explicitly): whoever has it can re-enter the hold in Redis, so the hold is never
    /// handed on in memory under that field (invariant 16,
    /// docs/DESIGN.md). A hold handed on starts without.
    pub(super) given_out: bool,
    /// When Redis last said it has the hold: the send time of its acquire, renewal or check.
    /// An unlock message heard on the lock's channel after it may mean Redis no longer has
    /// it (a force-unlock): then it is not handed on in memory (invariant 16, docs/DESIGN.md).
    pub(super) confirmed_at: Instant,
    /// A check of the hold is queued for the watchdog (see [`super::Holds::doubt`]).
    pub(super) doubted: bool,
}

/// The sequential context a guard was taken in: a tokio task, or a thread outside any task
/// (the body of `#[tokio::main]` runs in `block_on`, with no task id).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Holder {
    Task(tokio::task::Id),
    Thread(std::thread::ThreadId),
}

impl Holder {
    /// The context running now.
    pub(crate) fn current() -> Holder {
        match tokio::task::try_id() {
            Some(id) => Holder::Task(id),
            None => Holder::Thread(std::thread::current().id()),
        }
    }
}

impl State {
    pub(super) fn idle(&self) -> bool {
        self.turn.idle() && self.guards == 0
    }

    pub(super) fn live(&self, generation: u64) -> bool {
        self.generation == generation && self.lost.is_none() && Instant::now() < self.valid_until
    }

    /// Whether the hold counts in the `held_locks` gauge: guards registered, not marked lost.
    pub(super) fn held(&self) -> bool {
        self.guards > 0 && self.lost.is_none()
    }

    /// When the hold of `generation` stopped being known valid, if it has: the moment it was
    /// found lost, the end of its validity by the local clock, or — for a generation since
    /// replaced — when that was noticed. A generation replaced more than once reports when its
    /// successor ended, an upper bound (no guard outlives two fresh holds in practice: both
    /// need the same owner field).
    pub(super) fn ended_at(&self, generation: u64) -> Option<Instant> {
        if generation == self.generation {
            return self
                .lost
                .or_else(|| (Instant::now() >= self.valid_until).then_some(self.valid_until));
        }
        self.replaced
    }
}

impl Entry {
    /// Notes that a guard of this hold is now kept in the context running now.
    pub(crate) fn held_here(&self) {
        self.state.lock().holder = Some(Holder::current());
    }

    /// The owner of the hold of `generation` is given out: it is never handed on in memory.
    pub(crate) fn give_out(&self, generation: u64) {
        let mut state = self.state.lock();
        if state.generation == generation {
            state.given_out = true;
        }
    }

    /// Whether the hold of `generation` is lost: told so by Redis, replaced by a fresh hold,
    /// or its lease ran out by the local clock.
    pub(crate) fn is_lost(&self, generation: u64) -> bool {
        !self.state.lock().live(generation)
    }

    /// Whether the hold of `generation` is held now (live, with guards), under a field other
    /// than `field`: an acquire of that other field would be refused by Redis.
    pub(crate) fn held_against(&self, generation: u64, field: &str) -> bool {
        *self.field != *field && {
            let state = self.state.lock();
            state.live(generation) && state.guards > 0
        }
    }

    /// Whether Redis has not confirmed the hold of `generation` since `at` (an unlock message
    /// heard then): its last acquire, renewal or check was sent before.
    pub(crate) fn unconfirmed_since(&self, generation: u64, at: Instant) -> bool {
        let state = self.state.lock();
        state.generation == generation && state.confirmed_at < at
    }

    /// Whether the hold of `generation` is held now: live, with guards.
    pub(crate) fn is_held(&self, generation: u64) -> bool {
        let state = self.state.lock();
        state.live(generation) && state.guards > 0
    }

    /// When the hold of `generation` stopped being known valid, if it has (see
    /// [`Guard::lost_at`](crate::Guard::lost_at)).
    pub(crate) fn ended_at(&self, generation: u64) -> Option<Instant> {
        self.state.lock().ended_at(generation)
    }

    /// Resolves once the hold of `generation` is lost.
    pub(crate) async fn lost(&self, generation: u64) {
        loop {
            let notified = self.lost_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let until = {
                let state = self.state.lock();
                if !state.live(generation) {
                    return;
                }
                state.valid_until
            };
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(until) => {}
            }
        }
    }

    /// Marks the hold of `generation` lost (a no-op for an older generation).
    pub(crate) fn mark_lost(&self, generation: u64, loss: Loss) {
        let (was_held, counts) = {
            let mut state = self.state.lock();
            if state.generation != generation || state.lost.is_some() {
                return;
            }
            let was_held = state.held();
            state.lost = Some(Instant::now().min(state.valid_until));
            // A generation without guards was released already (a renewal in flight found
            // it gone), except for the one an unlock is releasing right now.
            (was_held, state.guards > 0 || loss == Loss::UnlockFoundGone)
        };
        self.metrics.held(was_held, false);
        if counts {
            self.metrics.lost(loss.cause());
        }
        tracing::warn!(key = %self.key, owner = %self.field, why = loss.why(), "lock lease lost");
        self.lost_notify.notify_waiters();
    }

    /// A renewal sent at `sent_at` found the hold of `generation` still held.
    pub(crate) fn renewed(&self, generation: u64, sent_at: Instant, lease: Duration) {
        let renewed = {
            let mut state = self.state.lock();
            let renewed = state.generation == generation && state.lost.is_none();
            if renewed {
                state.valid_until = state.valid_until.max(valid_until(sent_at, lease));
                state.confirmed_at = state.confirmed_at.max(sent_at);
                state.doubted = false;
            }
            renewed
        };
        if renewed {
            self.metrics.renewed();
        }
    }

    /// A check (a renewal with lease 0) sent at `sent_at` found the hold of `generation`
    /// still held in Redis.
    pub(crate) fn checked(&self, generation: u64, sent_at: Instant) {
        let mut state = self.state.lock();
        if state.generation == generation && state.lost.is_none() {
            state.confirmed_at = state.confirmed_at.max(sent_at);
            state.doubted = false;
        }
    }

    /// A renewal of this hold extended nothing, for `reason` (a metrics label).
    pub(crate) fn renewal_failed(&self, reason: &'static str) {
        self.metrics.renewal_failed(reason);
    }

    /// Whether only this client writes the entry's field.
    pub(crate) fn is_own(&self) -> bool {
        self.own
    }
}

/// How long the clocks' rates may differ over a lease: Redlock's allowance, 1 % of the lease
/// plus 2 ms.
pub(crate) fn drift(lease: Duration) -> Duration {
    lease / 100 + Duration::from_millis(2)
}

/// Until when a hold whose acquire or renewal was sent at `sent_at` with `lease` is known
/// valid. Redis starts the lease when it runs the script, after the send, so the send time
/// plus the lease is never later than its expiry by *its* clock — as long as both clocks run
/// at one rate. They need not: the drift allowance is taken off, so a server clock running up
/// to 1 % fast still expires the key after this process stopped believing it held. A lease no
/// longer than the allowance is never known valid.
pub(crate) fn valid_until(sent_at: Instant, lease: Duration) -> Instant {
    match lease.checked_sub(drift(lease)) {
        Some(valid) => sent_at
            .checked_add(valid)
            .unwrap_or_else(|| sent_at + Duration::from_secs(100 * 365 * 24 * 3600)),
        None => sent_at,
    }
}
