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
//! ([`crate::engine::holds`]), so the guard released last, re-entered or not, knows the run. A release
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
//!
//! # The local hand-off (lock cohorting)
//!
//! Before any script, a release of a [`Lock`](crate::Lock)'s last hold hands the claimed
//! waiter the hold itself, in memory: no round trip, nothing written. Redis keeps saying what
//! is true — this client holds the lock, under the same owner field, count 1, with the lease
//! the watchdog renews — and the waiter's guard carries that field, generation and validity
//! ([`Turn::hand_on`](crate::engine::holds::Turn::hand_on)). So the field travels with the hold: the
//! new holder's scope is the field's owner number, its re-entry `HINCRBY`s the field Redis
//! has, and a Redisson peer sees one valid hold throughout. The waiter's own fresh number is
//! simply never used (numbers are never reused, so nothing else can name it).
//!
//! Since the field stays, nothing that still names it may re-enter once the hold has moved on
//! (invariant 16, docs/DESIGN.md). A scope frame cannot: a scope is read at every poll of the
//! future inside it ([`crate::engine::scope::within`]), so only code polled inside the hold's `run` —
//! which borrows the guard, so the hold cannot move meanwhile — sees it, however far a future
//! first polled there travels afterwards. An owner string can, in any process: so a hold
//! whose owner was given out — read from its guard or lock handle, or named explicitly with
//! `with_owner` — is never handed on in memory; its release passes the lock with the pass
//! script, which writes the next holder's own field.
//!
//! It is refused — and the release takes its ordinary path (the pass script, or a release)
//! — when the hold is lost or about to be (less than half the watchdog lease left, or less
//! than a fixed lease the waiter asks for), when its owner was given out, when an unlock
//! message came on the lock's channel since Redis last confirmed the hold (a force-unlock by
//! another client publishes one: the run ends at once, and the watchdog checks the hold
//! handed on last right away, so its holder is told within a round trip), while no unlock
//! message could arrive (the channel's subscription is not confirmed: the subscriber
//! connection dropped and is not resubscribed yet, so a force-unlock's message would be
//! lost), or when the client is shutting down. It counts in the run of
//! [`Config::baton_passes`](crate::Config::baton_passes), and a run of hand-offs also ends
//! after [`LOCAL_RUN_FOR`]: then the release is an ordinary one (delete and unlock message).
//! Other clients' waiters are learnt off the hot path: a hand-off starts a count of the
//! channel's subscribers in the background when the last is older than [`COUNT_EVERY`]; one
//! that finds another subscriber than this client's own makes the next releases ordinary
//! ones, as the pass script's finding does — and after each of those, this client's tasks stay
//! out of the lock for [`YIELD_TO_OTHERS`], so the other client's waiter, woken one hop
//! further away, gets in instead of losing every race to them.
//!
//! While a hold handed on in memory is held, an acquire by another owner of this client (a
//! task that just handed it on, queuing again) is refused without asking Redis, which would
//! refuse it too: otherwise each hand-off would still cost that round trip. Such a waiter
//! looks again within 100 ms at most (`HELD_HERE_RECHECK_MS`), so a hold lost
//! unnoticed is soon asked about in Redis.
//!
//! Likewise, while a new owner's acquire of this client is in Redis, another new owner's
//! acquire of the key is refused in memory and queues ([`Queue::local_turn`]): tasks of one
//! client no longer race each other through Redis after an ordinary release (each refused
//! there would have cost a round trip, and a waiter busy with one cannot be handed the lock,
//! so the next release would be an ordinary one again).

use std::any::Any;
use std::future::poll_fn;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

pub(crate) mod queue_state;

use crate::engine::holds::{Entry, Holds};
pub(crate) use queue_state::Baton;
use queue_state::Entries;

/// Releases of a key made the ordinary way, without a claim, after a pass found another
/// client waiting: that client most likely still waits (it is served by the unlock message,
/// and so is everyone here), so passing is not worth its costs meanwhile — a claimed waiter
/// sits out the release's round trip, and the script counts the channel's subscribers.
const ORDINARY_AFTER_ANOTHER_CLIENT: u32 = 8;

/// How long this client's tasks stay out of a lock after a release made the ordinary way
/// because another client waits: that client's waiter is woken by the unlock message, one hop
/// further than this client's own, and would otherwise lose every race to them (invariant 16
/// of docs/DESIGN.md: a waiter of another process gets in within a bound). A waiter that does not
/// come within it (it left) costs the lock this long idle.
pub(crate) const YIELD_TO_OTHERS: Duration = Duration::from_millis(20);

/// How long a run of local hand-offs lasts at most before an ordinary release: the bound that
/// serves another process's waiter this client cannot know of (one polling without
/// subscribing, or subscribed through another node of a cluster) when holds are long, where
/// [`Config::baton_passes`](crate::Config::baton_passes) alone would let a run last many
/// holds' time.
pub(crate) const LOCAL_RUN_FOR: Duration = Duration::from_millis(50);

/// How old the count of a channel's subscribers may be before a local hand-off starts a new
/// one: other clients' waiters are learnt within about this long, at one read per key per
/// period however many hand-offs it makes.
pub(crate) const COUNT_EVERY: Duration = Duration::from_millis(10);

/// What a releaser hands a waiter: the passed lock's guard (a `Guard<K>` of the waiter's kind).
type Handed = Box<dyn Any + Send>;

/// The entries of one key's waiters that a release can pass the lock to, in the order they
/// joined.
#[derive(Default)]
pub(crate) struct Queue {
    entries: Mutex<Entries<Handed>>,
    /// Releases still to make without a claim (see [`ORDINARY_AFTER_ANOTHER_CLIENT`]).
    ordinary: AtomicU32,
    /// When the channel's subscribers were last counted for the local hand-off (started).
    counted_at: Mutex<Option<Instant>>,
    /// This client's latest hold of the key (taken from Redis or handed on in memory), and its
    /// generation: while it is held, an acquire of another owner of this client is refused
    /// without asking Redis — which would refuse it too — and queues here instead.
    held: Mutex<Option<(Arc<Entry>, u64)>>,
    /// When the last unlock message came on the channel: a hold Redis has not confirmed since
    /// may have been force-unlocked, and is not handed on in memory.
    unlock_heard: Mutex<Option<Instant>>,
    /// Whether an unlock message on the channel reaches this client now: its subscription is
    /// confirmed, and the subscriber connection has not dropped since. Otherwise a
    /// force-unlock goes unheard, and nothing is handed on in memory.
    listening: AtomicBool,
    /// Until when this client's tasks leave the lock to another client's waiter (see
    /// [`YIELD_TO_OTHERS`]).
    yield_until: Mutex<Option<Instant>>,
    /// The owner number of a new owner's acquire of this client in Redis now under way, if
    /// any: another new owner of this client queues behind it in memory instead of racing it
    /// through Redis (see [`Queue::local_turn`]).
    attempting: Mutex<Option<u64>>,
}

/// What a new owner's acquire is to do, by what this client knows of the key (see
/// [`Queue::local_turn`]).
pub(crate) enum LocalTurn {
    /// Refused without asking Redis; its waiter parks at most this long before it looks again.
    Refused(Duration),
    /// Ask Redis. While the marker (if any) lives, other new owners of this client queue
    /// behind this attempt in memory.
    Ask(Option<InFlight>),
}

/// A new owner's acquire of this client in Redis, under way: dropped when its round trip
/// ends (or the future carrying it is dropped), which lets the next new owner ask.
pub(crate) struct InFlight {
    queue: Arc<Queue>,
    task: u64,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut attempting = self.queue.attempting.lock();
        if *attempting == Some(self.task) {
            *attempting = None;
        }
    }
}

impl Queue {
    /// Places a waiter last, busy (its first re-check is still to come); it leaves the queue
    /// when the returned ticket is dropped.
    pub(crate) fn join(&self, baton: Baton) -> Ticket<'_> {
        let id = self.entries.lock().join(baton);
        Ticket { queue: self, id }
    }

    #[cfg(any(test, feature = "test-hooks"))]
    /// How many of its waiters are parked (claimable) now.
    pub(crate) fn parked(&self) -> usize {
        self.entries.lock().parked()
    }

    /// This client holds the key now through the hold (`entry`, `generation`). If an unlock
    /// message came since Redis last confirmed that hold, it is doubted in `holds` (checked
    /// at once): an acquire (or pass) that ran before a force-unlock may be registered after
    /// its message was heard, when that message's doubt found no hold to check (see
    /// [`Holds::doubt`]).
    pub(crate) fn held_here(&self, entry: &Arc<Entry>, generation: u64, holds: &Holds) {
        *self.held.lock() = Some((entry.clone(), generation));
        let heard = *self.unlock_heard.lock();
        if heard.is_some_and(|heard| entry.unconfirmed_since(generation, heard)) {
            holds.doubt(entry.clone(), generation);
        }
    }

    /// Another client waits (a count of the channel's subscribers found one): the next few
    /// releases are ordinary ones.
    pub(crate) fn another_client_waits(&self) {
        self.ordinary.store(ORDINARY_AFTER_ANOTHER_CLIENT, Relaxed);
    }

    /// A release made the ordinary way because another client waits: this client's tasks
    /// leave the lock to it for [`YIELD_TO_OTHERS`].
    fn yield_to_others(&self) {
        *self.yield_until.lock() = Some(Instant::now() + YIELD_TO_OTHERS);
    }

    #[cfg(any(test, feature = "test-hooks"))]
    /// Whether releases are ordinary ones for now because another client was found waiting.
    pub(crate) fn other_clients_wait(&self) -> bool {
        self.ordinary.load(Relaxed) > 0
    }

    /// Whether an acquire of `field` is to be refused without asking Redis, and for how long
    /// its waiter parks then: this client holds the key under another field, through a hold
    /// handed on in memory (Redis would refuse it too), or it leaves the lock to another
    /// client's waiter for now (see [`YIELD_TO_OTHERS`]) and the acquire is a `fresh` owner's
    /// (a re-entry of a hold is never held back).
    fn refusal(&self, field: &str, held_recheck: Duration, fresh: bool) -> Option<Duration> {
        let held = {
            let held = self.held.lock();
            held.as_ref()
                .is_some_and(|(entry, generation)| entry.held_against(*generation, field))
        };
        if held {
            return Some(held_recheck);
        }
        if !fresh {
            return None;
        }
        let until = (*self.yield_until.lock())?;
        let left = until.saturating_duration_since(Instant::now());
        (!left.is_zero()).then_some(left)
    }

    /// What a new owner's acquire of this client (owner number `task`, field `field`; a
    /// re-entry when not `fresh`) is to do: refused in memory, as [`refusal`](Queue::refusal)
    /// says, or — for a new owner while another new owner's acquire of this client is in
    /// Redis now — refused too, to look again once that one is served: the waiters of one
    /// client race each other through Redis no more (each round trip a refused waiter makes
    /// there is one a local hand-off later saves, and a waiter busy with one cannot be handed
    /// the lock). Otherwise it asks Redis, marked as the client's acquire under way.
    pub(crate) fn local_turn(
        self: &Arc<Self>,
        field: &str,
        task: u64,
        held_recheck: Duration,
        fresh: bool,
    ) -> LocalTurn {
        if let Some(park) = self.refusal(field, held_recheck, fresh) {
            return LocalTurn::Refused(park);
        }
        if !fresh {
            return LocalTurn::Ask(None);
        }
        let mut attempting = self.attempting.lock();
        match *attempting {
            Some(other) if other != task => LocalTurn::Refused(held_recheck),
            _ => {
                *attempting = Some(task);
                LocalTurn::Ask(Some(InFlight {
                    queue: self.clone(),
                    task,
                }))
            }
        }
    }

    /// The channel's subscription is confirmed (`true`), or no longer known live (the
    /// subscriber connection dropped). Confirmed, it counts as an unlock message: one
    /// published before went unheard, so a hold Redis has not confirmed since may have been
    /// force-unlocked. That holds for a hold taken before the key had waiters here too: the
    /// waiters' re-check after subscribing asks Redis, but "held" does not say by whom — it
    /// may be whoever took the lock after the force.
    pub(crate) fn listening(&self, listening: bool) {
        if listening {
            *self.unlock_heard.lock() = Some(Instant::now());
        }
        self.listening.store(listening, Relaxed);
    }

    #[cfg(any(test, feature = "test-hooks"))]
    /// Whether an unlock message on the channel reaches this client now.
    pub(crate) fn is_listening(&self) -> bool {
        self.listening.load(Relaxed)
    }

    /// Whether an unlock message came on the channel after `at`.
    pub(crate) fn heard_since(&self, at: Instant) -> bool {
        self.unlock_heard.lock().is_some_and(|heard| heard > at)
    }

    /// An unlock message came on the channel. Returns this client's hold of the key, if it is
    /// held now: Redis may no longer have it (see [`Holds::doubt`](crate::engine::holds::Holds::doubt)).
    pub(crate) fn unlock_heard(&self) -> Option<(Arc<Entry>, u64)> {
        *self.unlock_heard.lock() = Some(Instant::now());
        let held = self.held.lock();
        held.as_ref()
            .filter(|(entry, generation)| entry.is_held(*generation))
            .cloned()
    }

    /// Claims the first parked waiter. It keeps its place until it leaves, so a withdrawn
    /// claim leaves it first in line; waiters busy with an attempt of their own are skipped.
    pub(crate) fn claim(self: &Arc<Self>) -> Option<Claim> {
        let skip = |n: u32| n.checked_sub(1);
        if self.ordinary.fetch_update(Relaxed, Relaxed, skip).is_ok() {
            self.yield_to_others();
            return None;
        }
        let (id, baton) = self.entries.lock().claim()?;
        Some(Claim {
            queue: self.clone(),
            id,
            baton,
        })
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
        self.queue.entries.lock().withdraw(self.id);
    }

    /// Not passed: another client was found waiting, and the release was an ordinary one.
    /// The next few releases are ordinary too.
    pub(crate) fn another_client_waits(self) {
        self.queue.another_client_waits();
        self.queue.yield_to_others();
        self.withdraw();
    }

    /// The queue, when its channel's subscribers are due to be counted (the last count
    /// started [`COUNT_EVERY`] ago or more): the caller counts them, in the background.
    pub(crate) fn count_due(&self) -> Option<Arc<Queue>> {
        let now = Instant::now();
        let mut counted_at = self.queue.counted_at.lock();
        if counted_at.is_some_and(|at| now.saturating_duration_since(at) < COUNT_EVERY) {
            return None;
        }
        *counted_at = Some(now);
        Some(self.queue.clone())
    }

    /// When the last unlock message came on the lock's channel.
    pub(crate) fn unlock_heard(&self) -> Option<Instant> {
        *self.queue.unlock_heard.lock()
    }

    /// Whether an unlock message on the lock's channel would reach this client now (see
    /// [`Queue::listening`]).
    pub(crate) fn listening(&self) -> bool {
        self.queue.listening.load(Relaxed)
    }

    /// Notes the hold (`entry`, `generation`) handed on to the claimed waiter (see
    /// [`Queue::held_here`]).
    pub(crate) fn handing_on(&self, entry: &Arc<Entry>, generation: u64, holds: &Holds) {
        self.queue.held_here(entry, generation, holds);
    }

    /// Hands the passed lock's guard over. Returns it if the waiter has left meanwhile: the
    /// caller then drops it, which releases the hold.
    pub(crate) fn hand(self, guard: Handed) -> Option<Handed> {
        self.queue.entries.lock().hand(self.id, guard).err()
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
        self.queue.entries.lock().park(self.id);
    }

    /// The waiter is about to try for the lock itself. Returns the guard if the lock was
    /// passed to it meanwhile (waiting out a pass in flight first: its outcome is one round
    /// trip away, and the releaser bounds it — a caller whose deadline comes first drops the
    /// ticket instead, leaving whatever the pass wrote to the releaser); `None`: go ahead.
    pub(crate) async fn start_attempt(&self) -> Option<Handed> {
        poll_fn(|cx| self.queue.entries.lock().start_attempt(self.id, cx.waker())).await
    }

    /// Resolves when a releaser has handed this waiter the lock. A claim alone does not end
    /// the wait: an unlock message may still come to it (the pass found another client
    /// waiting and published), and it is this waiter's to consume.
    pub(crate) async fn acted(&self) {
        poll_fn(|cx| self.queue.entries.lock().acted(self.id, cx.waker())).await
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        let unclaimed = self.queue.entries.lock().leave(self.id);
        // Dropped outside the lock: the guard's drop spawns its release.
        drop(unclaimed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::holds::Lease;
    use std::pin::pin;
    use std::task::{Context, Waker};

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
