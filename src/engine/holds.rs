//! The holds of one client: what it believes it holds, per (lock key, owner field), and the
//! turn that orders every call changing that owner's count.
//!
//! An [`Entry`] exists while a hold of the owner is registered or a call on it is under way.
//! It keeps:
//!
//! - **the turn**: at most one counted call (acquire, release, settle) per key and owner is in
//!   flight at a time. With the turn, every reply can be checked against what the client
//!   accounts for: a reply of count 1 is a *fresh* hold, so a hold still registered from
//!   before is stale (lost unnoticed: expired, force-unlocked) and its guards can never
//!   release the new one; and after a call whose outcome is unknown (the connection broke
//!   with it in flight), the owner's count can be trimmed back to what the client accounts
//!   for, since no other call of the client is in flight to be trimmed by mistake.
//! - **the hold's generation**: guards belong to a generation; a new one starts with each
//!   fresh hold, so a guard of a lost generation is lost for good.
//! - **the validity**: until when the lease is known valid by the local monotonic clock (the
//!   last successful acquire or renewal's *send* time plus its lease, less an allowance for
//!   clock drift: [`valid_until`]), and the lost signal.
//!
//! The watchdog renews what is registered here. The map is a `DashMap`: every acquire and
//! release goes through it, and shards keep tasks on other keys out of each other's way.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::conn::{Call, Conn, LuaScript};
use crate::engine::turn_state::TurnState;
use crate::metrics::{ClientMetrics, HoldMetrics};

/// How a hold's lease is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lease {
    /// Renewed by the watchdog until released.
    Watchdog,
    /// Expires after this many milliseconds; never renewed.
    Fixed(i64),
}

impl Lease {
    /// The lease in milliseconds, as the scripts take it.
    pub(crate) fn millis(self, watchdog_lease: Duration) -> i64 {
        match self {
            Lease::Watchdog => watchdog_lease.as_millis() as i64,
            Lease::Fixed(ms) => ms,
        }
    }

    fn duration(self, watchdog_lease: Duration) -> Duration {
        Duration::from_millis(self.millis(watchdog_lease) as u64)
    }
}

/// How the watchdog renews a kind's holds: a batched script taking `KEYS` = the lock keys and
/// `ARGV` = their owner fields, then their leases in milliseconds (0: only check that the
/// hold exists), replying with 1 or 0 per hold (held, gone).
pub(crate) type Renewal = &'static LuaScript;

/// What a lock kind does to one of its holds outside the acquire loop.
pub trait HoldOps: Send + Sync + 'static {
    /// The lock's name, for errors and logs.
    fn name(&self) -> &str;
    /// The kind of lock, as metrics label it (see [`crate::metrics`]).
    fn kind(&self) -> &'static str;
    /// Releases up to `max` holds of `field`, keeping at least `keep`: the release script.
    /// Its reply is `-1` (not held), `0` (released) or the owner's remaining count.
    fn release(&self, conn: &Conn, field: &str, max: u32, keep: u32) -> Call;
    /// How the watchdog renews this kind's holds.
    fn renewal(&self) -> Renewal;
    /// Whether a hold's key can outlive the hold's lease because other holds share the key's
    /// expiry (a read/write lock: readers and the writer on one hash). The release of such a
    /// hold, once lost, then removes what is left of it (see [`crate::engine::acquire::trim_lost`]);
    /// elsewhere the key ends with the lease, and a lost hold sends nothing.
    fn shares_expiry(&self) -> bool {
        false
    }
}

/// Why a hold was lost: logged, and counted by cause in metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Loss {
    /// A renewal found the hold gone from Redis.
    RenewalFoundGone,
    /// An unlock found it gone.
    UnlockFoundGone,
    /// A settle found the owner's count below what its guards account for.
    CountFell,
    /// Not renewed within its lease by the local clock.
    Expired,
    /// The same owner took the lock afresh: the hold was lost unnoticed.
    Replaced,
    /// The client shut down.
    ShutDown,
}

impl Loss {
    fn why(self) -> &'static str {
        match self {
            Loss::RenewalFoundGone => "renewal found the lock gone",
            Loss::UnlockFoundGone => "unlock found the lock gone",
            Loss::CountFell => "the owner's count fell below its guards",
            Loss::Expired => "not renewed within its lease",
            Loss::Replaced => "the lock was taken afresh by the same owner",
            Loss::ShutDown => "client shut down",
        }
    }

    /// The `cause` label of `redbaton_leases_lost_total`.
    fn cause(self) -> &'static str {
        match self {
            Loss::RenewalFoundGone | Loss::UnlockFoundGone | Loss::CountFell => "gone",
            Loss::Expired => "expired",
            Loss::Replaced => "replaced",
            Loss::ShutDown => "shutdown",
        }
    }
}

/// The registry's hasher. Every acquire and release hashes its (key, owner) pair twice (the
/// turn's insert, the idle entry's removal); std's SipHash cost more than the rest of the
/// registry's work. foldhash is seeded per process, so names chosen by a user still cannot
/// be aimed at one bucket in advance.
type HoldsHasher = foldhash::fast::RandomState;

/// The registry of one client.
pub(crate) struct Holds {
    map: DashMap<(Arc<str>, Arc<str>), Arc<Entry>, HoldsHasher>,
    /// The client's id: an owner field that starts with it is this client's own.
    client_id: Arc<str>,
    watchdog_lease: Duration,
    /// Waiters alive, and undos of waiters that left still under way (see [`Waiting`]).
    waiting: AtomicU64,
    /// Notified when `waiting` drops to zero.
    none_waiting: Notify,
    /// Holds to check in Redis at once (see [`Entry::doubt`]), for the watchdog.
    doubted: Mutex<Vec<(Arc<Entry>, u64)>>,
    /// Wakes the watchdog for `doubted`.
    doubts: Notify,
    metrics: ClientMetrics,
}

/// A waiter, or its undo under way (the fair lock's place in the queue), counted until
/// dropped: shutdown lets them finish while the connection is still open.
pub(crate) struct Waiting {
    holds: Arc<Holds>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.holds.waiting.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.holds.none_waiting.notify_waiters();
        }
    }
}

/// One owner's hold on one lock, and the turn of calls changing it.
pub(crate) struct Entry {
    pub(crate) key: Arc<str>,
    pub(crate) field: Arc<str>,
    /// Only this client writes the field (its id is the client's): an unknown outcome can be
    /// settled by trimming the count to what this client accounts for.
    own: bool,
    /// Release and renewal for this entry (the kind that created it).
    pub(crate) ops: Arc<dyn HoldOps>,
    state: Mutex<State>,
    /// Wakes the next task waiting for the turn.
    turn_free: Notify,
    /// Wakes guards when the hold is lost.
    lost_notify: Notify,
    metrics: HoldMetrics,
}

struct State {
    /// Who has the turn, and how many wait for it.
    turn: TurnState,
    generation: u64,
    /// Guards of the current generation.
    guards: u32,
    /// Of which taken with the watchdog lease.
    watchdog_guards: u32,
    valid_until: Instant,
    /// When the current generation was found lost: when it stopped being known valid (the
    /// moment Redis's word came, or its validity's end if that was earlier).
    lost: Option<Instant>,
    /// When the generation this one replaced stopped being known valid, if guards of it were
    /// left: for their [`ended_at`](Entry::ended_at).
    replaced: Option<Instant>,
    /// Where the latest guard of the hold was taken (for the warning about a nested acquire
    /// outside a hold's scope).
    holder: Option<Holder>,
    /// How many baton passes in a row led to the current generation (0: its owner took the
    /// lock itself). Kept with the hold, not with a guard: re-entry adds guards to the same
    /// hold, and whichever of them is released last must see the run (see [`crate::engine::baton`]).
    /// Local hand-offs count here too: they keep the hold, and so its run.
    passes: u32,
    /// When the current generation was first handed on in memory: the start of its run of
    /// local hand-offs, which a time bound ends (see [`crate::engine::baton`]).
    local_since: Option<Instant>,
    /// The current holder's owner was given out (read from its guard or its lock handle, or
    /// named explicitly): whoever has it can re-enter the hold in Redis, so the hold is never
    /// handed on in memory under that field (invariant 16,
    /// docs/DESIGN.md). A hold handed on starts without.
    given_out: bool,
    /// When Redis last said it has the hold: the send time of its acquire, renewal or check.
    /// An unlock message heard on the lock's channel after it may mean Redis no longer has
    /// it (a force-unlock): then it is not handed on in memory (invariant 16, docs/DESIGN.md).
    confirmed_at: Instant,
    /// A check of the hold is queued for the watchdog (see [`Holds::doubt`]).
    doubted: bool,
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

/// Generations are unique per process, so a guard can never mistake a later hold for its own.
static NEXT_GENERATION: AtomicU64 = AtomicU64::new(1);

impl Holds {
    pub(crate) fn new(
        client_id: Arc<str>,
        watchdog_lease: Duration,
        metrics: ClientMetrics,
    ) -> Arc<Holds> {
        Arc::new(Holds {
            map: DashMap::with_hasher(HoldsHasher::default()),
            client_id,
            watchdog_lease,
            waiting: AtomicU64::new(0),
            none_waiting: Notify::new(),
            doubted: Mutex::new(Vec::new()),
            doubts: Notify::new(),
            metrics,
        })
    }

    /// The client's metrics.
    pub(crate) fn metrics(&self) -> &ClientMetrics {
        &self.metrics
    }

    /// Counts a waiter until the returned mark is dropped.
    pub(crate) fn waiting(self: &Arc<Self>) -> Waiting {
        self.waiting.fetch_add(1, Ordering::AcqRel);
        Waiting {
            holds: self.clone(),
        }
    }

    /// Waits until no waiter (nor undo) is left, at most until `deadline`.
    pub(crate) async fn none_waiting(&self, deadline: Instant) -> bool {
        loop {
            let notified = self.none_waiting.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.waiting.load(Ordering::Acquire) == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return false;
            }
        }
    }

    pub(crate) fn watchdog_lease(&self) -> Duration {
        self.watchdog_lease
    }

    /// Waits for the turn on (key, field), at most until `deadline`.
    pub(crate) async fn turn(
        self: &Arc<Self>,
        key: &Arc<str>,
        field: &Arc<str>,
        ops: &Arc<dyn HoldOps>,
        deadline: Instant,
    ) -> Option<Turn> {
        let entry = {
            // Under the map's shard lock: the entry cannot be removed as idle in between.
            let slot = self
                .map
                .entry((key.clone(), field.clone()))
                .or_insert_with(|| self.new_entry(key, field, ops));
            let entry = slot.value().clone();
            if entry.state.lock().turn.take_or_queue() {
                return Some(Turn {
                    holds: self.clone(),
                    entry,
                });
            }
            entry
        };
        let mut queued = Queued {
            holds: self,
            entry: &entry,
            waiting: true,
        };
        loop {
            let free = entry.turn_free.notified();
            tokio::pin!(free);
            free.as_mut().enable();
            if entry.state.lock().turn.take_queued() {
                queued.waiting = false;
                return Some(Turn {
                    holds: self.clone(),
                    entry: entry.clone(),
                });
            }
            if tokio::time::timeout_at(deadline, free).await.is_err() {
                return None;
            }
        }
    }

    fn new_entry(&self, key: &Arc<str>, field: &Arc<str>, ops: &Arc<dyn HoldOps>) -> Arc<Entry> {
        let own = field
            .strip_prefix(&*self.client_id)
            .is_some_and(|rest| rest.starts_with(':'));
        Arc::new(Entry {
            key: key.clone(),
            field: field.clone(),
            own,
            ops: ops.clone(),
            state: Mutex::new(State {
                turn: TurnState::default(),
                generation: NEXT_GENERATION.fetch_add(1, Ordering::Relaxed),
                guards: 0,
                watchdog_guards: 0,
                valid_until: Instant::now(),
                lost: None,
                replaced: None,
                holder: None,
                passes: 0,
                local_since: None,
                given_out: false,
                confirmed_at: Instant::now(),
                doubted: false,
            }),
            turn_free: Notify::new(),
            lost_notify: Notify::new(),
            metrics: HoldMetrics::new(&self.metrics, ops.kind(), ops.name()),
        })
    }

    /// Removes `entry` if nothing refers to it any more.
    fn remove_if_idle(&self, entry: &Arc<Entry>) {
        if !entry.state.lock().idle() {
            return;
        }
        self.map
            .remove_if(&(entry.key.clone(), entry.field.clone()), |_, e| {
                Arc::ptr_eq(e, entry) && e.state.lock().idle()
            });
    }

    /// The hold of `generation` on `entry` may be gone from Redis: an unlock message came on
    /// its channel while it was held through a hand-off in memory, or messages may have been
    /// lost. The watchdog checks it at once, so its holder is told within a round trip if it
    /// lost the lock (meanwhile it is not handed on: see [`Turn::hand_on`]).
    pub(crate) fn doubt(&self, entry: Arc<Entry>, generation: u64) {
        {
            let mut state = entry.state.lock();
            if state.generation != generation || state.doubted {
                return;
            }
            state.doubted = true;
        }
        tracing::debug!(key = %entry.key, owner = %entry.field, "an unlock message came while the lock was held here: checking the hold at once");
        self.doubted.lock().push((entry, generation));
        self.doubts.notify_one();
    }

    /// Resolves when holds are doubted (see [`doubt`](Holds::doubt)).
    pub(crate) async fn doubts(&self) {
        self.doubts.notified().await
    }

    /// The doubted holds still live, to check in Redis now (lease 0: only whether held).
    pub(crate) fn take_doubted(&self) -> Vec<Renewable> {
        std::mem::take(&mut *self.doubted.lock())
            .into_iter()
            .filter(|(entry, generation)| entry.state.lock().live(*generation))
            .map(|(entry, generation)| Renewable {
                entry,
                generation,
                lease_ms: 0,
            })
            .collect()
    }

    /// `owner` is given out (see [`Entry::give_out`]): its current holds of `key` (under
    /// each field a kind makes of it), if this client has any, are never handed on in memory.
    /// A scan of the registry: an owner is read from a lock handle rarely.
    pub(crate) fn give_out(&self, key: &str, owner: &str) {
        for slot in self.map.iter() {
            let entry = slot.value();
            let of_owner = entry
                .field
                .strip_prefix(owner)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(':'));
            if *entry.key == *key && of_owner {
                let generation = entry.state.lock().generation;
                entry.give_out(generation);
            }
        }
    }

    /// Whether a live hold of `key` by this client has a guard taken in the context running
    /// now. Only asked when an acquisition outside any scope is about to park, so the scan
    /// stays off the paths that do not wait.
    pub(crate) fn held_here(&self, key: &str) -> bool {
        let here = Holder::current();
        self.map.iter().any(|slot| {
            let entry = slot.value();
            if *entry.key != *key {
                return false;
            }
            let state = entry.state.lock();
            state.guards > 0 && state.lost.is_none() && state.holder == Some(here)
        })
    }

    /// Every entry with registered guards of a live generation, with what renewal sends:
    /// the watchdog lease, or 0 to only check that a fixed-lease hold still exists — or, when
    /// `renew` is false (a round between renewals), 0 for every hold.
    pub(crate) fn to_renew(&self, renew: bool) -> Vec<Renewable> {
        let now = Instant::now();
        let lease_ms = self.watchdog_lease.as_millis() as i64;
        self.map
            .iter()
            .filter_map(|slot| {
                let entry = slot.value();
                let state = entry.state.lock();
                if state.guards == 0 || state.lost.is_some() || now >= state.valid_until {
                    return None;
                }
                Some(Renewable {
                    entry: entry.clone(),
                    generation: state.generation,
                    lease_ms: if renew && state.watchdog_guards > 0 {
                        lease_ms
                    } else {
                        0
                    },
                })
            })
            .collect()
    }

    /// Marks lost every live hold whose lease ran out by the local clock.
    pub(crate) fn expire_overdue(&self) {
        let now = Instant::now();
        let overdue: Vec<(Arc<Entry>, u64)> = self
            .map
            .iter()
            .filter_map(|slot| {
                let state = slot.value().state.lock();
                (state.guards > 0 && state.lost.is_none() && now >= state.valid_until)
                    .then(|| (slot.value().clone(), state.generation))
            })
            .collect();
        for (entry, generation) in overdue {
            entry.mark_lost(generation, Loss::Expired);
        }
    }

    /// Every entry (client shutdown).
    pub(crate) fn entries(&self) -> Vec<Arc<Entry>> {
        self.map.iter().map(|slot| slot.value().clone()).collect()
    }

    /// How many holds are registered.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}

/// A task queued for the turn; leaves the queue if its wait is dropped or times out.
struct Queued<'a> {
    holds: &'a Holds,
    entry: &'a Arc<Entry>,
    waiting: bool,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        if !self.waiting {
            return;
        }
        // A hand-over meant for this task may have been consumed: pass it on.
        let pass_on = self.entry.state.lock().turn.give_up();
        if pass_on {
            self.entry.turn_free.notify_one();
        }
        self.holds.remove_if_idle(self.entry);
    }
}

/// A hold due for renewal.
pub(crate) struct Renewable {
    pub(crate) entry: Arc<Entry>,
    pub(crate) generation: u64,
    pub(crate) lease_ms: i64,
}

impl State {
    fn idle(&self) -> bool {
        self.turn.idle() && self.guards == 0
    }

    fn live(&self, generation: u64) -> bool {
        self.generation == generation && self.lost.is_none() && Instant::now() < self.valid_until
    }

    /// Whether the hold counts in the `held_locks` gauge: guards registered, not marked lost.
    fn held(&self) -> bool {
        self.guards > 0 && self.lost.is_none()
    }

    /// When the hold of `generation` stopped being known valid, if it has: the moment it was
    /// found lost, the end of its validity by the local clock, or — for a generation since
    /// replaced — when that was noticed. A generation replaced more than once reports when its
    /// successor ended, an upper bound (no guard outlives two fresh holds in practice: both
    /// need the same owner field).
    fn ended_at(&self, generation: u64) -> Option<Instant> {
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

/// The turn on one entry: the only counted call of this owner on this lock in flight. Freed
/// on drop; an entry left idle is removed.
pub(crate) struct Turn {
    holds: Arc<Holds>,
    entry: Arc<Entry>,
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
