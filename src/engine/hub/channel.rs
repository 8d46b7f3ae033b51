//! One channel as this process sees it ([`Channel`]): whether its subscription is confirmed,
//! the groups of waiters on it by key ([`Group`]), and what a message on it wakes.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fred::types::Value;
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::wake_state::Wakes;
use super::Wake;
use crate::engine::baton::Queue;
use crate::engine::holds::Holds;

/// One channel as seen by this process.
pub(crate) struct Channel {
    pub(super) name: Arc<str>,
    pub(super) wake: Wake,
    pub(super) confirmed: AtomicBool,
    pub(super) confirm: Notify,
    /// Why the server refused this channel's subscription (an ACL without the channel or
    /// the command): its waiters fail with [`Error::Auth`](crate::Error::Auth) instead of
    /// silently polling. A later waiter, once this channel is gone, tries again.
    pub(super) refused: Mutex<Option<String>>,
    /// The waiter groups, by key. Few per channel (usually one).
    pub(super) groups: Mutex<Vec<Arc<Group>>>,
    /// Messages delivered so far (wrapping), counted before the groups are read: a waiter
    /// that registers its group after a message was delivered sees the count moved (see
    /// [`Hub::confirmed_channel`]).
    pub(super) delivered: AtomicU32,
}

/// The waiters of one key on a channel.
pub(crate) struct Group {
    pub(super) key: Arc<str>,
    /// Its waiters' wake-ups (the group leaves its channel when none is registered).
    pub(super) wakes: Wakes,
    /// The batons of its waiters that can be passed the lock (see [`crate::engine::baton`]).
    pub(super) batons: Arc<Queue>,
    /// [`Wake::Lock`]: when the lock's lease ends, as the last `-<ms>` message said, while a
    /// timer task waits to wake the waiters then (`None`: no news, no timer).
    pub(super) lease_end: Mutex<Option<Instant>>,
    /// Tells that timer the end moved or was dropped.
    pub(super) lease_moved: Notify,
}

impl Group {
    /// The lock's lease now ends `ms` from now: every waiter is woken then, by a timer task
    /// (one per group, following later news). Waiters are not woken now: the lock is still
    /// held, and a re-check would only read the new expiry, one round trip each.
    pub(super) fn lease_ends_in(self: &Arc<Self>, ms: u64) {
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
    pub(super) fn forget_lease_end(&self) {
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

    /// The subscription is confirmed, or no longer known live (the subscriber connection
    /// dropped). The groups' baton queues follow: nothing is handed on in memory while an
    /// unlock message could not arrive (invariant 16, docs/DESIGN.md).
    pub(super) fn set_confirmed(&self, confirmed: bool) {
        self.confirmed.store(confirmed, Ordering::Release);
        for group in self.groups.lock().iter() {
            group.batons.listening(confirmed);
        }
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
    pub(super) fn refuse_if_denied(&self, error: &fred::error::Error) -> bool {
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
    pub(super) fn doubt_handed(&self, holds: &Holds) {
        for group in self.groups.lock().iter() {
            if let Some((entry, generation)) = group.batons.unlock_heard() {
                holds.doubt(entry, generation);
            }
        }
    }

    /// Applies a message to every group. Returns whether it was an unlock message, which may
    /// say a hold of this client is gone (see [`doubt_handed`](Channel::doubt_handed)).
    pub(super) fn deliver(&self, message: &Value) -> bool {
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
