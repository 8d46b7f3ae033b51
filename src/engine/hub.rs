//! The hub: one shared subscriber connection per [`Client`](crate::Client), routing release
//! messages to the tasks parked on each lock.
//!
//! Waiters of one channel share one Redis subscription, counted: the first waiter's
//! registration queues a SUBSCRIBE, the last one's departure an UNSUBSCRIBE. Both are queued
//! while the channel's map entry is locked and sent by one task in queue order, so the
//! server's view can never fall behind the registry (no leaked subscription, no unsubscribe
//! that overtakes a newer subscribe), even when registrations are dropped mid-flight by
//! cancellation.
//!
//! A subscription is *confirmed* once a PING on the subscriber connection has come back after
//! the SUBSCRIBE (fred resolves `subscribe` when the command is queued, not when the server
//! has processed it). A waiter re-checks the lock only after confirmation, so a release
//! published in between cannot be missed. A reconnect un-confirms every channel until it is
//! subscribed again.
//!
//! Within a channel, waiters are grouped by the key they wait for: two names can share a
//! channel (`x` and `{x}` both use `redisson_lock__channel:{x}`), and a message carries no
//! name, so each group gets the wake-up — a wake-up for the wrong key costs one failed
//! re-check, never a sleep until the lease ends. What a message means is the channel's
//! [`Wake`] rule. After the subscriber reconnects, or when the message stream lagged, messages
//! may have been lost: the hub then bumps its *generation* and every waiter re-checks.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use fred::error::Error as FredError;
use parking_lot::Mutex;
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

use crate::conn::Subscriber;
use crate::engine::baton::{Claim, LocalTurn, Queue};
use crate::engine::holds::Holds;
mod channel;
mod tasks;
pub(crate) mod wake_state;

pub(crate) use channel::{Channel, Group};
use tasks::{apply_ops, dispatch_messages, drop_idle, follow_shards};

pub(crate) use wake_state::Wake;
use wake_state::{TakenWakeUp, Wakes};

struct Slot {
    channel: Arc<Channel>,
    waiters: usize,
    /// Since when no waiter is registered: the subscription lingers for [`LINGER`] before it
    /// is dropped, so tasks that take turns on a lock (each waits, is served, comes back)
    /// do not subscribe and unsubscribe at every turn, and the key's baton queue — with what
    /// it knows of the lock's holds here — stays.
    idle_since: Option<Instant>,
}

/// How long a channel stays subscribed after its last waiter left.
const LINGER: Duration = Duration::from_secs(1);

enum Op {
    Subscribe(Arc<Channel>),
    Unsubscribe(Arc<str>),
}

pub(crate) struct Hub {
    subscriber: Subscriber,
    /// The client's holds: an unlock message doubts one held through a hand-off in memory.
    holds: Arc<Holds>,
    /// Hashed with foldhash (seeded per process): every release of a lock looks its channel
    /// up here for a parked waiter to pass it to.
    channels: DashMap<Arc<str>, Slot, foldhash::fast::RandomState>,
    /// How many channels `channels` holds, or one more for an instant: counted up before an
    /// insert and down after a removal, so a look-up that finds 0 need not hash the name —
    /// while nobody waits in the process, a lock+unlock looks nothing up (it would be four
    /// look-ups of an empty map).
    listed: AtomicUsize,
    ops: mpsc::UnboundedSender<Op>,
    /// Bumped whenever every waiter must re-check (reconnect, lag, shutdown); `rechecks`
    /// then wakes the parked ones. A counter and a `Notify` rather than a `watch` channel: a
    /// parked waiter keeps what it waits on, and a `watch` receiver's wait is twice a
    /// `Notified`.
    generation: AtomicU64,
    rechecks: Notify,
    closed: AtomicBool,
    /// Woken when a channel's last waiter left: its subscription is dropped once it has
    /// lingered (see [`drop_idle`]).
    idle: Notify,
}

/// A waiter's registration on a channel; dropping it releases the shared subscription, and
/// passes on a wake-up the waiter took and did not use.
pub(crate) struct Subscription {
    hub: Arc<Hub>,
    channel: Arc<Channel>,
    group: Arc<Group>,
    /// The wake-up the waiter took and has not used yet: passed on when the registration goes,
    /// however the waiter leaves — dropped while the re-check it was woken for is in flight
    /// included (that re-check finishes in the background, and its answer reaches nobody who
    /// could pass the wake-up on).
    unused: TakenWakeUp,
}

impl Subscription {
    pub(crate) fn channel(&self) -> &Arc<Channel> {
        &self.channel
    }

    /// Parks until a message for this waiter's key wakes it; `seen` is what
    /// [`messages`](Self::messages) said before the waiter last looked.
    pub(crate) fn notified(&self, seen: u32) -> impl Future<Output = ()> + Send + '_ {
        self.group.wakes.wait(self.channel.wake, seen)
    }

    /// The messages this waiter's group has had so far (wrapping): noted before each look, so
    /// that on a [`Wake::Permits`] channel the waiter takes no wake-up about what it saw.
    pub(crate) fn messages(&self) -> u32 {
        self.group.wakes.messages()
    }

    /// The baton queue of this waiter's key.
    pub(crate) fn batons(&self) -> &Queue {
        &self.group.batons
    }

    /// A message woke this waiter: it holds the wake-up until it uses it or passes it on.
    pub(crate) fn took_wake_up(&self) {
        self.unused.take();
    }

    /// Whether this waiter holds a wake-up it has not used yet.
    pub(crate) fn holds_wake_up(&self) -> bool {
        self.unused.held()
    }

    /// The waiter's look used the wake-up it held, if any.
    pub(crate) fn used_wake_up(&self) {
        self.unused.used();
    }

    /// Wakes every waiter of this waiter's group, parked or about to park.
    pub(crate) fn wake_group(&self) {
        self.group.wakes.wake_all();
    }

    /// Hands the wake-up this waiter holds, if any, to the next waiter: it will not use it.
    pub(crate) fn pass_on(&self) {
        if self.unused.pass_on(&self.group.wakes, self.channel.wake) {
            tracing::trace!(channel = %self.channel.name, "passing a wake-up on");
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        // While this waiter still counts among the group's.
        self.pass_on();
        if self.group.wakes.leave() == 0 {
            // The group stays with its channel while it lingers (its baton queue knows this
            // client's holds of the key); no timer is needed for nobody.
            self.group.forget_lease_end();
        }
        let name = &self.channel.name;
        let mut idle = false;
        if let Some(mut slot) = self.hub.channels.get_mut(name) {
            if Arc::ptr_eq(&slot.channel, &self.channel) {
                slot.waiters -= 1;
                if slot.waiters == 0 {
                    slot.idle_since = Some(Instant::now());
                    idle = true;
                }
            }
        }
        if idle {
            self.hub.idle.notify_one();
        }
    }
}

impl Hub {
    /// Connects the subscriber and starts the hub's tasks.
    pub(crate) async fn start(
        subscriber: Subscriber,
        holds: Arc<Holds>,
    ) -> Result<Arc<Hub>, FredError> {
        let streams = subscriber.connect().await?;
        let (ops, ops_rx) = mpsc::unbounded_channel();
        let hub = Arc::new(Hub {
            subscriber,
            holds,
            channels: DashMap::with_hasher(Default::default()),
            listed: AtomicUsize::new(0),
            ops,
            generation: AtomicU64::new(0),
            rechecks: Notify::new(),
            closed: AtomicBool::new(false),
            idle: Notify::new(),
        });
        if hub.subscriber.follows_shards() {
            tokio::spawn(follow_shards(Arc::downgrade(&hub)));
        }
        tokio::spawn(dispatch_messages(hub.clone(), streams.messages));
        tokio::spawn(drop_idle(hub.clone()));
        tokio::spawn(apply_ops(
            hub.clone(),
            ops_rx,
            streams.reconnects,
            streams.errors,
        ));
        Ok(hub)
    }

    /// Registers a waiter for `key` on `name`, subscribing if it is the channel's first.
    pub(crate) fn subscribe(
        self: &Arc<Self>,
        name: &Arc<str>,
        key: &Arc<str>,
        wake: Wake,
    ) -> Subscription {
        let channel = {
            let mut slot = self.channels.entry(name.clone()).or_insert_with(|| {
                self.listed.fetch_add(1, Ordering::Relaxed);
                let channel = Arc::new(Channel {
                    name: name.clone(),
                    wake,
                    confirmed: AtomicBool::new(false),
                    confirm: Notify::new(),
                    refused: Mutex::new(None),
                    groups: Mutex::new(Vec::new()),
                    delivered: AtomicU32::new(0),
                });
                let _ = self.ops.send(Op::Subscribe(channel.clone()));
                Slot {
                    channel,
                    waiters: 0,
                    idle_since: None,
                }
            });
            slot.waiters += 1;
            slot.idle_since = None;
            slot.channel.clone()
        };
        // A group made on a confirmed channel starts listening now (see `Queue::listening`).
        let mut fresh = false;
        let group = {
            let mut groups = channel.groups.lock();
            let group = match groups.iter().find(|g| g.key == *key) {
                Some(group) => group.clone(),
                None => {
                    let group = Arc::new(Group {
                        key: key.clone(),
                        wakes: Wakes::new(0),
                        batons: Arc::default(),
                        lease_end: Mutex::new(None),
                        lease_moved: Notify::new(),
                    });
                    // Under the groups' lock, as confirmations reach the groups (see
                    // `Channel::set_confirmed`).
                    fresh = channel.is_confirmed();
                    group.batons.listening(fresh);
                    groups.push(group.clone());
                    group
                }
            };
            group.wakes.join();
            group
        };
        if fresh {
            self.holds.doubt_keys(|k| k == &**key);
        }
        Subscription {
            hub: self.clone(),
            channel,
            group,
            unused: TakenWakeUp::default(),
        }
    }

    /// The channel's current registration if its subscription is already confirmed, with
    /// its [`delivered`](Channel::delivered) count. A waiter that notes both before its first
    /// attempt, and after registering finds the same channel (still confirmed: same
    /// generation) with the same count, missed no release after that attempt: none was
    /// delivered before its group was there to receive it. A message delivered meanwhile
    /// went only to the groups then registered — another key's, when two names share the
    /// channel (`x` and `{x}`) — so that waiter must re-check.
    pub(crate) fn confirmed_channel(&self, name: &str) -> Option<(Arc<Channel>, u32)> {
        self.slot(name)
            .filter(|slot| slot.channel.is_confirmed())
            .map(|slot| (slot.channel.clone(), slot.channel.delivered()))
    }

    /// Channel `name`'s entry, if it has one.
    fn slot(&self, name: &str) -> Option<dashmap::mapref::one::Ref<'_, Arc<str>, Slot>> {
        if self.listed.load(Ordering::Relaxed) == 0 {
            return None;
        }
        self.channels.get(name)
    }

    /// The baton queue of `key`'s waiters on channel `name`, if any wait (or waited lately)
    /// here.
    pub(crate) fn batons(&self, name: &str, key: &str) -> Option<Arc<Queue>> {
        let channel = self.slot(name)?.channel.clone();
        let groups = channel.groups.lock();
        let group = groups.iter().find(|g| *g.key == *key)?;
        Some(group.batons.clone())
    }

    /// Claims the first parked waiter of `key` on channel `name` that can be passed the
    /// lock (see [`crate::engine::baton`]).
    pub(crate) fn claim_baton(&self, name: &str, key: &str) -> Option<Claim> {
        self.batons(name, key)?.claim()
    }

    #[cfg(any(test, feature = "test-hooks"))]
    /// How many waiters of `key` on channel `name` a release could pass the lock to now.
    pub(crate) fn passable(&self, name: &str, key: &str) -> usize {
        self.batons(name, key).map_or(0, |batons| batons.parked())
    }

    #[cfg(any(test, feature = "test-hooks"))]
    /// Whether an unlock message on channel `name` reaches the waiters of `key` now.
    pub(crate) fn listening(&self, name: &str, key: &str) -> bool {
        self.batons(name, key)
            .is_some_and(|batons| batons.is_listening())
    }

    /// Whether an acquire of `key` (its waiters on channel `name`) by `field` (owner number
    /// `task`) is refused without asking Redis, and for how long its waiter parks then, or
    /// asks Redis (see [`Queue::local_turn`]).
    pub(crate) fn local_turn(
        &self,
        name: &str,
        key: &str,
        field: &str,
        task: u64,
        held_recheck: Duration,
        fresh: bool,
    ) -> LocalTurn {
        match self.batons(name, key) {
            Some(batons) => batons.local_turn(field, task, held_recheck, fresh),
            None => LocalTurn::Ask(None),
        }
    }

    #[cfg(any(test, feature = "test-hooks"))]
    /// Whether releases of `key` are ordinary ones for now, another client having been
    /// found waiting on channel `name` (see [`crate::engine::baton`]).
    pub(crate) fn other_clients_wait(&self, name: &str, key: &str) -> bool {
        self.batons(name, key)
            .is_some_and(|batons| batons.other_clients_wait())
    }

    /// The generation counter, bumped whenever waiters must re-check: a waiter that saw
    /// this value re-checks once it changes.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Resolves once the generation is no longer `seen`.
    pub(crate) async fn regenerated(&self, seen: u64) {
        // Made before the check, it is woken by any bump after it: `notify_waiters` reaches
        // every `Notified` made before the call, polled yet or not. (SeqCst on both sides:
        // the bump precedes the notification, the notified's making the check.)
        let notified = self.rechecks.notified();
        if self.generation() == seen {
            notified.await;
        }
    }

    /// Wakes every waiter so it re-checks its lock (reconnect, lag, shutdown). Messages may
    /// have been lost, a force-unlock's among them: holds handed on in memory are doubted.
    pub(crate) fn wake_all(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.rechecks.notify_waiters();
        for channel in self.channels() {
            channel.doubt_handed(&self.holds);
        }
    }

    /// Closes the subscriber connection; the hub's tasks end with it.
    pub(crate) async fn shutdown(&self) {
        self.closed.store(true, Ordering::Release);
        self.idle.notify_one();
        self.wake_all();
        if let Err(e) = self.subscriber.quit().await {
            tracing::debug!(error = %e, "subscriber quit");
        }
    }

    fn channels(&self) -> Vec<Arc<Channel>> {
        self.channels
            .iter()
            .map(|slot| slot.channel.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests;
