//! redbaton against the physical floor and the alternatives, side by side, in one run.
//!
//! `cargo bench --bench compare` starts a private `redis-server` on a free loopback port and
//! measures, in the same run: the floor (EVALSHA and PING round trips), a naive
//! `SET NX PX` lock (10 ms sleep and jittered), the peer crates `rslock`, `rlock` and
//! `redisson`, and redbaton twice: `redbaton` at its defaults (baton pass on) and
//! `redbaton-nobaton` (`baton_passes(0)`, the behaviour before the baton pass) — uncontended, reentrant, hand-off (1 process and several
//! processes), wake-up without barging, many keys and parked waiters. `redbaton-scripts`
//! sends redbaton's own acquire and release scripts straight through fred with no library
//! around them (polling 10 ms), so the uncontended and many-keys tables separate what the
//! library costs from what the protocol costs; the many-keys table also gives the CPU time each acquisition costs the
//! bench process and redis-server. It prints markdown tables, a target summary and one JSON
//! line per scenario and contender.
//!
//! Sizes are flags: `cargo bench --bench compare -- secs=2 procs=4 only=handoff,wakeup`, or
//! the same as environment variables (`RB_SECS=2`). See `Opts` (harness.rs) for the list.
//!
//! `redisson-java` (scenario `java`) runs the real Java Redisson (interop/java, built by
//! `scripts/install-java-peer.sh`) beside redbaton in uncontended, many-keys, wake-up and
//! hand-off runs of the same sizes (`java.rs`).
//!
//! `servers` (scenario) runs redbaton alone on Redis 6.2, Redis 7.0 and Valkey 8.1 in turn
//! (`servers=redis-6.2,valkey-8.1` to choose; scripts/install-servers.sh installs the two
//! besides Debian's 7.0): uncontended, many keys and wake-up side by side (`servers.rs`).
//!
//! `json=path` also writes the JSON lines to that file (relative paths are taken from the
//! workspace root), which `cargo bench --bench chart` turns into the wake-up latency chart.
//!
//! Times come from `CLOCK_MONOTONIC`, which every process on the host shares, so hand-offs
//! between processes are measured on one clock.

mod contenders;
mod counters;
#[path = "../fred_client.rs"]
mod fred_client;
mod handoff;
mod harness;
mod java;
mod many_keys;
mod parked;
mod report;
mod servers;
mod stats;
use testkit as support;
mod uncontended;

use fred::interfaces::ClientLike;
use fred::types::scripts::Script;
use serde_json::json;

use crate::contenders::Kind;
use crate::handoff::{contended_in_process, contended_processes, worker};
use crate::harness::{now_ns, Opts};
use crate::many_keys::{many_keys, redis_benchmark};
use crate::parked::parked;
use crate::report::{
    baton_handoff_target, baton_rate_target, contended_json, contended_row, hot_key_targets,
    json_line, multi_process_baton_targets, verdict, wait_targets, CONTENDED_HEADER, JSON,
};
use crate::stats::{us, ContendedResult};
use crate::support::RedisServer;
use crate::uncontended::uncontended;

#[tokio::main]
async fn main() {
    for arg in std::env::args().skip(1) {
        if let Some((k, v)) = arg.split_once('=') {
            std::env::set_var(format!("RB_{}", k.to_uppercase()), v);
        }
    }
    if std::env::var_os("RB_WORKER").is_some() {
        worker().await;
        return;
    }
    let opts = Opts::from_env();
    let wall = now_ns();
    let server = RedisServer::start();
    let raw = server.raw().await;
    let version: String = raw
        .info::<String>(Some(fred::types::InfoKind::Server))
        .await
        .expect("info")
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:").map(str::to_owned))
        .unwrap_or_default();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mut out = format!(
        "## Results\n\nredis-server {version} on 127.0.0.1, {cores} cores; secs={} iters={} hold={} µs; contenders: {}\n",
        opts.secs,
        opts.iters,
        opts.hold_us,
        opts.contenders.iter().map(|k| k.name()).collect::<Vec<_>>().join(", ")
    );
    let mut targets: Vec<(String, String, &'static str)> = Vec::new();
    let has_rb = opts.contenders.contains(&Kind::Redbaton);

    let mut floor = None;
    if opts.runs("uncontended") {
        let f = uncontended(&server, &opts, &mut out).await;
        floor = Some(f);
    }
    let floors_us = floor
        .as_ref()
        .map(|f| (us(f.evalsha_p50), us(f.after_hold_p50)));
    if let (Some(f), true) = (&floor, has_rb) {
        if let Some(line) = JSON
            .lock()
            .unwrap()
            .iter()
            .find(|l| l.contains("\"uncontended\"") && l.contains("\"redbaton\""))
        {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let r = v["ratio_to_2x_evalsha"].as_f64().unwrap_or(f64::NAN);
            targets.push((
                "uncontended lock+unlock ≤ 1.15 × (2 × EVALSHA)".into(),
                format!(
                    "{:.2} × ({:.1} µs vs 2 × {:.1} µs)",
                    r,
                    v["median_us"].as_f64().unwrap_or(0.0),
                    us(f.evalsha_p50)
                ),
                verdict(r <= 1.15),
            ));
        }
        let _ = f.ping_p50;
    }

    let mut handoff_1p: Vec<(Kind, ContendedResult)> = Vec::new();
    if opts.runs("handoff") {
        out.push_str(&format!(
            "\n### Hand-off: one name, {} tasks in 1 process, hold {} µs, barging allowed\n\n{CONTENDED_HEADER}\n",
            opts.tasks, opts.hold_us
        ));
        for k in opts.contenders_in("handoff") {
            let r =
                contended_in_process(k, &server, &raw, &opts, opts.tasks, true, "handoff").await;
            out.push_str(&contended_row(k, &r));
            out.push('\n');
            contended_json(
                "handoff_1p",
                k,
                &r,
                json!({"tasks": opts.tasks, "processes": 1}),
            );
            handoff_1p.push((k, r));
        }
    }
    let mut handoff_mp: Vec<(Kind, ContendedResult)> = Vec::new();
    if opts.runs("handoff_mp") {
        out.push_str(&format!(
            "\n### Hand-off: one name, {} processes × {} tasks, hold {} µs, barging allowed\n\n{CONTENDED_HEADER}\n",
            opts.procs, opts.per_proc, opts.hold_us
        ));
        for k in opts.contenders_in("handoff_mp") {
            let r = contended_processes(k, &server, &raw, &opts).await;
            out.push_str(&contended_row(k, &r));
            out.push('\n');
            contended_json(
                "handoff_mp",
                k,
                &r,
                json!({"tasks": opts.procs * opts.per_proc, "processes": opts.procs}),
            );
            handoff_mp.push((k, r));
        }
    }
    let mut wakeups: Vec<(usize, Kind, ContendedResult)> = Vec::new();
    if opts.runs("wakeup") {
        for waiters in [1usize, 15] {
            out.push_str(&format!(
                "\n### Wake-up without barging: {waiters} parked waiter(s), hold {} µs (every hand-off goes to a parked waiter)\n\n{CONTENDED_HEADER}\n",
                opts.hold_us
            ));
            for k in opts.contenders_in("wakeup") {
                let r = contended_in_process(
                    k,
                    &server,
                    &raw,
                    &opts,
                    waiters + 1,
                    false,
                    &format!("wakeup{waiters}"),
                )
                .await;
                out.push_str(&contended_row(k, &r));
                out.push('\n');
                // The distribution rides only on the wake-up lines: that is what the chart
                // draws, and it keeps the other lines short.
                contended_json(
                    "wakeup",
                    k,
                    &r,
                    json!({"waiters": waiters,
                        "handoff_samples": r.handoff_samples,
                        "handoff_percentiles_us": r.handoff_pcts_us}),
                );
                wakeups.push((waiters, k, r));
            }
        }
    }
    let mut many: Vec<(Kind, f64, (f64, f64))> = Vec::new();
    let mut ceiling = None;
    if opts.runs("many") {
        let sha: String = {
            let s = Script::from_lua("return 1");
            s.load(&raw).await.expect("load");
            s.sha1().to_string()
        };
        // Unpipelined, as many connections as the bench has tasks (what the old "ceiling"
        // was: every contender could beat it), and pipelined (-P 16) over 128 connections, so
        // that the server is the limit: the real ceiling.
        let evalsha = ["EVALSHA", sha.as_str(), "1", "k:__rand_int__"];
        let set = ["SET", "k:__rand_int__", "v"];
        let evalsha_c64 =
            redis_benchmark(server.port, opts.many_tasks, 1, opts.ceiling_n, &evalsha);
        let evalsha_ceiling = redis_benchmark(server.port, 128, 16, opts.ceiling_n * 4, &evalsha);
        let set_ceiling = redis_benchmark(server.port, 128, 16, opts.ceiling_n * 4, &set);
        ceiling = evalsha_ceiling;
        let fmt = |c: Option<f64>| c.map_or("n/a".into(), |c| format!("{c:.0}"));
        out.push_str(&format!(
            "\n### Many keys: {} names, {} tasks, lock+unlock without hold\n\nredis-benchmark in this run: trivial EVALSHA {} req/s (-c {}, no pipelining); ceiling (-c 128 -P 16): trivial EVALSHA {} req/s, SET {} req/s. One lock+unlock is two commands, so the ceiling for a script lock is EVALSHA / 2.\n\n{} run(s) per contender, interleaved; acq/s is the median run, spread = lowest–highest run.\n\n| contender | acq/s (median) | spread | fraction of (EVALSHA ceiling / 2) | ratio to redbaton | client CPU µs/acq | redis-server CPU µs/acq | net cmds/acq | script cmds/acq |\n|---|---|---|---|---|---|---|---|---|\n",
            opts.names, opts.many_tasks, fmt(evalsha_c64), opts.many_tasks,
            fmt(evalsha_ceiling), fmt(set_ceiling), opts.rounds,
        ));
        let mut rates: Vec<Vec<f64>> = vec![Vec::new(); opts.contenders.len()];
        let mut cmds_of: Vec<(f64, f64)> = vec![(0.0, 0.0); opts.contenders.len()];
        let mut cpu_of: Vec<Vec<(f64, f64)>> = vec![Vec::new(); opts.contenders.len()];
        for round in 0..opts.rounds {
            for (i, &k) in opts.contenders.iter().enumerate() {
                let run = many_keys(k, &server, &raw, &opts).await;
                let rate = run.rate;
                eprintln!(
                    "many keys, run {}: {} {rate:.0} acq/s, CPU µs/acq: client {:.1}, server {:.1}",
                    round + 1,
                    k.name(),
                    run.client_us,
                    run.server_us
                );
                json_line(
                    json!({"scenario": "many_keys_run", "contender": k.name(), "run": round + 1,
                    "acq_per_s": rate, "client_cpu_us_per_acq": run.client_us,
                    "server_cpu_us_per_acq": run.server_us}),
                );
                rates[i].push(rate);
                cpu_of[i].push((run.client_us, run.server_us));
                cmds_of[i] = run.cmds;
            }
        }
        let median = |v: &[f64]| {
            let mut v = v.to_vec();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let rb_median = opts
            .contenders
            .iter()
            .position(|&k| k == Kind::Redbaton)
            .map(|i| median(&rates[i]));
        for (i, &k) in opts.contenders.iter().enumerate() {
            let rate = median(&rates[i]);
            let lo = rates[i].iter().copied().fold(f64::INFINITY, f64::min);
            let hi = rates[i].iter().copied().fold(0.0, f64::max);
            let ratio = evalsha_ceiling.map(|c| rate / (c / 2.0));
            let cmds = cmds_of[i];
            let client_us = median(&cpu_of[i].iter().map(|c| c.0).collect::<Vec<_>>());
            let server_us = median(&cpu_of[i].iter().map(|c| c.1).collect::<Vec<_>>());
            out.push_str(&format!(
                "| {} | {:.0} | {:.0}–{:.0} | {} | {} | {:.1} | {:.1} | {:.2} | {:.2} |\n",
                k.name(),
                rate,
                lo,
                hi,
                ratio.map_or("n/a".into(), |r| format!("{r:.2}")),
                rb_median.map_or("n/a".into(), |rb| format!("{:.2}", rate / rb)),
                client_us,
                server_us,
                cmds.0,
                cmds.1
            ));
            json_line(
                json!({"scenario": "many_keys", "contender": k.name(), "names": opts.names,
                "tasks": opts.many_tasks, "acq_per_s": rate, "acq_per_s_runs": rates[i],
                "evalsha_unpipelined": evalsha_c64,
                "evalsha_ceiling": evalsha_ceiling,
                "set_ceiling": set_ceiling, "ratio_to_half_ceiling": ratio,
                "client_cpu_us_per_acq": client_us, "server_cpu_us_per_acq": server_us,
                "net_cmds_per_acq": cmds.0, "script_cmds_per_acq": cmds.1}),
            );
            many.push((k, rate, cmds));
        }
    }
    if opts.runs("java") {
        java::java_side_by_side(&server, &raw, &opts, &mut out).await;
    }
    if opts.runs("servers") {
        servers::servers_side_by_side(&opts, &mut out).await;
    }
    let mut parked_result = None;
    if opts.runs("parked") && has_rb {
        let p = parked(&server, &raw, &opts).await;
        out.push_str(&format!(
            "\n### Parked waiters (redbaton): {} tasks on {} names in one process, arriving in batches of {}\n\n| waiters | live heap per waiter | RSS per waiter | lock() future | pub/sub conns | drain after release | EVALSHA per waiter |\n|---|---|---|---|---|---|---|\n| {} | {:.0} B | {:.0} B | {} B | {} | {:.0} ms | {:.2} |\n",
            p.waiters, opts.parked_names, opts.parked_batch, p.waiters, p.heap_per_waiter, p.rss_per_waiter, p.future_bytes, p.pubsub_conns, p.drain_ms, p.evalsha_per_waiter
        ));
        json_line(
            json!({"scenario": "parked", "contender": "redbaton", "waiters": p.waiters,
            "names": opts.parked_names, "arrival_batch": opts.parked_batch,
            "rss_per_waiter_bytes": p.rss_per_waiter,
            "pubsub_connections": p.pubsub_conns, "drain_ms": p.drain_ms,
            "lock_future_bytes": p.future_bytes,
            "heap_per_waiter_bytes": p.heap_per_waiter,
            "evalsha_per_waiter": p.evalsha_per_waiter}),
        );
        parked_result = Some(p);
    }

    // ----- targets -----
    if has_rb {
        if let Some((e, after_hold)) = floors_us {
            for waiters in [1usize, 15] {
                let rows: Vec<_> = wakeups.iter().filter(|(w, _, _)| *w == waiters).collect();
                if let Some((_, _, rb)) = rows.iter().find(|(_, k, _)| *k == Kind::Redbaton) {
                    targets.push((
                        format!("wake-up p50 ≤ 4 × EVALSHA ({waiters} waiter(s))"),
                        format!(
                            "{:.0} µs = {:.2} × {:.1} µs",
                            rb.handoff_p50_us,
                            rb.handoff_p50_us / e,
                            e
                        ),
                        verdict(rb.handoff_p50_us <= 4.0 * e),
                    ));
                    let pairs: Vec<_> = rows.iter().map(|(_, k, r)| (*k, r)).collect();
                    baton_handoff_target(
                        &mut targets,
                        &pairs,
                        rb,
                        (e, after_hold),
                        &format!("wake-up, {waiters} waiter(s)"),
                    );
                    let nb = pairs.iter().find(|(k, _)| *k == Kind::RedbatonNoBaton);
                    baton_rate_target(
                        &mut targets,
                        rb,
                        nb.map(|(_, r)| *r),
                        &format!("wake-up, {waiters} waiter(s)"),
                    );
                    for (_, k, r) in rows.iter().filter(|(_, k, _)| {
                        ![Kind::Redbaton, Kind::RedbatonNoBaton, Kind::NaiveJitter].contains(k)
                    }) {
                        let factor = r.handoff_p50_us / rb.handoff_p50_us;
                        targets.push((
                            format!(
                                "wake-up p50 ≥ 20× lower than {} ({waiters} waiter(s))",
                                k.name()
                            ),
                            format!(
                                "{factor:.0}× ({:.0} µs vs {:.0} µs)",
                                r.handoff_p50_us, rb.handoff_p50_us
                            ),
                            verdict(factor >= 20.0),
                        ));
                    }
                }
            }
        }
        if let Some((_, rb)) = handoff_1p.iter().find(|(k, _)| *k == Kind::Redbaton) {
            hot_key_targets(&mut targets, &handoff_1p, rb, floors_us, opts.tasks);
            wait_targets(
                &mut targets,
                &handoff_1p,
                rb,
                &format!("{} tasks, 1 process", opts.tasks),
            );
            targets.push((
                format!(
                    "network commands per acquisition ≤ 4 ({} tasks / 1 process)",
                    opts.tasks
                ),
                format!(
                    "{:.2} (+ {:.2} inside scripts)",
                    rb.net_per_acq, rb.script_per_acq
                ),
                verdict(rb.net_per_acq <= 4.0),
            ));
            targets.push((
                "mutual exclusion (1 process)".into(),
                format!("{} overlaps", rb.overlaps),
                verdict(rb.overlaps == 0),
            ));
        }
        if let Some((_, rb)) = handoff_mp.iter().find(|(k, _)| *k == Kind::Redbaton) {
            let nb = handoff_mp.iter().find(|(k, _)| *k == Kind::RedbatonNoBaton);
            multi_process_baton_targets(
                &mut targets,
                rb,
                nb.map(|(_, r)| r),
                &format!("{} processes × {} tasks", opts.procs, opts.per_proc),
            );
            wait_targets(
                &mut targets,
                &handoff_mp,
                rb,
                &format!("{} processes × {} tasks", opts.procs, opts.per_proc),
            );
            let p = opts.procs as f64;
            targets.push((
                format!(
                    "network commands per acquisition ≤ P + 3 = {} ({} processes)",
                    p + 3.0,
                    opts.procs
                ),
                format!(
                    "{:.2} (+ {:.2} inside scripts)",
                    rb.net_per_acq, rb.script_per_acq
                ),
                verdict(rb.net_per_acq <= p + 3.0),
            ));
            targets.push((
                format!(
                    "subscriber connections = {} ({} processes)",
                    opts.procs, opts.procs
                ),
                format!("{}", rb.pubsub_conns),
                verdict(rb.pubsub_conns <= opts.procs),
            ));
            targets.push((
                "mutual exclusion (processes)".into(),
                format!("{} overlaps", rb.overlaps),
                verdict(rb.overlaps == 0),
            ));
        }
        if let (Some(c), Some((_, rate, _))) =
            (ceiling, many.iter().find(|(k, _, _)| *k == Kind::Redbaton))
        {
            let r = rate / (c / 2.0);
            targets.push((
                "many keys ≥ 0.60 × (EVALSHA ceiling / 2), pipelined ceiling".into(),
                format!("{r:.2} ({rate:.0} acq/s vs {c:.0} / 2)"),
                verdict(r >= 0.60),
            ));
        }
        if let Some((_, rb, _)) = many.iter().find(|(k, _, _)| *k == Kind::Redbaton) {
            let peers = [
                Kind::Rslock,
                Kind::RslockTuned,
                Kind::Rlock,
                Kind::RlockTuned,
                Kind::Redisson,
            ];
            if let Some((pk, peer, _)) = many
                .iter()
                .filter(|(k, _, _)| peers.contains(k))
                .max_by(|a, b| a.1.total_cmp(&b.1))
            {
                targets.push((
                    "many keys acq/s ≥ best peer crate's (medians)".into(),
                    format!("{:.2} × ({rb:.0} vs {peer:.0}, {})", rb / peer, pk.name()),
                    verdict(rb >= peer),
                ));
            }
            if let Some((_, naive, _)) = many.iter().find(|(k, _, _)| *k == Kind::Naive) {
                targets.push((
                    "(baseline, no target) many keys vs the naive SET NX lock on fred".into(),
                    format!("{:.2} × ({rb:.0} vs {naive:.0})", rb / naive),
                    "shown",
                ));
            }
        }
        if let Some(p) = &parked_result {
            targets.push((
                "parked: 1 subscriber connection per process".into(),
                format!("{}", p.pubsub_conns),
                verdict(p.pubsub_conns == 1),
            ));
            targets.push((
                "parked: ≤ 2 KiB per waiter (RSS delta)".into(),
                format!(
                    "{:.0} B RSS ({:.0} B live heap)",
                    p.rss_per_waiter, p.heap_per_waiter
                ),
                verdict(p.rss_per_waiter <= 2048.0),
            ));
        }
    }
    if !targets.is_empty() {
        out.push_str("\n### Targets\n\n| target | measured | verdict |\n|---|---|---|\n");
        for (t, m, v) in &targets {
            out.push_str(&format!("| {t} | {m} | {v} |\n"));
        }
    }
    out.push_str(&format!(
        "\nWhole run: {:.0} s.\n",
        (now_ns() - wall) as f64 / 1e9
    ));
    println!("{out}");
    println!("### JSON\n");
    let lines = JSON.lock().unwrap();
    for line in lines.iter() {
        println!("{line}");
    }
    let mut json_written = true;
    if let Some(path) = &opts.json {
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        match std::fs::write(path, text) {
            Ok(()) => eprintln!("JSON lines written to {}", path.display()),
            Err(e) => {
                eprintln!("could not write {}: {e}", path.display());
                json_written = false;
            }
        }
    }
    drop(lines);
    drop(raw);
    drop(server);
    if !json_written {
        // After the server is stopped: the tables are on stdout, but the file asked for is not.
        std::process::exit(1);
    }
}
