//! A [`SemaphorePermit`]: permits taken, given back on release or drop (in the
//! background), or at the client's shutdown.

use super::*;

/// Permits taken from a [`Semaphore`], given back when this is dropped (in a background
/// task, logged at `debug`) — at the end of its scope, on an error path, when the task
/// holding it is cancelled — or by [`release`](Self::release), which reports errors.
/// [`forget`](Self::forget) keeps them taken. Like `tokio::sync::SemaphorePermit`, but the
/// permits are in Redis: a process that dies holding them loses them for good (see
/// [`Semaphore`]).
///
/// [`Client::shutdown`](crate::Client::shutdown) gives back the permits of every
/// `SemaphorePermit` of the client still alive, as it releases the locks still held, and
/// waits for the background give-backs of those dropped before it.
#[must_use = "dropping the permit gives its permits back at once; bind it (`let _permit = ...`) for as long as they must be held"]
pub struct SemaphorePermit {
    inner: Arc<Inner>,
    /// How many permits it holds.
    permits: u32,
    /// Its entry in the client's outstanding permits; `None` once settled (released,
    /// dropped, forgotten), and for no permits.
    ticket: Option<u64>,
}

/// Gives back `permits` of a [`SemaphorePermit`] still alive when its client shuts down.
async fn shutdown_gives_back(inner: Arc<Inner>, permits: u32) -> Option<Error> {
    let outcome = give_back(inner.clone(), permits).await;
    match &outcome {
        Ok(_) => {
            tracing::warn!(semaphore = %inner.named.name(), permits, "shutdown gave back semaphore permits still held")
        }
        Err(e) => {
            tracing::warn!(semaphore = %inner.named.name(), permits, error = %e, "shutdown could not give back semaphore permits; they are lost")
        }
    }
    outcome.err()
}

impl SemaphorePermit {
    /// `permits` taken, given back by shutdown until they are settled.
    pub(super) fn new(inner: Arc<Inner>, permits: u32) -> SemaphorePermit {
        let ticket = (permits > 0).then(|| {
            let owner = inner.clone();
            inner.named.client.outstanding_permits.insert(
                permits,
                Box::new(move |permits| Box::pin(shutdown_gives_back(owner, permits))),
            )
        });
        SemaphorePermit {
            inner,
            permits,
            ticket,
        }
    }

    /// Takes the permits out of the client's outstanding ones: how many are still to give
    /// back (0 when shutdown gave them back already, or for none).
    fn settle(&mut self) -> u32 {
        self.ticket
            .take()
            .and_then(|ticket| self.inner.named.client.outstanding_permits.remove(ticket))
            .unwrap_or(0)
    }

    /// How many permits it holds.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The name of the semaphore the permits were taken from.
    pub fn semaphore_name(&self) -> &str {
        self.inner.named.name()
    }

    /// Gives the permits back and wakes as many waiters.
    ///
    /// Refused with [`Error::InvalidArgument`] when the count of free permits would pass
    /// [`MAX_PERMITS`] (others released or added permits meanwhile): then the permits are
    /// not given back. If Redis does not confirm the release within the command timeout, the
    /// error is returned and the release goes on in the background. [`Error::ShutDown`] after
    /// the client shut down: shutdown gave the permits back.
    ///
    /// # Cancel safety
    ///
    /// Calling `release` gives the permits back whether or not its future is awaited to the
    /// end: dropped before its first poll, the future drops the permit, which gives them back
    /// in the background; dropped once polled, the release round trip is finished in the
    /// background.
    pub async fn release(mut self) -> Result<()> {
        let permits = self.settle();
        if permits == 0 && self.permits > 0 {
            // Shutdown gave them back.
            return Err(Error::ShutDown);
        }
        release(self.inner.clone(), permits).await
    }

    /// Keeps the permits taken and drops the guard: nothing gives them back but a
    /// [`Semaphore::release`] (from any task or process), as with Redisson's `acquire`.
    /// Returns how many were kept.
    pub fn forget(mut self) -> u32 {
        self.settle();
        self.permits
    }
}

impl Drop for SemaphorePermit {
    fn drop(&mut self) {
        // Also the end of an acquire whose caller left (dropped, timed out): its permits,
        // taken after all, come back the same way. Counted before settling, so that a
        // shutdown that did not give these permits back waits for this give-back.
        if self.ticket.is_none() {
            return; // Released, forgotten, or none.
        }
        let returning = self.inner.named.client.outstanding_permits.returning();
        let permits = self.settle();
        if permits == 0 {
            return;
        }
        let inner = self.inner.clone();
        tracing::debug!(semaphore = %inner.named.name(), permits, "semaphore permits dropped; giving them back in the background");
        let runtime = inner.named.client.conn.runtime().clone();
        runtime.spawn(async move {
            let _returning = returning;
            if let Err(e) = give_back(inner.clone(), permits).await {
                tracing::warn!(semaphore = %inner.named.name(), permits, error = %e, "could not give back dropped semaphore permits; they are lost");
            }
        });
    }
}

impl std::fmt::Debug for SemaphorePermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SemaphorePermit")
            .field("semaphore", &self.semaphore_name())
            .field("permits", &self.permits)
            .finish()
    }
}

/// Runs the release script: `permits` more free permits; the new count.
pub(super) async fn give_back(inner: Arc<Inner>, permits: u32) -> Result<i64> {
    let named = &inner.named;
    let conn = &named.client.conn;
    let args = vec![
        Value::from(i64::from(permits)),
        Value::from_static_str(conn.publish_command()),
        Value::from(&*inner.channel),
    ];
    let call = conn.call(&RELEASE, &[&*named.key], args);
    match bounded(call, conn).await {
        Ok(Value::Null) => Err(out_of_range(named, &format!("releasing {permits} permits"))),
        Ok(reply) => reply.as_i64().ok_or_else(|| {
            Error::Redis(format!("unexpected release reply for {:?}", named.name()))
        }),
        Err(failed) => {
            if let Failed::MaybeRan(_) = failed {
                tracing::warn!(semaphore = %named.name(), permits, "the connection broke with a release in flight: the permits may or may not be back");
            }
            Err(failed.to_error(conn, named.name()))
        }
    }
}
