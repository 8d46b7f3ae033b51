//! [`Guard`]: proof of one hold of a lock, released on drop.

use std::sync::Arc;

use tokio::time::Instant;

use crate::acquire::{bounded, settle, Finish};
use crate::conn::{Conn, Failed};
use crate::holds::{Entry, Lease, Loss, Registered, Turn};
use crate::kinds::Kind;
use crate::owner::Owner;
use crate::{Error, Result};

/// One hold of a lock of kind `K` — [`LockGuard`](crate::LockGuard) for a [`Lock`](crate::Lock).
/// Release it with [`unlock`](Guard::unlock); dropping it releases it too, in a background
/// task (logged at `debug`).
///
/// A guard is `Send + 'static`: it can move into a spawned task and be released there — the
/// release acts as the owner that acquired it, not the current task.
///
/// While the guard lives, the lock may still be *lost*: a fixed lease ran out, another client
/// force-unlocked it, or the watchdog could not renew it for a whole lease (Redis unreachable).
/// [`lost`](Guard::lost) resolves when that happens, so work can stop before it writes:
///
/// ```no_run
/// # async fn run(lock: redbaton::Lock) -> redbaton::Result<()> {
/// # async fn work() {}
/// let guard = lock.lock().await?;
/// tokio::select! {
///     _ = guard.lost() => eprintln!("lease lost; abandoning the work"),
///     _ = work() => guard.unlock().await?,
/// }
/// # Ok(()) }
/// ```
#[must_use = "dropping the guard releases the lock"]
pub struct Guard<K: Kind> {
    kind: K,
    hold: Hold,
    extra: K::Extra,
    released: bool,
}

/// What releasing needs, movable into a background task.
#[derive(Clone)]
struct Hold {
    field: Arc<str>,
    entry: Arc<Entry>,
    generation: u64,
    lease: Lease,
    /// Where a fixed lease ends by the local clock.
    expires: Option<Instant>,
}

impl<K: Kind> Guard<K> {
    pub(crate) fn new(
        kind: K,
        field: Arc<str>,
        registered: Registered,
        lease: Lease,
        sent_at: Instant,
        extra: K::Extra,
    ) -> Self {
        let expires = match lease {
            Lease::Watchdog => None,
            Lease::Fixed(ms) => sent_at.checked_add(std::time::Duration::from_millis(ms as u64)),
        };
        Guard {
            kind,
            hold: Hold {
                field,
                entry: registered.entry,
                generation: registered.generation,
                lease,
                expires,
            },
            extra,
            released: false,
        }
    }

    /// Releases this hold. With reentry, the lock stays held until every hold is released.
    ///
    /// Returns [`Error::NotHeld`] when the lock was lost meanwhile (expired, force-unlocked,
    /// renewal failed): then nothing is sent, since the same owner may hold the lock anew.
    ///
    /// If Redis does not confirm the release within the command timeout, or the connection
    /// fails, the error is returned, and the release goes on in the background: it is retried
    /// until Redis answers (or, past a few command timeouts, the lease is left to end it). The
    /// watchdog stops renewing this hold either way.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future finishes the release in the background.
    pub async fn unlock(mut self) -> Result<()> {
        self.released = true;
        let conn = self.kind.named().client.conn.clone();
        Finish::new(release(self.kind.clone(), self.hold.clone()), &conn).await
    }

    /// Resolves when the lease is lost. Never resolves while the lock is held.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only watches.
    pub async fn lost(&self) {
        let hold_lost = self.hold.entry.lost(self.hold.generation);
        match self.hold.expires {
            Some(at) => {
                tokio::select! {
                    _ = hold_lost => {}
                    _ = tokio::time::sleep_until(at) => {}
                }
            }
            None => hold_lost.await,
        }
    }

    /// Whether the lease is lost (by Redis's word or by the local clock).
    pub fn is_lost(&self) -> bool {
        self.hold.expires.is_some_and(|at| Instant::now() >= at)
            || self.hold.entry.is_lost(self.hold.generation)
    }

    /// The owner this hold belongs to (`<client uuid>:<number>`, the hash field in Redis).
    pub fn owner(&self) -> Owner {
        self.kind
            .owner_part(&self.hold.field)
            .parse()
            .expect("owner fields are always well-formed")
    }

    /// The lock this guard holds.
    pub fn lock(&self) -> &K {
        &self.kind
    }

    pub(crate) fn extra(&self) -> K::Extra {
        self.extra
    }
}

/// Releases one hold under the owner's turn.
async fn release<K: Kind>(kind: K, hold: Hold) -> Result<()> {
    let named = kind.named();
    let client = &named.client;
    let conn = &client.conn;
    let ops = kind.ops();
    let far = Instant::now() + conn.command_timeout() * 4;
    let Some(turn) = client.holds.turn(&named.key, &hold.field, &ops, far).await else {
        return Err(Error::Timeout(conn.command_timeout()));
    };
    // Forgotten first, so no renewal can outlive the release. A lost hold must not run the
    // script: the same owner may have taken the lock again, and it would release that.
    let Some(guards_left) = turn.forget_guard(hold.generation, hold.lease) else {
        if conn.is_closed() {
            return Err(Error::ShutDown);
        }
        return Err(Error::NotHeld {
            name: named.name.clone(),
        });
    };
    if guards_left == 0 {
        // The hand-off latency of a waiter of this client starts here.
        client.holds.metrics().released(&named.key);
    }
    match bounded(ops.release(conn, &hold.field, 1, 0), conn).await {
        Ok(reply) => match reply.as_i64() {
            Some(-1) => {
                hold.entry.mark_lost(hold.generation, Loss::UnlockFoundGone);
                Err(Error::NotHeld {
                    name: named.name.clone(),
                })
            }
            Some(remaining) => {
                tracing::trace!(lock = %named.name, remaining, "released");
                Ok(())
            }
            None => Err(Error::Redis(format!(
                "unexpected release reply for {:?}",
                named.name
            ))),
        },
        Err(Failed::MaybeRan(e)) => {
            settle(conn.clone(), turn);
            Err(named.error(&e))
        }
        Err(failed @ Failed::Unreplicated { .. }) => {
            // Released on the primary; make the release reach the replicas too (the settle's
            // trim is idempotent and waits for them) before a failover could revive the hold.
            let error = failed.to_error(conn, &named.name);
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
                    named.name.clone(),
                );
            }
            Err(error)
        }
    }
}

/// Retries a release that certainly did not run (not connected), in the background, until
/// Redis answers or a few command timeouts passed (the lease then ends the hold).
fn retry_release(
    conn: Arc<Conn>,
    turn: Turn,
    ops: Arc<dyn crate::holds::HoldOps>,
    field: Arc<str>,
    name: String,
) {
    let runtime = conn.runtime().clone();
    runtime.spawn(async move {
        let give_up_at = Instant::now() + conn.command_timeout() * 4;
        loop {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            match bounded(ops.release(&conn, &field, 1, 0), &conn).await {
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

impl<K: Kind> Drop for Guard<K> {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let name = self.kind.named().name.clone();
        tracing::debug!(lock = %name, "guard dropped without unlock(); releasing in the background");
        let kind = self.kind.clone();
        let hold = self.hold.clone();
        let runtime = kind.named().client.conn.runtime().clone();
        runtime.spawn(async move {
            match release(kind, hold).await {
                Ok(()) | Err(Error::NotHeld { .. }) => {}
                Err(e) => tracing::debug!(lock = %name, error = %e, "background release"),
            }
        });
    }
}

impl<K: Kind> std::fmt::Debug for Guard<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("lock", &self.kind.named().name)
            .field("owner", &self.hold.field)
            .field("lost", &self.is_lost())
            .finish()
    }
}
