//! Repairs of a hold whose state in Redis is not what the client accounts for: an acquire
//! that must not count is undone ([`undo_acquire`]), an owner whose count a call of unknown
//! outcome may have changed is trimmed back to its guards ([`settle`]), a lost hold that
//! other holds keep alive is trimmed away ([`trim_lost`]), and a release that did not run is
//! retried ([`retry_release`]). Each runs under the owner's turn, so no other call of that
//! owner is in flight to be trimmed by mistake (invariant 11, docs/DESIGN.md).

use std::sync::Arc;
use std::time::Duration;

use fred::types::Value;
use tokio::time::Instant;

use crate::conn::{Conn, Failed, Replicas};
use crate::engine::call::bounded;
use crate::engine::holds::{HoldOps, Loss, Turn};

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
    let release = ops.release(&conn, &field, 1, 0, Replicas::Skip);
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
            let trim = entry.ops.release(&conn, &entry.field, u32::MAX, keep, Replicas::Await);
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

/// Retries a release that certainly did not run (not connected), in the background, until
/// Redis answers or a few command timeouts passed (the lease then ends the hold).
pub(crate) fn retry_release(
    conn: Arc<Conn>,
    turn: Turn,
    ops: Arc<dyn HoldOps>,
    field: Arc<str>,
    name: String,
) {
    let runtime = conn.runtime().clone();
    runtime.spawn(async move {
        let give_up_at = Instant::now() + conn.command_timeout() * 4;
        loop {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            match bounded(ops.release(&conn, &field, 1, 0, Replicas::Await), &conn).await {
                Ok(_) => {
                    tracing::debug!(lock = %name, "release retried successfully");
                    break;
                }
                Err(Failed::MaybeRan(_) | Failed::Unreplicated { .. }) => {
                    settle(conn.clone(), turn);
                    return;
                }
                Err(Failed::NotRun(e)) if Instant::now() < give_up_at && !conn.is_closed() => {
                    tracing::debug!(lock = %name, error = %e, "release retry failed");
                }
                Err(Failed::NotRun(e)) => {
                    tracing::warn!(lock = %name, error = %e, "could not release; the lock expires with its lease");
                    break;
                }
            }
        }
        drop(turn);
    });
}
