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
//!   clock drift: [`entry::valid_until`]), and the lost signal.
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

use crate::conn::{Call, Conn, LuaScript, Replicas};
use crate::metrics::{ClientMetrics, HoldMetrics};

mod entry;
mod turn;
mod turn_state;

use entry::Holder;
use entry::State;
pub(crate) use entry::{drift, Entry};
pub(crate) use turn::{HandOn, Registered, Turn};
use turn_state::TurnState;

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
pub(crate) trait HoldOps: Send + Sync + 'static {
    /// The lock's name, for errors and logs.
    fn name(&self) -> &str;
    /// The kind of lock, as metrics label it (see [`crate::metrics`]).
    fn kind(&self) -> &'static str;
    /// Releases up to `max` holds of `field`, keeping at least `keep`: the release script,
    /// its write acknowledged by the replicas as `replicas` says. Its reply is `-1` (not
    /// held), `0` (released) or the owner's remaining count.
    fn release(&self, conn: &Conn, field: &str, max: u32, keep: u32, replicas: Replicas) -> Call;
    /// How the watchdog renews this kind's holds.
    fn renewal(&self) -> Renewal;
    /// Whether a hold's key can outlive the hold's lease because other holds share the key's
    /// expiry (a read/write lock: readers and the writer on one hash). The release of such a
    /// hold, once lost, then removes what is left of it (see [`crate::engine::repair::trim_lost`]);
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
    /// Holds to check in Redis at once (see [`Holds::doubt`]), for the watchdog.
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

/// Generations are unique per process, so a guard can never mistake a later hold for its own.
pub(super) static NEXT_GENERATION: AtomicU64 = AtomicU64::new(1);

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

    /// Doubts every live hold of the keys `of` picks (see [`doubt`](Holds::doubt)): their
    /// channels' subscriptions were just confirmed, and an unlock message published before
    /// went unheard. The check confirms a hold again, so hand-offs in memory go on after one
    /// round trip in the background rather than a pass script on the release's path.
    pub(crate) fn doubt_keys(&self, of: impl Fn(&str) -> bool) {
        let entries: Vec<Arc<Entry>> = self.registered(of).collect();
        for entry in entries {
            let generation = {
                let state = entry.state.lock();
                if !(state.live(state.generation) && state.guards > 0) {
                    continue;
                }
                state.generation
            };
            self.doubt(entry, generation);
        }
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
        for entry in self.registered(|k| k == key) {
            let of_owner = entry
                .field
                .strip_prefix(owner)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(':'));
            if of_owner {
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
        self.registered(|k| k == key).any(|entry| {
            let state = entry.state.lock();
            state.guards > 0 && state.lost.is_none() && state.holder == Some(here)
        })
    }

    /// The registered holds of the keys `of` picks, one per key and field: a scan of the
    /// whole registry, for the paths that wait, subscribe or give an owner out, never for an
    /// acquire or a release.
    fn registered<'a>(
        &'a self,
        of: impl Fn(&str) -> bool + 'a,
    ) -> impl Iterator<Item = Arc<Entry>> + 'a {
        self.map
            .iter()
            .filter(move |slot| of(&slot.value().key))
            .map(|slot| slot.value().clone())
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
