//! The `metrics` feature against a real redis-server: what each metric records, exactly.
//!
//! Each test installs its own recorder for its thread only (tests run in parallel in one
//! process), and runs on tokio's current-thread runtime, so every task of the client —
//! watchdog, hub, background releases — records on that thread, into that recorder.
#![cfg(feature = "metrics")]

use testkit as support;

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Duration;

use metrics::LocalRecorderGuard;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use redbaton::{metrics as m, Client, Error};
use support::{command, command_calls, eventually, RedisServer};

type Labels = Vec<(String, String)>;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    let mut labels: Labels = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    labels.sort();
    labels
}

/// A recorder for this thread, read back by name and exact label set.
struct Recorded {
    snapshotter: Snapshotter,
    /// A snapshot takes what was recorded since the last one (counters and gauges are reset,
    /// histograms drained): the totals are kept here. Gauges only ever move by increments
    /// and decrements, so their deltas add up too.
    totals: RefCell<HashMap<(String, Labels), Value>>,
    _local: LocalRecorderGuard<'static>,
}

#[derive(Clone, Debug)]
enum Value {
    Counter(u64),
    Gauge(f64),
    Histogram(Vec<f64>),
}

impl Recorded {
    fn install() -> Recorded {
        // Leaked: the thread-local guard borrows it for the rest of the test.
        let recorder: &'static DebuggingRecorder = Box::leak(Box::new(DebuggingRecorder::new()));
        Recorded {
            snapshotter: recorder.snapshotter(),
            totals: RefCell::default(),
            _local: metrics::set_default_local_recorder(recorder),
        }
    }

    /// Everything recorded so far.
    fn read(&self) -> HashMap<(String, Labels), Value> {
        let mut totals = self.totals.borrow_mut();
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            let name = key.key().name().to_owned();
            let mut label_set: Labels = key
                .key()
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            label_set.sort();
            let total = totals.entry((name, label_set));
            match value {
                DebugValue::Counter(n) => {
                    let total = total.or_insert(Value::Counter(0));
                    if let Value::Counter(sum) = total {
                        *sum += n;
                    }
                }
                DebugValue::Gauge(g) => {
                    let total = total.or_insert(Value::Gauge(0.0));
                    if let Value::Gauge(sum) = total {
                        *sum += g.into_inner();
                    }
                }
                DebugValue::Histogram(samples) => {
                    let total = total.or_insert(Value::Histogram(Vec::new()));
                    if let Value::Histogram(all) = total {
                        all.extend(samples.into_iter().map(|s| s.into_inner()));
                    }
                }
            }
        }
        totals.clone()
    }

    fn find(&self, name: &str, pairs: &[(&str, &str)]) -> Option<Value> {
        self.read().remove(&(name.to_owned(), labels(pairs)))
    }

    fn counter(&self, name: &str, pairs: &[(&str, &str)]) -> u64 {
        match self.find(name, pairs) {
            Some(Value::Counter(n)) => n,
            None => 0,
            other => panic!("{name} is not a counter: {other:?}"),
        }
    }

    fn gauge(&self, name: &str, pairs: &[(&str, &str)]) -> f64 {
        match self.find(name, pairs) {
            Some(Value::Gauge(g)) => g,
            None => 0.0,
            other => panic!("{name} is not a gauge: {other:?}"),
        }
    }

    fn histogram(&self, name: &str, pairs: &[(&str, &str)]) -> Vec<f64> {
        match self.find(name, pairs) {
            Some(Value::Histogram(samples)) => samples,
            None => Vec::new(),
            other => panic!("{name} is not a histogram: {other:?}"),
        }
    }

    /// Every metric's name and label set.
    fn label_sets(&self) -> Vec<(String, Labels)> {
        self.read().into_keys().collect()
    }
}

const LOCK: (&str, &str) = ("kind", "lock");

async fn client_with(server: &RedisServer, lease: Duration, label_names: bool) -> Client {
    Client::builder()
        .url(server.url())
        .watchdog_lease(lease)
        .metrics_label_names(label_names)
        .connect()
        .await
        .unwrap()
}

#[tokio::test]
async fn acquisitions_wait_times_and_held_locks_are_counted() {
    let metrics = Recorded::install();
    m::describe();
    let server = RedisServer::start();
    let client = client_with(&server, Duration::from_secs(30), false).await;
    let lock = client.lock("m:count");
    for _ in 0..5 {
        let guard = lock.lock().await.unwrap();
        assert_eq!(metrics.gauge(m::HELD_LOCKS, &[LOCK]), 1.0);
        guard.unlock().await.unwrap();
        assert_eq!(metrics.gauge(m::HELD_LOCKS, &[LOCK]), 0.0);
    }
    // A re-entered lock is one hold.
    let outer = lock.lock().await.unwrap();
    let inner = outer.reenter().await.unwrap();
    assert_eq!(metrics.gauge(m::HELD_LOCKS, &[LOCK]), 1.0);
    inner.unlock().await.unwrap();
    assert_eq!(metrics.gauge(m::HELD_LOCKS, &[LOCK]), 1.0);
    // Another kind, labelled as such.
    let fenced = client.fenced_lock("m:fenced").lock().await.unwrap();
    let fenced_kind = [("kind", "fenced_lock")];
    assert_eq!(metrics.gauge(m::HELD_LOCKS, &fenced_kind), 1.0);
    outer.unlock().await.unwrap();
    fenced.unlock().await.unwrap();

    let acquired = [LOCK, ("outcome", "acquired")];
    assert_eq!(metrics.counter(m::ACQUISITIONS, &acquired), 7);
    assert_eq!(
        metrics.counter(m::ACQUISITIONS, &[fenced_kind[0], ("outcome", "acquired")]),
        1
    );
    let waits = metrics.histogram(m::ACQUIRE_WAIT, &[LOCK]);
    assert_eq!(waits.len(), 7, "one wait time per acquisition: {waits:?}");
    assert!(waits.iter().all(|w| (0.0..5.0).contains(w)), "{waits:?}");
    assert_eq!(metrics.gauge(m::HELD_LOCKS, &[LOCK]), 0.0);
    assert_eq!(metrics.gauge(m::HELD_LOCKS, &fenced_kind), 0.0);
    assert_eq!(metrics.gauge(m::WAITERS, &[LOCK]), 0.0);
    // Nobody waited, so no hand-off; no name label unless asked for.
    assert!(metrics.histogram(m::HANDOFF, &[LOCK]).is_empty());
    for (name, labels) in metrics.label_sets() {
        assert!(
            labels.iter().all(|(k, _)| k != "name"),
            "{name} {labels:?} has a name label"
        );
    }
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn refusals_errors_and_dropped_waits_have_their_outcomes() {
    let metrics = Recorded::install();
    let server = RedisServer::start();
    let client = client_with(&server, Duration::from_secs(30), false).await;
    let held = client.lock("m:busy").lock().await.unwrap();

    let other = client.lock("m:busy");
    let refused = tokio::spawn(async move {
        let once = other.try_lock().await.unwrap();
        let briefly = other.try_lock_for(Duration::from_millis(50)).await.unwrap();
        (once.is_none(), briefly.is_none())
    })
    .await
    .unwrap();
    assert_eq!(refused, (true, true));
    assert_eq!(
        metrics.counter(m::ACQUISITIONS, &[LOCK, ("outcome", "timed_out")]),
        2
    );

    // A key of another type: the call fails.
    let raw = server.raw().await;
    command(&raw, "SET", vec!["m:string".into(), "x".into()]).await;
    let wrong = client.lock("m:string").try_lock().await;
    assert!(matches!(wrong, Err(Error::WrongType { .. })), "{wrong:?}");
    assert_eq!(
        metrics.counter(m::ACQUISITIONS, &[LOCK, ("outcome", "error")]),
        1
    );

    // A wait dropped by its caller: cancelled, and no longer a waiter.
    let other = client.lock("m:busy");
    let dropped = tokio::spawn(async move {
        tokio::time::timeout(Duration::from_millis(300), other.lock())
            .await
            .is_err()
    })
    .await
    .unwrap();
    assert!(dropped);
    assert_eq!(
        metrics.counter(m::ACQUISITIONS, &[LOCK, ("outcome", "cancelled")]),
        1
    );
    assert_eq!(metrics.gauge(m::WAITERS, &[LOCK]), 0.0);
    assert_eq!(
        metrics.counter(m::ACQUISITIONS, &[LOCK, ("outcome", "acquired")]),
        1,
        "only the holder acquired"
    );
    held.unlock().await.unwrap();
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_parked_waiter_is_gauged_and_its_handoff_timed() {
    let metrics = Recorded::install();
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client_with(&server, Duration::from_secs(30), false).await;
    let held = client.lock("m:handoff").lock().await.unwrap();
    let evalsha_before = command_calls(&raw).await.get("evalsha").copied();

    let waiter = support::spawn_waiter(client.lock("m:handoff"));
    // Parked: registered as a waiter, and done with its attempt and its re-check after the
    // subscription, so the next attempt is the one the release wakes.
    assert!(
        eventually(Duration::from_secs(10), || async {
            let evalsha = command_calls(&raw).await.get("evalsha").copied();
            metrics.gauge(m::WAITERS, &[LOCK]) == 1.0
                && evalsha.unwrap_or(0) >= evalsha_before.unwrap_or(0) + 2
        })
        .await,
        "the waiter parks"
    );
    assert_eq!(metrics.gauge(m::WAITERS, &[LOCK]), 1.0);
    tokio::time::sleep(Duration::from_millis(100)).await; // a wait long enough to measure
    held.unlock().await.unwrap();
    waiter.await.unwrap();

    assert_eq!(metrics.gauge(m::WAITERS, &[LOCK]), 0.0);
    assert_eq!(metrics.gauge(m::HELD_LOCKS, &[LOCK]), 0.0);
    assert_eq!(
        metrics.counter(m::ACQUISITIONS, &[LOCK, ("outcome", "acquired")]),
        2
    );
    let handoffs = metrics.histogram(m::HANDOFF, &[LOCK]);
    assert_eq!(handoffs.len(), 1, "one release handed to one waiter");
    assert!(handoffs[0] > 0.0 && handoffs[0] < 5.0, "{handoffs:?}");
    let mut waits = metrics.histogram(m::ACQUIRE_WAIT, &[LOCK]);
    waits.sort_by(f64::total_cmp);
    assert_eq!(waits.len(), 2);
    assert!(waits[1] >= 0.1, "the waiter waited: {waits:?}");
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_watchdog_counts_renewals() {
    let metrics = Recorded::install();
    let server = RedisServer::start();
    // Renewed every 500 ms: a lease a loaded machine's scheduling delays cannot outlast (with
    // 300 ms, a CI run lost the hold between two renewals and counted fewer than three).
    let client = client_with(&server, Duration::from_millis(1500), false).await;
    let guard = client.lock("m:renewed").lock().await.unwrap();
    assert!(
        eventually(Duration::from_secs(20), || async {
            metrics.counter(m::RENEWALS, &[LOCK]) >= 3
        })
        .await,
        "renewals are counted: {} counted, the guard lost: {}",
        metrics.counter(m::RENEWALS, &[LOCK]),
        guard.is_lost()
    );
    assert!(!guard.is_lost());
    guard.unlock().await.unwrap();
    let failures: u64 = ["error", "not_replicated"]
        .iter()
        .map(|r| metrics.counter(m::RENEWAL_FAILURES, &[LOCK, ("reason", r)]))
        .sum();
    assert_eq!(failures, 0);
    assert_eq!(metrics.gauge(m::HELD_LOCKS, &[LOCK]), 0.0);
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn lost_leases_are_counted_by_cause() {
    let metrics = Recorded::install();
    let server = RedisServer::start();
    let client = client_with(&server, Duration::from_millis(300), false).await;
    let lost = |cause| metrics.counter(m::LEASES_LOST, &[LOCK, ("cause", cause)]);

    // Force-unlocked elsewhere: the next renewal finds it gone.
    let guard = client.lock("m:gone").lock().await.unwrap();
    let breaker = client_with(&server, Duration::from_secs(30), false).await;
    assert!(breaker.lock("m:gone").force_unlock().await.unwrap());
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the lease is lost");
    assert_eq!(lost("gone"), 1);
    assert_eq!(metrics.gauge(m::HELD_LOCKS, &[LOCK]), 0.0);
    assert!(matches!(guard.unlock().await, Err(Error::NotHeld { .. })));
    assert_eq!(
        lost("gone"),
        1,
        "an unlock of a lost hold does not count it again"
    );

    // A fixed lease that runs out: Redis or the local clock ends it, whichever is first.
    let guard = client
        .lock("m:fixed")
        .lock_with_lease(Duration::from_millis(150))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the lease ends");
    assert!(
        eventually(Duration::from_secs(5), || async {
            lost("gone") + lost("expired") == 2
        })
        .await
    );
    assert_eq!(metrics.gauge(m::HELD_LOCKS, &[LOCK]), 0.0);
    drop(guard);

    // Shut down while holding.
    let held = client.lock("m:at-shutdown").lock().await.unwrap();
    assert_eq!(metrics.gauge(m::HELD_LOCKS, &[LOCK]), 1.0);
    client.shutdown().await.unwrap();
    assert!(held.is_lost());
    assert_eq!(lost("shutdown"), 1);
    assert_eq!(lost("gone") + lost("expired"), 2);
    assert_eq!(lost("replaced"), 0);
    assert_eq!(metrics.gauge(m::HELD_LOCKS, &[LOCK]), 0.0);
    breaker.shutdown().await.unwrap();
}

#[tokio::test]
async fn lock_names_are_labels_only_when_asked_for() {
    let metrics = Recorded::install();
    let server = RedisServer::start();
    let unnamed = client_with(&server, Duration::from_secs(30), false).await;
    let named = client_with(&server, Duration::from_secs(30), true).await;

    unnamed
        .lock("m:anonymous")
        .lock()
        .await
        .unwrap()
        .unlock()
        .await
        .unwrap();
    let guard = named.lock("m:named").lock().await.unwrap();
    let with_name = [LOCK, ("name", "m:named")];
    assert_eq!(metrics.gauge(m::HELD_LOCKS, &with_name), 1.0);
    guard.unlock().await.unwrap();

    assert_eq!(
        metrics.counter(
            m::ACQUISITIONS,
            &[LOCK, ("name", "m:named"), ("outcome", "acquired")]
        ),
        1
    );
    assert_eq!(metrics.histogram(m::ACQUIRE_WAIT, &with_name).len(), 1);
    assert_eq!(
        metrics.counter(m::ACQUISITIONS, &[LOCK, ("outcome", "acquired")]),
        1,
        "the default client's acquisition carries no name"
    );
    let names: Vec<String> = metrics
        .label_sets()
        .into_iter()
        .flat_map(|(_, labels)| labels)
        .filter(|(k, _)| k == "name")
        .map(|(_, v)| v)
        .collect();
    assert!(!names.is_empty());
    assert!(names.iter().all(|n| n == "m:named"), "{names:?}");
    unnamed.shutdown().await.unwrap();
    named.shutdown().await.unwrap();
}

#[tokio::test]
async fn script_reloads_and_resubscriptions_are_counted() {
    let metrics = Recorded::install();
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client_with(&server, Duration::from_secs(30), false).await;

    let _ = command(&raw, "SCRIPT", vec!["FLUSH".into()]).await;
    let guard = client.lock("m:reload").lock().await.unwrap();
    assert_eq!(
        metrics.counter(m::SCRIPT_RELOADS, &[]),
        1,
        "the acquire script"
    );
    guard.unlock().await.unwrap();
    assert_eq!(
        metrics.counter(m::SCRIPT_RELOADS, &[]),
        2,
        "and the release script"
    );
    client
        .lock("m:reload")
        .lock()
        .await
        .unwrap()
        .unlock()
        .await
        .unwrap();
    assert_eq!(
        metrics.counter(m::SCRIPT_RELOADS, &[]),
        2,
        "both are cached again"
    );

    // The subscriber connection is a pub/sub one only while something is subscribed.
    let held = client.lock("m:resubscribe").lock().await.unwrap();
    let waiter = support::spawn_waiter(client.lock("m:resubscribe"));
    assert!(
        eventually(Duration::from_secs(10), || async {
            support::numsub(&raw, "redisson_lock__channel:{m:resubscribe}").await == 1
        })
        .await
    );
    assert_eq!(metrics.counter(m::SUBSCRIBER_RECONNECTS, &[]), 0);
    support::kill_pubsub_connections(&raw).await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            metrics.counter(m::RESUBSCRIBES, &[("outcome", "ok")]) >= 1
        })
        .await,
        "the hub resubscribes"
    );
    assert_eq!(metrics.counter(m::SUBSCRIBER_RECONNECTS, &[]), 1);
    assert_eq!(metrics.counter(m::RESUBSCRIBES, &[("outcome", "ok")]), 1);
    held.unlock().await.unwrap();
    waiter.await.unwrap();
    client.shutdown().await.unwrap();
}
