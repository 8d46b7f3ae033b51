//! Statistics: percentiles, units, Jain's fairness index, and what one contended run measured.

use crate::handoff::Event;

/// Nearest-rank percentile of sorted values.
pub(crate) fn pct(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub(crate) fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

pub(crate) fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// Jain's fairness index: (Σx)² / (n·Σx²); 1 = perfectly even.
pub(crate) fn jain(counts: &[u64]) -> f64 {
    let n = counts.len() as f64;
    let sum: f64 = counts.iter().map(|&c| c as f64).sum();
    let sq: f64 = counts.iter().map(|&c| (c as f64).powi(2)).sum();
    if sq == 0.0 {
        0.0
    } else {
        sum * sum / (n * sq)
    }
}

/// What one contended run measured.
pub(crate) struct ContendedResult {
    pub(crate) acquisitions: usize,
    /// Waits still pending when the scenario stopped (counted in the wait percentiles).
    pub(crate) pending: usize,
    pub(crate) acq_per_s: f64,
    pub(crate) handoff_p50_us: f64,
    pub(crate) handoff_p99_us: f64,
    /// Hand-offs measured (the sample behind the hand-off percentiles).
    pub(crate) handoff_samples: usize,
    /// Hand-off percentiles p0 (min), p1, …, p99, p100 (max) in µs: the whole distribution
    /// in 101 numbers, for the wake-up chart.
    pub(crate) handoff_pcts_us: Vec<f64>,
    pub(crate) wait_p99_ms: f64,
    pub(crate) wait_max_ms: f64,
    pub(crate) jain: f64,
    pub(crate) net_per_acq: f64,
    pub(crate) script_per_acq: f64,
    pub(crate) pubsub_conns: usize,
    pub(crate) overlaps: u64,
    /// Of the releases with another task waiting, the share the releaser itself won again.
    pub(crate) regained_pct: f64,
    /// Releases with another task waiting (the sample behind `regained_pct`).
    pub(crate) contested: usize,
}

pub(crate) fn analyse(
    events: Vec<Event>,
    tasks: usize,
    overlaps_in_process: u64,
    cmds: (f64, f64),
    pubsub_conns: usize,
) -> ContendedResult {
    let (pending, mut events): (Vec<Event>, Vec<Event>) =
        events.into_iter().partition(|e| e.acq == 0);
    events.sort_by_key(|e| e.acq);
    let mut handoffs = Vec::new();
    let mut overlaps = overlaps_in_process;
    let (mut contested, mut regained) = (0usize, 0usize);
    for pair in events.windows(2) {
        let (prev, next) = (pair[0], pair[1]);
        // Another task was already waiting when `prev` released: did the releaser win again?
        if events
            .iter()
            .any(|e| e.task != prev.task && e.call < prev.rel && e.acq > prev.rel)
        {
            contested += 1;
            if next.task == prev.task {
                regained += 1;
            }
        }
        if next.acq < prev.rel {
            overlaps += 1; // two holders at once: a mutual-exclusion violation
        } else if next.call < prev.rel {
            // The next holder was already waiting when the previous one released.
            handoffs.push(next.acq - prev.rel);
        }
    }
    handoffs.sort_unstable();
    let mut waits: Vec<u64> = events
        .iter()
        .map(|e| e.acq - e.call)
        .chain(pending.iter().map(|e| e.rel - e.call))
        .collect();
    waits.sort_unstable();
    let mut counts = vec![0u64; tasks];
    for e in &events {
        if let Some(c) = counts.get_mut(e.task as usize) {
            *c += 1;
        }
    }
    let span = match (events.first(), events.iter().map(|e| e.rel).max()) {
        (Some(first), Some(last)) => (last - first.acq).max(1),
        _ => 1,
    };
    ContendedResult {
        pending: pending.len(),
        acquisitions: events.len(),
        acq_per_s: events.len() as f64 / (span as f64 / 1e9),
        handoff_p50_us: us(pct(&handoffs, 50.0)),
        handoff_p99_us: us(pct(&handoffs, 99.0)),
        handoff_samples: handoffs.len(),
        handoff_pcts_us: (0..=100).map(|p| us(pct(&handoffs, p as f64))).collect(),
        wait_p99_ms: ms(pct(&waits, 99.0)),
        wait_max_ms: ms(waits.last().copied().unwrap_or(0)),
        jain: jain(&counts),
        net_per_acq: cmds.0,
        script_per_acq: cmds.1,
        pubsub_conns,
        overlaps,
        regained_pct: 100.0 * regained as f64 / contested.max(1) as f64,
        contested,
    }
}
