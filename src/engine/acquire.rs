//! Acquiring a lock of any kind: the owner an acquire is made for (the enclosing hold's, an
//! explicit one, or a new one), and its attempts — the kind's acquire script under the owner's
//! turn — driven by the shared wait loop ([`crate::engine::wait`]).
//!
//! A round trip that changes a count is never abandoned half-way: when its caller is dropped,
//! or stops waiting after the command timeout, it is finished in a spawned task ([`Finish`]).
//! A hold taken by such a round trip is released at once; one whose outcome is unknown is
//! settled ([`crate::engine::repair`]).

use std::any::Any;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::Either;
use futures::TryFutureExt;
use tokio::time::Instant;

use crate::conn::Failed;
use crate::engine::baton::{Baton, InFlight, LocalTurn};
use crate::engine::call::{bounded, Finish};
use crate::engine::client_inner::ClientInner;
use crate::engine::guard::Guard;
use crate::engine::holds::{Lease, Waiting};
use crate::engine::hub::Wake;
use crate::engine::kind::{Kind, Reply};
use crate::engine::repair::{settle, undo_acquire};
use crate::engine::wait::{wait_for, Attempts, Try, HELD_HERE_RECHECK_MS};
use crate::{Error, Result};

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
        let mut in_flight = None;
        if K::PASSES && self.baton().is_some() {
            let (channel, _) = self.kind.channel(&field);
            let held_recheck = Duration::from_millis(HELD_HERE_RECHECK_MS);
            let hub = &named.client.hub;
            match hub.local_turn(
                &channel,
                &named.key,
                &field,
                self.task,
                held_recheck,
                self.fresh,
            ) {
                LocalTurn::Refused(park) => {
                    // A hold of this client has the lock, or another new owner's acquire of
                    // this client is in Redis now (Redis would refuse, or that one goes first:
                    // parked briefly, so a hold lost unnoticed is asked about in Redis soon),
                    // or the lock is left to another client's waiter for now.
                    let refused = Ok(Try::Busy(park.as_millis().max(1) as u64));
                    return Either::Left(std::future::ready(refused));
                }
                LocalTurn::Ask(marker) => in_flight = marker,
            }
        }
        let round_trip = attempt(self.kind.clone(), field, self.lease, self.waits, in_flight);
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

/// Whether Redis still has `field`'s hold of `key` (the kind's renewal script with lease 0, a
/// read); `None` if it could not tell.
async fn still_held(
    conn: &crate::conn::Conn,
    ops: &Arc<dyn crate::engine::holds::HoldOps>,
    key: &str,
    field: &str,
) -> Option<bool> {
    let args = vec![fred::types::Value::from(field), fred::types::Value::from(0)];
    match conn.eval::<Vec<i64>>(ops.renewal(), &[key], args).await {
        Ok(held) => held.first().map(|&held| held == 1),
        Err(e) => {
            tracing::debug!(error = %e, "could not check a hold");
            None
        }
    }
}

/// One acquire round trip under the owner's turn. `_in_flight`, this client's marker of a new
/// owner's acquire in Redis, if it is one, lives as long as the round trip, finished in the
/// background or not.
async fn attempt<K: Kind>(
    kind: K,
    field: Arc<str>,
    lease: Lease,
    waits: bool,
    _in_flight: Option<InFlight>,
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
                    // timeout (invariant 15, docs/DESIGN.md). The undo keeps the owner's turn, so
                    // the caller's next attempt comes after it.
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
                // wait (invariant 18, docs/DESIGN.md). Redis started its lease when the script ran,
                // so it would otherwise keep the lock from everyone until then.
                tracing::debug!(lock = %named.name(), waited = ?sent_at.elapsed(), "acquired after the lease's end by the local clock; releasing it");
                turn.note_count(count);
                undo_acquire(conn.clone(), turn, ops, field, named.name().to_owned()).await;
                return Ok(Try::Busy(0));
            }
            // Where this client's waiters of the key queue, if any do or did lately: asked
            // whether an unlock message came meanwhile, and told of the hold.
            let channel = K::PASSES.then(|| kind.channel(&field).0);
            let batons = || {
                let channel = channel.as_deref()?;
                client.hub.batons(channel, &named.key)
            };
            let mut queue = batons();
            let mut confirmed = None;
            if count <= 1
                && queue
                    .as_ref()
                    .is_some_and(|queue| queue.heard_since(sent_at))
            {
                // An unlock message came while this acquire was in flight, when no hold of
                // it was registered to doubt: a force-unlock may have ended it already.
                // Redis is asked before the guard is given (invariants 8 and 16,
                // docs/DESIGN.md); a hold found gone is tried for again.
                let asked_at = Instant::now();
                match still_held(conn, &ops, &named.key, &field).await {
                    Some(false) => {
                        tracing::debug!(lock = %named.name(), "acquired, but gone by the reply's time (an unlock message came meanwhile); trying again");
                        turn.note_count(count);
                        return Ok(Try::Busy(0));
                    }
                    Some(true) => confirmed = Some(asked_at),
                    // Not learnt: registered, and doubted as it is (see `Queue::held_here`).
                    None => {}
                }
                // The queue may have gone or come during the read.
                queue = batons();
            }
            let registered = turn.acquired(count, lease, sent_at);
            if let Some(at) = confirmed {
                registered.entry.checked(registered.generation, at);
            }
            if let Some(queue) = queue {
                // Noted so that this client's other owners queue behind it without asking
                // Redis (and doubted if an unlock message came since Redis confirmed it).
                queue.held_here(&registered.entry, registered.generation, &client.holds);
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
