//! The verdict: the merged histories and the guarded counters checked (mutual exclusion,
//! fence order, lost updates), and the summary printed.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use fred::interfaces::{HashesInterface, KeysInterface};

use crate::faults::{Fault, FaultKind};
use crate::history::{judge_history, Section};
use crate::record::{counter_key, fence_key, names, since, Record, WriteOutcome};
use crate::worker::Forced;
use crate::{Opts, TopologyKind};

/// How long after a force-unlock's reply a section under the field of a hold it struck may
/// begin and still count as struck: the run of hand-offs in memory that hold was in ends when
/// the unlock message reaches its client (invariant 16, docs/DESIGN.md), at the latest at the
/// run's own 50 ms bound; the rest is a loaded machine's delay between a hand-off and its
/// section's first instant, which is all the history records. A section under another field
/// is a hold of its own and must exclude the force's.
pub(crate) const RUN_AFTER_FORCE: Duration = Duration::from_millis(250);

/// Marks lost from the force on the sections a force-unlock struck, as breaking the current
/// holder is what a force-unlock is for: the section running across the force (or whose
/// holder was told, or whose release found the hold gone, after it), and the rest of that
/// hold's run of hand-offs in memory under the same owner field (see [`RUN_AFTER_FORCE`]).
/// Every other section must exclude the others as usual. Returns how many were struck.
pub(crate) fn strike(records: &mut [Record], forced: &[Forced]) -> usize {
    let after = RUN_AFTER_FORCE.as_nanos() as u64;
    let mut struck: Vec<Option<u64>> = vec![None; records.len()];
    for f in forced {
        // Sabotaged sections hold nothing: no force strikes them.
        let of_name = || {
            (0..records.len()).filter(|&i| records[i].name == f.name && records[i].op != "sabotage")
        };
        let hit =
            |r: &Record| r.end_ns > f.sent_ns && (r.start_ns < f.replied_ns || r.lost() || r.gone);
        let victims: Vec<&str> = of_name()
            .filter(|&i| hit(&records[i]))
            .map(|i| records[i].owner.as_str())
            .collect();
        for i in of_name() {
            let r = &records[i];
            // A victim whose field is unknown (a Java worker's) is struck alone: it has no
            // run of hand-offs.
            let alone = r.owner == "-" && hit(r);
            let in_run = r.owner != "-"
                && victims.contains(&r.owner.as_str())
                && r.end_ns > f.sent_ns
                && r.start_ns < f.replied_ns + after;
            if alone || in_run {
                let at = f.sent_ns.max(r.start_ns);
                struck[i] = Some(struck[i].map_or(at, |before| before.min(at)));
            }
        }
    }
    let mut count = 0;
    for (r, struck) in records.iter_mut().zip(struck) {
        if let Some(at) = struck {
            count += 1;
            r.lost_ns = Some(r.lost_ns.map_or(at, |told| told.min(at)));
        }
    }
    count
}

/// How long after a replica's full resync began an acquire may still be refused as not
/// replicated: the client re-reads the replicas that can acknowledge every second, and a
/// refused acquire had waited its acknowledgement timeout (1 s) first; the rest is slack for
/// a loaded machine.
const RESYNC_NOTICED: Duration = Duration::from_millis(2500);

/// What went wrong while the only replica was in a full resync, once the clients had had time
/// to notice it (see [`RESYNC_NOTICED`]): `ReplicaSync::Auto` waits only for replicas that can
/// acknowledge (invariant 13, docs/DESIGN.md), so no acquire may be refused as not replicated
/// then — and, in a resync the soak forced on a healthy primary, acquisitions go on (a client
/// that waited for the resyncing replica would retry every refused `lock()` until its end:
/// no error, no section).
pub(crate) fn resync_violations(
    faults: &[Fault],
    refusals: &[u64],
    records: &[Record],
    epoch: u64,
) -> Vec<String> {
    let noticed = RESYNC_NOTICED.as_nanos() as u64;
    let mut found = Vec::new();
    for f in faults {
        let Some((from, to)) = f.resync else { continue };
        let span = to.saturating_sub(from + noticed);
        let began = records
            .iter()
            .filter(|r| r.start_ns > from + noticed && r.start_ns < to)
            .count();
        if f.kind == FaultKind::Resync && span >= 2_000_000_000 && began == 0 {
            found.push(format!(
                "no section began between +{:.1} s and +{:.1} s, while the replica's full resync \
                 that began at +{:.1} s went on",
                since(epoch, from + noticed).as_secs_f64(),
                since(epoch, to).as_secs_f64(),
                since(epoch, from).as_secs_f64()
            ));
        }
        let n = refusals
            .iter()
            .filter(|&&at| at > from + noticed && at < to)
            .count();
        if n > 0 {
            found.push(format!(
                "{n} acquires refused between +{:.1} s and +{:.1} s, while the replica's full \
                 resync that began at +{:.1} s went on",
                since(epoch, from + noticed).as_secs_f64(),
                since(epoch, to).as_secs_f64(),
                since(epoch, from).as_secs_f64()
            ));
        }
    }
    found
}

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
    /// Force-unlocks by the operator, and the sections they struck.
    pub(crate) forced: (usize, usize),
    /// Calls refused as not replicated.
    pub(crate) refusals: usize,
    /// The last worker's command timeout, in ms.
    pub(crate) short_timeout_ms: u64,
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
         {:?}, watchdog lease {} ms, command timeout {} ms (the last worker's {} ms), calls {}",
        s.opts.processes,
        s.opts.tasks,
        s.opts.java,
        names(s.opts.java > 0, s.opts.names),
        s.opts.lease_ms,
        s.opts.command_timeout_ms,
        s.short_timeout_ms,
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
    let identities: Vec<String> = ["escaped", "reparented", "with_owner"]
        .iter()
        .filter(|path| get(&format!("acquired: {path}")) > 0)
        .map(|path| {
            format!(
                "{path} {} (then refused {}, a hold of its own {})",
                get(&format!("acquired: {path}")),
                get(&format!("{path}: refused")),
                get(&format!("{path}: a hold of its own"))
            )
        })
        .collect();
    if !identities.is_empty() {
        println!("stale identities       {}", identities.join("; "));
    }
    if s.forced.0 > 0 {
        println!(
            "force-unlocks          {} by the operator, striking {} sections (counted as lost from \
             the force on)",
            s.forced.0, s.forced.1
        );
    }
    let resyncs: Vec<&Fault> = s.faults.iter().filter(|f| f.resync.is_some()).collect();
    if !resyncs.is_empty() {
        let longest = resyncs
            .iter()
            .filter_map(|f| f.resync.map(|(from, to)| Duration::from_nanos(to - from)))
            .max()
            .unwrap_or_default();
        println!(
            "replica full resyncs   {} (up to {} each), {} calls refused as not replicated in all",
            resyncs.len(),
            ms(longest),
            s.refusals
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
            owner: "-".into(),
            gone: false,
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

    fn section(start: u64, end: u64, owner: &str) -> Record {
        Record {
            start_ns: start,
            end_ns: end,
            fence: None,
            lost_ns: None,
            owner: owner.into(),
            ..record(1, false, Accepted, 1)
        }
    }

    fn forced(sent: u64, replied: u64) -> Forced {
        Forced {
            name: 0,
            sent_ns: sent,
            replied_ns: replied,
        }
    }

    #[test]
    fn a_force_strikes_its_victim_and_the_run_handed_on_under_its_field_only() {
        let ms = 1_000_000;
        let mut records = [
            // Held across the force, then handed on twice in memory under the same field.
            section(100 * ms, 110 * ms, "c:1"),
            section(111 * ms, 115 * ms, "c:1"),
            section(116 * ms, 120 * ms, "c:1"),
            // The operator's own section, after the force.
            section(106 * ms, 130 * ms, "op:1"),
            // Another field after the force: a hold of its own, not struck.
            section(121 * ms, 125 * ms, "c:2"),
            // The same field long after the run's bound: not struck either.
            section(500 * ms, 505 * ms, "c:1"),
        ];
        let struck = strike(&mut records, &[forced(104 * ms, 105 * ms)]);
        assert_eq!(struck, 3);
        let lost: Vec<Option<u64>> = records.iter().map(|r| r.lost_ns).collect();
        assert_eq!(
            lost,
            [
                Some(104 * ms),
                Some(111 * ms),
                Some(116 * ms),
                None,
                None,
                None
            ]
        );
    }

    #[test]
    fn a_java_hold_whose_reply_came_after_the_force_is_struck_when_its_release_found_it_gone() {
        let ms = 1_000_000;
        // A Java acquire sent before the force ran in Redis first; its reply (and so its
        // section) came after the force's: Redisson reads nothing more, its release learns.
        let java = |gone| Record {
            gone,
            ..section(106 * ms, 112 * ms, "-")
        };
        let mut records = [java(true), section(107 * ms, 130 * ms, "op:1")];
        assert_eq!(strike(&mut records, &[forced(104 * ms, 105 * ms)]), 1);
        assert_eq!(records[0].lost_ns, Some(106 * ms));
        // Its release found the hold its own: a hold taken after the force, not struck.
        let mut records = [java(false), section(107 * ms, 130 * ms, "op:1")];
        assert_eq!(strike(&mut records, &[forced(104 * ms, 105 * ms)]), 0);
    }

    #[test]
    fn an_overlap_no_force_explains_is_still_one() {
        let ms = 1_000_000;
        let mut records = [
            section(100 * ms, 110 * ms, "c:1"),
            section(105 * ms, 115 * ms, "c:2"),
        ];
        // A force long before, and one on another name.
        let other = Forced {
            name: 1,
            ..forced(104 * ms, 105 * ms)
        };
        assert_eq!(strike(&mut records, &[forced(10 * ms, 11 * ms), other]), 0);
        let sections: Vec<Section> = records
            .iter()
            .map(|r| Section {
                name: 0,
                start: Duration::from_nanos(r.start_ns),
                end: Duration::from_nanos(r.end_ns),
                fence: None,
                lost_at: r.lost_ns.map(Duration::from_nanos),
            })
            .collect();
        let verdict = judge_history("x", &sections.iter().collect::<Vec<_>>());
        assert_eq!(verdict.overlaps.len(), 1);
    }

    #[test]
    fn refusals_count_only_once_a_resync_was_noticed_and_while_it_lasts() {
        let s = 1_000_000_000;
        let resync = Fault {
            at_ns: 0,
            kind: FaultKind::Resync,
            length: Duration::from_secs(6),
            ok: true,
            resync: Some((10 * s, 16 * s)),
        };
        // Before it was noticed, after it ended: allowed; in between: one violation line.
        let refusals = [10 * s + s / 2, 12 * s + 6 * s / 10, 13 * s, 17 * s];
        let progress = [section(13 * s, 13 * s + 5, "c:1")];
        let found = resync_violations(std::slice::from_ref(&resync), &refusals, &progress, 0);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].starts_with("2 acquires"), "{found:?}");
        // No refusal, but no section either while the forced resync went on.
        let found = resync_violations(&[resync], &[], &[], 0);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].starts_with("no section began"), "{found:?}");
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
