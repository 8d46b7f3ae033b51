//! Releasing a hold: the owner's last guard may hand the lock to a parked waiter of this
//! client — in memory, or with the pass script — and otherwise the release script runs; one
//! bounded call either way, and its unknown or failed outcomes repaired
//! ([`crate::engine::repair`]). See [`crate::engine::baton`] for when a hand-off is allowed.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::time::Instant;

use crate::conn::{Conn, Failed, Replicas};
use crate::engine::baton::{Claim, LOCAL_RUN_FOR};
use crate::engine::call::bounded;
use crate::engine::guard::{Guard, Hold};
use crate::engine::holds::{HandOn, HoldOps, Lease, Loss, Turn};
use crate::engine::kind::Kind;
use crate::engine::repair::{retry_release, settle, trim_lost, undo_acquire};
use crate::{Error, Result};

/// Releases one hold under the owner's turn, in three steps: choose the route (the owner's
/// last hold may go to a parked waiter of this client, in memory or with the pass script; a
/// lost hold sends nothing), make its one bounded call, and read the reply, repairing what
/// an unknown or failed outcome may have left behind (see [`crate::engine::repair`]).
pub(crate) async fn release<K: Kind>(kind: K, hold: Hold, extra: K::Extra) -> Result<()> {
    let named = kind.named();
    let conn = &named.client.conn;
    let ops = kind.ops();
    let far = Instant::now() + conn.command_timeout() * 4;
    let Some(turn) = named
        .client
        .holds
        .turn(&named.key, &hold.field, &ops, far)
        .await
    else {
        return Err(Error::Timeout(conn.command_timeout()));
    };
    let (passing, call) = match route(&kind, &hold, &turn, extra).await {
        Route::HandedInMemory => {
            // No yield, unlike after a pass: a releaser coming straight back for the lock is
            // refused in memory, sends nothing that could push the woken holder out of this
            // worker's next slot, and must queue before that holder releases — or the run
            // ends at its first hand-off, two tasks taking turns paying a release and an
            // acquire in Redis per turn.
            drop(turn);
            return Ok(());
        }
        Route::Lost => return Err(lost(&kind, &ops, turn)),
        Route::Pass(passing, call) => (Some(passing), call),
        Route::Release => (None, ops.release(conn, &hold.field, 1, 0, Replicas::Await)),
    };
    let sent_at = Instant::now();
    let mut outcome = bounded(call, conn).await;
    if let Some(passing) = passing {
        match passing.finish(&kind, &ops, &outcome, sent_at).await {
            AfterPass::Done => return Ok(()),
            AfterPass::Released => {}
            AfterPass::Refused => {
                outcome = bounded(ops.release(conn, &hold.field, 1, 0, Replicas::Await), conn).await
            }
        }
    }
    released(&kind, &hold, turn, ops, outcome)
}

/// Where a release goes.
enum Route<K: Kind> {
    /// Handed to a parked waiter of this client in memory: nothing is sent.
    HandedInMemory,
    /// The hold is lost: nothing may be sent (the owner may hold the lock anew).
    Lost,
    /// The pass script, which gives the lock to the claimed waiter (or releases it, when
    /// another client waits).
    Pass(Passing<K>, crate::conn::Call),
    /// The release script.
    Release,
}

/// Chooses how `hold` is released under `turn`, and forgets its guard before anything is
/// sent, so no renewal can outlive the release.
async fn route<K: Kind>(kind: &K, hold: &Hold, turn: &Turn, extra: K::Extra) -> Route<K> {
    let mut claim = None;
    if turn.last_guard(hold.generation) {
        // The hand-off latency of a waiter of this client starts here.
        let named = kind.named();
        named.client.holds.metrics().released(&named.key);
        // The run is the hold's, whichever of its guards (re-entry adds some) goes last.
        if let Some(waiting) = claim_waiter(kind, hold, turn.passes()) {
            match hand_on(kind, hold, turn, waiting, extra) {
                Handing::Handed => return Route::HandedInMemory,
                Handing::Ordinary => {}
                Handing::Script(waiting) => claim = Some(waiting),
            }
        }
    }
    let Some(guards_left) = turn.forget_guard(hold.generation, hold.lease) else {
        if let Some(claim) = claim {
            claim.withdraw();
        }
        return Route::Lost;
    };
    match claim {
        Some(claim) if guards_left == 0 => {
            match Passing::claim(kind, hold, turn.passes(), claim).await {
                Some((passing, call)) => Route::Pass(passing, call),
                None => Route::Release,
            }
        }
        Some(claim) => {
            claim.withdraw();
            Route::Release
        }
        None => Route::Release,
    }
}

/// The error for a release of a lost hold, which sent nothing. Where other holds keep the
/// key alive past this hold's lease, what is left of the lost hold is trimmed instead (the
/// holds taken anew stay), or it would lock others out.
fn lost<K: Kind>(kind: &K, ops: &Arc<dyn HoldOps>, turn: Turn) -> Error {
    let named = kind.named();
    let conn = &named.client.conn;
    if conn.is_closed() {
        return Error::ShutDown;
    }
    if ops.shares_expiry() {
        trim_lost(conn.clone(), turn);
    }
    Error::NotHeld {
        name: named.name().to_owned(),
    }
}

/// What the release script's reply says, and the repairs its failures call for.
fn released<K: Kind>(
    kind: &K,
    hold: &Hold,
    turn: Turn,
    ops: Arc<dyn HoldOps>,
    outcome: std::result::Result<fred::types::Value, Failed>,
) -> Result<()> {
    let named = kind.named();
    let conn = &named.client.conn;
    match outcome {
        Ok(reply) => match reply.as_i64() {
            Some(-1) => {
                hold.entry.mark_lost(hold.generation, Loss::UnlockFoundGone);
                Err(Error::NotHeld {
                    name: named.name().to_owned(),
                })
            }
            Some(remaining) => {
                tracing::trace!(lock = %named.name(), remaining, "released");
                Ok(())
            }
            None => Err(Error::Redis(format!(
                "unexpected release reply for {:?}",
                named.name()
            ))),
        },
        Err(Failed::MaybeRan(e)) => {
            settle(conn.clone(), turn);
            Err(named.error(&e))
        }
        Err(failed @ Failed::Unreplicated { .. }) => {
            // Released on the primary; make the release reach the replicas too (the settle's
            // trim is idempotent and waits for them) before a failover could revive the hold.
            let error = failed.to_error(conn, named.name());
            settle(conn.clone(), turn);
            Err(error)
        }
        Err(Failed::NotRun(e)) => {
            let error = named.error(&e);
            if error.is_transient() {
                retry_release(
                    conn.clone(),
                    turn,
                    ops,
                    hold.field.clone(),
                    named.name().to_owned(),
                );
            }
            Err(error)
        }
    }
}

/// What a pass's reply left the release to do.
enum AfterPass {
    /// Nothing: the lock went to the waiter (or was released again, the waiter gone).
    Done,
    /// The pass script released the lock the ordinary way: its reply is the release's.
    Released,
    /// The server refused the pass script: release with the release script.
    Refused,
}

/// The pass script's reply when the lock went to the claimed waiter.
const PASSED: i64 = -2;

/// A baton pass under way: the claimed waiter, and its turn.
struct Passing<K: Kind> {
    claim: Claim,
    /// The next owner's turn, held from before the pass is sent until its hold is registered:
    /// no call of that owner can run in between.
    turn: Turn,
    field: Arc<str>,
    lease: Lease,
    extra: K::Extra,
    /// This pass's place in the run of passes in a row.
    passes: u32,
}

/// Claims the first parked waiter that can take `hold`'s lock, if the kind passes and the
/// client allows another hand-off after the `passes` in a row that led to the hold.
fn claim_waiter<K: Kind>(kind: &K, hold: &Hold, passes: u32) -> Option<Claim> {
    let named = kind.named();
    let client = &named.client;
    if !K::PASSES || passes >= client.config.baton_passes {
        return None;
    }
    let (channel, _) = kind.channel(&hold.field);
    client.hub.claim_baton(&channel, &named.key)
}

/// What [`hand_on`] did with the claim.
enum Handing {
    /// The waiter was handed the hold, in memory.
    Handed,
    /// The run of hand-offs is over: release the ordinary way.
    Ordinary,
    /// Not in memory: the claim is the pass script's to use.
    Script(Claim),
}

/// The local hand-off of `hold`, the last of its hold, to the claimed waiter (see
/// [`crate::engine::baton`]): its guard carries the same field, generation and validity, and nothing
/// is sent. Counts the channel's subscribers in the background when the count is due.
fn hand_on<K: Kind>(kind: &K, hold: &Hold, turn: &Turn, claim: Claim, extra: K::Extra) -> Handing {
    let conn = &kind.named().client.conn;
    if conn.is_closed() {
        // Shutting down: the hold is released, not handed to a waiter about to leave.
        claim.withdraw();
        return Handing::Ordinary;
    }
    if kind.explicit_owner().is_some() {
        // Its owner was named from outside, and whoever named it can re-enter the field: the
        // next holder gets a field of its own, written by the pass script (invariant 16,
        // docs/DESIGN.md).
        return Handing::Script(claim);
    }
    if !claim.listening() {
        // A force-unlock now would go unheard (the subscriber connection dropped): the pass
        // script asks Redis (invariant 16, docs/DESIGN.md).
        return Handing::Script(claim);
    }
    let next = claim.baton().lease;
    let heard = claim.unlock_heard();
    let registered = match turn.hand_on(hold.generation, hold.lease, next, LOCAL_RUN_FOR, heard) {
        HandOn::Handed(registered) => registered,
        HandOn::RunOver => {
            claim.withdraw();
            return Handing::Ordinary;
        }
        HandOn::NotLocal => return Handing::Script(claim),
    };
    if let (Some(queue), Some(count)) = (claim.count_due(), kind.listeners(conn)) {
        let name = kind.named().name().to_owned();
        conn.runtime().spawn(async move {
            match count.await {
                // More than this client's own subscriber: someone else may be waiting.
                Ok(listeners) if listeners > 1 => queue.another_client_waits(),
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(lock = %name, error = %e, "could not count the channel's subscribers")
                }
            }
        });
    }
    let holds = &kind.named().client.holds;
    claim.handing_on(&registered.entry, registered.generation, holds);
    tracing::trace!(lock = %kind.named().name(), owner = %hold.field, "handed on locally");
    let guard = Guard::new(
        kind.clone(),
        hold.field.clone(),
        registered,
        next,
        Instant::now(),
        extra,
    );
    // A waiter that left meanwhile drops it: released (or handed on) at once.
    drop(claim.hand(Box::new(guard)));
    Handing::Handed
}

impl<K: Kind> Passing<K> {
    /// With `claim` on a parked waiter: the pass, if the client sends pass scripts and that
    /// waiter's turn is free (it is, unless an abandoned attempt of its own is still
    /// finishing), with the pass script to send. `None`: release as usual.
    async fn claim(
        kind: &K,
        hold: &Hold,
        passes: u32,
        claim: Claim,
    ) -> Option<(Passing<K>, crate::conn::Call)> {
        let named = kind.named();
        let client = &named.client;
        if client.passes_refused.load(Ordering::Relaxed) {
            claim.withdraw();
            return None;
        }
        let waiter = claim.baton();
        let field = kind.field(named.task_field(waiter.task));
        let ops = kind.ops();
        let Some(turn) = client
            .holds
            .turn(&named.key, &field, &ops, Instant::now())
            .await
        else {
            claim.withdraw();
            return None;
        };
        let lease = waiter.lease;
        let lease_ms = lease.millis(client.holds.watchdog_lease());
        let Some((call, extra)) = kind.pass(&client.conn, &hold.field, &field, lease_ms) else {
            claim.withdraw();
            return None;
        };
        let passing = Passing {
            claim,
            turn,
            field,
            lease,
            extra,
            passes: passes + 1,
        };
        Some((passing, call))
    }

    /// The lock is the waiter's: registers its hold (with the watchdog, for a watchdog
    /// lease) and hands the guard over. A waiter that left meanwhile gets nothing: the guard
    /// is dropped, which releases the hold at once (or passes it on again).
    fn hand_over(self, kind: &K, sent_at: Instant) {
        let registered = self.turn.passed(self.lease, sent_at, self.passes);
        drop(self.turn);
        // Doubted if a force-unlock's message came while the pass was in flight.
        let holds = &kind.named().client.holds;
        self.claim
            .handing_on(&registered.entry, registered.generation, holds);
        tracing::trace!(lock = %kind.named().name(), owner = %self.field, "passed");
        let guard = Guard::new(
            kind.clone(),
            self.field,
            registered,
            self.lease,
            sent_at,
            self.extra,
        );
        drop(self.claim.hand(Box::new(guard)));
    }

    /// Reads the pass script's reply `outcome` (sent at `sent_at`): the waiter gets the
    /// lock, or parks on, or the pass's unknown outcome is settled.
    async fn finish(
        self,
        kind: &K,
        ops: &Arc<dyn HoldOps>,
        outcome: &std::result::Result<fred::types::Value, Failed>,
        sent_at: Instant,
    ) -> AfterPass {
        let named = kind.named();
        let conn = &named.client.conn;
        match outcome {
            Ok(reply) if reply.as_i64() == Some(PASSED) => {
                if conn.is_closed() || self.turn.ended_before_reply(1, self.lease, sent_at) {
                    // Shutting down, or the pass's reply came after the lease it wrote had
                    // ended by the local clock (invariant 18, docs/DESIGN.md): the waiter gets
                    // no guard, and the hold the pass wrote goes as an acquire's would.
                    self.undo(conn, ops.clone(), named.name()).await;
                } else {
                    self.hand_over(kind, sent_at);
                    // The next holder was just woken into this worker's next slot. Whatever
                    // the releaser does next (often another acquire, whose send wakes the
                    // connection's task) would push it out of that slot, onto the queue other
                    // workers wake up to steal from: let it run first.
                    tokio::task::yield_now().await;
                }
                AfterPass::Done
            }
            // Released the ordinary way, message and all: another client was waiting.
            Ok(reply) if reply.as_i64() == Some(0) => {
                self.another_client_waits();
                AfterPass::Released
            }
            // The pass may have run: the next owner's count, like the releaser's, is trimmed
            // back to what this client accounts for (none), which releases it.
            Err(Failed::MaybeRan(_) | Failed::Unreplicated { .. }) => {
                self.settle(conn);
                AfterPass::Released
            }
            Err(Failed::NotRun(e)) if !named.error(e).is_transient() => {
                // The server refused the script before it wrote anything: release the
                // ordinary way, now and from now on.
                tracing::warn!(lock = %named.name(), error = %e, "the server refuses the baton pass (an ACL without PUBSUB NUMSUB?); this client releases without it");
                named.client.passes_refused.store(true, Ordering::Relaxed);
                self.withdraw();
                AfterPass::Refused
            }
            _ => {
                self.withdraw();
                AfterPass::Released
            }
        }
    }

    /// Passed while the client shuts down: released again at once.
    async fn undo(self, conn: &Arc<Conn>, ops: Arc<dyn HoldOps>, name: &str) {
        undo_acquire(conn.clone(), self.turn, ops, self.field, name.to_owned()).await;
        self.claim.withdraw();
    }

    /// Not passed: the waiter parks on (an ordinary release wakes it as any waiter).
    fn withdraw(self) {
        self.claim.withdraw();
    }

    /// Not passed, because another client was waiting; the waiter parks on.
    fn another_client_waits(self) {
        self.claim.another_client_waits();
    }

    /// The pass's outcome is unknown: the next owner's count is trimmed back to none.
    fn settle(self, conn: &Arc<Conn>) {
        self.claim.withdraw();
        settle(conn.clone(), self.turn);
    }
}
