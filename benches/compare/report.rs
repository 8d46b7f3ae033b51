//! The report: the JSON lines, the contended table's rows, and the targets with their verdicts.

use serde_json::json;

use crate::contenders::Kind;
use crate::stats::ContendedResult;

pub(crate) fn contended_json(
    scenario: &str,
    kind: Kind,
    r: &ContendedResult,
    extra: serde_json::Value,
) {
    let mut v = json!({
        "scenario": scenario,
        "contender": kind.name(),
        "waits_by": kind.waits_by(),
        "acquisitions": r.acquisitions,
        "acq_per_s": r.acq_per_s,
        "handoff_p50_us": r.handoff_p50_us,
        "handoff_p99_us": r.handoff_p99_us,
        "wait_p99_ms": r.wait_p99_ms,
        "wait_max_ms": r.wait_max_ms,
        "waits_pending_at_stop": r.pending,
        "jain": r.jain,
        "net_cmds_per_acq": r.net_per_acq,
        "script_cmds_per_acq": r.script_per_acq,
        "pubsub_connections": r.pubsub_conns,
        "mutual_exclusion_violations": r.overlaps,
        "releaser_regained_pct": r.regained_pct,
    });
    if let (Some(obj), serde_json::Value::Object(more)) = (v.as_object_mut(), extra) {
        obj.extend(more);
    }
    json_line(v);
}

/// JSON lines are collected and printed together after the tables.
pub(crate) static JSON: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

pub(crate) fn json_line(v: serde_json::Value) {
    JSON.lock().unwrap().push(v.to_string());
}

pub(crate) const CONTENDED_HEADER: &str = "| contender | waits by | acq/s | hand-off p50 µs | hand-off p99 µs | wait p99 ms | wait max ms | pending at stop | Jain | net cmds/acq | script cmds/acq | pub/sub conns | overlaps | releaser won again |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|";

pub(crate) fn contended_row(kind: Kind, r: &ContendedResult) -> String {
    format!(
        "| {} | {} | {:.0} | {:.0} | {:.0} | {:.1} | {:.1} | {} | {:.3} | {:.2} | {:.2} | {} | {} | {:.0} % |",
        kind.name(),
        kind.waits_by(),
        r.acq_per_s,
        r.handoff_p50_us,
        r.handoff_p99_us,
        r.wait_p99_ms,
        r.wait_max_ms,
        r.pending,
        r.jain,
        r.net_per_acq,
        r.script_per_acq,
        r.pubsub_conns,
        r.overlaps,
        r.regained_pct
    )
}

/// Wait p99 against the best peer crate (the target) and the best naive baseline (shown).
pub(crate) fn wait_targets(
    targets: &mut Vec<(String, String, &'static str)>,
    rows: &[(Kind, ContendedResult)],
    rb: &ContendedResult,
    label: &str,
) {
    let best = |kinds: &[Kind]| {
        rows.iter()
            .filter(|(k, _)| kinds.contains(k))
            .min_by(|a, b| a.1.wait_p99_ms.total_cmp(&b.1.wait_p99_ms))
    };
    if let Some((pk, pr)) = best(&[
        Kind::Rslock,
        Kind::RslockTuned,
        Kind::Rlock,
        Kind::RlockTuned,
        Kind::Redisson,
    ]) {
        targets.push((
            format!("wait p99 ({label}) ≤ best peer crate's"),
            format!(
                "{:.1} ms vs {:.1} ms ({})",
                rb.wait_p99_ms,
                pr.wait_p99_ms,
                pk.name()
            ),
            verdict(rb.wait_p99_ms <= pr.wait_p99_ms),
        ));
    }
    if let Some((pk, pr)) = best(&[Kind::Naive, Kind::NaiveJitter]) {
        targets.push((
            format!("(baseline, no target) wait p99 ({label}) vs best naive lock"),
            format!(
                "{:.1} ms vs {:.1} ms ({})",
                rb.wait_p99_ms,
                pr.wait_p99_ms,
                pk.name()
            ),
            if rb.wait_p99_ms <= pr.wait_p99_ms {
                "lower"
            } else {
                "higher"
            },
        ));
    }
}

/// The baton pass's one-process hand-off target: the release call to the next holder's
/// acquisition p50 ≤ 1.3 × the trivial EVALSHA median, with redbaton-nobaton's ratio beside,
/// and the ratio to a trivial EVALSHA sent right after a 1 ms hold (`after_hold_us`): the
/// cheapest round trip a hand-off that follows a critical section could make.
pub(crate) fn baton_handoff_target(
    targets: &mut Vec<(String, String, &'static str)>,
    rows: &[(Kind, &ContendedResult)],
    rb: &ContendedResult,
    (evalsha_us, after_hold_us): (f64, f64),
    label: &str,
) {
    let nb = rows
        .iter()
        .find(|(k, _)| *k == Kind::RedbatonNoBaton)
        .map_or("redbaton-nobaton not run".to_owned(), |(_, nb)| {
            format!(
                "redbaton-nobaton {:.0} µs = {:.2} ×",
                nb.handoff_p50_us,
                nb.handoff_p50_us / evalsha_us
            )
        });
    targets.push((
        format!("baton: hand-off p50 ≤ 1.3 × EVALSHA ({label})"),
        format!(
            "{:.0} µs = {:.2} × {:.1} µs ({:.2} × {:.1} µs after a 1 ms hold); {nb}",
            rb.handoff_p50_us,
            rb.handoff_p50_us / evalsha_us,
            evalsha_us,
            rb.handoff_p50_us / after_hold_us,
            after_hold_us
        ),
        verdict(rb.handoff_p50_us <= 1.3 * evalsha_us),
    ));
}

/// The baton pass's throughput target: acquisitions/s ≥ redbaton-nobaton's in the same run.
pub(crate) fn baton_rate_target(
    targets: &mut Vec<(String, String, &'static str)>,
    rb: &ContendedResult,
    nb: Option<&ContendedResult>,
    label: &str,
) {
    if let Some(nb) = nb {
        targets.push((
            format!("baton: acq/s ≥ redbaton-nobaton's ({label})"),
            format!(
                "{:.2} × ({:.0} vs {:.0})",
                rb.acq_per_s / nb.acq_per_s,
                rb.acq_per_s,
                nb.acq_per_s
            ),
            verdict(rb.acq_per_s >= nb.acq_per_s),
        ));
    }
}

/// Issue 12 §2's targets on the one-process hot key (`tasks` tasks, one name): redbaton
/// (baton on) against the floor, against redbaton-nobaton and against every other contender,
/// all from this run.
pub(crate) fn hot_key_targets(
    targets: &mut Vec<(String, String, &'static str)>,
    rows: &[(Kind, ContendedResult)],
    rb: &ContendedResult,
    floors_us: Option<(f64, f64)>,
    tasks: usize,
) {
    let label = format!("hot key, {tasks} tasks, 1 process");
    let nb = rows
        .iter()
        .find(|(k, _)| *k == Kind::RedbatonNoBaton)
        .map(|(_, r)| r);
    let refs: Vec<(Kind, &ContendedResult)> = rows.iter().map(|(k, r)| (*k, r)).collect();
    if let Some(floors) = floors_us {
        baton_handoff_target(targets, &refs, rb, floors, &label);
    }
    // A fair FIFO leaves the releaser 1 chance in `tasks`; noise = 2 standard errors of a
    // share of 1/tasks over the contested releases measured.
    let fair = 1.0 / tasks.max(1) as f64;
    let bound = 100.0 * (fair + 2.0 * (fair * (1.0 - fair) / rb.contested.max(1) as f64).sqrt());
    targets.push((
        format!(
            "baton: releaser won again ≤ 1/{tasks} ({:.2} %) + noise ({label})",
            100.0 * fair
        ),
        format!(
            "{:.1} % of {} contested releases (bound {bound:.2} % with 2 σ); {}",
            rb.regained_pct,
            rb.contested,
            nb.map_or("redbaton-nobaton not run".into(), |nb| format!(
                "redbaton-nobaton {:.1} %",
                nb.regained_pct
            ))
        ),
        verdict(rb.regained_pct <= bound),
    ));
    targets.push((
        format!("baton: Jain's index ≥ 0.95 ({label})"),
        format!(
            "{:.3}; {}",
            rb.jain,
            nb.map_or("redbaton-nobaton not run".into(), |nb| format!(
                "redbaton-nobaton {:.3}",
                nb.jain
            ))
        ),
        verdict(rb.jain >= 0.95),
    ));
    if let Some((ok, ork)) = rows
        .iter()
        .filter(|(k, _)| *k != Kind::Redbaton)
        .min_by(|a, b| a.1.wait_p99_ms.total_cmp(&b.1.wait_p99_ms))
    {
        targets.push((
            format!("baton: wait p99 ≤ every other contender's, naive-jitter included ({label})"),
            format!(
                "{:.1} ms (max {:.1} ms) vs lowest other {:.1} ms ({}); {}",
                rb.wait_p99_ms,
                rb.wait_max_ms,
                ork.wait_p99_ms,
                ok.name(),
                nb.map_or("redbaton-nobaton not run".into(), |nb| format!(
                    "redbaton-nobaton {:.1} ms (max {:.1} ms)",
                    nb.wait_p99_ms, nb.wait_max_ms
                ))
            ),
            verdict(rb.wait_p99_ms <= ork.wait_p99_ms),
        ));
    }
    baton_rate_target(targets, rb, nb, &label);
}

/// Issue 12 §2 on the multi-process hot key: the baton pass must make no figure worse than
/// redbaton-nobaton's in the same run (each row gives redbaton / redbaton-nobaton).
pub(crate) fn multi_process_baton_targets(
    targets: &mut Vec<(String, String, &'static str)>,
    rb: &ContendedResult,
    nb: Option<&ContendedResult>,
    label: &str,
) {
    let Some(nb) = nb else { return };
    // (figure, redbaton, redbaton-nobaton, unit, format precision, higher is better)
    let figures = [
        ("acq/s", rb.acq_per_s, nb.acq_per_s, "", 0, true),
        ("wait p99", rb.wait_p99_ms, nb.wait_p99_ms, " ms", 1, false),
        ("Jain's index", rb.jain, nb.jain, "", 3, true),
        (
            "hand-off p50",
            rb.handoff_p50_us,
            nb.handoff_p50_us,
            " µs",
            0,
            false,
        ),
    ];
    for (figure, r, n, unit, prec, higher_better) in figures {
        let ok = if higher_better { r >= n } else { r <= n };
        targets.push((
            format!("baton: {figure} no worse than redbaton-nobaton's ({label})"),
            format!(
                "{:.2} × ({r:.prec$}{unit} vs {n:.prec$}{unit})",
                r / n,
                prec = prec
            ),
            verdict(ok),
        ));
    }
}

pub(crate) fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "**missed**"
    }
}
