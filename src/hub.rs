//! The hub: one shared subscriber connection per [`Client`](crate::Client), routing unlock
//! messages to the tasks parked on each lock.
//!
//! Waiters of one channel share one Redis subscription, counted: the first waiter's
//! registration queues a SUBSCRIBE, the last one's departure an UNSUBSCRIBE. Both are queued
//! while the registry lock is held and sent by one task in queue order, so the server's view
//! can never fall behind the registry (no leaked subscription, no unsubscribe that overtakes
//! a newer subscribe), even when registrations are dropped mid-flight by cancellation.
//!
//! A subscription is *confirmed* once a PING on the subscriber connection has come back after
//! the SUBSCRIBE (fred resolves `subscribe` when the command is queued, not when the server
//! has processed it). A waiter re-checks the lock only after confirmation, so an unlock
//! published in between cannot be missed.
//!
//! An unlock message (`0`) wakes **one** waiter of the channel in this process; a read-unlock
//! (`1`) wakes all. After the subscriber reconnects, or when the message stream lagged,
//! messages may have been lost: the hub then bumps its *generation* and every waiter re-checks.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use fred::clients::SubscriberClient;
use fred::interfaces::{ClientLike, ClusterInterface, EventInterface, PubsubInterface};
use fred::types::{ClusterHash, CustomCommand, Value};
use parking_lot::Mutex;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{mpsc, watch, Notify};

use crate::config::PubSubMode;

/// One lock channel as seen by this process.
pub(crate) struct Channel {
    name: Arc<str>,
    /// Wake-one primitive the channel's waiters park on.
    wake: Notify,
    confirmed: AtomicBool,
    confirm: Notify,
}

impl Channel {
    /// Resolves once the server has processed this channel's SUBSCRIBE.
    pub(crate) async fn confirmed(&self) {
        loop {
            let notified = self.confirm.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.confirmed.load(Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }

    fn set_confirmed(&self) {
        self.confirmed.store(true, Ordering::Release);
        self.confirm.notify_waiters();
    }

    pub(crate) fn is_confirmed(&self) -> bool {
        self.confirmed.load(Ordering::Acquire)
    }
}

struct Slot {
    channel: Arc<Channel>,
    waiters: usize,
}

enum Op {
    Subscribe(Arc<Channel>),
    Unsubscribe(Arc<str>),
}

pub(crate) struct Hub {
    subscriber: SubscriberClient,
    mode: PubSubMode,
    channels: Mutex<HashMap<Arc<str>, Slot>>,
    ops: mpsc::UnboundedSender<Op>,
    generation: watch::Sender<u64>,
    closed: AtomicBool,
}

/// A waiter's registration on a channel; dropping it releases the shared subscription.
pub(crate) struct Subscription {
    hub: Arc<Hub>,
    channel: Arc<Channel>,
}

impl Subscription {
    pub(crate) fn channel(&self) -> &Arc<Channel> {
        &self.channel
    }

    /// Parks until an unlock message for this channel wakes this waiter.
    pub(crate) async fn notified(&self) {
        self.channel.wake.notified().await
    }

    /// Hands a wake-up this waiter received but will not use to the next waiter.
    pub(crate) fn pass_on(&self) {
        tracing::trace!(channel = %self.channel.name, "passing a wake-up on");
        self.channel.wake.notify_one();
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut channels = self.hub.channels.lock();
        let Some(slot) = channels.get_mut(&self.channel.name) else {
            return;
        };
        if !Arc::ptr_eq(&slot.channel, &self.channel) {
            return;
        }
        slot.waiters -= 1;
        if slot.waiters == 0 {
            channels.remove(&self.channel.name);
            // Queued under the registry lock: ordered after this channel's SUBSCRIBE and
            // before any later one.
            let _ = self
                .hub
                .ops
                .send(Op::Unsubscribe(self.channel.name.clone()));
        }
    }
}

impl Hub {
    /// Connects the subscriber and starts the hub's tasks.
    pub(crate) async fn start(
        subscriber: SubscriberClient,
        mode: PubSubMode,
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
            mode,
            channels: Mutex::new(HashMap::new()),
            ops,
            generation: watch::channel(0).0,
            closed: AtomicBool::new(false),
        });
        if mode == PubSubMode::Sharded && hub.subscriber.is_clustered() {
            tokio::spawn(follow_shards(Arc::downgrade(&hub)));
        }
        tokio::spawn(dispatch_messages(hub.clone(), messages));
        tokio::spawn(apply_ops(hub.clone(), ops_rx, reconnects));
        Ok(hub)
    }

    /// Registers a waiter on `name`, subscribing if it is the channel's first.
    pub(crate) fn subscribe(self: &Arc<Self>, name: &Arc<str>) -> Subscription {
        let mut channels = self.channels.lock();
        let channel = match channels.get_mut(name) {
            Some(slot) => {
                slot.waiters += 1;
                slot.channel.clone()
            }
            None => {
                let channel = Arc::new(Channel {
                    name: name.clone(),
                    wake: Notify::new(),
                    confirmed: AtomicBool::new(false),
                    confirm: Notify::new(),
                });
                channels.insert(
                    name.clone(),
                    Slot {
                        channel: channel.clone(),
                        waiters: 1,
                    },
                );
                let _ = self.ops.send(Op::Subscribe(channel.clone()));
                channel
            }
        };
        Subscription {
            hub: self.clone(),
            channel,
        }
    }

    /// The channel's current registration if its subscription is already confirmed.
    pub(crate) fn confirmed_channel(&self, name: &str) -> Option<Arc<Channel>> {
        let channels = self.channels.lock();
        channels
            .get(name)
            .filter(|slot| slot.channel.is_confirmed())
            .map(|slot| slot.channel.clone())
    }

    /// A receiver of the generation counter, bumped whenever waiters must re-check.
    pub(crate) fn generation(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// Wakes every waiter so it re-checks its lock (reconnect, lag, shutdown).
    pub(crate) fn wake_all(&self) {
        self.generation.send_modify(|g| *g += 1);
    }

    /// Closes the subscriber connection; the hub's tasks end with it.
    pub(crate) async fn shutdown(&self) {
        self.closed.store(true, Ordering::Release);
        self.wake_all();
        if let Err(e) = self.subscriber.quit().await {
            tracing::debug!(error = %e, "subscriber quit");
        }
    }

    async fn send_subscribe(&self, names: Vec<String>) -> Result<(), fred::error::Error> {
        match self.mode {
            PubSubMode::Classic => self.subscriber.subscribe(names).await,
            PubSubMode::Sharded => {
                // One at a time: a multi-channel SSUBSCRIBE must stay within one slot.
                for name in names {
                    match self.subscriber.ssubscribe(name.clone()).await {
                        // Redirected (the slot moved): fred re-read the slot map; once more.
                        Err(e) if crate::error::is_spent_redirect(&e) => {
                            self.subscriber.ssubscribe(name).await?
                        }
                        other => other?,
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

    /// The primaries currently serving the shard channels' slots (sharded mode on a cluster).
    fn shard_owners(&self) -> Vec<Option<fred::types::config::Server>> {
        let Some(state) = self.subscriber.cached_cluster_state() else {
            return Vec::new();
        };
        let mut names: Vec<Arc<str>> = self.channels.lock().keys().cloned().collect();
        names.sort();
        names
            .iter()
            .map(|n| {
                state
                    .get_server(fred::util::redis_keyslot(n.as_bytes()))
                    .cloned()
            })
            .collect()
    }
}

/// Sharded pub/sub on a cluster: a shard subscription lives on the node serving its slot, and
/// when the slot moves (failover, resharding) that node drops it with a SUNSUBSCRIBE push that
/// fred discards, while the connection stays up. So, while channels are subscribed, re-read
/// the slot map every `SHARD_SCAN` (Redisson scans its cluster topology periodically too) and
/// resubscribe, waking every waiter, when the owner of a subscribed slot changed.
async fn follow_shards(hub: std::sync::Weak<Hub>) {
    let mut last = Vec::new();
    loop {
        tokio::time::sleep(SHARD_SCAN).await;
        let Some(hub) = hub.upgrade() else { break };
        if hub.closed.load(Ordering::Acquire) {
            break;
        }
        if hub.channels.lock().is_empty() {
            last.clear();
            continue;
        }
        if let Err(e) = hub.subscriber.sync_cluster().await {
            tracing::debug!(error = %e, "cluster slot map refresh failed");
            continue;
        }
        let owners = hub.shard_owners();
        if !last.is_empty() && owners != last {
            tracing::info!("a subscribed slot moved to another node; resubscribing");
            resubscribe(&hub).await;
        }
        last = owners;
    }
}

/// How often the hub re-reads a cluster's slot map while shard channels are subscribed.
const SHARD_SCAN: std::time::Duration = std::time::Duration::from_secs(1);

/// Routes unlock messages to waiters.
async fn dispatch_messages(
    hub: Arc<Hub>,
    mut messages: tokio::sync::broadcast::Receiver<fred::types::Message>,
) {
    loop {
        match messages.recv().await {
            Ok(message) => {
                let channel = hub
                    .channels
                    .lock()
                    .get(&*message.channel)
                    .map(|slot| slot.channel.clone());
                let Some(channel) = channel else { continue };
                match message.value.as_str().as_deref() {
                    Some("0") => {
                        tracing::trace!(channel = %channel.name, "unlock message: waking one waiter");
                        channel.wake.notify_one();
                    }
                    Some("1") => {
                        tracing::trace!(channel = %channel.name, "read-unlock message: waking all waiters");
                        channel.wake.notify_waiters();
                        channel.wake.notify_one();
                    }
                    _ => {}
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
    loop {
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
                Ok(_) | Err(RecvError::Lagged(_)) => resubscribe(&hub).await,
                Err(RecvError::Closed) => break,
            },
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
                        tracing::warn!(channel = %channel.name, error = %e, "subscribe failed")
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
        Ok(()) => subscribed.iter().for_each(|c| c.set_confirmed()),
        Err(e) => tracing::warn!(error = %e, "subscription barrier failed"),
    }
}

async fn resubscribe(hub: &Hub) {
    let channels: Vec<Arc<Channel>> = hub
        .channels
        .lock()
        .values()
        .map(|slot| slot.channel.clone())
        .collect();
    tracing::info!(
        channels = channels.len(),
        "subscriber reconnected; resubscribing"
    );
    if !channels.is_empty() {
        let names = channels.iter().map(|c| c.name.to_string()).collect();
        match hub.send_subscribe(names).await {
            Ok(()) => match hub.barrier().await {
                Ok(()) => channels.iter().for_each(|c| c.set_confirmed()),
                Err(e) => tracing::warn!(error = %e, "resubscription barrier failed"),
            },
            Err(e) => tracing::warn!(error = %e, "resubscribe failed"),
        }
    }
    // Messages published while disconnected are gone: every waiter re-checks.
    hub.wake_all();
}
