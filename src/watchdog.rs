//! Lease renewal for every lock a [`Client`](crate::Client) holds, and lost-lease signalling.
//!
//! One task per client wakes every third of the watchdog lease and renews **all** watchdog
//! holds in one round trip per batch (the batched `renew.lua`); fixed-lease holds ride along
//! in the same batch with lease 0, which only checks that they are still held. A hold whose
//! renewal finds it gone (expired, force-unlocked, taken over) is marked lost at once; a hold
//! that could not be renewed for a whole lease by the local **monotonic** clock is marked lost
//! too. Either way its guards' [`lost()`](crate::LockGuard::lost) resolves and the hold leaves
//! the registry, so it is never renewed again.
//!
//! The registry is keyed by (lock key, owner). A new acquire after a hold was lost creates a
//! new entry; entries are removed by identity, so a stale guard can never de-register a newer
//! hold of the same owner.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use fred::interfaces::ClientLike;
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::client::ClientInner;

/// Keys renewed per script call.
const BATCH: usize = 100;

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
}

struct HoldState {
    guards: u32,
    watchdog_guards: u32,
    /// Until when the lease is known valid by the local clock: when the last successful
    /// acquire or renewal was *sent*, plus its lease.
    valid_until: Instant,
}

/// One owner's hold on one lock, shared by its (re-entrant) guards.
pub(crate) struct Hold {
    pub(crate) key: Arc<str>,
    pub(crate) channel: Arc<str>,
    pub(crate) owner: Arc<str>,
    state: Mutex<HoldState>,
    lost: AtomicBool,
    lost_notify: Notify,
}

impl Hold {
    /// Lost: told so by Redis, or the lease ran out by the local clock.
    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire) || Instant::now() >= self.state.lock().valid_until
    }

    /// Resolves once the hold is lost.
    pub(crate) async fn lost(&self) {
        loop {
            let notified = self.lost_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_lost() {
                return;
            }
            let until = self.state.lock().valid_until;
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(until) => {}
            }
        }
    }

    pub(crate) fn mark_lost(&self, why: &str) {
        if !self.lost.swap(true, Ordering::AcqRel) {
            tracing::warn!(key = %self.key, owner = %self.owner, why, "lock lease lost");
        }
        self.lost_notify.notify_waiters();
    }
}

/// Holds by (lock key, owner field).
type Registry = HashMap<(Arc<str>, Arc<str>), Arc<Hold>>;

pub(crate) struct Watchdog {
    lease: Duration,
    holds: Mutex<Registry>,
    stop: Notify,
}

fn far_future(from: Instant) -> Instant {
    from + Duration::from_secs(100 * 365 * 24 * 3600)
}

impl Watchdog {
    pub(crate) fn new(lease: Duration) -> Self {
        Watchdog {
            lease,
            holds: Mutex::new(HashMap::new()),
            stop: Notify::new(),
        }
    }

    pub(crate) fn lease(&self) -> Duration {
        self.lease
    }

    /// Records one more hold of (key, owner), taken by a request sent at `sent_at`.
    pub(crate) fn register(
        &self,
        key: &Arc<str>,
        channel: &Arc<str>,
        owner: &Arc<str>,
        lease: Lease,
        sent_at: Instant,
    ) -> Arc<Hold> {
        let lease_len = match lease {
            Lease::Watchdog => self.lease,
            Lease::Fixed(ms) => Duration::from_millis(ms as u64),
        };
        let valid_until = sent_at
            .checked_add(lease_len)
            .unwrap_or_else(|| far_future(sent_at));
        let watchdog = u32::from(lease == Lease::Watchdog);
        let mut holds = self.holds.lock();
        let map_key = (key.clone(), owner.clone());
        if let Some(hold) = holds.get(&map_key) {
            // A hold whose lease already ran out by the local clock is over, even if the
            // watchdog has not noticed yet: the lock was taken anew, and reviving the old
            // hold would let its stale guards release the new one.
            if !hold.is_lost() {
                let mut state = hold.state.lock();
                state.guards += 1;
                state.watchdog_guards += watchdog;
                state.valid_until = state.valid_until.max(valid_until);
                return hold.clone();
            }
            hold.mark_lost("lease ran out before the lock was taken again");
        }
        let hold = Arc::new(Hold {
            key: key.clone(),
            channel: channel.clone(),
            owner: owner.clone(),
            state: Mutex::new(HoldState {
                guards: 1,
                watchdog_guards: watchdog,
                valid_until,
            }),
            lost: AtomicBool::new(false),
            lost_notify: Notify::new(),
        });
        holds.insert(map_key, hold.clone());
        hold
    }

    /// Forgets one guard of `hold`; at zero guards the hold is no longer renewed.
    pub(crate) fn release(&self, hold: &Arc<Hold>, lease: Lease) {
        let mut holds = self.holds.lock();
        let mut state = hold.state.lock();
        state.guards = state.guards.saturating_sub(1);
        if lease == Lease::Watchdog {
            state.watchdog_guards = state.watchdog_guards.saturating_sub(1);
        }
        if state.guards == 0 {
            drop(state);
            Self::remove(&mut holds, hold);
        }
    }

    fn remove(holds: &mut Registry, hold: &Arc<Hold>) {
        let map_key = (hold.key.clone(), hold.owner.clone());
        if holds.get(&map_key).is_some_and(|h| Arc::ptr_eq(h, hold)) {
            holds.remove(&map_key);
        }
    }

    fn forget_lost(&self, hold: &Arc<Hold>, why: &str) {
        hold.mark_lost(why);
        Self::remove(&mut self.holds.lock(), hold);
    }

    /// Removes and returns every hold (client shutdown).
    pub(crate) fn drain(&self) -> Vec<(Arc<Hold>, u32)> {
        self.holds
            .lock()
            .drain()
            .map(|(_, hold)| {
                let guards = hold.state.lock().guards;
                (hold, guards)
            })
            .collect()
    }

    /// Number of holds currently tracked.
    pub(crate) fn len(&self) -> usize {
        self.holds.lock().len()
    }

    pub(crate) fn stop(&self) {
        self.stop.notify_one();
    }

    /// Marks lost every hold whose lease ran out by the local clock.
    fn expire_overdue(&self) {
        let now = Instant::now();
        let overdue: Vec<Arc<Hold>> = self
            .holds
            .lock()
            .values()
            .filter(|h| h.state.lock().valid_until <= now)
            .cloned()
            .collect();
        for hold in overdue {
            self.forget_lost(&hold, "not renewed within its lease");
        }
    }

    /// The holds to send this round with the lease argument each gets (0 = check only).
    fn snapshot(&self) -> Vec<(Arc<Hold>, i64)> {
        let lease_ms = self.lease.as_millis() as i64;
        self.holds
            .lock()
            .values()
            .map(|h| {
                let renew = h.state.lock().watchdog_guards > 0;
                (h.clone(), if renew { lease_ms } else { 0 })
            })
            .collect()
    }

    async fn renew_round(&self, inner: &ClientInner) {
        let groups = slot_groups(self.snapshot(), inner.redis.is_clustered());
        // Groups run concurrently: on a cluster, a primary that is down must not hold up the
        // renewal of locks on the others past the round's time limit.
        futures::future::join_all(groups.iter().map(|group| self.renew_group(inner, group))).await;
    }

    async fn renew_group(&self, inner: &ClientInner, group: &[(Arc<Hold>, i64)]) {
        for chunk in group.chunks(BATCH) {
            let args: Vec<(&str, &str, i64)> = chunk
                .iter()
                .map(|(h, lease)| (&*h.key, &*h.owner, *lease))
                .collect();
            let sent_at = Instant::now();
            match inner.scripts.renew(&inner.redis, &args).await {
                Ok(held) => {
                    for ((hold, lease), held) in chunk.iter().zip(held) {
                        if !held {
                            self.forget_lost(hold, "renewal found the lock gone");
                        } else if *lease > 0 {
                            let mut state = hold.state.lock();
                            let until = sent_at + self.lease;
                            state.valid_until = state.valid_until.max(until);
                        }
                    }
                    tracing::trace!(holds = chunk.len(), "renewed");
                }
                // Entries stay: the next round retries, and expire_overdue ends any hold that
                // stays unrenewed for a whole lease.
                Err(e) => tracing::warn!(holds = chunk.len(), error = %e, "lease renewal failed"),
            }
        }
    }
}

/// Splits a renewal batch so each script call stays within one hash slot on a cluster (a
/// script's keys must share a slot there: CROSSSLOT otherwise); elsewhere one group.
fn slot_groups(batch: Vec<(Arc<Hold>, i64)>, clustered: bool) -> Vec<Vec<(Arc<Hold>, i64)>> {
    if !clustered {
        return vec![batch];
    }
    let mut by_slot: std::collections::BTreeMap<u16, Vec<(Arc<Hold>, i64)>> = Default::default();
    for item in batch {
        let slot = fred::util::redis_keyslot(item.0.key.as_bytes());
        by_slot.entry(slot).or_default().push(item);
    }
    by_slot.into_values().collect()
}

/// The watchdog task: renews every `lease / 3` until the client shuts down or is dropped.
pub(crate) async fn run(client: Weak<ClientInner>, watchdog: Arc<Watchdog>) {
    let period = watchdog.lease / 3;
    let mut next = Instant::now() + period;
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            _ = watchdog.stop.notified() => break,
        }
        let Some(inner) = client.upgrade() else { break };
        if inner.is_closed() {
            break;
        }
        watchdog.expire_overdue();
        if watchdog.len() > 0 {
            // Bounded by the period, so a stalled server cannot delay local expiry checks by
            // more than one period.
            if tokio::time::timeout(period, watchdog.renew_round(&inner))
                .await
                .is_err()
            {
                tracing::warn!(?period, "lease renewal round timed out");
            }
            watchdog.expire_overdue();
        }
        drop(inner);
        next += period;
        let now = Instant::now();
        if next < now {
            next = now + period;
        }
    }
    tracing::debug!("watchdog stopped");
}
