//! The `redbaton` binary as users run it: real processes against a real redis-server.
//! Exit statuses, exclusion across processes, lost leases, signals, re-entry, status, demo.

mod cli_support;
// The library's test support (real redis-server processes, the fault proxy), shared by path
// rather than copied.
use testkit as support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cli_support::{
    bin, process_gone, redbaton, run, run_within, send_signal, wait_for_file, wait_within,
    KillOnDrop, TempDir,
};
use redbaton::Client;
use support::proxy::{Mode, Proxy};
use support::RedisServer;

const SEC: Duration = Duration::from_secs(1);

/// Sets a plain string key (user data that is not a lock).
fn set_string(server: &RedisServer, key: &str) {
    let status = Command::new("redis-cli")
        .args(["-p", &server.port.to_string(), "set", key, "user data"])
        .stdout(Stdio::null())
        .status()
        .expect("redis-cli");
    assert!(status.success());
}

fn get_string(server: &RedisServer, key: &str) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &server.port.to_string(), "get", key])
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn status_json(url: &str, name: &str) -> (i32, serde_json::Value) {
    let (code, out, err) = run(redbaton(url, &["status", name, "--json"]));
    let json = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out} {err}"));
    (code, json)
}

/// Starts `redbaton exec NAME -- sh -c SCRIPT` in the background.
fn spawn_exec(url: &str, extra: &[&str], name: &str, script: &str) -> KillOnDrop {
    let mut args = vec!["exec"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[name, "--", "sh", "-c", script]);
    redbaton(url, &args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map(KillOnDrop)
        .unwrap()
}

#[test]
fn usage_errors_exit_64() {
    let url = "redis://127.0.0.1:1";
    for args in [
        &["exec", "name", "true"][..],                     // CMD without `--`
        &["exec", "name"][..],                             // no CMD
        &["exec", "--wait", "soon", "name", "--", "true"], // bad duration
        &["exec", "--lease", "-5", "name", "--", "true"],
        &["exec", "--lease", "0", "name", "--", "true"],
        &["exec", "--watchdog-lease", "1x", "name", "--", "true"],
        &["unlock", "name"][..], // --force is required
        &["frobnicate"][..],
    ] {
        let (code, _, err) = run(redbaton(url, args));
        assert_eq!(code, 64, "{args:?}: {err}");
        assert!(!err.is_empty(), "{args:?} explains itself");
    }
    let (_, _, err) = run(redbaton(url, &["exec", "name", "true"]));
    assert!(err.contains("put `--` before CMD"), "{err}");
    let (code, out, _) = run(redbaton(url, &["--help"]));
    assert_eq!(code, 0);
    assert!(out.contains("76") && out.contains("lease lost"), "{out}");
}

#[test]
fn redis_unreachable_exits_69_in_a_sentence_naming_host_and_port() {
    let port = support::free_port();
    let url = format!("redis://127.0.0.1:{port}");
    for args in [
        &["exec", "x", "--", "true"][..],
        &["status", "x"][..],
        &["unlock", "--force", "x"][..],
    ] {
        let (code, _, err) = run(redbaton(&url, args));
        assert_eq!(code, 69, "{args:?}: {err}");
        // One sentence, not Rust debug text (`IO: Os { code: 111, kind: … }`).
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(
            !err.contains("Os {") && !err.contains("kind:") && !err.contains("IO:"),
            "no Rust debug text: {err}"
        );
        assert!(
            err.contains(&format!(
                "cannot connect to Redis at redis://127.0.0.1:{port}: connection refused"
            )),
            "{err}"
        );
    }
}

#[test]
fn wrong_password_exits_77_without_printing_it() {
    let server = RedisServer::start_with(&["--requirepass", "rightpw"]);
    let url = format!("redis://:hunter2secret@127.0.0.1:{}", server.port);
    let (code, out, err) = run(redbaton(&url, &["exec", "x", "--", "true"]));
    assert_eq!(code, 77, "{err}");
    assert!(
        !err.contains("hunter2secret") && !out.contains("hunter2secret"),
        "{err}"
    );
    // The right password works.
    let url = format!("redis://:rightpw@127.0.0.1:{}", server.port);
    let (code, _, err) = run(redbaton(&url, &["exec", "x", "--", "true"]));
    assert_eq!(code, 0, "{err}");
}

#[test]
fn invalid_names_and_non_lock_keys_exit_65_and_user_data_survives() {
    let server = RedisServer::start();
    let url = server.url();
    let (code, _, err) = run(redbaton(&url, &["exec", "", "--", "true"]));
    assert_eq!(code, 65, "{err}");
    let (code, _, _) = run(redbaton(&url, &["status", ""]));
    assert_eq!(code, 65);
    set_string(&server, "plain");
    for args in [
        &["exec", "plain", "--", "true"][..],
        &["status", "plain"][..],
        &["unlock", "--force", "plain"][..],
    ] {
        let (code, _, err) = run(redbaton(&url, args));
        assert_eq!(code, 65, "{args:?}: {err}");
        assert!(err.contains("not a lock"), "{err}");
    }
    assert_eq!(get_string(&server, "plain"), "user data");
}

#[test]
fn cmd_status_signals_126_127_and_the_lock_is_released() {
    let server = RedisServer::start();
    let url = server.url();
    let (code, _, _) = run(redbaton(&url, &["exec", "l", "--", "sh", "-c", "exit 3"]));
    assert_eq!(code, 3);
    let (code, _, _) = run(redbaton(
        &url,
        &["exec", "l", "--", "sh", "-c", "kill -TERM $$"],
    ));
    assert_eq!(code, 128 + 15);
    let (code, _, err) = run(redbaton(&url, &["exec", "l", "--", "/nonexistent/cmd"]));
    assert_eq!(code, 127, "{err}");
    let dir = TempDir::new("noexec");
    let plain = dir.path("not-executable");
    std::fs::write(&plain, "echo should not run\n").unwrap();
    for cmd in [plain.to_str().unwrap(), dir.0.to_str().unwrap()] {
        let (code, out, err) = run(redbaton(&url, &["exec", "l", "--", cmd]));
        assert_eq!(code, 126, "{cmd}: {err}");
        assert!(out.is_empty());
    }
    // Released every time: free now, and a try-once exec gets it.
    let (code, _, _) = run(redbaton(&url, &["status", "l"]));
    assert_eq!(code, 1);
    let (code, out, _) = run(redbaton(
        &url,
        &[
            "exec",
            "--wait",
            "0",
            "l",
            "--",
            "sh",
            "-c",
            "echo $REDBATON_LOCK",
        ],
    ));
    assert_eq!((code, out.trim()), (0, "l"));
}

/// A release Redis refuses after CMD ran (here: an ACL that CMD itself set, denying EVALSHA)
/// is reported: exit 74, with CMD's status and the reason on stderr.
#[test]
fn a_failed_release_exits_74_naming_cmds_status() {
    let server = RedisServer::start();
    let url = server.url();
    let port = server.port.to_string();
    let deny = format!("redis-cli -p {port} acl setuser default -evalsha >/dev/null; exit 3");
    let (code, _, err) = run(redbaton(
        &url,
        &["exec", "refused", "--", "sh", "-c", &deny],
    ));
    let allowed = Command::new("redis-cli")
        .args(["-p", &port, "acl", "setuser", "default", "+evalsha"])
        .output()
        .expect("redis-cli");
    assert!(allowed.status.success());
    assert_eq!(code, 74, "{err}");
    assert!(err.contains("could not be released"), "{err}");
    assert!(err.contains("exited with 3"), "{err}");
}

/// On a cluster, a name whose key and channel hash to different slots could be taken but
/// never released: exec refuses it (65) before anything is sent.
#[test]
fn exec_refuses_a_name_the_cluster_cannot_place() {
    let cluster = support::cluster::RedisCluster::start(3, 0);
    let url = cluster.url();
    let (code, _, err) = run(redbaton(&url, &["exec", "q}b", "--", "true"]));
    assert_eq!(code, 65, "{err}");
    assert!(err.contains("slot"), "{err}");
    for node in cluster.nodes.iter() {
        assert_eq!(
            support::cluster::cli(node.port, &["dbsize"]).trim(),
            "0",
            "nothing written"
        );
    }
}

#[test]
fn busy_lock_exits_75_or_the_conflict_code_naming_the_holders() {
    let server = RedisServer::start();
    let url = server.url();
    let dir = TempDir::new("busy");
    let ready = dir.path("ready");
    let mut holder = spawn_exec(
        &url,
        &[],
        "busy",
        &format!("echo up > {}; sleep 30", ready.display()),
    );
    wait_for_file(&ready, 20 * SEC);
    let (code, _, err) = run(redbaton(
        &url,
        &["exec", "--wait", "0", "busy", "--", "true"],
    ));
    assert_eq!(code, 75, "{err}");
    assert!(
        err.contains("\"busy\"") && err.contains("1 owner") && err.contains("hold count 1"),
        "{err}"
    );
    // The wait asked for, as given: `--wait 0` is "0s", not the milliseconds the try took.
    assert!(err.contains("not acquired within 0s"), "{err}");
    let start = Instant::now();
    let (code, _, err) = run(redbaton(
        &url,
        &["exec", "-w", "300ms", "-E", "9", "busy", "--", "true"],
    ));
    assert_eq!(code, 9);
    assert!(err.contains("not acquired within 300ms"), "{err}");
    assert!(start.elapsed() >= Duration::from_millis(300));
    let (code, _, _) = run(redbaton(
        &url,
        &[
            "exec",
            "--wait",
            "1",
            "--conflict-exit-code",
            "3",
            "busy",
            "--",
            "true",
        ],
    ));
    assert_eq!(code, 3);
    // `-E 0` (flock's idiom, README's cron example): a busy lock is no failure.
    let (code, _, err) = run(redbaton(
        &url,
        &["exec", "--wait", "0", "-E", "0", "busy", "--", "false"],
    ));
    assert_eq!(code, 0, "{err}");
    // ... and with --quiet, not even a line on stderr (cron mails any output).
    let (code, out, err) = run(redbaton(
        &url,
        &[
            "exec", "--wait", "0", "-E", "0", "--quiet", "busy", "--", "false",
        ],
    ));
    assert_eq!((code, out.as_str(), err.as_str()), (0, "", ""));
    send_signal(holder.id(), "TERM");
    assert!(wait_within(&mut holder, 20 * SEC).is_some());
}

#[test]
fn exec_excludes_across_processes() {
    let server = RedisServer::start();
    let url = server.url();
    let dir = TempDir::new("excl");
    let counter = dir.path("counter");
    std::fs::write(&counter, "0\n").unwrap();
    let script = format!(
        "n=$(cat {f}); sleep 0.005; echo $((n + 1)) > {f}",
        f = counter.display()
    );
    let start = Instant::now();
    let workers: Vec<_> = (0..8)
        .map(|_| {
            let url = url.clone();
            let script = script.clone();
            std::thread::spawn(move || {
                for _ in 0..25 {
                    let (code, _, err) = run(redbaton(
                        &url,
                        &["exec", "counter", "--", "sh", "-c", &script],
                    ));
                    assert_eq!(code, 0, "{err}");
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    assert_eq!(std::fs::read_to_string(&counter).unwrap().trim(), "200");
    eprintln!("200 exec runs by 8 processes in {:?}", start.elapsed());
}

#[test]
fn force_unlock_stops_cmd_and_its_grandchildren_with_76() {
    let server = RedisServer::start();
    let url = server.url();
    let dir = TempDir::new("lost");
    let pids = dir.path("pids");
    let mut exec = spawn_exec(
        &url,
        &[],
        "job",
        &format!("sleep 300 & echo $$ $! > {}; wait", pids.display()),
    );
    let text = wait_for_file(&pids, 20 * SEC);
    let pids: Vec<u32> = text
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 2);
    let start = Instant::now();
    let (code, _, _) = run(redbaton(&url, &["unlock", "--force", "job"]));
    assert_eq!(code, 0);
    let status = wait_within(&mut exec, 10 * SEC).expect("exec ends after its lock is lost");
    assert_eq!(status.code(), Some(76));
    assert!(start.elapsed() < 6 * SEC, "took {:?}", start.elapsed());
    for pid in pids {
        assert!(
            process_gone(pid),
            "pid {pid} (CMD or its background child) survived"
        );
    }
    let mut err = String::new();
    std::io::Read::read_to_string(exec.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(err.contains("lost"), "{err}");
    // Free again; a second force-unlock finds nothing.
    let (code, _, _) = run(redbaton(&url, &["unlock", "--force", "job"]));
    assert_eq!(code, 1);
}

#[test]
fn a_fixed_lease_outlived_by_cmd_is_a_lost_lease() {
    let server = RedisServer::start();
    let url = server.url();
    let start = Instant::now();
    let (code, _, err) = run(redbaton(
        &url,
        &["exec", "--lease", "700ms", "short", "--", "sleep", "30"],
    ));
    assert_eq!(code, 76, "{err}");
    assert!(start.elapsed() < 10 * SEC);
    // A CMD that ignores SIGTERM gets SIGKILL after --kill-after.
    let start = Instant::now();
    let (code, _, err) = run(redbaton(
        &url,
        &[
            "exec",
            "--lease",
            "700ms",
            "--kill-after",
            "300ms",
            "short",
            "--",
            "sh",
            "-c",
            "trap '' TERM; while :; do sleep 0.05; done",
        ],
    ));
    assert_eq!(code, 76, "{err}");
    assert!(start.elapsed() < 10 * SEC, "took {:?}", start.elapsed());
    // A command that ends within its lease is fine.
    let (code, _, _) = run(redbaton(
        &url,
        &["exec", "--lease", "20s", "short", "--", "true"],
    ));
    assert_eq!(code, 0);
}

#[test]
fn redis_gone_past_the_watchdog_lease_is_a_lost_lease() {
    let mut server = RedisServer::start();
    let url = server.url();
    let dir = TempDir::new("gone");
    let ready = dir.path("ready");
    let mut exec = spawn_exec(
        &url,
        &["--watchdog-lease", "1s"],
        "gone",
        &format!("echo up > {}; sleep 300", ready.display()),
    );
    wait_for_file(&ready, 20 * SEC);
    server.kill();
    let status =
        wait_within(&mut exec, 15 * SEC).expect("exec ends once its lease cannot be renewed");
    assert_eq!(status.code(), Some(76));
}

/// Shell that prints the machine's uptime — a monotonic clock every process reads alike,
/// unlike the wall clock, which may be stepped — as `<seconds>.<hundredths> <idle>`.
const UPTIME: &str = "cat /proc/uptime";

/// The uptime as the shell's [`UPTIME`] prints it, in nanoseconds.
fn now_ns() -> i128 {
    parse_ns(&std::fs::read_to_string("/proc/uptime").unwrap())
}

/// An uptime (`<seconds>.<hundredths>`, anything after a space ignored) as nanoseconds.
fn parse_ns(line: &str) -> i128 {
    let secs = line.split_whitespace().next().unwrap_or_default();
    let secs: f64 = secs.parse().unwrap_or_else(|e| panic!("{e}: {line:?}"));
    (secs * 1e9) as i128
}

fn secs(ns: i128) -> f64 {
    ns as f64 / 1e9
}

/// A tokio runtime for the in-process proxy and lock client of a test.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn a_stalled_network_stops_cmd_as_soon_as_the_lease_runs_out() {
    // Redis stalls (no reply, no error) for longer than the watchdog lease. The lease runs out
    // by redbaton's local clock no later than `lease` after the stall began (no renewal gets
    // through it); CMD must get SIGTERM promptly then, not after a command timeout (5 s).
    let server = RedisServer::start();
    let rt = runtime();
    let proxy = rt.block_on(Proxy::start(server.port));
    let dir = TempDir::new("stall");
    let beats = dir.path("beats");
    let term = dir.path("term");
    let lease = 2 * SEC;
    let mut exec = spawn_exec(
        &proxy.url(),
        &["--watchdog-lease", "2s"],
        "stalled",
        &format!(
            "trap '{UPTIME} > {t}; exit 0' TERM; while :; do {UPTIME} >> {b}; sleep 0.05; done",
            t = term.display(),
            b = beats.display()
        ),
    );
    wait_for_file(&beats, 20 * SEC);
    let other = rt.block_on(Client::connect(&server.url())).unwrap();
    let stalled_at = now_ns();
    proxy.set(Mode::Stalled);

    // Another client, straight to the server, takes the lock as soon as the key expires.
    let guard = rt.block_on(async {
        let lock = other.lock("stalled");
        let start = tokio::time::Instant::now();
        loop {
            if let Some(guard) = lock.try_lock().await.unwrap() {
                return guard;
            }
            assert!(
                start.elapsed() < 20 * SEC,
                "the stalled holder's key never expired"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    let acquired_at = now_ns();

    let term_at = parse_ns(&wait_for_file(&term, 20 * SEC));
    let text = std::fs::read_to_string(&beats).unwrap();
    let last_beat = parse_ns(text.lines().last().unwrap());
    let lease_out_by = stalled_at + lease.as_nanos() as i128;
    let timeline = format!(
        "from the stall: lock taken by the other client at +{:.2}s, CMD's SIGTERM at +{:.2}s, \
         its last beat at +{:.2}s (lease {lease:?})",
        secs(acquired_at - stalled_at),
        secs(term_at - stalled_at),
        secs(last_beat - stalled_at)
    );
    // Generous for a loaded machine, yet below what it rules out: CMD stopped only when a
    // renewal stuck in the stall times out, 5 s (the command timeout) after it was sent —
    // at least 3 s after the lease ran out.
    let slack = 2_500_000_000;
    assert!(
        term_at <= lease_out_by + slack,
        "CMD stopped late: {timeline}"
    );
    assert!(
        last_beat <= acquired_at + slack,
        "CMD ran on while another client held the lock: {timeline}"
    );
    eprintln!("{timeline}");

    proxy.set(Mode::Open);
    let status = wait_within(&mut exec, 30 * SEC).expect("exec ends after its lease is lost");
    assert_eq!(status.code(), Some(76));
    rt.block_on(async {
        guard.unlock().await.unwrap();
        other.shutdown().await.unwrap();
    });
}

#[test]
fn a_lease_over_before_its_acquire_returns_never_runs_cmd() {
    // Every reply comes 100 ms late, after the 10 ms lease ended: the library never hands out
    // such a hold (it releases it and tries again), so within --wait nothing is acquired and
    // CMD never runs; nothing is left held.
    let server = RedisServer::start();
    let rt = runtime();
    let proxy = rt.block_on(Proxy::start(server.port));
    proxy.set(Mode::RepliesDelayed(Duration::from_millis(100)));
    let url = proxy.url();
    let dir = TempDir::new("late");
    let ran = dir.path("ran");
    let (code, _, err) = run(redbaton(
        &url,
        &[
            "exec",
            "--lease",
            "10ms",
            "--wait",
            "1s",
            "late",
            "--",
            "sh",
            "-c",
            &format!("touch {}", ran.display()),
        ],
    ));
    assert_eq!(code, 75, "{err}");
    assert!(!ran.exists(), "CMD ran although its lease was over");
    // An attempt still in flight at the deadline is released in the background.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while status_json(&server.url(), "late").0 != 1 {
        assert!(std::time::Instant::now() < deadline, "left held");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn signals_are_forwarded_to_cmd() {
    let server = RedisServer::start();
    let url = server.url();
    let dir = TempDir::new("sig");
    for signal in ["TERM", "HUP", "INT"] {
        let ready = dir.path(&format!("ready-{signal}"));
        let got = dir.path(&format!("got-{signal}"));
        let mut exec = spawn_exec(
            &url,
            &[],
            "sig",
            &format!(
                "trap 'echo {signal} > {g}; exit 7' {signal}; echo up > {r}; while :; do sleep 0.05; done",
                g = got.display(),
                r = ready.display()
            ),
        );
        wait_for_file(&ready, 20 * SEC);
        send_signal(exec.id(), signal);
        let status = wait_within(&mut exec, 10 * SEC).expect("CMD ends on the forwarded signal");
        assert_eq!(
            status.code(),
            Some(7),
            "{signal}: CMD's trap ran and set the status"
        );
        assert_eq!(std::fs::read_to_string(&got).unwrap().trim(), signal);
    }
}

#[test]
fn a_signal_while_waiting_ends_without_running_cmd() {
    let server = RedisServer::start();
    let url = server.url();
    let dir = TempDir::new("sigwait");
    let ready = dir.path("ready");
    let ran = dir.path("ran");
    let mut holder = spawn_exec(
        &url,
        &[],
        "w",
        &format!("echo up > {}; sleep 30", ready.display()),
    );
    wait_for_file(&ready, 20 * SEC);
    let mut waiter = spawn_exec(&url, &[], "w", &format!("echo ran > {}", ran.display()));
    // The waiter is parked once its subscription shows up on the lock's channel.
    let start = Instant::now();
    loop {
        let (_, json) = status_json(&url, "w");
        if json["subscribers"] == 1 {
            break;
        }
        assert!(start.elapsed() < 20 * SEC, "the waiter never subscribed");
        std::thread::sleep(Duration::from_millis(50));
    }
    send_signal(waiter.id(), "TERM");
    let status = wait_within(&mut waiter, 10 * SEC).expect("waiter ends");
    assert_eq!(status.code(), Some(128 + 15));
    assert!(!ran.exists(), "CMD must not run");
    send_signal(holder.id(), "TERM");
    assert!(wait_within(&mut holder, 20 * SEC).is_some());
}

#[test]
fn nested_exec_of_the_same_lock_re_enters() {
    let server = RedisServer::start();
    let url = server.url();
    let dir = TempDir::new("nested");
    let inner = dir.path("inner.json");
    let script = format!(
        "{bin} exec --wait 0 nest -- {bin} status nest --json > {out}",
        bin = bin(),
        out = inner.display()
    );
    let (code, _, err) =
        run(redbaton(&url, &["exec", "nest", "--", "sh", "-c", &script]).env("REDIS_URL", &url));
    assert_eq!(code, 0, "{err}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&inner).unwrap()).unwrap();
    assert_eq!(json["locked"], true);
    assert_eq!(json["hold_count"], 2, "{json}");
    assert_eq!(json["owners"].as_array().unwrap().len(), 1, "{json}");
    assert_eq!(json["owners"][0]["count"], 2);
    // Both holds were released.
    let (code, _) = status_json(&url, "nest");
    assert_eq!(code, 1);
}

#[test]
fn status_reports_owner_count_ttl_and_waiters() {
    let server = RedisServer::start();
    let url = server.url();
    let dir = TempDir::new("status");
    let owner_file = dir.path("owner");

    let (code, json) = status_json(&url, "st");
    assert_eq!(code, 1);
    assert_eq!(json["locked"], false);
    assert_eq!(json["ttl_ms"], serde_json::Value::Null);
    let (code, text, _) = run(redbaton(&url, &["status", "st"]));
    assert_eq!(code, 1);
    assert!(text.contains("free"), "{text}");

    let mut holder = spawn_exec(
        &url,
        &[],
        "st",
        &format!("echo $REDBATON_OWNER > {}; sleep 30", owner_file.display()),
    );
    let owner = wait_for_file(&owner_file, 20 * SEC).trim().to_owned();
    let (code, json) = status_json(&url, "st");
    assert_eq!(code, 0);
    assert_eq!(json["locked"], true);
    assert_eq!(json["owners"][0]["owner"], owner.as_str());
    assert_eq!(json["owners"][0]["count"], 1);
    let ttl = json["ttl_ms"].as_u64().unwrap();
    assert!(ttl > 20_000 && ttl <= 30_000, "watchdog lease 30 s: {ttl}");
    assert_eq!(json["subscribers"], 0);
    let (code, text, _) = run(redbaton(&url, &["status", "st"]));
    assert_eq!(code, 0);
    assert!(text.contains("locked") && text.contains(&owner), "{text}");

    let mut waiter = spawn_exec(&url, &[], "st", "true");
    let start = Instant::now();
    while status_json(&url, "st").1["subscribers"] != 1 {
        assert!(start.elapsed() < 20 * SEC, "the waiter never subscribed");
        std::thread::sleep(Duration::from_millis(50));
    }
    send_signal(holder.id(), "TERM");
    assert!(wait_within(&mut holder, 20 * SEC).is_some());
    let status = wait_within(&mut waiter, 20 * SEC).expect("the waiter gets the lock next");
    assert_eq!(status.code(), Some(0));
}

#[test]
fn demo_sells_exactly_the_stock() {
    let out = run_within(
        Command::new(bin())
            .args(["demo", "--processes", "2", "--tasks", "3", "--stock", "40"])
            .env_remove("REDIS_URL"),
        Duration::from_secs(60),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("sold 40 of 40 (oversold 0)"), "{stdout}");
    assert!(stdout.contains("overlapping holds 0"), "{stdout}");
    assert!(stdout.contains("hand-off latency"), "{stdout}");
}

#[test]
fn demo_without_redis_server_exits_69_with_a_hint() {
    let dir = TempDir::new("nopath");
    let out = run_within(
        Command::new(bin())
            .args(["demo", "--stock", "5"])
            .env("PATH", &dir.0)
            .env_remove("REDIS_URL"),
        Duration::from_secs(30),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert!(
        err.contains("redis-server is not installed") && err.contains("apt-get install"),
        "{err}"
    );
}

#[test]
fn cmd_does_not_outlive_a_killed_redbaton() {
    let server = RedisServer::start();
    let url = server.url();
    let dir = TempDir::new("pdeath");
    let pid_file = dir.path("pid");
    let mut exec = spawn_exec(
        &url,
        &[],
        "orphan",
        &format!(
            "echo $$ > {}; while :; do sleep 0.05; done",
            pid_file.display()
        ),
    );
    let cmd_pid: u32 = wait_for_file(&pid_file, 20 * SEC).trim().parse().unwrap();
    send_signal(exec.id(), "KILL");
    assert!(wait_within(&mut exec, 10 * SEC).is_some());
    let start = Instant::now();
    while !process_gone(cmd_pid) {
        assert!(
            start.elapsed() < 10 * SEC,
            "CMD kept running after redbaton was killed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn on_a_terminal_cmd_gets_the_foreground() {
    // `script` (util-linux) gives redbaton a pseudo-terminal as stdin; CMD reads from it,
    // which stops a background process group (SIGTTIN) instead of reading.
    let server = RedisServer::start();
    let inner = format!(
        "{} --url {} exec tty -- sh -c 'read x; echo \"got=$x $(cut -d\" \" -f5,8 /proc/$$/stat)\"'",
        bin(),
        server.url()
    );
    let mut child = Command::new("script")
        .args(["-qec", &inner, "/dev/null"])
        .env_remove("REDIS_URL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map(KillOnDrop)
        .expect("script(1) from util-linux");
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), b"hello\n").unwrap();
    let status = wait_within(&mut child, 20 * SEC).expect("CMD could read the terminal");
    let mut out = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut out).unwrap();
    assert!(status.success(), "{out}");
    let line = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("got=hello "))
        .unwrap_or_else(|| panic!("no answer from CMD: {out:?}"));
    let (pgrp, tpgid) = line.split_once(' ').unwrap();
    assert_eq!(
        pgrp, tpgid,
        "CMD's group is the terminal's foreground group"
    );
}
