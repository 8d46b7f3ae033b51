//! Taking permits: one waiter's attempts on a semaphore, driven by the shared wait loop.

use super::*;

/// One waiter's attempts on a semaphore.
pub(super) struct SemaphoreAttempts {
    pub(super) inner: Arc<Inner>,
    pub(super) permits: u32,
    pub(super) recheck_ms: u64,
}

impl Attempts for SemaphoreAttempts {
    type Output = SemaphorePermit;

    fn client(&self) -> &ClientInner {
        &self.inner.named.client
    }

    fn name(&self) -> &str {
        self.inner.named.name()
    }

    fn kind(&self) -> &'static str {
        "semaphore"
    }

    fn channel(&self) -> (Arc<str>, Arc<str>, Wake) {
        (
            self.inner.channel.clone(),
            self.inner.named.key.clone(),
            Wake::Permits,
        )
    }

    fn attempt(&mut self) -> impl Future<Output = Result<Try<SemaphorePermit>>> + Send {
        let round_trip = take(self.inner.clone(), self.permits, self.recheck_ms);
        Finish::new(round_trip, &self.inner.named.client.conn)
    }
}

/// One acquire round trip.
async fn take(inner: Arc<Inner>, permits: u32, recheck_ms: u64) -> Result<Try<SemaphorePermit>> {
    let named = &inner.named;
    let conn = &named.client.conn;
    let call = conn.call(
        &ACQUIRE,
        &[&named.key],
        vec![Value::from(i64::from(permits))],
    );
    // Given up past its bound, the call still runs on a healthy connection: permits its late
    // reply took are given back.
    let late = {
        let inner = inner.clone();
        move |call: crate::conn::Call| {
            let runtime = inner.named.client.conn.runtime().clone();
            runtime.spawn(async move {
                let reply = match call.await {
                    Ok(reply) | Err(Failed::Unreplicated { reply, .. }) => reply,
                    Err(_) => return,
                };
                if reply.as_i64() == Some(1) {
                    tracing::info!(semaphore = %inner.named.name(), permits, "an acquire given up past its bound took permits when it ran: giving them back");
                    drop(SemaphorePermit::new(inner, permits));
                }
            });
        }
    };
    let reply = match bounded(call, conn).or_late(late).await {
        Ok(reply) => reply,
        Err(failed) => {
            match &failed {
                Failed::MaybeRan(_) => {
                    tracing::warn!(semaphore = %named.name(), permits, "an acquire in flight got no reply: if the connection broke, its permits may be taken and cannot be given back");
                }
                // Taken on the primary only: it does not count; dropping them gives them back.
                Failed::Unreplicated { reply, .. } if reply.as_i64() == Some(1) => {
                    drop(SemaphorePermit::new(inner.clone(), permits))
                }
                _ => {}
            }
            return Err(failed.to_error(conn, named.name()));
        }
    };
    match reply.as_i64() {
        Some(1) => {
            let permit = SemaphorePermit::new(inner.clone(), permits);
            if conn.is_closed() {
                // Taken while the client shuts down, maybe after it gave back the permits
                // still held: given back here.
                drop(permit);
                return Err(Error::ShutDown);
            }
            Ok(Try::Got(permit))
        }
        Some(0) => Ok(Try::Busy(recheck_ms)),
        Some(-1) => Ok(Try::TooFew(recheck_ms)),
        _ => Err(Error::Redis(format!(
            "unexpected acquire reply for {:?}",
            named.name()
        ))),
    }
}
