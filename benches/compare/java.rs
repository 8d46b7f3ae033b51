//! `redisson-java`: the real Java Redisson (interop/java's `Driver bench`, built by
//! `scripts/install-java-peer.sh`) beside redbaton, in one run: uncontended lock+unlock, many
//! keys, the one-waiter wake-up and the 16-task hand-off. It is what a user of this wire format
//! would pick instead, so it anchors every figure the format sets.
//!
//! Each round runs the Java driver once (its JIT warmed up on every scenario before anything is
//! timed) and then redbaton through the bench's own scenario code; the rounds alternate, and the
//! table gives the median round and the spread. The driver's contended runs report every
//! acquisition on `CLOCK_MONOTONIC`, and are analysed by the same code as redbaton's.

use std::process::Stdio;

use serde_json::{json, Value};

use crate::contenders::Kind;
use crate::handoff::{contended_in_process, Event};
use crate::harness::{now_ns, Opts};
use crate::many_keys::many_keys;
use crate::report::json_line;
use crate::stats::{analyse, pct, us, ContendedResult};
use crate::support::java_peer::{driver_command, redisson_version};
use crate::support::RedisServer;

/// One round of one side.
struct Round {
    uncontended_p50_us: f64,
    uncontended_p99_us: f64,
    many_per_s: f64,
    wakeup: ContendedResult,
    contended: ContendedResult,
}

/// The Java driver's round: its output lines, parsed.
async fn java_round(server: &RedisServer, opts: &Opts) -> Round {
    let mut command = tokio::process::Command::from(driver_command(&[], "bench"));
    command
        .args(["--nodes", &format!("127.0.0.1:{}", server.port)])
        .args(["--secs", &opts.secs.to_string()])
        .args(["--iters", &opts.iters.to_string()])
        .args(["--hold-us", &opts.hold_us.to_string()])
        .args(["--names", &opts.names.to_string()])
        .args(["--many-threads", &opts.many_tasks.to_string()])
        .args(["--tasks", &opts.tasks.to_string()])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    let output = command.output().await.expect("run the Java driver");
    assert!(
        output.status.success(),
        "the Java driver failed: {}",
        output.status
    );
    let lines: Vec<Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let scenario = |name: &str| {
        lines
            .iter()
            .find(|l| l["scenario"] == name)
            .unwrap_or_else(|| panic!("the Java driver reported no {name} run"))
    };
    let mut ns: Vec<u64> = scenario("uncontended")["ns"]
        .as_array()
        .expect("latencies")
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    ns.sort_unstable();
    let many = scenario("many");
    let events = |run: &Value, tasks: usize| {
        let events: Vec<Event> = run["events"]
            .as_array()
            .expect("events")
            .iter()
            .map(|e| {
                let n = |i: usize| e[i].as_u64().expect("a time");
                Event {
                    task: n(0) as u32,
                    call: n(1),
                    acq: n(2),
                    rel: n(3),
                }
            })
            .collect();
        let overlaps = run["overlaps"].as_u64().unwrap_or(0);
        analyse(events, tasks, overlaps, (0.0, 0.0), 0)
    };
    Round {
        uncontended_p50_us: us(pct(&ns, 50.0)),
        uncontended_p99_us: us(pct(&ns, 99.0)),
        many_per_s: many["acquisitions"].as_f64().unwrap_or(0.0)
            / many["secs"].as_f64().unwrap_or(1.0),
        wakeup: events(scenario("wakeup"), 2),
        contended: events(scenario("contended"), opts.tasks),
    }
}

/// redbaton's round: the same four scenarios through the bench's own code, as `kind`
/// (`Redbaton`, or `RedbatonNoBaton` for the two contended runs only: without the in-process
/// hand-off, every release goes through Redis and its message, as Redisson's do).
async fn redbaton_round(
    kind: Kind,
    server: &RedisServer,
    raw: &fred::clients::Client,
    opts: &Opts,
) -> Round {
    let (mut uncontended_p50_us, mut uncontended_p99_us, mut many_per_s) =
        (f64::NAN, f64::NAN, f64::NAN);
    if kind == Kind::Redbaton {
        let (ns, _) = redbaton_cycles(server, opts.iters, "bench:java-side:uncontended").await;
        uncontended_p50_us = us(pct(&ns, 50.0));
        uncontended_p99_us = us(pct(&ns, 99.0));
        many_per_s = many_keys(kind, server, raw, opts).await.rate;
    }
    let tag = kind.name();
    let wakeup = contended_in_process(
        kind,
        server,
        raw,
        opts,
        2,
        false,
        &format!("java-side-wakeup-{tag}"),
    )
    .await;
    let contended = contended_in_process(
        kind,
        server,
        raw,
        opts,
        opts.tasks,
        true,
        &format!("java-side-handoff-{tag}"),
    )
    .await;
    Round {
        uncontended_p50_us,
        uncontended_p99_us,
        many_per_s,
        wakeup,
        contended,
    }
}

/// `iters` uncontended lock+unlock cycles of redbaton on `name` (after a tenth more to warm
/// up), each timed, and as many trivial `EVALSHA` round trips on the same client's connection,
/// interleaved in blocks of five: both sorted, in ns. In a task of its own, as the uncontended
/// scenario runs (not on the main thread).
pub(crate) async fn redbaton_cycles(
    server: &RedisServer,
    iters: usize,
    name: &'static str,
) -> (Vec<u64>, Vec<u64>) {
    use fred::interfaces::LuaInterface;
    let (url, iters) = (server.url(), iters.max(10));
    let (mut cycles, mut evalsha) = tokio::spawn(async move {
        let client = redbaton::Client::connect(&url).await.expect("connect");
        let lock = client.lock(name);
        let trivial = fred::types::scripts::Script::from_lua("return 1");
        trivial.load(client.redis()).await.expect("load");
        let sha = trivial.sha1().to_string();
        let (mut cycles, mut evalsha) = (Vec::with_capacity(iters), Vec::with_capacity(iters));
        for i in 0..iters + iters / 10 {
            let t = now_ns();
            lock.lock()
                .await
                .expect("lock")
                .unlock()
                .await
                .expect("unlock");
            let cycle = now_ns() - t;
            let t = now_ns();
            let _: i64 = client
                .redis()
                .evalsha(sha.as_str(), "bench:floor", ())
                .await
                .expect("evalsha");
            if i >= iters / 10 {
                cycles.push(cycle);
                evalsha.push(now_ns() - t);
            }
        }
        client.shutdown().await.expect("shutdown");
        (cycles, evalsha)
    })
    .await
    .expect("the uncontended run");
    cycles.sort_unstable();
    evalsha.sort_unstable();
    (cycles, evalsha)
}

/// A row of the table: scenario, metric, the figure in a round, whether higher is better.
type Row = (&'static str, &'static str, fn(&Round) -> f64, bool);

/// The median and the lowest and highest of `values`.
pub(crate) fn spread(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    (
        values[values.len() / 2],
        values[0],
        values[values.len() - 1],
    )
}

/// Runs `opts.rounds` rounds of both sides and appends the table to `out`.
pub(crate) async fn java_side_by_side(
    server: &RedisServer,
    raw: &fred::clients::Client,
    opts: &Opts,
    out: &mut String,
) {
    let version = redisson_version();
    let (mut java, mut rb, mut nobaton) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..opts.rounds {
        java.push(java_round(server, opts).await);
        rb.push(redbaton_round(Kind::Redbaton, server, raw, opts).await);
        nobaton.push(redbaton_round(Kind::RedbatonNoBaton, server, raw, opts).await);
        eprintln!("redisson-java, round {} of {} done", round + 1, opts.rounds);
    }
    out.push_str(&format!(
        "\n### Java Redisson {version} beside redbaton\n\nJava Redisson (interop/java, `lock()` with the watchdog lease, JIT warmed up on every scenario first) and redbaton at its defaults; {} rounds, alternating; median round (lowest–highest). Ratio = redisson-java / redbaton (for acq/s above 1 means Redisson is faster; for times, above 1 means redbaton is). `redbaton-nobaton` (`baton_passes(0)`) runs the two contended scenarios without the in-process hand-off: every release through Redis and its message, as Redisson's.\n\n| scenario | metric | redbaton | redbaton-nobaton | redisson-java | ratio to redbaton | ratio to nobaton |\n|---|---|---|---|---|---|---|\n",
        opts.rounds
    ));
    let rows: [Row; 7] = [
        (
            "uncontended lock+unlock",
            "p50 µs",
            |r| r.uncontended_p50_us,
            false,
        ),
        (
            "uncontended lock+unlock",
            "p99 µs",
            |r| r.uncontended_p99_us,
            false,
        ),
        ("many keys", "acq/s", |r| r.many_per_s, true),
        (
            "wake-up, 1 parked waiter",
            "hand-off p50 µs",
            |r| r.wakeup.handoff_p50_us,
            false,
        ),
        (
            "wake-up, 1 parked waiter",
            "hand-off p99 µs",
            |r| r.wakeup.handoff_p99_us,
            false,
        ),
        (
            "hand-off, 16 tasks",
            "acq/s",
            |r| r.contended.acq_per_s,
            true,
        ),
        (
            "hand-off, 16 tasks",
            "wait p99 ms",
            |r| r.contended.wait_p99_ms,
            false,
        ),
    ];
    let cell = |(m, lo, hi): (f64, f64, f64)| {
        if m.is_nan() {
            "—".to_owned()
        } else {
            format!("{m:.1} ({lo:.1}–{hi:.1})")
        }
    };
    let ratio_cell = |r: f64| {
        if r.is_nan() {
            "—".to_owned()
        } else {
            format!("{r:.2}")
        }
    };
    for (scenario, metric, of, higher_is_better) in rows {
        let rb_s = spread(rb.iter().map(of).collect());
        let nb_s = spread(nobaton.iter().map(of).collect());
        let j_s = spread(java.iter().map(of).collect());
        let (ratio, ratio_nb) = (j_s.0 / rb_s.0, j_s.0 / nb_s.0);
        out.push_str(&format!(
            "| {scenario} | {metric} | {} | {} | {} | {} | {} |\n",
            cell(rb_s),
            cell(nb_s),
            cell(j_s),
            ratio_cell(ratio),
            ratio_cell(ratio_nb)
        ));
        let (rb_m, j_m) = (rb_s.0, j_s.0);
        json_line(
            json!({"scenario": "redisson_java", "row": scenario, "metric": metric,
            "redisson_version": version, "redbaton_median": rb_m, "redbaton_runs": rb.iter().map(of).collect::<Vec<_>>(),
            "redisson_java_median": j_m, "redisson_java_runs": java.iter().map(of).collect::<Vec<_>>(),
            "ratio": ratio, "higher_is_better": higher_is_better}),
        );
    }
    let overlaps: u64 = java
        .iter()
        .chain(&rb)
        .map(|r| r.wakeup.overlaps + r.contended.overlaps)
        .sum();
    out.push_str(&format!("\nOverlapping holds in these runs: {overlaps}.\n"));
}
