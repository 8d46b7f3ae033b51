//! [`LockGuard`]: proof of one hold, released on drop.

use std::sync::Arc;

use tokio::time::Instant;

use crate::owner::Owner;
use crate::scripts::UnlockReply;
use crate::watchdog::{Hold, Lease};
use crate::{Error, Lock, Result};

/// One hold of a [`Lock`]. Release it with [`unlock`](LockGuard::unlock); dropping it releases
/// it too, in a background task (logged at `debug`).
///
/// A guard is `Send + 'static`: it can move into a spawned task and be released there — the
/// release acts as the owner that acquired it, not the current task.
///
/// While the guard lives, the lock may still be *lost*: a fixed lease ran out, another client
/// force-unlocked it, or the watchdog could not renew it for a whole lease (Redis unreachable).
/// [`lost`](LockGuard::lost) resolves when that happens, so work can stop before it writes:
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
pub struct LockGuard {
    held: Option<Held>,
    /// Kept for `lost()`/`is_lost()` after `held` was taken.
    hold: Arc<Hold>,
}

/// What releasing needs, movable into a background task.
struct Held {
    lock: Lock,
    owner: Arc<str>,
    hold: Arc<Hold>,
    lease: Lease,
}

impl LockGuard {
    /// Registers a hold acquired by a request sent at `sent_at`.
    pub(crate) fn new(lock: Lock, owner: Arc<str>, lease: Lease, sent_at: Instant) -> Self {
        let shared = lock.shared();
        let hold =
            shared
                .client
                .watchdog
                .register(&shared.key, &shared.channel, &owner, lease, sent_at);
        LockGuard {
            held: Some(Held {
                lock,
                owner,
                hold: hold.clone(),
                lease,
            }),
            hold,
        }
    }

    /// Releases this hold. With reentry, the lock stays held until every hold is released.
    ///
    /// Returns [`Error::NotHeld`] when the lock was lost meanwhile (expired, force-unlocked,
    /// renewal failed): then nothing is sent, since the same owner may hold the lock anew.
    pub async fn unlock(mut self) -> Result<()> {
        let held = self.held.take().expect("a guard is released only once");
        // Boxed: the script call's future is several KiB, and it would otherwise be inlined
        // into every task that ever unlocks — parked waiters included.
        Box::pin(held.release()).await
    }

    /// Resolves when the lease is lost. Never resolves while the lock is held.
    pub async fn lost(&self) {
        self.hold.lost().await
    }

    /// Whether the lease is lost (by Redis's word or by the local clock).
    pub fn is_lost(&self) -> bool {
        self.hold.is_lost()
    }

    /// The owner this hold belongs to (`<client uuid>:<number>`, the hash field in Redis).
    pub fn owner(&self) -> Owner {
        self.hold
            .owner
            .parse()
            .expect("owner fields are always well-formed")
    }

    /// The lock this guard holds.
    pub fn lock(&self) -> &Lock {
        &self
            .held
            .as_ref()
            .expect("a live guard holds its lock")
            .lock
    }
}

impl Held {
    async fn release(self) -> Result<()> {
        let Held {
            lock,
            owner,
            hold,
            lease,
        } = self;
        let shared = lock.shared();
        let client = &shared.client;
        // Stop renewing first, so no renewal can outlive the release.
        client.watchdog.release(&hold, lease);
        if client.is_closed() {
            return Err(Error::ShutDown);
        }
        // A lost hold must not run the script: the same owner may have taken the lock again,
        // and the script would release that newer hold.
        if hold.is_lost() {
            return Err(Error::NotHeld {
                name: shared.name.clone(),
            });
        }
        let lease_ms = lease.millis(client.watchdog.lease());
        let reply = client
            .scripts
            .unlock(
                &client.redis,
                &shared.key,
                &shared.channel,
                &owner,
                lease_ms,
                client.publish_command(),
            )
            .await
            .map_err(|e| client.error(e, &shared.name))?;
        match reply {
            UnlockReply::NotHeld => {
                hold.mark_lost("unlock found the lock gone");
                Err(Error::NotHeld {
                    name: shared.name.clone(),
                })
            }
            UnlockReply::StillHeld => {
                tracing::trace!(lock = %shared.name, "released one hold; still held");
                Ok(())
            }
            UnlockReply::Released => {
                tracing::trace!(lock = %shared.name, "released");
                Ok(())
            }
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let Some(held) = self.held.take() else { return };
        let name = held.lock.name().to_owned();
        tracing::debug!(lock = %name, "guard dropped without unlock(); releasing in the background");
        let runtime = held.lock.shared().client.runtime.clone();
        runtime.spawn(async move {
            match held.release().await {
                Ok(()) | Err(Error::ShutDown) => {}
                Err(e) => tracing::debug!(lock = %name, error = %e, "background release"),
            }
        });
    }
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.hold.key)
            .field("owner", &self.hold.owner)
            .field("lost", &self.is_lost())
            .finish()
    }
}
