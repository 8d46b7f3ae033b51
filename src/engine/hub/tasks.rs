//! The hub's tasks: routing messages to channels, sending (un)subscriptions in order and
//! again after a reconnect, dropping subscriptions that lingered unused, and following a
//! cluster's slot map for shard subscriptions.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::channel::Channel;
use super::{Hub, Op, LINGER};

/// Drops the subscriptions that lingered [`LINGER`] without a waiter; sleeps while there are
/// none. One task per hub, rather than a timer per departure: on many keys, the last waiter
/// of some channel leaves at almost every release.
pub(super) async fn drop_idle(hub: Arc<Hub>) {
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
                if removed.is_some() {
                    hub.listed.fetch_sub(1, Ordering::Relaxed);
                }
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
pub(super) async fn follow_shards(hub: std::sync::Weak<Hub>) {
    // The slot map as of the last look: every subscription since was sent with it or a newer
    // one, so a slot whose owner differs now may have lost its subscriptions. (Comparing owners
    // at the last look with owners now for the channels of both looks missed a channel
    // subscribed between two looks, on a node that lost its slot before the second.)
    let mut last = hub.upgrade().and_then(|hub| hub.subscriber.slot_map());
    loop {
        tokio::time::sleep(SHARD_SCAN).await;
        let Some(hub) = hub.upgrade() else { break };
        if hub.closed.load(Ordering::Acquire) {
            break;
        }
        if hub.channels.is_empty() {
            continue;
        }
        if let Err(e) = hub.subscriber.refresh_slot_map().await {
            tracing::debug!(error = %e, "cluster slot map refresh failed");
            continue;
        }
        let now = hub.subscriber.slot_map();
        if let (Some(before), Some(now)) = (&last, &now) {
            let moved = hub.channels.iter().any(|channel| {
                let slot = fred::util::redis_keyslot(channel.key().as_bytes());
                before.get_server(slot) != now.get_server(slot)
            });
            if moved {
                tracing::info!("a subscribed slot moved to another node; resubscribing");
                resubscribe(&hub).await;
            }
        }
        last = now;
    }
}

/// How often the hub re-reads a cluster's slot map while shard channels are subscribed.
const SHARD_SCAN: std::time::Duration = std::time::Duration::from_secs(1);

/// How long after a failed resubscription the hub tries again.
const RESUBSCRIBE_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// Routes release messages to waiters.
pub(super) async fn dispatch_messages(
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
/// An error on the subscriber connection (it dropped) makes every channel unconfirmed at once,
/// long before the reconnection: messages published meanwhile are lost, a force-unlock's among
/// them, so no hold is handed on in memory until the channel is confirmed again (invariant
/// 16, docs/DESIGN.md), and the holds handed on are checked now.
pub(super) async fn apply_ops(
    hub: Arc<Hub>,
    mut ops: mpsc::UnboundedReceiver<Op>,
    mut reconnects: tokio::sync::broadcast::Receiver<fred::types::config::Server>,
    mut errors: tokio::sync::broadcast::Receiver<(
        fred::error::Error,
        Option<fred::types::config::Server>,
    )>,
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
            // First: an error comes before the reconnection that follows it.
            biased;
            error = errors.recv(), if !errors.is_closed() => {
                if let Ok((e, _)) = &error {
                    tracing::debug!(error = %e, "subscriber connection error: deaf until resubscribed");
                }
                hub.channels().iter().for_each(|c| {
                    c.set_confirmed(false);
                    c.doubt_handed(&hub.holds);
                });
                // Resubscribed when it reconnects; this, if no reconnection is reported.
                retry_at = Some(tokio::time::Instant::now() + RESUBSCRIBE_RETRY);
            }
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

pub(super) async fn apply_batch(hub: &Hub, batch: Vec<Op>) {
    let mut subscribed = Vec::new();
    for op in batch {
        match op {
            Op::Subscribe(channel) => {
                match hub
                    .subscriber
                    .subscribe(vec![channel.name.to_string()])
                    .await
                {
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
                if let Err(e) = hub.subscriber.unsubscribe(&name).await {
                    tracing::debug!(channel = %name, error = %e, "unsubscribe failed");
                }
            }
        }
    }
    if subscribed.is_empty() {
        return;
    }
    match hub.subscriber.barrier().await {
        Ok(()) => now_confirmed(hub, &subscribed),
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

/// The subscriptions of `channels` are confirmed: their unlock messages are heard from now
/// on, and this client's holds of their keys, which one published before may have ended
/// unheard, are checked at once (invariant 16, docs/DESIGN.md) — found in one scan of the
/// holds however many channels a reconnection confirms.
fn now_confirmed(hub: &Hub, channels: &[Arc<Channel>]) {
    let mut keys = HashSet::new();
    for channel in channels {
        channel.set_confirmed(true);
        keys.extend(channel.groups.lock().iter().map(|g| g.key.clone()));
    }
    hub.holds.doubt_keys(|key| keys.contains(key));
}

/// Resubscribes every channel and wakes every waiter. Returns whether the subscriptions are
/// confirmed again.
pub(super) async fn resubscribe(hub: &Hub) -> bool {
    let channels = hub.channels();
    tracing::info!(
        channels = channels.len(),
        "subscriber reconnected; resubscribing"
    );
    let mut confirmed = true;
    if !channels.is_empty() {
        let names = channels.iter().map(|c| c.name.to_string()).collect();
        let result = match hub.subscriber.subscribe(names).await {
            Ok(()) => hub.subscriber.barrier().await,
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => now_confirmed(hub, &channels),
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
