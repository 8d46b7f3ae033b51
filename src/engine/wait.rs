//! The wait loop every kind shares: try, register with the hub, re-check once subscribed,
//! then park until a message, a re-check request, the holder's pttl or the caller's deadline.
//!
//! A waiter tries once; if refused, it registers on its channel with the client's hub,
//! waits for the subscription to be confirmed, tries again, and then parks until a message
//! wakes it, the hub asks everyone to re-check (reconnect, lag), or the holder's remaining
//! lease runs out — whichever comes first, capped by the caller's deadline. So a lost
//! message costs at most one lease (invariants 2 and 3, docs/DESIGN.md). What one attempt is
//! belongs to the waiter ([`Attempts`]): a lock kind's in [`crate::engine::acquire`], a
//! semaphore's in its kind.

use std::any::Any;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::Either;
use tokio::time::Instant;

use crate::engine::baton::{Baton, Ticket};
use crate::engine::client_inner::ClientInner;
use crate::engine::hub::Wake;
use crate::metrics;
use crate::{Error, Result};

/// How long a parked waiter pauses before retrying after a connection error or timeout.
const RETRY_AFTER_ERROR_MS: u64 = 200;

/// How long a waiter refused without a round trip (its client holds the lock through a hold
/// handed on in memory, see [`crate::engine::baton`]) parks at most before it looks again.
pub(crate) const HELD_HERE_RECHECK_MS: u64 = 100;

/// The longest a waiter parks while its channel's subscription is not confirmed (the
/// subscriber is down or cannot subscribe): it polls instead of trusting messages.
const UNCONFIRMED_POLL: Duration = Duration::from_secs(1);

/// What one attempt came to.
pub(crate) enum Try<T> {
    /// Acquired.
    Got(T),
    /// Refused; the holder's lease has this many milliseconds left (the park's bound).
    Busy(u64),
    /// Refused, as [`Busy`](Try::Busy), though permits are free: fewer than this waiter asks
    /// for, but a smaller request could take them.
    TooFew(u64),
}

/// One waiter's attempts, as the wait loop drives them.
pub(crate) trait Attempts: Send {
    type Output: Send;

    /// The client the waiter belongs to.
    fn client(&self) -> &ClientInner;

    /// The lock's name, for logs.
    fn name(&self) -> &str;

    /// The lock's kind, as metrics label it.
    fn kind(&self) -> &'static str;

    /// The channel to listen on, the key the waiter waits for, and the channel's rule.
    fn channel(&self) -> (Arc<str>, Arc<str>, Wake);

    /// One try.
    fn attempt(&mut self) -> impl Future<Output = Result<Try<Self::Output>>> + Send;

    /// Called once the first try was refused, before the waiter waits: drops what it need
    /// not keep while it waits.
    fn parking(&mut self) {}

    /// Called once when the waiter leaves without the lock (timeout, error, cancellation).
    fn give_up(&mut self) {}

    /// Who this waiter is for a baton pass, if the lock can be passed to it (see
    /// [`crate::engine::baton`]).
    fn baton(&self) -> Option<Baton> {
        None
    }

    /// Whether a waiter whose look succeeded after a wake-up wakes every other waiter of its
    /// group: they wait for the same news (the lock became free), not for a turn.
    fn wakes_group(&self) -> bool {
        false
    }

    /// The output for a guard passed to this waiter by a releaser of its client. `None`
    /// (never, for a kind that hands out batons) drops it, which releases its hold.
    fn passed(&mut self, _guard: Box<dyn Any + Send>) -> Option<Self::Output> {
        None
    }
}

/// A waiter of the wait loop: its attempts and its time frame. Disarmed on success;
/// otherwise gives up on drop, whatever the exit.
struct Waiter<A: Attempts> {
    attempts: A,
    armed: bool,
    /// When the call started (its first poll).
    start: Instant,
    /// When the caller's wait ends, if it does.
    deadline: Option<Instant>,
}

impl<A: Attempts> Waiter<A> {
    /// Acquired: nothing to give up.
    fn acquired(&mut self, output: A::Output) -> A::Output {
        self.armed = false;
        output
    }

    /// Whether the caller's wait is over.
    fn over(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }
}

/// What a parked waiter knows between its attempts.
#[derive(Default)]
struct Parked {
    /// How long the holder's lease has left, by the last refusal (the park's bound).
    held_for: u64,
    /// An attempt the replicas did not acknowledge was undone: it is retried within the
    /// caller's wait, and reported only once the wait is spent. Boxed: it is rare, and kept in
    /// a parked waiter's state.
    unreplicated: Option<Box<Error>>,
    /// Since when attempts fail with transient errors.
    failing_since: Option<Instant>,
}

impl Parked {
    /// Refused: the holder's lease has `pttl` milliseconds left.
    fn refused(&mut self, pttl: u64) {
        self.held_for = pttl;
        self.failing_since = None;
        self.unreplicated = None;
    }

    /// The attempt was undone for want of replicas: retried soon.
    fn unreplicated(&mut self, error: Error) {
        self.held_for = RETRY_AFTER_ERROR_MS;
        self.unreplicated = Some(Box::new(error));
    }

    /// An attempt failed with `error`: the error to leave with, or `None` to retry soon. A
    /// parked waiter rides out a restart or failover (transient errors) for up to `bound`.
    fn failed(&mut self, error: Error, bound: Duration, name: &str) -> Option<Error> {
        if !error.is_transient() {
            return Some(error);
        }
        let since = *self.failing_since.get_or_insert_with(Instant::now);
        if since.elapsed() > bound {
            return Some(error);
        }
        tracing::debug!(lock = %name, %error, "retrying after error");
        self.held_for = RETRY_AFTER_ERROR_MS;
        self.unreplicated = matches!(error, Error::NotReplicated { .. }).then(|| Box::new(error));
        None
    }

    /// The outcome of a wait that ends without the lock: nothing, or the refusal of the last
    /// attempt the replicas did not acknowledge.
    fn gave_up<T>(&mut self) -> Result<Option<T>> {
        self.unreplicated.take().map_or(Ok(None), |e| Err(*e))
    }

    /// How long to park: the holder's remaining lease, capped by the caller's deadline.
    fn park_time(&self, deadline: Option<Instant>) -> Duration {
        let lease_left = Duration::from_millis(self.held_for.max(1));
        match deadline {
            Some(d) => lease_left.min(d.saturating_duration_since(Instant::now())),
            None => lease_left,
        }
    }
}

impl<A: Attempts> Drop for Waiter<A> {
    fn drop(&mut self) {
        if self.armed {
            self.attempts.give_up();
        }
    }
}

/// The wait loop, recorded in metrics. Armed when called (dropped unpolled, it gives up like
/// any waiter), and its wait starts then: callers await it at once.
///
/// A parked waiter's task keeps this future for as long as it waits, so it is one state
/// machine (a loop future inside it would add its own state and its borrows of this one's),
/// and what it keeps is kept once: the wait's frame is computed here, not in the future
/// (which would keep its inputs beside it).
pub(crate) fn wait_for<A: Attempts>(
    attempts: A,
    wait: Option<Duration>,
) -> impl Future<Output = Result<Option<A::Output>>> + Send {
    let start = Instant::now();
    let mut waiter = Waiter {
        attempts,
        armed: true,
        start,
        // Instant + Duration::MAX would overflow: such a wait has no deadline.
        deadline: wait.and_then(|w| start.checked_add(w)),
    };
    async move {
        let client_metrics = waiter.attempts.client().holds.metrics();
        let attempts = &waiter.attempts;
        let mut recording =
            metrics::Acquire::start(client_metrics, attempts.kind(), attempts.name());
        let outcome = 'wait: {
            // Scoped: what only the setup needs is not kept in a parked waiter's state (a value
            // borrowed once is kept until its scope ends, moved out or not).
            let (mut parked, subscription, skip_recheck, mut generation) = {
                let (channel_name, group_key, wake) = waiter.attempts.channel();
                // The hub is borrowed where it is used, not kept.
                let hub = &waiter.attempts.client().hub;
                // If the channel is already subscribed and confirmed before the first attempt, and
                // no message came before this waiter's group was registered, any release after
                // that attempt reaches it: the re-check can be skipped.
                let early = hub.confirmed_channel(&channel_name);
                let generation = hub.generation();

                let mut parked = Parked::default();
                match waiter.attempts.attempt().await {
                    Ok(Try::Got(output)) => break 'wait Ok(Some(waiter.acquired(output))),
                    Ok(Try::Busy(pttl) | Try::TooFew(pttl)) => parked.refused(pttl),
                    Err(e @ Error::NotReplicated { .. }) if !waiter.over() => {
                        tracing::debug!(lock = %waiter.attempts.name(), error = %e, "not replicated; retrying");
                        parked.unreplicated(e);
                    }
                    Err(e) => break 'wait Err(e),
                }
                if waiter.over() {
                    break 'wait parked.gave_up();
                }
                waiter.attempts.parking();

                let hub = &waiter.attempts.client().hub;
                let subscription = hub.subscribe(&channel_name, &group_key, wake);
                recording.waiting(&group_key);
                let skip_recheck = early.is_some_and(|(ch, delivered)| {
                    Arc::ptr_eq(&ch, subscription.channel()) && ch.delivered() == delivered
                }) && hub.generation() == generation;
                (parked, subscription, skip_recheck, generation)
            };
            // In the key's baton queue from here, so a release can pass the lock straight to it.
            let ticket = waiter
                .attempts
                .baton()
                .map(|baton| subscription.batons().join(baton));
            if !skip_recheck {
                // Bounded like any wait: a subscriber that is down costs at most a poll.
                let bound = parked.park_time(waiter.deadline).min(UNCONFIRMED_POLL);
                tokio::select! {
                    _ = subscription.channel().confirmed() => {}
                    _ = tokio::time::sleep(bound) => {
                        tracing::debug!(lock = %waiter.attempts.name(), "subscription not confirmed in time");
                    }
                }
            }
            tracing::trace!(lock = %waiter.attempts.name(), pttl = parked.held_for, "waiting");

            let mut recheck = !skip_recheck;
            // The group's message count when this waiter last looked: any wake-up is news to
            // it until it has looked once.
            let mut seen = subscription.messages().wrapping_sub(1);
            let mut passed = false;
            loop {
                if recheck {
                    generation = waiter.attempts.client().hub.generation();
                    seen = subscription.messages();
                    // Passed the lock meanwhile: no attempt of its own (it would re-enter).
                    // A pass to it still in flight is waited out, but not past the caller's
                    // deadline: leaving then gets nothing, and the hold the pass wrote is
                    // released by the releaser (see `crate::engine::baton`).
                    let handed = match &ticket {
                        Some(ticket) => {
                            match until(waiter.deadline, ticket.start_attempt()).await {
                                Some(handed) => handed,
                                None => break 'wait parked.gave_up(),
                            }
                        }
                        None => None,
                    };
                    let tried = match handed.and_then(|guard| waiter.attempts.passed(guard)) {
                        Some(output) => Ok(Try::Got(output)),
                        None => waiter.attempts.attempt().await,
                    };
                    let woken = subscription.holds_wake_up();
                    if woken || passed {
                        recording.woken(matches!(tried, Ok(Try::Got(_))));
                    }
                    match &tried {
                        // Used: the lock is its, or taken by a holder whose release will wake.
                        Ok(Try::Got(_) | Try::Busy(_)) => subscription.used_wake_up(),
                        // Woken for permits too few for it (a smaller request may use them), or
                        // the attempt failed: the next waiter may fare better.
                        Ok(Try::TooFew(_)) | Err(_) => subscription.pass_on(),
                    }
                    match tried {
                        Ok(Try::Got(output)) => {
                            if woken {
                                tracing::debug!(lock = %waiter.attempts.name(), waited = ?waiter.start.elapsed(), "acquired after wake-up");
                            }
                            if waiter.attempts.wakes_group() {
                                subscription.wake_group();
                            }
                            break 'wait Ok(Some(waiter.acquired(output)));
                        }
                        Ok(Try::Busy(pttl) | Try::TooFew(pttl)) => parked.refused(pttl),
                        Err(e) => {
                            let bound = waiter.attempts.client().holds.watchdog_lease();
                            if let Some(e) = parked.failed(e, bound, waiter.attempts.name()) {
                                break 'wait Err(e);
                            }
                        }
                    }
                }
                if let Some(why) = subscription.channel().refused() {
                    break 'wait Err(Error::Auth(format!(
                        "subscribing to the lock's channel: {why}"
                    )));
                }
                recheck = true;
                passed = false;
                if waiter.over() {
                    break 'wait parked.gave_up();
                }
                if waiter.attempts.client().conn.is_closed() {
                    // Shutting down (its wake-up may have come before this turn of the loop).
                    break 'wait Err(Error::ShutDown);
                }
                let mut bound = parked.park_time(waiter.deadline);
                if !subscription.channel().is_confirmed() {
                    bound = bound.min(UNCONFIRMED_POLL);
                } else if let Some(ticket) = &ticket {
                    // Claimable only once its subscription is confirmed: until then the pass
                    // script could not tell this client's subscriber from another client's.
                    ticket.park();
                }
                let hub = &waiter.attempts.client().hub;
                tokio::select! {
                    biased;
                    _ = baton_acted(&ticket) => passed = true,
                    _ = subscription.notified(seen) => subscription.took_wake_up(),
                    _ = hub.regenerated(generation) => {}
                    _ = tokio::time::sleep(bound) => {}
                }
                if waiter.attempts.client().conn.is_closed() {
                    break 'wait Err(Error::ShutDown);
                }
                if subscription.holds_wake_up() && waiter.over() {
                    // Leaving: the subscription passes the wake-up on as it goes.
                    break 'wait parked.gave_up();
                }
            }
        };
        recording.finish(&outcome);
        outcome
    }
}

/// `future`'s output, or `None` if `deadline` passes first (an output ready by then is
/// taken, even past it).
async fn until<T>(deadline: Option<Instant>, future: impl Future<Output = T>) -> Option<T> {
    match deadline {
        Some(deadline) => tokio::time::timeout_at(deadline, future).await.ok(),
        None => Some(future.await),
    }
}

/// Resolves when a releaser handed the waiter the lock; never without a ticket.
fn baton_acted<'t>(ticket: &'t Option<Ticket<'_>>) -> impl Future<Output = ()> + Send + 't {
    match ticket {
        Some(ticket) => Either::Left(ticket.acted()),
        None => Either::Right(std::future::pending()),
    }
}
