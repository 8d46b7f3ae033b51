//! The wait loop every lock kind shares, and the round trips that can outlive their caller.
//!
//! A waiter tries once; if refused, it registers on its channel with the client's hub,
//! waits for the subscription to be confirmed, tries again, and then parks until a message
//! wakes it, the hub asks everyone to re-check (reconnect, lag), or the holder's remaining
//! lease runs out — whichever comes first, capped by the caller's deadline. So a lost
//! message costs at most one lease.
//!
//! A round trip that changes a count (acquire, release) is never abandoned half-way: when
//! its caller is dropped, or stops waiting after the command timeout, it is finished in a
//! spawned task ([`Finish`]). A hold taken by such a round trip is released at once; a round
//! trip whose connection broke with it in flight — so nobody knows whether it ran — is
//! settled ([`settle`]): the owner's count is trimmed back to what the client accounts for.

use std::any::Any;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use fred::types::Value;
use futures::future::Either;
use futures::TryFutureExt;
use tokio::time::Instant;

use crate::baton::{Baton, Ticket};
use crate::conn::{Conn, Failed};
use crate::holds::{HoldOps, Lease, Loss, Turn, Waiting};
use crate::hub::Wake;
use crate::kind::{Kind, Reply};
use crate::metrics;
use crate::shared::ClientInner;
use crate::{Error, Result};
use guard::Guard;

mod call;
pub(crate) mod free;
pub(crate) mod guard;

pub(crate) use call::{bounded, Finish, CALL_BOUND};

/// How long a parked waiter pauses before retrying after a connection error or timeout.
const RETRY_AFTER_ERROR_MS: u64 = 200;

/// How long a waiter refused without a round trip (its client holds the lock through a hold
/// handed on in memory, see [`crate::baton`]) parks at most before it looks again.
const HELD_HERE_RECHECK_MS: u64 = 100;

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
    /// [`crate::baton`]).
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
    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl<A: Attempts> Drop for Waiter<A> {
    fn drop(&mut self) {
        if self.armed {
            self.attempts.give_up();
        }
    }
}

/// Acquires a lock of kind `K`: `wait` None waits forever; `Some(ZERO)` tries once.
///
/// Set up on the first poll (the owner is the task that polls), and the setup's state is then
/// replaced by the wait's, not kept beside it: a parked waiter's task holds this future for
/// as long as it waits.
pub(crate) fn acquire<K: Kind>(
    kind: &K,
    wait: Option<Duration>,
    lease: Lease,
) -> impl Future<Output = Result<Option<Guard<K>>>> + Send + '_ {
    futures::future::lazy(move |_| start(kind, wait, lease)).try_flatten()
}

/// The setup of [`acquire`]: the wait loop to await.
fn start<K: Kind>(
    kind: &K,
    wait: Option<Duration>,
    lease: Lease,
) -> Result<impl Future<Output = Result<Option<Guard<K>>>> + Send + 'static> {
    let named = kind.named();
    named.check()?;
    // Without an explicit owner: the enclosing hold's owner (re-entry), else a new one.
    let (task, fresh) = match kind.explicit_owner() {
        Some(_) => (0, false),
        None => match named.enclosing() {
            Some(number) => (number, false),
            None => (named.client.owners.fresh(), true),
        },
    };
    let waits = wait != Some(Duration::ZERO);
    let mut attempts = LockAttempts {
        kind: kind.waiting(wait),
        task,
        fresh,
        field: None,
        lease,
        waits,
        waiting: Some(named.client.holds.waiting()),
    };
    let field = attempts.make_field();
    let span = tracing::trace_span!("acquire", lock = %named.name(), owner = %field);
    attempts.field = Some(field);
    Ok(traced(wait_for(attempts, wait), span))
}

/// `future` inside `span` if tracing records the span. Boxed then: a parked waiter keeps its
/// acquire future for as long as it waits, and a span would take 40 bytes of it even when
/// nothing records it (tracing that records spans costs more than a box anyway).
pub(crate) fn traced<F: Future + Send>(
    future: F,
    span: tracing::Span,
) -> impl Future<Output = F::Output> + Send {
    if span.is_disabled() {
        Either::Left(future)
    } else {
        Either::Right(Box::pin(tracing::Instrument::instrument(future, span)))
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
            let (mut held_for, mut unreplicated, subscription, skip_recheck, mut generation) = {
                let (channel_name, group_key, wake) = waiter.attempts.channel();
                // The hub is borrowed where it is used, not kept.
                let hub = &waiter.attempts.client().hub;
                // If the channel is already subscribed and confirmed before the first attempt, and
                // no message came before this waiter's group was registered, any release after
                // that attempt reaches it: the re-check can be skipped.
                let early = hub.confirmed_channel(&channel_name);
                let generation = hub.generation();

                // An attempt the replicas did not acknowledge was undone: it is retried within
                // the caller's wait, and reported only once the wait is spent. Boxed: it is rare,
                // and kept in a parked waiter's state.
                let mut unreplicated: Option<Box<Error>> = None;
                let held_for = match waiter.attempts.attempt().await {
                    Ok(Try::Got(output)) => {
                        waiter.disarm();
                        break 'wait Ok(Some(output));
                    }
                    Ok(Try::Busy(pttl) | Try::TooFew(pttl)) => pttl,
                    Err(e @ Error::NotReplicated { .. }) if !past(waiter.deadline) => {
                        tracing::debug!(lock = %waiter.attempts.name(), error = %e, "not replicated; retrying");
                        unreplicated = Some(Box::new(e));
                        RETRY_AFTER_ERROR_MS
                    }
                    Err(e) => break 'wait Err(e),
                };
                if past(waiter.deadline) {
                    break 'wait unreplicated.map_or(Ok(None), |e| Err(*e));
                }
                waiter.attempts.parking();

                let hub = &waiter.attempts.client().hub;
                let subscription = hub.subscribe(&channel_name, &group_key, wake);
                recording.waiting(&group_key);
                let skip_recheck = early.is_some_and(|(ch, delivered)| {
                    Arc::ptr_eq(&ch, subscription.channel()) && ch.delivered() == delivered
                }) && hub.generation() == generation;
                (
                    held_for,
                    unreplicated,
                    subscription,
                    skip_recheck,
                    generation,
                )
            };
            // In the key's baton queue from here, so a release can pass the lock straight to it.
            let ticket = waiter
                .attempts
                .baton()
                .map(|baton| subscription.batons().join(baton));
            if !skip_recheck {
                // Bounded like any wait: a subscriber that is down costs at most a poll.
                let bound = park_time(held_for, waiter.deadline).min(UNCONFIRMED_POLL);
                tokio::select! {
                    _ = subscription.channel().confirmed() => {}
                    _ = tokio::time::sleep(bound) => {
                        tracing::debug!(lock = %waiter.attempts.name(), "subscription not confirmed in time");
                    }
                }
            }
            tracing::trace!(lock = %waiter.attempts.name(), pttl = held_for, "waiting");

            let mut recheck = !skip_recheck;
            // The group's message count when this waiter last looked: any wake-up is news to
            // it until it has looked once.
            let mut seen = subscription.messages().wrapping_sub(1);
            let mut passed = false;
            let mut failing_since: Option<Instant> = None;
            loop {
                if recheck {
                    generation = waiter.attempts.client().hub.generation();
                    seen = subscription.messages();
                    // Passed the lock meanwhile: no attempt of its own (it would re-enter).
                    // A pass to it still in flight is waited out, but not past the caller's
                    // deadline: leaving then gets nothing, and the hold the pass wrote is
                    // released by the releaser (see `crate::baton`).
                    let handed = match &ticket {
                        Some(ticket) => {
                            match until(waiter.deadline, ticket.start_attempt()).await {
                                Some(handed) => handed,
                                None => break 'wait unreplicated.map_or(Ok(None), |e| Err(*e)),
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
                            waiter.disarm();
                            break 'wait Ok(Some(output));
                        }
                        Ok(Try::Busy(pttl) | Try::TooFew(pttl)) => {
                            held_for = pttl;
                            failing_since = None;
                            unreplicated = None;
                        }
                        Err(e) if e.is_transient() => {
                            // Parked waiters ride out a restart or failover, within a bound.
                            let since = *failing_since.get_or_insert_with(Instant::now);
                            if since.elapsed() > waiter.attempts.client().holds.watchdog_lease() {
                                break 'wait Err(e);
                            }
                            tracing::debug!(lock = %waiter.attempts.name(), error = %e, "retrying after error");
                            held_for = RETRY_AFTER_ERROR_MS;
                            unreplicated =
                                matches!(e, Error::NotReplicated { .. }).then(|| Box::new(e));
                        }
                        Err(e) => break 'wait Err(e),
                    }
                }
                if let Some(why) = subscription.channel().refused() {
                    break 'wait Err(Error::Auth(format!(
                        "subscribing to the lock's channel: {why}"
                    )));
                }
                recheck = true;
                passed = false;
                if past(waiter.deadline) {
                    break 'wait unreplicated.map_or(Ok(None), |e| Err(*e));
                }
                if waiter.attempts.client().conn.is_closed() {
                    // Shutting down (its wake-up may have come before this turn of the loop).
                    break 'wait Err(Error::ShutDown);
                }
                let mut bound = park_time(held_for, waiter.deadline);
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
                if subscription.holds_wake_up() && past(waiter.deadline) {
                    // Leaving: the subscription passes the wake-up on as it goes.
                    break 'wait unreplicated.map_or(Ok(None), |e| Err(*e));
                }
            }
        };
        recording.finish(&outcome);
        outcome
    }
}

/// Whether the caller's wait is over.
fn past(deadline: Option<Instant>) -> bool {
    deadline.is_some_and(|d| Instant::now() >= d)
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

/// How long a waiter parks: the holder's remaining lease, capped by the caller's deadline.
fn park_time(held_for_ms: u64, deadline: Option<Instant>) -> Duration {
    let lease_left = Duration::from_millis(held_for_ms.max(1));
    match deadline {
        Some(d) => lease_left.min(d.saturating_duration_since(Instant::now())),
        None => lease_left,
    }
}

/// The attempts of a lock kind: the kind's acquire script, under the owner's turn.
struct LockAttempts<K: Kind> {
    /// Its explicit owner, if any, is theirs.
    kind: K,
    /// Without an explicit owner, the owner number: the enclosing hold's, or a new one.
    task: u64,
    /// The owner is a new one (no explicit owner, no enclosing hold).
    fresh: bool,
    /// The owner's hash field. Kept until the first attempt is refused; a waiter then makes
    /// it for each attempt instead. A field made on a waiter's first poll is the one
    /// allocation that would outlive the burst of round trips many waiters arriving at once
    /// have in flight: interleaved with their buffers, one small string per waiter would keep
    /// the allocator from returning those pages once the waiters park.
    field: Option<Arc<str>>,
    lease: Lease,
    waits: bool,
    /// Counted while it waits, and while its give-up runs.
    waiting: Option<Waiting>,
}

impl<K: Kind> LockAttempts<K> {
    fn make_field(&self) -> Arc<str> {
        let owner = match self.kind.explicit_owner() {
            Some(owner) => owner.clone(),
            None => self.kind.named().task_field(self.task),
        };
        self.kind.field(owner)
    }

    fn field(&self) -> Arc<str> {
        match &self.field {
            Some(field) => field.clone(),
            None => self.make_field(),
        }
    }
}

impl<K: Kind> Attempts for LockAttempts<K> {
    type Output = Guard<K>;

    fn client(&self) -> &ClientInner {
        &self.kind.named().client
    }

    fn name(&self) -> &str {
        self.kind.named().name()
    }

    fn kind(&self) -> &'static str {
        K::KIND
    }

    fn channel(&self) -> (Arc<str>, Arc<str>, Wake) {
        let (channel, wake) = self.kind.channel(&self.field());
        (channel, self.kind.named().key.clone(), wake)
    }

    fn attempt(&mut self) -> impl Future<Output = Result<Try<Guard<K>>>> + Send {
        let named = self.kind.named();
        let field = self.field();
        if K::PASSES && self.baton().is_some() {
            let (channel, _) = self.kind.channel(&field);
            let held_recheck = Duration::from_millis(HELD_HERE_RECHECK_MS);
            let refusal =
                named
                    .client
                    .hub
                    .refusal(&channel, &named.key, &field, held_recheck, self.fresh);
            if let Some(park) = refusal {
                // A hold of this client handed on in memory has the lock (Redis would refuse:
                // parked briefly, so a hold lost unnoticed is asked about in Redis soon), or
                // the lock is left to another client's waiter for now.
                let refused = Ok(Try::Busy(park.as_millis().max(1) as u64));
                return Either::Left(std::future::ready(refused));
            }
        }
        let round_trip = attempt(self.kind.clone(), field, self.lease, self.waits);
        Either::Right(Finish::new(round_trip, &named.client.conn))
    }

    fn parking(&mut self) {
        self.field = None;
        let named = self.kind.named();
        if self.fresh && named.client.holds.held_here(&named.key) {
            tracing::warn!(
                lock = %named.name(),
                "waiting for a lock that this task already holds outside a hold's scope: \
                 every acquisition outside one is a new owner, so this waits for that hold to \
                 be released, which may never happen if it is this code's own; to re-enter, \
                 acquire inside `guard.run(..)` / `lock.run(..)` or with `guard.reenter()`"
            );
        }
    }

    fn baton(&self) -> Option<Baton> {
        let passes = K::PASSES
            && self.kind.explicit_owner().is_none()
            && self.kind.named().client.config.baton_passes > 0;
        passes.then_some(Baton {
            task: self.task,
            lease: self.lease,
        })
    }

    fn passed(&mut self, guard: Box<dyn Any + Send>) -> Option<Guard<K>> {
        let guard = guard.downcast::<Guard<K>>().ok()?;
        Some(guard.adopt(self.kind.clone()))
    }

    fn give_up(&mut self) {
        let named = self.kind.named();
        let conn = named.client.conn.clone();
        let field = self.field();
        if let Some(call) = self.kind.give_up(&conn, &field) {
            let name = named.name().to_owned();
            let holds = named.client.holds.clone();
            let (key, ops) = (named.key.clone(), self.kind.ops());
            let waiting = self.waiting.take();
            let runtime = conn.runtime().clone();
            runtime.spawn(async move {
                // Under the owner's turn: an attempt abandoned in flight (finished in the
                // background) runs first, so what it does cannot outlive the undo.
                let far = Instant::now() + conn.command_timeout() * 4;
                let turn = holds.turn(&key, &field, &ops, far).await;
                if let Err(e) = bounded(call, &conn).await {
                    tracing::warn!(lock = %name, error = %e, "could not undo a wait that gave up");
                }
                drop(turn);
                drop(waiting);
            });
        }
    }
}

/// One acquire round trip under the owner's turn.
async fn attempt<K: Kind>(
    kind: K,
    field: Arc<str>,
    lease: Lease,
    waits: bool,
) -> Result<Try<Guard<K>>> {
    let named = kind.named();
    let client = &named.client;
    let conn = &client.conn;
    let deadline = Instant::now() + conn.command_timeout();
    let ops = kind.ops();
    let Some(turn) = client.holds.turn(&named.key, &field, &ops, deadline).await else {
        return Err(Error::Timeout(conn.command_timeout()));
    };
    let lease_ms = lease.millis(client.holds.watchdog_lease());
    let sent_at = Instant::now();
    let reply = match bounded(kind.acquire(conn, &field, lease_ms, waits), conn).await {
        Ok(reply) => reply,
        Err(Failed::Unreplicated { reply, .. })
            if matches!(
                kind.decode(reply.clone()),
                Ok(Reply::Held(_) | Reply::TooFew(_))
            ) =>
        {
            // Refused: nothing was taken, whatever the replicas saw.
            reply
        }
        Err(failed) => {
            let error = failed.to_error(conn, named.name());
            match failed {
                Failed::MaybeRan(_) => settle(conn.clone(), turn),
                Failed::Unreplicated { reply, .. } => {
                    // Taken on the primary only: it does not count. Refused at once and undone
                    // in the background (the owner's count goes back; a fresh hold ends any
                    // stale one): on this connection the undo would queue behind the next
                    // group's `WAIT`, and the caller would pay a second acknowledgement
                    // timeout (invariant 15). The undo keeps the owner's turn, so the
                    // caller's next attempt comes after it.
                    if let Ok(Reply::Acquired { count, .. }) = kind.decode(reply) {
                        turn.note_count(count);
                    }
                    let undo =
                        undo_acquire(conn.clone(), turn, ops, field, named.name().to_owned());
                    conn.runtime().spawn(undo);
                }
                Failed::NotRun(_) => {}
            }
            return Err(error);
        }
    };
    let decoded = match kind.decode(reply) {
        // A try cannot deadlock: it only fails to get the lock.
        Err(Error::WouldDeadlock { .. }) if !waits => return Ok(Try::Busy(0)),
        decoded => decoded?,
    };
    match decoded {
        Reply::Held(pttl) => Ok(Try::Busy(pttl)),
        Reply::TooFew(pttl) => Ok(Try::TooFew(pttl)),
        Reply::Acquired { count, extra } => {
            if conn.is_closed() {
                // Shut down meanwhile: shutdown waits for this turn, so release it here.
                turn.note_count(count);
                undo_acquire(conn.clone(), turn, ops, field, named.name().to_owned()).await;
                return Err(Error::ShutDown);
            }
            if turn.ended_before_reply(count, lease, sent_at) {
                // Lost before it arrived: released, and tried again within the caller's
                // wait (invariant 18). Redis started its lease when the script ran, so it
                // would otherwise keep the lock from everyone until then.
                tracing::debug!(lock = %named.name(), waited = ?sent_at.elapsed(), "acquired after the lease's end by the local clock; releasing it");
                turn.note_count(count);
                undo_acquire(conn.clone(), turn, ops, field, named.name().to_owned()).await;
                return Ok(Try::Busy(0));
            }
            let registered = turn.acquired(count, lease, sent_at);
            if K::PASSES {
                let (channel, _) = kind.channel(&field);
                let (entry, generation) = (&registered.entry, registered.generation);
                client
                    .hub
                    .held_here(&channel, &named.key, entry, generation);
            }
            if count > i64::from(turn.accounted()) && turn.entry().is_own() {
                // Redis counts holds of this owner that no guard accounts for: a hold whose
                // guard was lost while its key lived on (a renewal the primary applied but no
                // replica acknowledged, say). Re-entering would keep them alive for ever,
                // locking everyone else out: trim them, behind this acquire.
                tracing::warn!(lock = %named.name(), count, accounted = turn.accounted(), "the owner held more than its guards account for; trimming");
                settle(conn.clone(), turn);
            } else {
                drop(turn);
            }
            tracing::trace!(lock = %named.name(), count, "acquired");
            Ok(Try::Got(Guard::new(
                kind, field, registered, lease, sent_at, extra,
            )))
        }
    }
}

/// Logs a trim's outcome; a count below what the client's guards rely on means their hold
/// is gone.
fn settled(turn: &Turn, keep: u32, reply: &Value, why: Trim) {
    let entry = turn.entry();
    let remaining = reply.as_i64().unwrap_or(-1);
    tracing::info!(key = %entry.key, owner = %entry.field, keep, remaining, why = why.why(), "trimmed the owner's count to its guards");
    if keep > 0 && remaining < i64::from(keep) {
        turn.lose(Loss::CountFell);
    }
}

/// Releases the one hold an acquire just took under `turn` (not registered: the caller gets
/// no guard). A release whose outcome is unknown is settled.
pub(crate) async fn undo_acquire(
    conn: Arc<Conn>,
    turn: Turn,
    ops: Arc<dyn HoldOps>,
    field: Arc<str>,
    name: String,
) {
    let release = crate::conn::unsynced(|| ops.release(&conn, &field, 1, 0));
    match bounded(release, &conn).await {
        // Unsynced: no replica is asked, so none can be found missing.
        Ok(_) | Err(Failed::Unreplicated { .. }) => {}
        Err(Failed::MaybeRan(_)) => settle(conn, turn),
        Err(Failed::NotRun(e)) => {
            tracing::warn!(lock = %name, error = %e, "could not release an acquire that did not count; it ends with its lease");
        }
    }
}

/// How long a settle keeps trying before the lease is left to end it.
const SETTLE_RETRY: Duration = Duration::from_millis(200);

/// Why an owner's count is trimmed.
#[derive(Clone, Copy)]
enum Trim {
    /// A counted call's outcome is unknown.
    Unknown,
    /// A lost hold is released while other holds keep its key alive.
    Lost,
}

impl Trim {
    fn why(self) -> &'static str {
        match self {
            Trim::Unknown => "a counted call's outcome is unknown",
            Trim::Lost => "a lost hold's key outlived its lease",
        }
    }
}

/// Settles an owner whose count may have been changed by a call of unknown outcome: trims
/// its count in Redis back to the holds this client accounts for, under the turn (so no
/// other call of the client is in flight to be trimmed by mistake). Only for owners whose
/// field only this client writes; another client sharing an explicit owner could be holding
/// counts this client does not know about.
pub(crate) fn settle(conn: Arc<Conn>, turn: Turn) {
    trim(conn, turn, Trim::Unknown);
}

/// Removes what is left in Redis of a lost hold (its lease ended by the local clock, say)
/// whose key other holds keep alive ([`HoldOps::shares_expiry`]): the same trim as a
/// settle's, so the holds this client still accounts for on that owner — taken anew after
/// the loss — stay, and only the lost ones go, however many guards shared them.
pub(crate) fn trim_lost(conn: Arc<Conn>, turn: Turn) {
    trim(conn, turn, Trim::Lost);
}

/// Trims the owner's count back to the holds this client accounts for, under `turn`, in the
/// background (see [`settle`]).
fn trim(conn: Arc<Conn>, turn: Turn, why: Trim) {
    let entry = turn.entry().clone();
    if !entry.is_own() {
        tracing::warn!(key = %entry.key, owner = %entry.field, why = why.why(), "the owner is shared with another client, so its count is not trimmed: a hold left behind ends with its lease");
        return;
    }
    let runtime = conn.runtime().clone();
    runtime.spawn(async move {
        let give_up_at = Instant::now() + conn.command_timeout() * 4;
        loop {
            let keep = turn.accounted();
            let trim = entry.ops.release(&conn, &entry.field, u32::MAX, keep);
            match bounded(trim, &conn).await {
                Ok(reply) => {
                    settled(&turn, keep, &reply, why);
                    break;
                }
                // Idempotent: sent again until replicas acknowledge it (a WAIT covers every
                // earlier write of its connection), or the time is up.
                Err(Failed::Unreplicated { reply, .. })
                    if Instant::now() >= give_up_at || conn.is_closed() =>
                {
                    settled(&turn, keep, &reply, why);
                    tracing::warn!(key = %entry.key, "trimmed, but no replica acknowledged it");
                    break;
                }
                Err(e) if Instant::now() < give_up_at && !conn.is_closed() => {
                    tracing::debug!(key = %entry.key, error = %e, "trim failed; retrying");
                    tokio::time::sleep(SETTLE_RETRY).await;
                }
                Err(e) => {
                    tracing::warn!(key = %entry.key, owner = %entry.field, error = %e, why = why.why(), "could not trim the owner's count; a hold left behind ends with its lease");
                    break;
                }
            }
        }
        drop(turn);
    });
}
