//! Waiting until a lock is free without taking it: the single-flight wait (one caller takes
//! the lock and computes; the rest wait here, and all of them are woken by the one unlock
//! message that frees it, instead of taking the lock one after another).
//!
//! The wait loop is the acquire's (subscribe before the re-check, park until a message, a
//! reconnect or the holder's remaining lease), with an attempt that only reads the lock's
//! PTTL. Its waiters form a group of their own on the lock's channel: the unlock message
//! wakes one of them (as it wakes one waiter of each group), and the first that finds the lock
//! free wakes the rest of its group at once.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::engine::acquire::traced;
use crate::engine::client_inner::ClientInner;
use crate::engine::hub::Wake;
use crate::engine::kind::Kind;
use crate::engine::wait::{wait_for, Attempts, Try};
use crate::Result;

/// How long a waiter parks before it looks again when the key exists without an expiry (no
/// lock redbaton or Redisson makes; one set by hand).
const NO_EXPIRY_RECHECK_MS: u64 = 1_000;

/// Waits until the lock of `kind` is free (its key is absent): `true` once it is, `false`
/// when `wait` (None: forever) ran out first. Never takes it.
pub(crate) async fn until_free<K: Kind>(kind: &K, wait: Option<Duration>) -> Result<bool> {
    let named = kind.named();
    named.check()?;
    // The channel does not depend on the field for the kinds that offer this wait.
    let (channel, _) = kind.channel(&named.key);
    let group: Arc<str> = format!("{}\0until-free", named.key).into();
    let attempts = FreeAttempts {
        kind: kind.clone(),
        channel,
        group,
    };
    let span = tracing::trace_span!("until_free", lock = %named.name());
    let free = traced(wait_for(attempts, wait), span).await?;
    Ok(free.is_some())
}

struct FreeAttempts<K: Kind> {
    kind: K,
    channel: Arc<str>,
    group: Arc<str>,
}

impl<K: Kind> Attempts for FreeAttempts<K> {
    type Output = ();

    fn client(&self) -> &ClientInner {
        &self.kind.named().client
    }

    fn name(&self) -> &str {
        self.kind.named().name()
    }

    fn kind(&self) -> &'static str {
        "until_free"
    }

    fn channel(&self) -> (Arc<str>, Arc<str>, Wake) {
        (self.channel.clone(), self.group.clone(), Wake::Lock)
    }

    fn attempt(&mut self) -> impl Future<Output = Result<Try<()>>> + Send {
        let kind = self.kind.clone();
        async move {
            Ok(match kind.named().pttl().await? {
                -2 => Try::Got(()),
                ms if ms > 0 => Try::Busy(ms as u64),
                _ => Try::Busy(NO_EXPIRY_RECHECK_MS),
            })
        }
    }

    fn wakes_group(&self) -> bool {
        true
    }
}
