//! Hand-off under contention: the task loop, shared by the one-process run and the worker
//! processes (this binary re-executed).

use std::process::Stdio;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::watch;

use crate::contenders::{Ctx, Kind};
use crate::counters::{commands_per_acq, network_breakdown, sample_pubsub};
use crate::harness::{env_or, now_ns, sleep_until_ns, Opts};
use crate::stats::{analyse, ContendedResult};
use crate::support::{command_calls, RedisServer};

/// One acquisition: when the task called lock, got it, and called unlock (ns, monotonic).
/// A wait still pending when the scenario stopped has `acq` 0 and `rel` = the stop time: it
/// counts in the wait percentiles at its length so far (a lock that starves a task must not
/// look good by never finishing its wait).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Event {
    pub(crate) task: u32,
    pub(crate) call: u64,
    pub(crate) acq: u64,
    pub(crate) rel: u64,
}

struct LoopSpec {
    pub(crate) name: String,
    pub(crate) tasks: usize,
    task_base: u32,
    pub(crate) start_ns: u64,
    pub(crate) end_ns: u64,
    pub(crate) hold: Duration,
    /// false: a releaser queues again only once another task holds the lock.
    barging: bool,
}

/// Holds the lock for `d`, timed by the OS rather than tokio's timer wheel: a tokio sleep
/// would end on the same millisecond tick on which polling contenders' retry sleeps end,
/// handing them a hand-off no real critical section would.
pub(crate) async fn hold(d: Duration) {
    tokio::task::spawn_blocking(move || std::thread::sleep(d))
        .await
        .expect("hold");
}

/// Runs `spec.tasks` tasks contending for one name; returns their events and the number of
/// times a task found another holder inside the critical section.
async fn contend(ctx: Arc<Ctx>, spec: LoopSpec) -> (Vec<Event>, u64) {
    let holders = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicU64::new(0));
    let (seq_tx, _) = watch::channel(0u64);
    let seq_tx = Arc::new(seq_tx);
    let spec = Arc::new(spec);
    let mut handles = Vec::new();
    for t in 0..spec.tasks {
        let (ctx, holders, overlaps, seq_tx, spec) = (
            ctx.clone(),
            holders.clone(),
            overlaps.clone(),
            seq_tx.clone(),
            spec.clone(),
        );
        handles.push(tokio::spawn(async move {
            let mut events = Vec::new();
            let mut seq_rx = seq_tx.subscribe();
            sleep_until_ns(spec.start_ns).await;
            let stop = tokio::time::Instant::now()
                + Duration::from_nanos(spec.end_ns.saturating_sub(now_ns()));
            while now_ns() < spec.end_ns {
                let call = now_ns();
                let Ok(held) = tokio::time::timeout_at(stop, ctx.lock(&spec.name)).await else {
                    // Still waiting at the stop: counted as a wait of (stop - call).
                    events.push(Event {
                        task: spec.task_base + t as u32,
                        call,
                        acq: 0,
                        rel: now_ns().max(call),
                    });
                    break;
                };
                let acq = now_ns();
                if holders.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                let mut mine = 0;
                seq_tx.send_modify(|s| {
                    *s += 1;
                    mine = *s;
                });
                hold(spec.hold).await;
                holders.fetch_sub(1, Ordering::SeqCst);
                let rel = now_ns();
                ctx.unlock(held).await;
                events.push(Event {
                    task: spec.task_base + t as u32,
                    call,
                    acq,
                    rel,
                });
                if !spec.barging {
                    // Queue again only after someone else took the lock (or the run ended).
                    let left = spec.end_ns.saturating_sub(now_ns()) + 50_000_000;
                    let next = seq_rx.wait_for(|s| *s > mine);
                    if tokio::time::timeout(Duration::from_nanos(left), next)
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            }
            events
        }));
    }
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.expect("task"));
    }
    (all, overlaps.load(Ordering::SeqCst))
}

/// Contention inside this process: `tasks` tasks on one name.
pub(crate) async fn contended_in_process(
    kind: Kind,
    server: &RedisServer,
    raw: &fred::clients::Client,
    opts: &Opts,
    tasks: usize,
    barging: bool,
    tag: &str,
) -> ContendedResult {
    let ctx = Arc::new(Ctx::connect(kind, &server.url()).await);
    let before = command_calls(raw).await;
    let start_ns = now_ns() + 50_000_000;
    let end_ns = start_ns + (opts.secs * 1e9) as u64;
    let sampler = sample_pubsub(raw.clone(), end_ns);
    let spec = LoopSpec {
        name: format!("bench:{tag}:{}", kind.name()),
        tasks,
        task_base: 0,
        start_ns,
        end_ns,
        hold: Duration::from_micros(opts.hold_us),
        barging,
    };
    let (events, overlaps) = contend(ctx.clone(), spec).await;
    let after = command_calls(raw).await;
    let conns = sampler.await.expect("sampler");
    let acquired = events.iter().filter(|e| e.acq != 0).count();
    let cmds = commands_per_acq(kind, &before, &after, acquired);
    eprintln!(
        "{tag}, {tasks} tasks, {}: network commands per acquisition: {}",
        kind.name(),
        network_breakdown(kind, &before, &after, acquired)
    );
    if let Ok(ctx) = Arc::try_unwrap(ctx) {
        ctx.shutdown().await;
    }
    analyse(events, tasks, overlaps, cmds, conns)
}

/// Contention across `procs` worker processes (this binary re-executed) × `per_proc` tasks.
pub(crate) async fn contended_processes(
    kind: Kind,
    server: &RedisServer,
    raw: &fred::clients::Client,
    opts: &Opts,
) -> ContendedResult {
    let exe = std::env::current_exe().expect("current exe");
    let mut children = Vec::new();
    for p in 0..opts.procs {
        let mut child = tokio::process::Command::new(&exe)
            .env("RB_WORKER", "1")
            .env("RB_KIND", kind.name())
            .env("RB_URL", server.url())
            .env("RB_WORKER_TASKS", opts.per_proc.to_string())
            .env("RB_TASK_BASE", (p * opts.per_proc).to_string())
            .env("RB_HOLD_US", opts.hold_us.to_string())
            .env("RB_NAME", format!("bench:handoff_mp:{}", kind.name()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn worker");
        let stdin = child.stdin.take().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let ready = lines.next_line().await.expect("worker output");
        assert_eq!(ready.as_deref(), Some("READY"), "worker did not start");
        children.push((child, stdin, lines));
    }
    let before = command_calls(raw).await;
    let start_ns = now_ns() + 100_000_000;
    let end_ns = start_ns + (opts.secs * 1e9) as u64;
    let sampler = sample_pubsub(raw.clone(), end_ns);
    for (_, stdin, _) in &mut children {
        stdin
            .write_all(format!("{start_ns} {end_ns}\n").as_bytes())
            .await
            .expect("start worker");
    }
    let mut events = Vec::new();
    let mut overlaps = 0;
    for (_, _, lines) in &mut children {
        while let Some(line) = lines.next_line().await.expect("worker output") {
            let mut f = line.split_whitespace();
            match f.next() {
                Some("E") => {
                    let n: Vec<u64> = f.map(|x| x.parse().expect("number")).collect();
                    events.push(Event {
                        task: n[0] as u32,
                        call: n[1],
                        acq: n[2],
                        rel: n[3],
                    });
                }
                Some("V") => overlaps += f.next().and_then(|x| x.parse::<u64>().ok()).unwrap_or(0),
                Some("END") => break,
                _ => panic!("unexpected worker line {line:?}"),
            }
        }
    }
    let after = command_calls(raw).await;
    let conns = sampler.await.expect("sampler");
    for (mut child, mut stdin, _) in children {
        let _ = stdin.write_all(b"q\n").await;
        drop(stdin);
        let status = child.wait().await.expect("worker exit");
        assert!(status.success(), "worker failed: {status}");
    }
    let acquired = events.iter().filter(|e| e.acq != 0).count();
    let cmds = commands_per_acq(kind, &before, &after, acquired);
    analyse(events, opts.procs * opts.per_proc, overlaps, cmds, conns)
}

/// Worker process: connect, say READY, run the hand-off loop between the times the parent
/// sends, print events, wait for `q`, shut down.
pub(crate) async fn worker() {
    let kind = Kind::parse(&std::env::var("RB_KIND").expect("RB_KIND")).expect("kind");
    let url = std::env::var("RB_URL").expect("RB_URL");
    let ctx = Arc::new(Ctx::connect(kind, &url).await);
    println!("READY");
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    let line = stdin.next_line().await.expect("stdin").expect("start line");
    let mut f = line
        .split_whitespace()
        .map(|x| x.parse::<u64>().expect("ns"));
    let (start_ns, end_ns) = (f.next().unwrap(), f.next().unwrap());
    let spec = LoopSpec {
        name: std::env::var("RB_NAME").expect("RB_NAME"),
        tasks: env_or("WORKER_TASKS", 4),
        task_base: env_or("TASK_BASE", 0),
        start_ns,
        end_ns,
        hold: Duration::from_micros(env_or("HOLD_US", 1000)),
        barging: true,
    };
    let (events, overlaps) = contend(ctx.clone(), spec).await;
    let mut out = String::new();
    for e in events {
        out.push_str(&format!("E {} {} {} {}\n", e.task, e.call, e.acq, e.rel));
    }
    out.push_str(&format!("V {overlaps}\nEND\n"));
    let mut stdout = tokio::io::stdout();
    stdout.write_all(out.as_bytes()).await.expect("stdout");
    stdout.flush().await.expect("stdout");
    let _ = stdin.next_line().await;
    if let Ok(ctx) = Arc::try_unwrap(ctx) {
        ctx.shutdown().await;
    }
}
