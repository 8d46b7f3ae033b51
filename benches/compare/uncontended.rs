//! The uncontended scenario: the round-trip floor and every contender's lock+unlock and
//! reentrant figures beside it.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use fred::interfaces::{ClientLike, LuaInterface};
use fred::types::scripts::Script;
use fred::types::Value;
use serde_json::json;

use crate::contenders::{Ctx, Kind};
use crate::handoff::hold;
use crate::harness::{now_ns, Opts, ALLOCATIONS};
use crate::report::json_line;
use crate::stats::{pct, us};
use crate::support::RedisServer;

pub(crate) struct Floor {
    pub(crate) evalsha_p50: u64,
    /// A trivial EVALSHA sent right after a 1 ms hold (the client's workers and the server
    /// idle meanwhile): the round trip a hand-off after a critical section starts from.
    pub(crate) after_hold_p50: u64,
    pub(crate) ping_p50: u64,
}

/// Floor, uncontended and reentrant figures, interleaved in blocks so that background noise
/// hits every contender alike.
pub(crate) async fn uncontended(server: &RedisServer, opts: &Opts, out: &mut String) -> Floor {
    let url = server.url();
    let kinds = opts.contenders_in("uncontended");
    let iters = opts.iters.max(10);
    let task = tokio::spawn(async move {
        let mut ctxs = Vec::new();
        for &k in &kinds {
            ctxs.push((k, Ctx::connect(k, &url).await));
        }
        let rb = match ctxs.iter().find(|(k, _)| *k == Kind::Redbaton) {
            Some((_, Ctx::Redbaton(c))) => c.clone(),
            _ => redbaton::Client::connect(&url).await.expect("connect"),
        };
        // The floor runs on redbaton's own command connection.
        let redis = rb.redis().clone();
        let trivial = Script::from_lua("return 1");
        trivial.load(&redis).await.expect("load");
        let sha = trivial.sha1().to_string();
        // redbaton's own two scripts sent raw: the server-side cost of its protocol.
        let lock_script = Script::from_lua(include_str!("../../lua/lock/acquire.lua"));
        let unlock_script = Script::from_lua(include_str!("../../lua/lock/release.lua"));
        lock_script.load(&redis).await.expect("load");
        unlock_script.load(&redis).await.expect("load");
        let mut samples: HashMap<&'static str, Vec<u64>> = HashMap::new();
        // Small interleaved blocks: background load hits the floor and every contender alike.
        let per_block = 5;
        let blocks = (iters / per_block).max(1);
        for block in 0..=blocks {
            let keep = block >= blocks / 10; // the first tenth warms up
            let mut record = |what: &'static str, ns: u64| {
                if keep {
                    samples.entry(what).or_default().push(ns);
                }
            };
            for _ in 0..per_block {
                let t = now_ns();
                let _: i64 = redis
                    .evalsha(sha.as_str(), "bench:floor", ())
                    .await
                    .expect("evalsha");
                record("evalsha", now_ns() - t);
            }
            for _ in 0..per_block {
                let t = now_ns();
                let _: Value = redis.ping(None).await.expect("ping");
                record("ping", now_ns() - t);
            }
            for _ in 0..per_block {
                let t = now_ns();
                two_trivial(&redis, &sha).await;
                record("evalsha2", now_ns() - t);
            }
            for _ in 0..per_block {
                let t = now_ns();
                raw_scripts_cycle(&redis, &lock_script, &unlock_script).await;
                record("scripts", now_ns() - t);
            }
            for (k, ctx) in &ctxs {
                let name = format!("bench:uncontended:{}", k.name());
                for _ in 0..per_block {
                    let t = now_ns();
                    let held = ctx.lock(&name).await;
                    ctx.unlock(held).await;
                    record(k.name(), now_ns() - t);
                }
            }
            let lock = rb.lock("bench:reentrant");
            for _ in 0..per_block {
                let t = now_ns();
                let a = lock.lock().await.expect("lock");
                let b = a.reenter().await.expect("lock");
                let c = a.reenter().await.expect("lock");
                c.unlock().await.expect("unlock");
                b.unlock().await.expect("unlock");
                a.unlock().await.expect("unlock");
                record("reentrant", now_ns() - t);
            }
        }
        // Apart from the interleaved blocks: idle milliseconds between them would slow the
        // round trips measured after them (the host's cores and redis-server go idle too).
        let after_hold = samples.entry("after_hold").or_default();
        for _ in 0..iters.min(500) {
            hold(Duration::from_millis(1)).await;
            let t = now_ns();
            let _: i64 = redis
                .evalsha(sha.as_str(), "bench:floor", ())
                .await
                .expect("evalsha");
            after_hold.push(now_ns() - t);
        }
        // Allocations per cycle, counted apart from the timed blocks (the count is the whole
        // process's, so nothing else may run meanwhile).
        let mut allocs: Vec<(String, f64)> = vec![
            (
                "2 × trivial EVALSHA".into(),
                allocations_per(|| two_trivial(&redis, &sha)).await,
            ),
            (
                "lock + unlock scripts by raw EVALSHA".into(),
                allocations_per(|| raw_scripts_cycle(&redis, &lock_script, &unlock_script)).await,
            ),
        ];
        for (k, ctx) in &ctxs {
            let name = format!("bench:uncontended:{}", k.name());
            let per = allocations_per(|| async {
                let held = ctx.lock(&name).await;
                ctx.unlock(held).await;
            })
            .await;
            allocs.push((format!("{} lock+unlock", k.name()), per));
        }
        let lock = rb.lock("bench:allocations");
        allocs.push((
            "redbaton lock+unlock on a handle made once".into(),
            allocations_per(|| async {
                lock.lock()
                    .await
                    .expect("lock")
                    .unlock()
                    .await
                    .expect("unlock");
            })
            .await,
        ));
        allocs.push((
            "redbaton `client.lock(name)` (the handle alone)".into(),
            allocations_per(|| async {
                std::hint::black_box(rb.lock("bench:allocations"));
            })
            .await,
        ));
        for (_, ctx) in ctxs {
            ctx.shutdown().await;
        }
        (samples, allocs)
    });
    let (mut samples, allocs) = task.await.expect("uncontended task");
    for v in samples.values_mut() {
        v.sort_unstable();
    }
    let floor = Floor {
        evalsha_p50: pct(&samples["evalsha"], 50.0),
        after_hold_p50: pct(&samples["after_hold"], 50.0),
        ping_p50: pct(&samples["ping"], 50.0),
    };
    let two_floor = 2.0 * floor.evalsha_p50 as f64;
    out.push_str("\n### Floor and uncontended lock+unlock (one task, one name)\n\n");
    out.push_str(
        "| measurement | median µs | p99 µs | median / (2 × EVALSHA) |\n|---|---|---|---|\n",
    );
    for (label, key, ratio) in [
        ("trivial EVALSHA (floor)", "evalsha", false),
        (
            "trivial EVALSHA right after a 1 ms hold",
            "after_hold",
            false,
        ),
        ("PING", "ping", false),
        ("2 × trivial EVALSHA, back to back", "evalsha2", false),
        (
            "redbaton's lock + unlock scripts by raw EVALSHA",
            "scripts",
            false,
        ),
    ] {
        let v = &samples[key];
        let _ = ratio;
        out.push_str(&format!(
            "| {label} | {:.1} | {:.1} | — |\n",
            us(pct(v, 50.0)),
            us(pct(v, 99.0))
        ));
        json_line(json!({"scenario": "floor", "measurement": key,
            "median_us": us(pct(v, 50.0)), "p99_us": us(pct(v, 99.0))}));
    }
    for k in opts.contenders_in("uncontended") {
        let v = &samples[k.name()];
        let p50 = pct(v, 50.0);
        out.push_str(&format!(
            "| {} lock+unlock | {:.1} | {:.1} | {:.2} |\n",
            k.name(),
            us(p50),
            us(pct(v, 99.0)),
            p50 as f64 / two_floor
        ));
        json_line(json!({"scenario": "uncontended", "contender": k.name(),
            "median_us": us(p50), "p99_us": us(pct(v, 99.0)),
            "evalsha_floor_us": us(floor.evalsha_p50),
            "ratio_to_2x_evalsha": p50 as f64 / two_floor}));
    }
    let v = &samples["reentrant"];
    out.push_str(&format!(
        "| redbaton reentrant: lock + reenter ×2 + unlock ×3 | {:.1} | {:.1} | {:.2} (÷ 3 pairs) |\n",
        us(pct(v, 50.0)),
        us(pct(v, 99.0)),
        pct(v, 50.0) as f64 / (3.0 * two_floor)
    ));
    out.push_str("\nPeers are not reentrant (rslock, rlock, the naive lock: a second lock() waits for itself; redisson 0.1.0 draws a fresh owner per attempt, so re-locking waits for its own lease), so the reentrant row is redbaton's alone.\n");
    json_line(json!({"scenario": "reentrant", "contender": "redbaton",
        "median_us": us(pct(v, 50.0)), "p99_us": us(pct(v, 99.0)),
        "ratio_to_6x_evalsha": pct(v, 50.0) as f64 / (3.0 * two_floor)}));
    out.push_str("\n### Allocations per uncontended cycle (the whole process, 200 cycles after 50 unmeasured)\n\n| cycle | allocations |\n|---|---|\n");
    for (what, per) in &allocs {
        out.push_str(&format!("| {what} | {per:.1} |\n"));
        json_line(json!({"scenario": "allocations", "cycle": what, "per_cycle": per}));
    }
    if let Some(v) = samples.get("redbaton") {
        println!(
            "uncontended: redbaton lock+unlock median {:.1} µs; trivial EVALSHA median {:.1} µs (ratio to 2× floor {:.2})",
            us(pct(v, 50.0)),
            us(floor.evalsha_p50),
            pct(v, 50.0) as f64 / two_floor
        );
        // The issue-28 target: the library's cycle against its own scripts sent raw.
        if let Some(raw) = samples.get(Kind::Scripts.name()) {
            println!(
                "uncontended: redbaton / redbaton-scripts (raw scripts through fred) {:.3}",
                pct(v, 50.0) as f64 / pct(raw, 50.0) as f64
            );
        }
    }
    floor
}

/// Two trivial `EVALSHA`s back to back: the round-trip floor of a lock+unlock cycle.
async fn two_trivial(redis: &fred::clients::Client, sha: &str) {
    for _ in 0..2 {
        let _: i64 = redis
            .evalsha(sha, "bench:floor", ())
            .await
            .expect("evalsha");
    }
}

/// redbaton's lock and unlock scripts sent raw through fred: the cycle without the library.
async fn raw_scripts_cycle(redis: &fred::clients::Client, lock: &Script, unlock: &Script) {
    let (key, channel) = (
        "bench:raw-scripts",
        "redisson_lock__channel:{bench:raw-scripts}",
    );
    let _: Value = lock
        .evalsha(
            redis,
            key,
            vec![Value::from(30_000i64), "bench-raw:1".into()],
        )
        .await
        .expect("lock script");
    let _: Value = unlock
        .evalsha(
            redis,
            key,
            vec![
                Value::from("bench-raw:1"),
                Value::from(1i64),
                Value::from(0i64),
                "0".into(),
                "PUBLISH".into(),
                channel.into(),
            ],
        )
        .await
        .expect("unlock script");
}

/// Allocations the process makes per run of `cycle`: 50 runs to warm up, then the mean of 200.
async fn allocations_per<F, Fut>(mut cycle: F) -> f64
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    const WARM: usize = 50;
    const RUNS: usize = 200;
    for _ in 0..WARM {
        cycle().await;
    }
    let before = ALLOCATIONS.load(Ordering::SeqCst);
    for _ in 0..RUNS {
        cycle().await;
    }
    (ALLOCATIONS.load(Ordering::SeqCst) - before) as f64 / RUNS as f64
}
