//! What the `metrics` feature records during a contention run: 16 tasks take 4 locks 50 times
//! each, holding each for 1 ms, while a recorder (metrics-util's `DebuggingRecorder`; in a
//! service, an exporter such as `metrics-exporter-prometheus`) collects what redbaton records.
//! Starts a private redis-server (or uses `REDIS_URL`).
//!
//! ```text
//! cargo run --example metrics --features metrics
//! ```

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use redbaton::Client;

#[path = "common/redis.rs"]
mod common;

const TASKS: usize = 16;
const ROUNDS: usize = 50;
const NAMES: usize = 4;
const HOLD: Duration = Duration::from_millis(1);

#[tokio::main]
async fn main() -> redbaton::Result<()> {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().expect("no other recorder installed");
    redbaton::metrics::describe();

    let redis = common::redis();
    let client = Client::builder()
        .url(&redis.url)
        // Four fixed names: few enough to label metrics with them.
        .metrics_label_names(true)
        // Renewed every 100 ms, so that renewals show in a run this short.
        .watchdog_lease(Duration::from_millis(300))
        .connect()
        .await?;

    let started = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let client = client.clone();
            tokio::spawn(async move {
                for round in 0..ROUNDS {
                    let lock = client.lock(format!("metrics:{}", (task + round) % NAMES));
                    let guard = lock.lock().await?;
                    tokio::time::sleep(HOLD).await;
                    guard.unlock().await?;
                }
                Ok::<_, redbaton::Error>(())
            })
        })
        .collect();
    // Read the recorder every 10 ms meanwhile, so the gauges' peaks show.
    let mut totals = Totals::default();
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    while !tasks.iter().all(|t| t.is_finished()) {
        tick.tick().await;
        totals.add(&snapshotter);
    }
    for task in tasks {
        task.await.expect("task")?;
    }
    let elapsed = started.elapsed();
    client.shutdown().await?;
    totals.add(&snapshotter);

    println!(
        "{TASKS} tasks x {ROUNDS} acquisitions on {NAMES} locks, {HOLD:?} hold: {:.2} s, {:.0} acquisitions/s\n",
        elapsed.as_secs_f64(),
        (TASKS * ROUNDS) as f64 / elapsed.as_secs_f64()
    );
    for (name, series) in totals.0 {
        println!("{name}");
        for (labels, value) in series {
            println!("  {{{labels}}} {value}");
        }
    }
    Ok(())
}

/// What the recorder collected, by metric name and label set.
#[derive(Default)]
struct Totals(BTreeMap<String, BTreeMap<String, Total>>);

enum Total {
    Counter(u64),
    Gauge { now: f64, peak: f64 },
    Histogram(Vec<f64>),
}

impl Totals {
    /// Adds what was recorded since the last snapshot: the debugging recorder hands out
    /// deltas (counters and gauges reset, histograms drained), and redbaton's gauges move only
    /// by increments and decrements, so the deltas add up.
    fn add(&mut self, snapshotter: &Snapshotter) {
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let labels: Vec<String> = key
                .key()
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            let series = self.0.entry(key.key().name().to_owned()).or_default();
            let total = series.entry(labels.join(","));
            match value {
                DebugValue::Counter(n) => {
                    if let Total::Counter(sum) = total.or_insert(Total::Counter(0)) {
                        *sum += n;
                    }
                }
                DebugValue::Gauge(delta) => {
                    let gauge = Total::Gauge {
                        now: 0.0,
                        peak: 0.0,
                    };
                    if let Total::Gauge { now, peak } = total.or_insert(gauge) {
                        *now += delta.into_inner();
                        *peak = peak.max(*now);
                    }
                }
                DebugValue::Histogram(samples) => {
                    if let Total::Histogram(all) = total.or_insert(Total::Histogram(Vec::new())) {
                        all.extend(samples.iter().map(|s| s.into_inner()));
                    }
                }
            }
        }
    }
}

impl std::fmt::Display for Total {
    /// A counter as its value, a gauge with its peak, a histogram of seconds as its count and
    /// quantiles in milliseconds.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Total::Counter(n) => write!(f, "{n}"),
            Total::Gauge { now, peak } => write!(f, "{now} (peak {peak})"),
            Total::Histogram(samples) if samples.is_empty() => write!(f, "no samples"),
            Total::Histogram(samples) => {
                let mut ms: Vec<f64> = samples.iter().map(|s| s * 1e3).collect();
                ms.sort_by(f64::total_cmp);
                let at = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize];
                write!(
                    f,
                    "n={} p50={:.2}ms p90={:.2}ms p99={:.2}ms max={:.2}ms",
                    ms.len(),
                    at(0.5),
                    at(0.9),
                    at(0.99),
                    at(1.0)
                )
            }
        }
    }
}
