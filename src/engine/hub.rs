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
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use fred::clients::SubscriberClient;
use fred::interfaces::{ClientLike, ClusterInterface, EventInterface, PubsubInterface};
use fred::types::{ClusterHash, CustomCommand, Value};
use parking_lot::Mutex;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

use crate::config::PubSubMode;
use crate::engine::baton::{Claim, LocalTurn, Queue};
use crate::engine::holds::{Entry, Holds};
pub(crate) mod wake_state;

pub(crate) use wake_state::Wake;
use wake_state::{TakenWakeUp, Wakes};

/// One channel as seen by this process.
pub(crate) struct Channel {
    name: Arc<str>,
    wake: Wake,
    confirmed: AtomicBool,
    confirm: Notify,
    /// Why the server refused this channel's subscription (an ACL without the channel or
    /// the command): its waiters fail with [`Error::Auth`](crate::Error::Auth) instead of
    /// silently polling. A later waiter, once this channel is gone, tries again.
    refused: Mutex<Option<String>>,
    /// The waiter groups, by key. Few per channel (usually one).
    groups: Mutex<Vec<Arc<Group>>>,
    /// Messages delivered so far (wrapping), counted before the groups are read: a waiter
    /// that registers its group after a message was delivered sees the count moved (see
    /// [`Hub::confirmed_channel`]).
    delivered: AtomicU32,
}

/// The waiters of one key on a channel.
pub(crate) struct Group {
    key: Arc<str>,
    /// Its waiters' wake-ups (the group leaves its channel when none is registered).
    wakes: Wakes,
    /// The batons of its waiters that can be passed the lock (see [`crate::engine::baton`]).
    batons: Arc<Queue>,
    /// [`Wake::Lock`]: when the lock's lease ends, as the last `-<ms>` message said, while a
    /// timer task waits to wake the waiters then (`None`: no news, no timer).
    lease_end: Mutex<Option<Instant>>,
    /// Tells that timer the end moved or was dropped.
    lease_moved: Notify,
}

impl Group {
    /// The lock's lease now ends `ms` from now: every waiter is woken then, by a timer task
    /// (one per group, following later news). Waiters are not woken now: the lock is still
    /// held, and a re-check would only read the new expiry, one round trip each.
    fn lease_ends_in(self: &Arc<Self>, ms: u64) {
        let Some(end) = Instant::now().checked_add(Duration::from_millis(ms)) else {
            return;
        };
        let timer_idle = self.lease_end.lock().replace(end).is_none();
        if timer_idle {
            tokio::spawn(wake_at_lease_end(self.clone()));
        } else {
            self.lease_moved.notify_one();
        }
    }

    /// Drops the news of the lease's end (the lock was released and waiters woken, or none is
    /// left): its timer stops.
    fn forget_lease_end(&self) {
        if self.lease_end.lock().take().is_some() {
            self.lease_moved.notify_one();
        }
    }
}

impl Channel {
    /// Resolves once the server has processed this channel's SUBSCRIBE (or refused it).
    pub(crate) async fn confirmed(&self) {
        loop {
            let notified = self.confirm.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_confirmed() || self.refused.lock().is_some() {
                return;
            }
            notified.await;
        }
    }

    fn set_confirmed(&self, confirmed: bool) {
        self.confirmed.store(confirmed, Ordering::Release);
        if confirmed {
            self.confirm.notify_waiters();
        }
    }

    pub(crate) fn is_confirmed(&self) -> bool {
        self.confirmed.load(Ordering::Acquire)
    }

    /// The messages delivered on this channel so far (wrapping).
    pub(crate) fn delivered(&self) -> u32 {
        self.delivered.load(Ordering::Acquire)
    }

    /// The server's refusal of this subscription, if it refused it.
    pub(crate) fn refused(&self) -> Option<String> {
        self.refused.lock().clone()
    }

    /// Records a refusal when `error` is one (a permission, not a passing failure), waking
    /// the waiters so they report it. Returns whether it was.
    fn refuse_if_denied(&self, error: &fred::error::Error) -> bool {
        let details = error.details();
        if !details.starts_with("NOPERM") && !details.starts_with("NOAUTH") {
            return false;
        }
        tracing::error!(channel = %self.name, error = %details, "the server refuses this subscription: its waiters fail");
        *self.refused.lock() = Some(details.to_owned());
        self.confirm.notify_waiters();
        self.groups
            .lock()
            .iter()
            .for_each(|g| g.wakes.wake_parked());
        true
    }

    /// Doubts every hold of this channel's keys that this client holds through a hand-off in
    /// memory: the message may say Redis no longer has it (a force-unlock), or messages may
    /// have been lost. It ends the run of hand-offs at once (invariant 16,
    /// docs/DESIGN.md).
    fn doubt_handed(&self, holds: &Holds) {
        for group in self.groups.lock().iter() {
            if let Some((entry, generation)) = group.batons.unlock_heard() {
                holds.doubt(entry, generation);
            }
        }
    }

    /// Applies a message to every group. Returns whether it was an unlock message, which may
    /// say a hold of this client is gone (see [`doubt_handed`](Channel::doubt_handed)).
    fn deliver(&self, message: &Value) -> bool {
        // Before the groups are read: a group registered after they were is told by the count.
        self.delivered.fetch_add(1, Ordering::AcqRel);
        let Some(text) = message.as_str() else {
            return false;
        };
        let groups = self.groups.lock().clone();
        match (self.wake, &*text) {
            (Wake::Lock, "0") => {
                tracing::trace!(channel = %self.name, "unlock message: waking one waiter");
                groups.iter().for_each(|g| {
                    g.forget_lease_end();
                    g.wakes.wake_one();
                });
                true
            }
            (Wake::Lock, "1") => {
                tracing::trace!(channel = %self.name, "write-unlock message: waking all waiters");
                groups.iter().for_each(|g| {
                    g.forget_lease_end();
                    g.wakes.wake_all();
                });
                true
            }
            (Wake::Lock, news) => {
                let Some(ms) = news.strip_prefix('-').and_then(|ms| ms.parse::<u64>().ok()) else {
                    return false;
                };
                tracing::trace!(channel = %self.name, ms, "the lock's expiry came closer: waking all waiters then");
                groups.iter().for_each(|g| g.lease_ends_in(ms));
                false
            }
            (Wake::Permits, n) => {
                let Ok(permits) = n.parse::<u64>() else {
                    return false;
                };
                if permits == 0 {
                    return false;
                }
                tracing::trace!(channel = %self.name, permits, "permits released: waking as many waiters");
                groups
                    .iter()
                    .for_each(|g| g.wakes.permits_released(permits));
                false
            }
        }
    }
}

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
    subscriber: SubscriberClient,
    /// The client's holds: an unlock message doubts one held through a hand-off in memory.
    holds: Arc<Holds>,
    mode: PubSubMode,
    /// Hashed with foldhash (seeded per process): every release of a lock looks its channel
    /// up here for a parked waiter to pass it to.
    channels: DashMap<Arc<str>, Slot, foldhash::fast::RandomState>,
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
        subscriber: SubscriberClient,
        mode: PubSubMode,
        holds: Arc<Holds>,
    ) -> Result<Arc<Hub>, fred::error::Error> {
        // Receivers first: the initial connection also emits a reconnect event.
        let mut reconnects = subscriber.reconnect_rx();
        let messages = subscriber.message_rx();
        subscriber.init().await?;
        // Consume the initial connection's event, or it would count as a reconnect.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), reconnects.recv()).await;
        let (ops, ops_rx) = mpsc::unbounded_channel();
        let hub = Arc::new(Hub {
            subscriber,
            holds,
            mode,
            channels: DashMap::with_hasher(Default::default()),
            ops,
            generation: AtomicU64::new(0),
            rechecks: Notify::new(),
            closed: AtomicBool::new(false),
            idle: Notify::new(),
        });
        if mode == PubSubMode::Sharded && hub.subscriber.is_clustered() {
            tokio::spawn(follow_shards(Arc::downgrade(&hub)));
        }
        tokio::spawn(dispatch_messages(hub.clone(), messages));
        tokio::spawn(drop_idle(hub.clone()));
        tokio::spawn(apply_ops(hub.clone(), ops_rx, reconnects));
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
                    groups.push(group.clone());
                    group
                }
            };
            group.wakes.join();
            group
        };
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
        self.channels
            .get(name)
            .filter(|slot| slot.channel.is_confirmed())
            .map(|slot| (slot.channel.clone(), slot.channel.delivered()))
    }

    /// The baton queue of `key`'s waiters on channel `name`, if any wait here.
    fn batons(&self, name: &str, key: &str) -> Option<Arc<Queue>> {
        let channel = self.channels.get(name)?.channel.clone();
        let groups = channel.groups.lock();
        let group = groups.iter().find(|g| *g.key == *key)?;
        Some(group.batons.clone())
    }

    /// This client holds `key` (channel `name`) now through the hold (`entry`, `generation`):
    /// noted where its waiters queue, if any do or did lately, so that its other owners'
    /// acquires queue behind it without asking Redis.
    pub(crate) fn held_here(&self, name: &str, key: &str, entry: &Arc<Entry>, generation: u64) {
        if let Some(batons) = self.batons(name, key) {
            batons.held_here(entry, generation);
        }
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

    async fn send_subscribe(&self, names: Vec<String>) -> Result<(), fred::error::Error> {
        match self.mode {
            PubSubMode::Classic => self.subscriber.subscribe(names).await,
            PubSubMode::Sharded => {
                // One at a time: a multi-channel SSUBSCRIBE must stay within one slot.
                for name in names {
                    let mut tries = 0;
                    loop {
                        tries += 1;
                        match self.subscriber.ssubscribe(name.clone()).await {
                            // Redirected: the slot moved or is moving (fred, told to follow
                            // no redirection, answers either error, seen during migrations)
                            // and re-read the slot map. Subscribing twice does no harm: again,
                            // a few times while a migration settles, or waiters would wait for
                            // the lease.
                            Err(e)
                                if tries < SUBSCRIBE_TRIES
                                    && (crate::error::is_redirect(&e)
                                        || crate::error::is_rewrite(&e)) =>
                            {
                                tokio::time::sleep(std::time::Duration::from_millis(20 * tries))
                                    .await;
                            }
                            other => break other?,
                        }
                    }
                }
                Ok(())
            }
        }
    }

    async fn send_unsubscribe(&self, name: &str) -> Result<(), fred::error::Error> {
        match self.mode {
            PubSubMode::Classic => self.subscriber.unsubscribe(name).await,
            PubSubMode::Sharded => self.subscriber.sunsubscribe(name).await,
        }
    }

    /// Resolves once the server has processed everything sent on the subscriber before it.
    async fn barrier(&self) -> Result<(), fred::error::Error> {
        match self.mode {
            // SSUBSCRIBE already waits for the server's reply.
            PubSubMode::Sharded => Ok(()),
            PubSubMode::Classic if self.subscriber.is_clustered() => {
                // fred sends a cluster client's SUBSCRIBEs to the node owning the slot of its
                // id; the PING must go there too, or it proves nothing.
                let slot = fred::util::redis_keyslot(self.subscriber.id().as_bytes());
                let ping = CustomCommand::new_static("PING", ClusterHash::Custom(slot), false);
                self.subscriber
                    .custom::<Value, Value>(ping, Vec::new())
                    .await
                    .map(drop)
            }
            PubSubMode::Classic => self.subscriber.ping::<Value>(None).await.map(drop),
        }
    }

    /// Whether a subscribed shard channel's slot is served by another primary in `now` than in
    /// `before`.
    fn shard_moved(
        &self,
        before: &fred::types::cluster::ClusterRouting,
        now: &fred::types::cluster::ClusterRouting,
    ) -> bool {
        self.channels.iter().any(|channel| {
            let slot = fred::util::redis_keyslot(channel.key().as_bytes());
            before.get_server(slot) != now.get_server(slot)
        })
    }
}

/// Drops the subscriptions that lingered [`LINGER`] without a waiter; sleeps while there are
/// none. One task per hub, rather than a timer per departure: on many keys, the last waiter
/// of some channel leaves at almost every release.
async fn drop_idle(hub: Arc<Hub>) {
    loop {
        hub.idle.notified().await;
        loop {
            if hub.closed.load(Ordering::Acquire) {
                return;
            }
            tokio::time::sleep(LINGER / 2).await;
            let now = Instant::now();
            let mut lingering = false;
            let idle: Vec<Arc<str>> = hub
                .channels
                .iter()
                .filter_map(|slot| {
                    let since = slot.idle_since?;
                    lingering = true;
                    (now.saturating_duration_since(since) >= LINGER).then(|| slot.key().clone())
                })
                .collect();
            for name in idle {
                let removed = hub.channels.remove_if(&name, |_, slot| {
                    let expired = slot
                        .idle_since
                        .is_some_and(|since| now.saturating_duration_since(since) >= LINGER);
                    if expired {
                        // Queued under the map entry's lock: ordered after this channel's
                        // SUBSCRIBE and before any later one.
                        let _ = hub.ops.send(Op::Unsubscribe(name.clone()));
                    }
                    expired
                });
                drop(removed);
            }
            if !lingering {
                break;
            }
        }
    }
}

/// Sharded pub/sub on a cluster: a shard subscription lives on the node serving its slot, and
/// when the slot moves (failover, resharding) that node drops it with a SUNSUBSCRIBE push that
/// fred discards, while the connection stays up. So, while channels are subscribed, re-read
/// the slot map every `SHARD_SCAN` (Redisson scans its cluster topology periodically too) and
/// resubscribe, waking every waiter, when the owner of a subscribed slot changed.
async fn follow_shards(hub: std::sync::Weak<Hub>) {
    // The slot map as of the last look: every subscription since was sent with it or a newer
    // one, so a slot whose owner differs now may have lost its subscriptions. (Comparing owners
    // at the last look with owners now for the channels of both looks missed a channel
    // subscribed between two looks, on a node that lost its slot before the second.)
    let mut last = hub
        .upgrade()
        .and_then(|hub| hub.subscriber.cached_cluster_state());
    loop {
        tokio::time::sleep(SHARD_SCAN).await;
        let Some(hub) = hub.upgrade() else { break };
        if hub.closed.load(Ordering::Acquire) {
            break;
        }
        if hub.channels.is_empty() {
            continue;
        }
        if let Err(e) = hub.subscriber.sync_cluster().await {
            tracing::debug!(error = %e, "cluster slot map refresh failed");
            continue;
        }
        let now = hub.subscriber.cached_cluster_state();
        if let (Some(before), Some(now)) = (&last, &now) {
            if hub.shard_moved(before, now) {
                tracing::info!("a subscribed slot moved to another node; resubscribing");
                resubscribe(&hub).await;
            }
        }
        last = now;
    }
}

/// Wakes `group`'s waiters when the lock's lease ends by the latest news; stops when the news
/// is dropped.
async fn wake_at_lease_end(group: Arc<Group>) {
    loop {
        // Made before the end is read: news that comes after is not missed.
        let moved = group.lease_moved.notified();
        let Some(end) = *group.lease_end.lock() else {
            return;
        };
        tokio::select! {
            _ = tokio::time::sleep_until(end) => {}
            _ = moved => continue,
        }
        let mut lease_end = group.lease_end.lock();
        if *lease_end == Some(end) {
            *lease_end = None;
            drop(lease_end);
            tracing::trace!(key = %group.key, "the lock's lease ended: waking all waiters");
            group.wakes.wake_all();
            return;
        }
    }
}

/// How many times a shard subscription is sent while the cluster redirects it.
const SUBSCRIBE_TRIES: u64 = 5;

/// How often the hub re-reads a cluster's slot map while shard channels are subscribed.
const SHARD_SCAN: std::time::Duration = std::time::Duration::from_secs(1);

/// How long after a failed resubscription the hub tries again.
const RESUBSCRIBE_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// Routes release messages to waiters.
async fn dispatch_messages(
    hub: Arc<Hub>,
    mut messages: tokio::sync::broadcast::Receiver<fred::types::Message>,
) {
    loop {
        match messages.recv().await {
            Ok(message) => {
                let channel = hub
                    .channels
                    .get(&*message.channel)
                    .map(|slot| slot.channel.clone());
                if let Some(channel) = channel {
                    if channel.deliver(&message.value) {
                        channel.doubt_handed(&hub.holds);
                    }
                }
            }
            Err(RecvError::Lagged(missed)) => {
                // Never fatal: messages were dropped, so everyone re-checks.
                tracing::warn!(missed, "pub/sub listener lagged; waking every waiter");
                hub.wake_all();
            }
            Err(RecvError::Closed) => break,
        }
    }
}

/// Sends (un)subscriptions in queue order; after a reconnect resubscribes and wakes everyone.
async fn apply_ops(
    hub: Arc<Hub>,
    mut ops: mpsc::UnboundedReceiver<Op>,
    mut reconnects: tokio::sync::broadcast::Receiver<fred::types::config::Server>,
) {
    let mut retry_at: Option<tokio::time::Instant> = None;
    loop {
        let retry = async {
            match retry_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            op = ops.recv() => {
                let Some(op) = op else { break };
                let mut batch = vec![op];
                while let Ok(op) = ops.try_recv() {
                    batch.push(op);
                }
                apply_batch(&hub, batch).await;
            }
            event = reconnects.recv() => match event {
                Ok(_) | Err(RecvError::Lagged(_)) => {
                    crate::metrics::subscriber_reconnected();
                    // Until resubscribed, no channel is known to be live.
                    hub.channels().iter().for_each(|c| c.set_confirmed(false));
                    retry_at = (!resubscribe(&hub).await)
                        .then(|| tokio::time::Instant::now() + RESUBSCRIBE_RETRY);
                }
                Err(RecvError::Closed) => break,
            },
            _ = retry => {
                if hub.closed.load(Ordering::Acquire) {
                    break;
                }
                retry_at = (!resubscribe(&hub).await)
                    .then(|| tokio::time::Instant::now() + RESUBSCRIBE_RETRY);
            }
        }
    }
}

async fn apply_batch(hub: &Hub, batch: Vec<Op>) {
    let mut subscribed = Vec::new();
    for op in batch {
        match op {
            Op::Subscribe(channel) => {
                match hub.send_subscribe(vec![channel.name.to_string()]).await {
                    Ok(()) => subscribed.push(channel),
                    // The registry still lists it: the reconnect path resubscribes it, and its
                    // waiters fall back to the lock's PTTL meanwhile.
                    Err(e) => {
                        if !channel.refuse_if_denied(&e) {
                            tracing::warn!(channel = %channel.name, error = %e, "subscribe failed")
                        }
                    }
                }
            }
            Op::Unsubscribe(name) => {
                if let Err(e) = hub.send_unsubscribe(&name).await {
                    tracing::debug!(channel = %name, error = %e, "unsubscribe failed");
                }
            }
        }
    }
    if subscribed.is_empty() {
        return;
    }
    match hub.barrier().await {
        Ok(()) => subscribed.iter().for_each(|c| c.set_confirmed(true)),
        Err(e) => {
            // Without the barrier nothing proves the subscriptions live; a refused one
            // (an ACL without PING) is reported, not left to poll.
            let refused = subscribed
                .iter()
                .fold(false, |r, c| c.refuse_if_denied(&e) | r);
            if !refused {
                tracing::warn!(error = %e, "subscription barrier failed");
            }
        }
    }
}

/// Resubscribes every channel and wakes every waiter. Returns whether the subscriptions are
/// confirmed again.
async fn resubscribe(hub: &Hub) -> bool {
    let channels = hub.channels();
    tracing::info!(
        channels = channels.len(),
        "subscriber reconnected; resubscribing"
    );
    let mut confirmed = true;
    if !channels.is_empty() {
        let names = channels.iter().map(|c| c.name.to_string()).collect();
        let result = match hub.send_subscribe(names).await {
            Ok(()) => hub.barrier().await,
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => channels.iter().for_each(|c| c.set_confirmed(true)),
            Err(e) => {
                if !channels
                    .iter()
                    .fold(false, |r, c| c.refuse_if_denied(&e) | r)
                {
                    tracing::warn!(error = %e, "resubscribe failed; retrying shortly");
                }
                confirmed = false;
            }
        }
    }
    crate::metrics::resubscribed(confirmed);
    // Messages published while disconnected are gone: every waiter re-checks.
    hub.wake_all();
    confirmed
}

#[cfg(test)]
mod tests;
