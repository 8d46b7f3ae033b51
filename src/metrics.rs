//! Metrics, recorded through the [`metrics`](https://docs.rs/metrics) facade (the `metrics`
//! feature): install any recorder or exporter (Prometheus, StatsD, …) and these appear. Without
//! the feature, none of this is compiled: the engine's recording calls are empty inline
//! functions.
//!
//! | name | type | labels | what it counts |
//! | --- | --- | --- | --- |
//! | `redbaton_acquisitions_total` | counter | `kind`, `outcome` | acquire calls, by how they ended: `acquired`, `timed_out` (the wait ran out, or a `try_lock` was refused), `error` (the call returned an error), `cancelled` (the future was dropped) |
//! | `redbaton_acquire_wait_seconds` | histogram | `kind` | for acquired calls: from the call to the guard (the first round trip included) |
//! | `redbaton_handoff_seconds` | histogram | `kind` | from the moment this client sends the release that frees a lock to the moment a waiter of this client, woken by it, holds the lock. Hand-offs to other processes are not seen |
//! | `redbaton_waiters` | gauge | `kind` | acquire calls of this process that were refused and are waiting (parked, or re-checking) |
//! | `redbaton_held_locks` | gauge | `kind` | holds this process registers (one per lock and owner, however often re-entered), not yet known lost |
//! | `redbaton_renewals_total` | counter | `kind` | watchdog renewals that extended a hold's lease (per hold) |
//! | `redbaton_renewal_failures_total` | counter | `kind`, `reason` | watchdog renewals that did not: `error` (the script failed or timed out; the next round retries), `not_replicated` (no replica acknowledged it, see [`ReplicaSync`](crate::ReplicaSync)) |
//! | `redbaton_leases_lost_total` | counter | `kind`, `cause` | holds marked lost: `gone` (a renewal, unlock or settle found Redis no longer had it: expired, force-unlocked, taken over), `expired` (not renewed within its lease by the local clock: Redis unreachable, or a fixed lease ran out), `replaced` (the same owner took the lock afresh before the loss was noticed), `shutdown` ([`Client::shutdown`](crate::Client::shutdown) ended it) |
//! | `redbaton_subscriber_reconnects_total` | counter | | reconnections of the subscriber connection |
//! | `redbaton_resubscribes_total` | counter | `outcome` | resubscriptions of every channel after a reconnect (or a moved shard slot): `ok`, `failed` (retried a second later) |
//! | `redbaton_script_reloads_total` | counter | | scripts loaded again after a `NOSCRIPT` reply (a restart, `SCRIPT FLUSH` or a failover emptied the server's script cache) |
//!
//! `kind` is the lock type: `lock`, `fenced_lock`, `fair_lock`, `read_lock`, `write_lock`,
//! `semaphore`, `leased_semaphore` — and `until_free` for the waits of
//! [`Lock::wait_until_free`](crate::Lock::wait_until_free) and its kin, which take nothing
//! (their `acquired` outcome means the lock was found free). A [`MultiLock`](crate::MultiLock) or
//! [`RedLock`](crate::RedLock) records through the locks it is made of. A `Lock` and a
//! `FencedLock` of the same name and owner share one hold (one hash in Redis), which the
//! registry metrics (`held_locks`, renewals, lost leases) label with the kind that took it
//! first.
//!
//! **Lock names** are added as a `name` label to every metric that has a `kind` only when
//! the client opts in with [`Builder::metrics_label_names`](crate::Builder::metrics_label_names)
//! ([`Config::metrics_label_names`](crate::Config::metrics_label_names)): each name is a
//! separate time series in the recorder, kept for the life of the process, so a service that
//! locks per order or per user would grow without bound.
//!
//! Gauges move by increments and decrements, so several clients in one process add up. The
//! `held_locks` gauge counts a hold lost by the local clock until the watchdog's next round
//! (a third of the watchdog lease) marks it lost.
//!
//! ```no_run
//! # #[cfg(feature = "metrics")]
//! # async fn run() -> redbaton::Result<()> {
//! // Any recorder: metrics-exporter-prometheus, metrics-util's DebuggingRecorder, …
//! // (installed with `metrics::set_global_recorder` or the exporter's own `install`).
//! redbaton::metrics::describe(); // units and help texts, for exporters that show them
//! let client = redbaton::Client::builder()
//!     .url("redis://127.0.0.1:6379")
//!     .metrics_label_names(true) // only for a small, fixed set of lock names
//!     .connect()
//!     .await?;
//! # client.shutdown().await }
//! ```
//!
//! `examples/metrics.rs` runs a contention test and prints what was recorded.
//!
//! # Tracing
//!
//! Events go through [`tracing`](https://docs.rs/tracing), each with the target of the module
//! that emits it (`redbaton::<module>`), with fields such as `lock`, `key`, `owner`, `error`:
//!
//! | target | level | events |
//! | --- | --- | --- |
//! | `redbaton::acquire` | trace | span `acquire` (fields `lock`, `owner`) around every acquire call; `waiting`, `acquired` |
//! | `redbaton::acquire` | debug | acquired after a wake-up (with the wait), retries after an error or an unreplicated acquire, a subscription not confirmed in time |
//! | `redbaton::acquire` | info / warn | a call of unknown outcome settled (info); an owner holding more than its guards account for, a settle or undo that failed (warn) |
//! | `redbaton::acquire::guard` | trace / debug / warn | `released`; a guard dropped without `unlock()`, a background release; a release given up (the lease ends it) |
//! | `redbaton::holds` | warn | `lock lease lost`, with `why` |
//! | `redbaton::watchdog` | trace / warn | `renewed`; renewal failed, round timed out, renewal not acknowledged by replicas |
//! | `redbaton::hub` | trace | messages received and the wake-ups they cause |
//! | `redbaton::hub` | info / warn / error | resubscribing after a reconnect or a moved slot (info); a lagging listener, a failed subscribe or resubscribe (warn); a subscription the server refuses (error, its waiters fail with [`Error::Auth`](crate::Error::Auth)) |
//! | `redbaton::conn` | debug / warn | `NOSCRIPT` reloads, cluster redirects (debug); a failed `WAIT` (warn) |
//! | `redbaton::client` | debug / warn | connected, shut down (debug); a hold still held at shutdown, released (warn) |
//! | `redbaton::kinds::*` | info | `force-unlocked` |
//! | `redbaton::kinds::semaphore` | trace / debug / warn | span `acquire` (fields `semaphore`, `permits`); permits given back after an abandoned acquire; a broken connection with a permit call in flight |
//! | `redbaton::multilock`, `redbaton::redlock` | trace / debug | parts busy, released, or granted late |

#[cfg(feature = "metrics")]
mod recording {
    use std::collections::HashMap;
    use std::sync::Arc;

    use metrics::{counter, gauge, histogram, Label, SharedString, Unit};
    use parking_lot::Mutex;
    use tokio::time::Instant;

    /// Acquire calls by outcome (`acquired`, `timed_out`, `error`, `cancelled`) and kind.
    pub const ACQUISITIONS: &str = "redbaton_acquisitions_total";
    /// Seconds from an acquire call to its guard.
    pub const ACQUIRE_WAIT: &str = "redbaton_acquire_wait_seconds";
    /// Seconds from this client's release to the next holder among its woken waiters.
    pub const HANDOFF: &str = "redbaton_handoff_seconds";
    /// Acquire calls waiting after a refusal.
    pub const WAITERS: &str = "redbaton_waiters";
    /// Holds registered and not known lost.
    pub const HELD_LOCKS: &str = "redbaton_held_locks";
    /// Leases extended by the watchdog.
    pub const RENEWALS: &str = "redbaton_renewals_total";
    /// Watchdog renewals that extended nothing, by reason (`error`, `not_replicated`).
    pub const RENEWAL_FAILURES: &str = "redbaton_renewal_failures_total";
    /// Holds marked lost, by cause (`gone`, `expired`, `replaced`, `shutdown`).
    pub const LEASES_LOST: &str = "redbaton_leases_lost_total";
    /// Reconnections of the subscriber connection.
    pub const SUBSCRIBER_RECONNECTS: &str = "redbaton_subscriber_reconnects_total";
    /// Resubscriptions of every channel, by outcome (`ok`, `failed`).
    pub const RESUBSCRIBES: &str = "redbaton_resubscribes_total";
    /// Scripts loaded again after `NOSCRIPT`.
    pub const SCRIPT_RELOADS: &str = "redbaton_script_reloads_total";

    /// Registers the unit and a one-line description of every metric with the installed
    /// recorder (exporters show them as help texts). Optional; call it once after installing
    /// the recorder.
    pub fn describe() {
        use metrics::{describe_counter, describe_gauge, describe_histogram};
        describe_counter!(
            ACQUISITIONS,
            Unit::Count,
            "Acquire calls, by kind and outcome"
        );
        describe_histogram!(
            ACQUIRE_WAIT,
            Unit::Seconds,
            "From an acquire call to its guard"
        );
        describe_histogram!(
            HANDOFF,
            Unit::Seconds,
            "From a release by this client to the next holder among its woken waiters"
        );
        describe_gauge!(
            WAITERS,
            Unit::Count,
            "Acquire calls waiting after a refusal"
        );
        describe_gauge!(
            HELD_LOCKS,
            Unit::Count,
            "Holds registered and not known lost"
        );
        describe_counter!(RENEWALS, Unit::Count, "Leases extended by the watchdog");
        describe_counter!(
            RENEWAL_FAILURES,
            Unit::Count,
            "Watchdog renewals that extended nothing, by reason"
        );
        describe_counter!(LEASES_LOST, Unit::Count, "Holds marked lost, by cause");
        describe_counter!(
            SUBSCRIBER_RECONNECTS,
            Unit::Count,
            "Reconnections of the subscriber connection"
        );
        describe_counter!(RESUBSCRIBES, Unit::Count, "Resubscriptions, by outcome");
        describe_counter!(
            SCRIPT_RELOADS,
            Unit::Count,
            "Scripts reloaded after NOSCRIPT"
        );
    }

    /// `kind`, then `name` when the client labels names, then `extra`.
    fn labels(
        kind: &'static str,
        name: &Option<SharedString>,
        extra: Option<(&'static str, &'static str)>,
    ) -> Vec<Label> {
        let mut labels = Vec::with_capacity(3);
        labels.push(Label::from_static_parts("kind", kind));
        if let Some(name) = name {
            labels.push(Label::new("name", name.clone()));
        }
        if let Some((key, value)) = extra {
            labels.push(Label::from_static_parts(key, value));
        }
        labels
    }

    /// One client's metrics settings, and what hand-off latency needs: per lock key with
    /// waiters in this client, when a release of this client last freed it.
    #[derive(Clone)]
    pub(crate) struct ClientMetrics(Arc<ClientState>);

    struct ClientState {
        label_names: bool,
        /// Only keys with waiters: the entry goes with the last one, so it stays small.
        waited: Mutex<HashMap<Arc<str>, Waited>>,
    }

    #[derive(Default)]
    struct Waited {
        waiters: usize,
        released_at: Option<Instant>,
    }

    impl ClientMetrics {
        pub(crate) fn new(label_names: bool) -> Self {
            ClientMetrics(Arc::new(ClientState {
                label_names,
                waited: Mutex::new(HashMap::new()),
            }))
        }

        fn name(&self, name: &str) -> Option<SharedString> {
            self.0
                .label_names
                .then(|| SharedString::from(name.to_owned()))
        }

        /// A release of this client that frees the lock `key` is about to be sent.
        pub(crate) fn released(&self, key: &str) {
            if let Some(waited) = self.0.waited.lock().get_mut(key) {
                waited.released_at = Some(Instant::now());
            }
        }
    }

    /// One acquire call, from its start to its outcome.
    pub(crate) struct Acquire {
        client: ClientMetrics,
        kind: &'static str,
        name: Option<SharedString>,
        start: Instant,
        /// The key waited for, once refused.
        waiting: Option<Arc<str>>,
        finished: bool,
    }

    impl Acquire {
        pub(crate) fn start(client: &ClientMetrics, kind: &'static str, name: &str) -> Self {
            Acquire {
                client: client.clone(),
                kind,
                name: client.name(name),
                start: Instant::now(),
                waiting: None,
                finished: false,
            }
        }

        /// The call was refused and now waits for `key`.
        pub(crate) fn waiting(&mut self, key: &Arc<str>) {
            if self.waiting.is_some() {
                return;
            }
            self.client
                .0
                .waited
                .lock()
                .entry(key.clone())
                .or_default()
                .waiters += 1;
            self.waiting = Some(key.clone());
            gauge!(WAITERS, labels(self.kind, &self.name, None)).increment(1.0);
        }

        /// A re-check after a wake-up came to `acquired`: the release that woke it, if it
        /// was this client's, is consumed either way (a failed re-check means the hand-off
        /// went elsewhere).
        pub(crate) fn woken(&mut self, acquired: bool) {
            let Some(key) = &self.waiting else { return };
            let released_at = self
                .client
                .0
                .waited
                .lock()
                .get_mut(key)
                .and_then(|w| w.released_at.take());
            if let (true, Some(at)) = (acquired, released_at) {
                histogram!(HANDOFF, labels(self.kind, &self.name, None)).record(at.elapsed());
            }
        }

        /// Records the call's outcome.
        pub(crate) fn finish<T, E>(mut self, outcome: &Result<Option<T>, E>) {
            let outcome = match outcome {
                Ok(Some(_)) => {
                    let wait = self.start.elapsed();
                    histogram!(ACQUIRE_WAIT, labels(self.kind, &self.name, None)).record(wait);
                    "acquired"
                }
                Ok(None) => "timed_out",
                Err(_) => "error",
            };
            self.count(outcome);
        }

        fn count(&mut self, outcome: &'static str) {
            self.finished = true;
            let labels = labels(self.kind, &self.name, Some(("outcome", outcome)));
            counter!(ACQUISITIONS, labels).increment(1);
        }
    }

    impl Drop for Acquire {
        fn drop(&mut self) {
            if !self.finished {
                self.count("cancelled");
            }
            if let Some(key) = self.waiting.take() {
                let mut waited = self.client.0.waited.lock();
                if let Some(w) = waited.get_mut(&key) {
                    w.waiters -= 1;
                    if w.waiters == 0 {
                        waited.remove(&key);
                    }
                }
                drop(waited);
                gauge!(WAITERS, labels(self.kind, &self.name, None)).decrement(1.0);
            }
        }
    }

    /// The metrics of one hold in the registry.
    pub(crate) struct HoldMetrics {
        kind: &'static str,
        name: Option<SharedString>,
    }

    impl HoldMetrics {
        pub(crate) fn new(client: &ClientMetrics, kind: &'static str, name: &str) -> Self {
            HoldMetrics {
                kind,
                name: client.name(name),
            }
        }

        /// The hold counted as held `before` a change and `after` it.
        pub(crate) fn held(&self, before: bool, after: bool) {
            if before != after {
                let gauge = gauge!(HELD_LOCKS, labels(self.kind, &self.name, None));
                if after {
                    gauge.increment(1.0);
                } else {
                    gauge.decrement(1.0);
                }
            }
        }

        pub(crate) fn renewed(&self) {
            counter!(RENEWALS, labels(self.kind, &self.name, None)).increment(1);
        }

        pub(crate) fn renewal_failed(&self, reason: &'static str) {
            let labels = labels(self.kind, &self.name, Some(("reason", reason)));
            counter!(RENEWAL_FAILURES, labels).increment(1);
        }

        pub(crate) fn lost(&self, cause: &'static str) {
            let labels = labels(self.kind, &self.name, Some(("cause", cause)));
            counter!(LEASES_LOST, labels).increment(1);
        }
    }

    pub(crate) fn subscriber_reconnected() {
        counter!(SUBSCRIBER_RECONNECTS).increment(1);
    }

    pub(crate) fn resubscribed(ok: bool) {
        let outcome = if ok { "ok" } else { "failed" };
        counter!(RESUBSCRIBES, "outcome" => outcome).increment(1);
    }

    pub(crate) fn script_reloaded() {
        counter!(SCRIPT_RELOADS).increment(1);
    }
}

/// The same calls, doing nothing: every one is an empty inline function on a zero-sized
/// type, so the engine's calls compile away.
#[cfg(not(feature = "metrics"))]
mod recording {
    use std::sync::Arc;

    #[derive(Clone)]
    pub(crate) struct ClientMetrics;

    impl ClientMetrics {
        #[inline(always)]
        pub(crate) fn new(_label_names: bool) -> Self {
            ClientMetrics
        }

        #[inline(always)]
        pub(crate) fn released(&self, _key: &str) {}
    }

    pub(crate) struct Acquire;

    impl Acquire {
        #[inline(always)]
        pub(crate) fn start(_client: &ClientMetrics, _kind: &'static str, _name: &str) -> Self {
            Acquire
        }

        #[inline(always)]
        pub(crate) fn waiting(&mut self, _key: &Arc<str>) {}

        #[inline(always)]
        pub(crate) fn woken(&mut self, _acquired: bool) {}

        #[inline(always)]
        pub(crate) fn finish<T, E>(self, _outcome: &Result<Option<T>, E>) {}
    }

    pub(crate) struct HoldMetrics;

    impl HoldMetrics {
        #[inline(always)]
        pub(crate) fn new(_client: &ClientMetrics, _kind: &'static str, _name: &str) -> Self {
            HoldMetrics
        }

        #[inline(always)]
        pub(crate) fn held(&self, _before: bool, _after: bool) {}

        #[inline(always)]
        pub(crate) fn renewed(&self) {}

        #[inline(always)]
        pub(crate) fn renewal_failed(&self, _reason: &'static str) {}

        #[inline(always)]
        pub(crate) fn lost(&self, _cause: &'static str) {}
    }

    #[inline(always)]
    pub(crate) fn subscriber_reconnected() {}

    #[inline(always)]
    pub(crate) fn resubscribed(_ok: bool) {}

    #[inline(always)]
    pub(crate) fn script_reloaded() {}
}

#[cfg(feature = "metrics")]
pub use recording::{
    describe, ACQUIRE_WAIT, ACQUISITIONS, HANDOFF, HELD_LOCKS, LEASES_LOST, RENEWALS,
    RENEWAL_FAILURES, RESUBSCRIBES, SCRIPT_RELOADS, SUBSCRIBER_RECONNECTS, WAITERS,
};
pub(crate) use recording::{
    resubscribed, script_reloaded, subscriber_reconnected, Acquire, ClientMetrics, HoldMetrics,
};
