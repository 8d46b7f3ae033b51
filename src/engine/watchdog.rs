//! Lease renewal for every hold of a [`Client`](crate::Client), and lost-lease signalling.
//!
//! One task per client wakes every third of the watchdog lease and renews **all** watchdog
//! holds in one round trip per batch, and in between, every
//! [`lease_check_interval`](crate::Config::lease_check_interval), asks the same way whether
//! each hold is still there (lease 0: a read, no write, no `WAIT`). A hold doubted by the hub
//! (an unlock message came while it was held through a hand-off in memory) is checked at once — one batched script per renewal flavour (each kind
//! names its own, see [`HoldOps::renewal`](crate::engine::holds::HoldOps::renewal)) and, on a
//! cluster, per hash slot. Fixed-lease holds ride along with lease 0, which only checks that
//! they are still held. A hold whose renewal finds it gone (expired, force-unlocked, taken
//! over) is marked lost at once; a hold that could not be renewed for a whole lease by the
//! local **monotonic** clock is marked lost too. Either way its guards'
//! [`lost()`](crate::Guard::lost) resolves, and it is never renewed again.

use std::collections::BTreeMap;
use std::sync::Arc;

use fred::types::Value;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::conn::{Ack, Conn};
use crate::engine::holds::{Holds, Loss, Renewable};

/// Holds renewed per script call.
const BATCH: usize = 100;

/// The watchdog of one client.
pub(crate) struct Watchdog {
    conn: Arc<Conn>,
    holds: Arc<Holds>,
    /// How often holds are checked between renewals.
    check_every: std::time::Duration,
    stop: Notify,
}

impl Watchdog {
    /// Starts the renewal task.
    pub(crate) fn start(
        conn: Arc<Conn>,
        holds: Arc<Holds>,
        check_every: std::time::Duration,
    ) -> Arc<Watchdog> {
        let watchdog = Arc::new(Watchdog {
            conn,
            holds,
            check_every,
            stop: Notify::new(),
        });
        tokio::spawn(run(Arc::downgrade(&watchdog)));
        watchdog
    }

    /// Stops the renewal task.
    pub(crate) fn stop(&self) {
        self.stop.notify_one();
    }

    async fn send_round(&self, holds: Vec<Renewable>) {
        // Grouped by renewal script and, on a cluster, by hash slot (a script's keys must
        // share a slot there: CROSSSLOT otherwise).
        let clustered = self.conn.is_clustered();
        let mut groups: BTreeMap<(usize, u16), Vec<Renewable>> = BTreeMap::new();
        for hold in holds {
            let script = hold.entry.ops.renewal() as *const _ as usize;
            let slot = if clustered {
                fred::util::redis_keyslot(hold.entry.key.as_bytes())
            } else {
                0
            };
            groups.entry((script, slot)).or_default().push(hold);
        }
        // Groups run concurrently: on a cluster, a primary that is down must not hold up the
        // renewal of locks on the others past the round's time limit.
        futures::future::join_all(groups.values().map(|group| self.renew_group(group))).await;
    }

    async fn renew_group(&self, group: &[Renewable]) {
        let lease = self.holds.watchdog_lease();
        for chunk in group.chunks(BATCH) {
            let script = chunk[0].entry.ops.renewal();
            let keys: Vec<&str> = chunk.iter().map(|h| &*h.entry.key).collect();
            let mut args: Vec<Value> = chunk.iter().map(|h| Value::from(&*h.entry.field)).collect();
            args.extend(chunk.iter().map(|h| Value::from(h.lease_ms)));
            let sent_at = Instant::now();
            // A check writes nothing: no replica has anything to acknowledge.
            let sent = if chunk.iter().all(|h| h.lease_ms == 0) {
                let check = self.conn.eval::<Vec<i64>>(script, &keys, args);
                futures::future::Either::Left(async move { Ok((check.await?, Ack::NotAsked)) })
            } else {
                futures::future::Either::Right(
                    self.conn.eval_synced::<Vec<i64>>(script, &keys, args),
                )
            };
            match sent.await {
                Ok((held, ack)) => {
                    // A renewal the replicas did not acknowledge extends nothing: the replica
                    // that would take over does not have the new expiry.
                    let counts = !matches!(ack, Ack::Short { .. });
                    if !counts {
                        tracing::warn!(
                            holds = chunk.len(),
                            ?ack,
                            "renewal not acknowledged by replicas; validity not extended"
                        );
                    }
                    for (hold, held) in chunk.iter().zip(held) {
                        if held != 1 {
                            hold.entry
                                .mark_lost(hold.generation, Loss::RenewalFoundGone);
                        } else if hold.lease_ms > 0 && counts {
                            hold.entry.renewed(hold.generation, sent_at, lease);
                        } else if hold.lease_ms > 0 {
                            hold.entry.renewal_failed("not_replicated");
                        } else {
                            hold.entry.checked(hold.generation, sent_at);
                        }
                    }
                    tracing::trace!(holds = chunk.len(), "renewed");
                }
                // Holds stay: the next round retries, and expiry ends any hold that stays
                // unrenewed for a whole lease.
                Err(e) => {
                    tracing::warn!(holds = chunk.len(), error = %e, "lease renewal failed");
                    chunk
                        .iter()
                        .filter(|h| h.lease_ms > 0)
                        .for_each(|h| h.entry.renewal_failed("error"));
                }
            }
        }
    }
}

/// The watchdog task: renews every `lease / 3`, checks every `check_every` in between and
/// doubted holds at once, until stopped or dropped.
async fn run(watchdog: std::sync::Weak<Watchdog>) {
    let Some((period, check_every)) = watchdog.upgrade().map(|w| {
        let period = w.holds.watchdog_lease() / 3;
        (period, w.check_every.min(period))
    }) else {
        return;
    };
    let mut next_renewal = Instant::now() + period;
    let mut next_check = Instant::now() + check_every;
    loop {
        let Some(dog) = watchdog.upgrade() else { break };
        let mut doubted = false;
        tokio::select! {
            _ = tokio::time::sleep_until(next_renewal.min(next_check)) => {}
            _ = dog.holds.doubts() => doubted = true,
            _ = dog.stop.notified() => break,
        }
        if dog.conn.is_closed() {
            break;
        }
        dog.holds.expire_overdue();
        let now = Instant::now();
        // Bounded by the period, so a stalled server cannot delay local expiry checks by
        // more than one period.
        let holds = if doubted {
            dog.holds.take_doubted()
        } else if dog.holds.len() == 0 {
            Vec::new()
        } else {
            dog.holds.to_renew(now >= next_renewal)
        };
        if !holds.is_empty() {
            if tokio::time::timeout(period, dog.send_round(holds))
                .await
                .is_err()
            {
                tracing::warn!(?period, "lease renewal round timed out");
            }
            dog.holds.expire_overdue();
        }
        drop(dog);
        if doubted {
            continue;
        }
        let now = Instant::now();
        if now >= next_renewal {
            next_renewal += period;
            if next_renewal < now {
                next_renewal = now + period;
            }
        }
        next_check = now + check_every;
    }
    tracing::debug!("watchdog stopped");
}
