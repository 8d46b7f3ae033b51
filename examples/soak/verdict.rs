//! The verdict: the merged histories and the guarded counters checked (mutual exclusion,
//! fence order, lost updates), and the summary printed.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use fred::interfaces::{HashesInterface, KeysInterface};

use crate::faults::{Fault, FaultKind};
use crate::history::{judge_history, Section};
use crate::record::{counter_key, fence_key, names, since, Record, WriteOutcome};
use crate::{Opts, TopologyKind};

/// What the merged history and the counters showed.
#[derive(Default)]
pub(crate) struct Report {
    pub(crate) sections: usize,
    pub(crate) checked: u64,
    /// Sections told lost part-way, checked for overlap up to when they were told.
    pub(crate) checked_until_told: u64,
    pub(crate) lost: usize,
    pub(crate) overlaps: usize,
    pub(crate) fence_disorders: usize,
    pub(crate) lost_updates: u64,
    pub(crate) accepted: u64,
    pub(crate) acknowledged: u64,
    pub(crate) valid_writes: u64,
    pub(crate) stale_rejected_lost: u64,
    pub(crate) stale_rejected_valid: u64,
    pub(crate) rejected_by_valid: u64,
    pub(crate) counter_total: u64,
    pub(crate) valid_accepted: u64,
    pub(crate) violations: Violations,
}

/// Violations by kind.
#[derive(Default)]
pub(crate) struct Violations(pub(crate) BTreeMap<&'static str, Vec<String>>);

impl Violations {
    pub(crate) fn add(&mut self, kind: &'static str, detail: String) {
        self.0.entry(kind).or_default().push(detail);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn print(&self) {
        let total: usize = self.0.values().map(Vec::len).sum();
        println!("FAIL: {total} violations");
        for (kind, details) in &self.0 {
            println!("  {kind}: {}", details.len());
            for d in details.iter().take(8) {
                println!("    - {d}");
            }
            if details.len() > 8 {
                println!("    ... and {} more", details.len() - 8);
            }
        }
    }
}

pub(crate) async fn check(
    raw: &fred::clients::Client,
    names: &[&str],
    records: &[Record],
    counters: &BTreeMap<String, u64>,
    epoch: u64,
) -> Result<Report, String> {
    let mut report = Report {
        sections: records.len(),
        lost: records.iter().filter(|r| r.lost()).count(),
        ..Report::default()
    };
    for (n, name) in names.iter().enumerate() {
        let mine: Vec<&Record> = records.iter().filter(|r| r.name == n).collect();
        let sections: Vec<Section> = mine
            .iter()
            .map(|r| Section {
                name: n,
                start: since(epoch, r.start_ns),
                end: since(epoch, r.end_ns),
                fence: r.fence,
                lost_at: r.lost_ns.map(|ns| since(epoch, ns)),
            })
            .collect();
        let verdict = judge_history(name, &sections.iter().collect::<Vec<_>>());
        report.checked += verdict.checked as u64;
        report.checked_until_told += verdict.checked_until_told as u64;
        report.overlaps += verdict.overlaps.len();
        report.fence_disorders += verdict.fence_disorders.len();
        for overlap in verdict.overlaps {
            report.violations.add("overlap", overlap);
        }
        for disorder in verdict.fence_disorders {
            report.violations.add("fencing out of order", disorder);
        }

        // The guarded counter: every acknowledged accepted write is in it, nothing else is.
        let hash: HashMap<String, i64> = raw
            .hgetall(counter_key(name))
            .await
            .map_err(|e| format!("read {}: {e}", counter_key(name)))?;
        let issued: Option<i64> = raw
            .get(fence_key(name))
            .await
            .map_err(|e| format!("read {}: {e}", fence_key(name)))?;
        let state = CounterState {
            value: hash.get("value").copied().unwrap_or(0) as u64,
            accepted: hash.get("accepted").copied().unwrap_or(0) as u64,
            issued: issued.unwrap_or(0),
        };
        judge_counter(name, &mine, &state, &mut report);
    }
    for (label, what) in [
        ("tasks unfinished", "tasks did not finish"),
        ("task panicked", "tasks panicked"),
        (
            "phantom hold count",
            "fresh acquisitions found their owner already counted in Redis: a hold nobody \
             knows about (invariants 6, 11 of docs/DESIGN.md; see worker logs)",
        ),
        (
            "stray holds",
            "holds stayed after every task released (see worker logs)",
        ),
    ] {
        if let Some(&n) = counters.get(label).filter(|&&n| n > 0) {
            report.violations.add(label, format!("{n} {what}"));
        }
    }
    Ok(report)
}

/// What Redis holds for one name's guarded counter at the end.
pub(crate) struct CounterState {
    /// The counter's value.
    pub(crate) value: u64,
    /// Writes the compare-and-set script accepted.
    pub(crate) accepted: u64,
    /// The fencing counter: the newest fence issued.
    pub(crate) issued: i64,
}

/// Checks one name's guarded counter against the writes its sections saw: no lost update,
/// nothing written that nobody sent, and a valid section's write rejected only by the newer
/// fence of a holder whose lease was lost.
pub(crate) fn judge_counter(
    name: &str,
    mine: &[&Record],
    state: &CounterState,
    report: &mut Report,
) {
    let &CounterState {
        value,
        accepted,
        issued,
    } = state;
    let count = |w: WriteOutcome| mine.iter().filter(|r| r.write == w).count() as u64;
    let acknowledged = count(WriteOutcome::Accepted);
    let unknown = count(WriteOutcome::Unknown);
    report.accepted += accepted;
    report.counter_total += value;
    report.acknowledged += acknowledged;
    let lost_updates = acknowledged.max(accepted).saturating_sub(value);
    report.lost_updates += lost_updates;
    if lost_updates > 0 {
        report.violations.add(
            "lost update",
            format!(
                "{name}: {lost_updates} lost updates (counter {value}, {accepted} writes \
                 accepted, {acknowledged} acknowledged)"
            ),
        );
    }
    if value > acknowledged + unknown || value != accepted {
        report.violations.add(
            "counter mismatch",
            format!(
                "{name}: counter {value} does not match its writes ({accepted} accepted by \
                 the script, {acknowledged} acknowledged, {unknown} unanswered)"
            ),
        );
    }
    let ahead = count(WriteOutcome::Ahead);
    if ahead > 0 {
        report.violations.add(
            "fence ahead of its counter",
            format!(
                "{name}: {ahead} writes carried a fence ahead of the fencing counter (data lost)"
            ),
        );
    }
    let highest = mine.iter().filter_map(|r| r.fence).max().unwrap_or(0);
    if issued < highest {
        report.violations.add(
            "fencing counter behind",
            format!("{name}: fencing counter {issued} is behind a fence handed out ({highest})"),
        );
    }

    // Rejected writes. A valid section's write may be rejected only because a holder
    // whose lease was lost (or whose INCR got no reply) took a newer fence meanwhile; a
    // newer fence of another valid section means two valid holders at once.
    let by_fence: HashMap<i64, &Record> = mine
        .iter()
        .filter_map(|r| r.fence.map(|f| (f, *r)))
        .collect();
    for r in mine {
        if !r.lost() && r.write != WriteOutcome::NotSent {
            report.valid_writes += 1;
            if r.write == WriteOutcome::Accepted {
                report.valid_accepted += 1;
            }
        }
        if r.write != WriteOutcome::Rejected {
            continue;
        }
        if r.lost() {
            report.stale_rejected_lost += 1;
            continue;
        }
        match by_fence.get(&r.newest) {
            Some(blocker) if !blocker.lost() => {
                report.rejected_by_valid += 1;
                report.violations.add(
                    "valid write rejected by another valid holder",
                    format!(
                        "{name}: a valid section's write (fence {:?}, worker {} task {}) was \
                         rejected by fence {} of another valid section (worker {} task {})",
                        r.fence, r.worker, r.task, r.newest, blocker.worker, blocker.task
                    ),
                );
            }
            _ => report.stale_rejected_valid += 1,
        }
    }
}

pub(crate) struct Summary<'a> {
    pub(crate) report: &'a Report,
    pub(crate) counters: &'a BTreeMap<String, u64>,
    pub(crate) faults: &'a [Fault],
    pub(crate) records: &'a [Record],
    pub(crate) epoch: u64,
    pub(crate) faults_started_ns: u64,
    pub(crate) stop_ns: u64,
    pub(crate) run_time: Duration,
    pub(crate) opts: &'a Opts,
    pub(crate) seed: u64,
    pub(crate) reached: bool,
}

pub(crate) fn percentile(sorted: &[u64], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    Duration::from_nanos(sorted[i])
}

pub(crate) fn ms(d: Duration) -> String {
    if d >= Duration::from_secs(1) {
        format!("{:.2} s", d.as_secs_f64())
    } else {
        format!("{:.1} ms", d.as_secs_f64() * 1000.0)
    }
}

pub(crate) fn print_summary(s: &Summary) {
    let r = s.report;
    let get = |k: &str| s.counters.get(k).copied().unwrap_or(0);
    println!();
    println!("=== redbaton soak summary (seed {}) ===", s.seed);
    println!(
        "setup                  {} processes x {} tasks (+ {} Java Redisson processes), names \
         {:?}, watchdog lease {} ms, command timeout {} ms, calls {}",
        s.opts.processes,
        s.opts.tasks,
        s.opts.java,
        names(s.opts.java > 0, s.opts.names),
        s.opts.lease_ms,
        s.opts.command_timeout_ms,
        s.opts.calls
    );
    println!(
        "acquisitions checked   {} (target {}{}); {} sections recorded, {} with the lease lost \
         ({} of them checked until told)",
        r.checked,
        s.opts.acquisitions,
        if s.reached {
            ", reached"
        } else {
            ", NOT reached"
        },
        r.sections,
        r.lost,
        r.checked_until_told
    );
    let acquired: Vec<String> = s
        .counters
        .iter()
        .filter_map(|(k, v)| k.strip_prefix("acquired: ").map(|op| format!("{op} {v}")))
        .collect();
    println!("acquired by call       {}", acquired.join(", "));
    let mut by_kind: BTreeMap<FaultKind, (usize, usize)> = BTreeMap::new();
    for f in s.faults {
        let e = by_kind.entry(f.kind).or_default();
        if f.ok {
            e.0 += 1;
        } else {
            e.1 += 1;
        }
    }
    let kinds: Vec<String> = by_kind
        .iter()
        .map(|(k, (ok, failed))| {
            if *failed > 0 {
                format!("{} {ok} (+{failed} failed)", k.label())
            } else {
                format!("{} {ok}", k.label())
            }
        })
        .collect();
    println!(
        "faults injected        {} ({})",
        s.faults.iter().filter(|f| f.ok).count(),
        if kinds.is_empty() {
            "none".to_owned()
        } else {
            kinds.join(", ")
        }
    );
    let longest_stall = s
        .faults
        .iter()
        .filter(|f| f.kind == FaultKind::ProxyStall)
        .map(|f| f.length)
        .max()
        .unwrap_or_default();
    let restarts: Vec<Duration> = s
        .faults
        .iter()
        .filter(|f| f.kind == FaultKind::Restart)
        .map(|f| f.length)
        .collect();
    if !s.faults.is_empty() {
        println!(
            "fault lengths          proxy stall up to {}, server restart (kill to serving) up to {}",
            ms(longest_stall),
            ms(restarts.iter().max().copied().unwrap_or_default())
        );
    }
    if s.opts.topology != TopologyKind::Standalone {
        let promotions: Vec<Duration> = s
            .faults
            .iter()
            .filter(|f| f.kind == FaultKind::Failover)
            .map(|f| f.length)
            .collect();
        println!(
            "failovers              {} on {:?} (kill to promotion up to {}), replica sync {}",
            promotions.len(),
            s.opts.topology,
            ms(promotions.iter().max().copied().unwrap_or_default()),
            s.opts.replica_sync
        );
        println!(
            "not replicated         {} acquires refused, {} re-entries refused (undone; no guard)",
            get("acquire error: NotReplicated"),
            get("re-enter error: NotReplicated")
        );
    }
    println!("overlaps               {}", r.overlaps);
    println!("fencing out of order   {}", r.fence_disorders);
    println!(
        "lost updates           {} (guarded counters total {}: {} writes accepted, {} of them \
         acknowledged to their writer)",
        r.lost_updates, r.counter_total, r.accepted, r.acknowledged
    );
    println!(
        "rejected stale writes  {} (from sections whose lease was lost {}; from valid sections \
         pre-empted by the later fence of a lost holder {}; by another valid holder {})",
        r.stale_rejected_lost + r.stale_rejected_valid,
        r.stale_rejected_lost,
        r.stale_rejected_valid,
        r.rejected_by_valid
    );
    println!(
        "valid-section writes   {} ({} accepted)",
        r.valid_writes, r.valid_accepted
    );
    println!("lost leases            {}", r.lost);
    let waits = |proxied: Option<bool>| {
        let mut waits: Vec<u64> = s
            .records
            .iter()
            .filter(|r| r.wait_ns > 0 && proxied.is_none_or(|p| r.proxied == p))
            .map(|r| r.wait_ns)
            .collect();
        waits.sort_unstable();
        format!(
            "p50 {}, p99 {}, max {}",
            ms(percentile(&waits, 0.50)),
            ms(percentile(&waits, 0.99)),
            ms(percentile(&waits, 1.0))
        )
    };
    println!("acquire wait           {}", waits(None));
    println!(
        "  direct / via proxy   {} / {}",
        waits(Some(false)),
        waits(Some(true))
    );
    if let Some(longest) = s.records.iter().max_by_key(|r| r.wait_ns) {
        println!(
            "  longest              {} by {} (worker {} task {}, {}), section at +{:.1} s",
            ms(Duration::from_nanos(longest.wait_ns)),
            longest.op,
            longest.worker,
            longest.task,
            if longest.proxied {
                "via proxy"
            } else {
                "direct"
            },
            since(s.epoch, longest.start_ns).as_secs_f64()
        );
    }
    // The longest time with no acquisition at all, while the faults ran.
    let mut starts: Vec<u64> = s
        .records
        .iter()
        .map(|r| r.start_ns)
        .filter(|&t| t >= s.faults_started_ns && t <= s.stop_ns)
        .collect();
    starts.push(s.faults_started_ns);
    starts.push(s.stop_ns);
    starts.sort_unstable();
    let (gap, gap_at) = starts
        .windows(2)
        .map(|w| (w[1] - w[0], w[0]))
        .max()
        .unwrap_or((0, s.faults_started_ns));
    let cause = s
        .faults
        .iter()
        .rev()
        .find(|f| f.at_ns <= gap_at + gap && f.at_ns + 5_000_000_000 >= gap_at)
        .map(|f| {
            format!(
                " (around {} of {} at +{:.1} s)",
                f.kind.label(),
                ms(f.length),
                since(s.epoch, f.at_ns).as_secs_f64()
            )
        })
        .unwrap_or_default();
    println!(
        "longest stall          {} at +{:.1} s{cause}",
        ms(Duration::from_nanos(gap)),
        since(s.epoch, gap_at).as_secs_f64()
    );
    println!(
        "tasks                  {} finished of {}",
        get("tasks") - get("tasks unfinished"),
        get("tasks")
    );
    println!(
        "try calls that missed  {}; stray holds {}; phantom hold counts {} (counts of 2 that \
         fell back to 1: a timed-out acquire of the task released late {})",
        get("try missed"),
        get("stray holds"),
        get("phantom hold count"),
        get("late release of a timed-out acquire")
    );
    let errors: Vec<String> = s
        .counters
        .iter()
        .filter(|(k, _)| {
            k.contains("error") || k.starts_with("unlock:") || k.starts_with("sabotaged")
        })
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    if !errors.is_empty() {
        println!("errors (expected under faults):");
        for e in errors {
            println!("                       {e}");
        }
    }
    println!(
        "run time               {:.1} s ({:.0} checked acquisitions/s)",
        s.run_time.as_secs_f64(),
        r.checked as f64 / s.run_time.as_secs_f64()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(fence: i64, lost: bool, write: WriteOutcome, newest: i64) -> Record {
        Record {
            name: 0,
            start_ns: fence as u64 * 10,
            end_ns: fence as u64 * 10 + 5,
            fence: Some(fence),
            lost_ns: lost.then_some(fence as u64 * 10 + 1),
            write,
            newest,
            wait_ns: 1,
            op: "lock".into(),
            proxied: false,
            worker: 0,
            task: fence as usize,
        }
    }

    fn judge(records: &[Record], value: u64, accepted: u64, issued: i64) -> Report {
        let mut report = Report::default();
        let mine: Vec<&Record> = records.iter().collect();
        let state = CounterState {
            value,
            accepted,
            issued,
        };
        judge_counter("x", &mine, &state, &mut report);
        report
    }

    use WriteOutcome::*;

    #[test]
    fn a_clean_counter_passes() {
        let records = [record(1, false, Accepted, 1), record(2, false, Accepted, 2)];
        let report = judge(&records, 2, 2, 2);
        assert!(report.violations.is_empty());
        assert_eq!((report.valid_writes, report.valid_accepted), (2, 2));
    }

    #[test]
    fn an_acknowledged_write_missing_from_the_counter_is_a_lost_update() {
        let records = [record(1, false, Accepted, 1), record(2, false, Accepted, 2)];
        let report = judge(&records, 1, 1, 2);
        assert_eq!(report.lost_updates, 1);
        assert!(report.violations.0.contains_key("lost update"));
    }

    #[test]
    fn a_counter_ahead_of_its_writes_is_refused() {
        let records = [record(1, false, Accepted, 1)];
        let report = judge(&records, 2, 2, 1);
        assert!(report.violations.0.contains_key("counter mismatch"));
    }

    #[test]
    fn a_stale_holders_later_fence_explains_a_rejection() {
        // Fence 3's holder stalled and lost its lease; its late INCR beat fence 2's write.
        let records = [
            record(2, false, Rejected, 3),
            record(3, true, Accepted, 3),
            record(1, true, Rejected, 3),
        ];
        let report = judge(&records, 1, 1, 3);
        assert!(report.violations.is_empty(), "{:?}", report.violations.0);
        assert_eq!(
            (report.stale_rejected_valid, report.stale_rejected_lost),
            (1, 1)
        );
    }

    #[test]
    fn a_rejection_by_another_valid_holder_is_a_violation() {
        let records = [record(2, false, Rejected, 3), record(3, false, Accepted, 3)];
        let report = judge(&records, 1, 1, 3);
        assert_eq!(report.rejected_by_valid, 1);
        assert!(report
            .violations
            .0
            .contains_key("valid write rejected by another valid holder"));
    }

    #[test]
    fn fences_beyond_the_fencing_counter_mean_lost_data() {
        let records = [record(5, false, Ahead, 4)];
        let report = judge(&records, 0, 0, 4);
        assert!(report
            .violations
            .0
            .contains_key("fence ahead of its counter"));
        assert!(report.violations.0.contains_key("fencing counter behind"));
    }
}
