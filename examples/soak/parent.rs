//! The parent: starts redis-server and the fault proxy, runs the worker processes, injects
//! faults until enough acquisitions were checked, then merges the workers' histories, checks
//! them and prints the summary.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::interfaces::{ClientLike, HashesInterface, KeysInterface};
use fred::prelude::{Builder as FredBuilder, Config as FredConfig, ReconnectPolicy};
use fred::types::CustomCommand;
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::failover::Topology;
use crate::history::{judge_history, Section};
use crate::proxy::{Mode, Proxy};
use crate::record::{counter_key, fence_key, mono_ns, since, Record, WriteOutcome, NAMES};
use crate::server::Server;
use crate::{Opts, TopologyKind};

/// The kinds of fault, in the summary's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum FaultKind {
    PubsubKill,
    ScriptFlush,
    ClientPause,
    ProxyStall,
    ProxyCut,
    Restart,
    /// A failover topology's primary SIGKILLed and its replica promoted.
    Failover,
}

impl FaultKind {
    const ALL: [(FaultKind, u32); 6] = [
        (FaultKind::PubsubKill, 20),
        (FaultKind::ScriptFlush, 15),
        (FaultKind::ClientPause, 20),
        (FaultKind::ProxyStall, 17),
        (FaultKind::ProxyCut, 15),
        (FaultKind::Restart, 13),
    ];

    fn label(self) -> &'static str {
        match self {
            FaultKind::PubsubKill => "subscribers killed",
            FaultKind::ScriptFlush => "script flush",
            FaultKind::ClientPause => "client pause",
            FaultKind::ProxyStall => "proxy stall",
            FaultKind::ProxyCut => "proxy cut",
            FaultKind::Restart => "server restart",
            FaultKind::Failover => "primary killed and replica promoted",
        }
    }

    fn pick(rng: &mut fastrand::Rng) -> FaultKind {
        let total: u32 = Self::ALL.iter().map(|(_, w)| w).sum();
        let mut x = rng.u32(0..total);
        for (kind, w) in Self::ALL {
            if x < w {
                return kind;
            }
            x -= w;
        }
        unreachable!()
    }
}

/// One injected fault.
#[derive(Clone, Debug)]
struct Fault {
    at_ns: u64,
    kind: FaultKind,
    /// How long it lasted (pause, stall, cut, restart downtime).
    length: Duration,
    ok: bool,
}

async fn raw_client(url: &str) -> Result<fred::clients::Client, String> {
    let config = FredConfig::from_url(url).map_err(|e| e.to_string())?;
    let client = FredBuilder::from_config(config)
        .with_connection_config(|c| {
            c.connection_timeout = Duration::from_secs(2);
            c.internal_command_timeout = Duration::from_secs(2);
        })
        .with_performance_config(|p| p.default_command_timeout = Duration::from_secs(5))
        .set_policy(ReconnectPolicy::new_constant(0, 100))
        .build()
        .map_err(|e| e.to_string())?;
    client.init().await.map_err(|e| e.to_string())?;
    Ok(client)
}

async fn command(raw: &fred::clients::Client, name: &'static str, args: &[&str]) -> bool {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    raw.custom::<fred::types::Value, _>(CustomCommand::new_static(name, None, false), args)
        .await
        .is_ok()
}

/// Injects faults until `stop` turns true; leaves the proxy open and the server up.
async fn inject_faults(
    server: Arc<Mutex<Server>>,
    proxy: Arc<Proxy>,
    raw: fred::clients::Client,
    mut stop: watch::Receiver<bool>,
    seed: u64,
    every: Duration,
    lease: Duration,
) -> Vec<Fault> {
    let mut rng = fastrand::Rng::with_seed(seed ^ 0xFA17);
    let mut faults = Vec::new();
    loop {
        let pause = every.mul_f64(0.5 + rng.f64());
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.changed() => {}
        }
        if *stop.borrow() {
            break;
        }
        let kind = FaultKind::pick(&mut rng);
        let at_ns = mono_ns();
        let started = Instant::now();
        let ok = match kind {
            FaultKind::PubsubKill => command(&raw, "CLIENT", &["KILL", "TYPE", "pubsub"]).await,
            FaultKind::ScriptFlush => command(&raw, "SCRIPT", &["FLUSH"]).await,
            FaultKind::ClientPause => {
                let ms = rng.u64(200..=800).to_string();
                let ok = command(&raw, "CLIENT", &["PAUSE", &ms, "ALL"]).await;
                tokio::time::sleep(Duration::from_millis(ms.parse().unwrap_or(0))).await;
                ok
            }
            FaultKind::ProxyStall => {
                // Up to 1.6 leases: long enough, sometimes, for a lease to run out.
                let ms = rng.u64(200..=(lease.as_millis() as u64 * 8 / 5).max(300));
                proxy.set(Mode::Stalled);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                proxy.set(Mode::Open);
                true
            }
            FaultKind::ProxyCut => {
                proxy.set(Mode::Cut);
                tokio::time::sleep(Duration::from_millis(rng.u64(20..=300))).await;
                proxy.set(Mode::Open);
                true
            }
            // Never picked: failovers have their own schedule.
            FaultKind::Failover => false,
            FaultKind::Restart => {
                let server = server.clone();
                match tokio::task::spawn_blocking(move || server.lock().restart()).await {
                    Ok(Ok(())) => true,
                    Ok(Err(e)) => {
                        eprintln!("soak: {e}");
                        false
                    }
                    Err(e) => {
                        eprintln!("soak: restart task: {e}");
                        false
                    }
                }
            }
        };
        faults.push(Fault {
            at_ns,
            kind,
            length: started.elapsed(),
            ok,
        });
    }
    proxy.set(Mode::Open);
    faults
}

fn read_number(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

fn spawn_worker(
    opts: &Opts,
    id: usize,
    dir: &Path,
    (direct, proxy): (u16, u16),
    lock_url: Option<&str>,
    seed: u64,
) -> Child {
    let log = std::fs::File::create(dir.join(format!("worker-{id}.log"))).expect("a worker log");
    let exe = std::env::current_exe().expect("the soak's own executable");
    let mut command = Command::new(exe);
    command
        .arg("worker")
        .args(["--id", &id.to_string()])
        .args(["--direct-port", &direct.to_string()])
        .args(["--proxy-port", &proxy.to_string()])
        .arg("--dir")
        .arg(dir)
        .args(["--seed", &seed.to_string()])
        .args(["--tasks", &opts.tasks.to_string()])
        .args(["--lease-ms", &opts.lease_ms.to_string()])
        .args(["--command-timeout-ms", &opts.command_timeout_ms.to_string()])
        .args(["--sabotage", &opts.sabotage.to_string()])
        .args(["--grace-secs", &opts.grace_secs.to_string()])
        .args(["--calls", &opts.calls])
        .args(["--names", &opts.names.to_string()])
        .args(["--replica-sync", &opts.replica_sync])
        .stdin(Stdio::null())
        .stdout(Stdio::from(log.try_clone().expect("a worker log")))
        .stderr(Stdio::from(log));
    if let Some(url) = lock_url {
        command.args(["--lock-url", url]);
    }
    command.spawn().expect("spawn a worker process")
}

/// Kills primaries until `count` failovers were done (or one failed): each returns once the
/// topology is whole again, then the next waits `every`.
async fn fail_over_repeatedly(
    topology: Arc<Mutex<Topology>>,
    count: usize,
    every: Duration,
    done: Arc<std::sync::atomic::AtomicUsize>,
) -> (Vec<Fault>, Option<String>) {
    let mut faults = Vec::new();
    for n in 0..count {
        tokio::time::sleep(every).await;
        let at_ns = mono_ns();
        let topology = topology.clone();
        let outcome = tokio::task::spawn_blocking(move || topology.lock().fail_over()).await;
        match outcome {
            Ok(Ok(took)) => {
                eprintln!("soak: failover {} done; promoted after {took:.1?}", n + 1);
                faults.push(Fault {
                    at_ns,
                    kind: FaultKind::Failover,
                    length: took,
                    ok: true,
                });
                done.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            }
            Ok(Err(e)) => return (faults, Some(e)),
            Err(e) => return (faults, Some(e.to_string())),
        }
    }
    (faults, None)
}

/// Runs the soak; the exit code says whether it found a violation.
pub fn main(opts: Opts) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match runtime.block_on(run(opts)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("soak: {e}");
            ExitCode::from(2)
        }
    }
}

async fn run(opts: Opts) -> Result<bool, String> {
    let seed = opts.seed.unwrap_or_else(|| fastrand::u64(..));
    // tmpfs when there is one: `appendfsync always` then costs no disk flush, and a killed
    // server still finds every acknowledged write in its AOF.
    let base = opts.dir.clone().unwrap_or_else(|| {
        let shm = PathBuf::from("/dev/shm");
        if shm.is_dir() {
            shm
        } else {
            std::env::temp_dir()
        }
    });
    let dir = base.join(format!(
        "redbaton-soak-{}-{}",
        std::process::id(),
        mono_ns()
    ));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let failing_over = opts.topology != TopologyKind::Standalone;
    let max_time = Duration::from_secs(opts.max_time_secs.unwrap_or(
        120 + opts.acquisitions / 20
            + if failing_over {
                40 * opts.failovers as u64
            } else {
                0
            },
    ));
    let lease = Duration::from_millis(opts.lease_ms);
    println!(
        "soak: target {} acquisitions; {} processes x {} tasks (half through the proxy) on {:?}; \
         watchdog lease {lease:?}; faults {}; seed {seed}; data in {}",
        opts.acquisitions,
        opts.processes,
        opts.tasks,
        &NAMES[..opts.names],
        if opts.no_faults {
            "off".to_owned()
        } else {
            format!("about every {} ms", opts.fault_every_ms)
        },
        dir.display()
    );

    let server = Server::start(&dir)?;
    let port = server.port;
    let url = server.url();
    let server = Arc::new(Mutex::new(server));
    let proxy = Arc::new(Proxy::start(port).await);
    // A failover topology for the locks; the server above keeps the fences and counters.
    let topology = match opts.topology {
        TopologyKind::Standalone => None,
        kind => {
            let dir = dir.clone();
            let started = tokio::task::spawn_blocking(move || match kind {
                TopologyKind::Cluster => Topology::cluster(&dir),
                _ => Topology::sentinel(&dir),
            })
            .await
            .map_err(|e| e.to_string())??;
            println!("soak: locks on a {:?} at {}", kind, started.url());
            Some(Arc::new(Mutex::new(started)))
        }
    };
    let lock_url = topology.as_ref().map(|t| t.lock().url());

    let epoch = mono_ns();
    let started = Instant::now();
    let mut workers: Vec<Option<Child>> = (0..opts.processes)
        .map(|id| {
            Some(spawn_worker(
                &opts,
                id,
                &dir,
                (port, proxy.port),
                lock_url.as_deref(),
                seed,
            ))
        })
        .collect();
    // Interrupted: take the server and the workers down too.
    {
        let pids: Vec<u32> = workers.iter().flatten().map(Child::id).collect();
        let server = server.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                for pid in pids {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid as i32),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                server.lock().kill();
                eprintln!("soak: interrupted");
                std::process::exit(130);
            }
        });
    }
    let mut violations = Violations::default();

    // Every worker connected.
    let ready = Instant::now();
    while (0..opts.processes).any(|id| !dir.join(format!("ready-{id}")).exists()) {
        for (id, w) in workers.iter_mut().enumerate() {
            if let Some(Ok(Some(status))) = w.as_mut().map(|c| c.try_wait()) {
                return Err(format!(
                    "worker {id} exited before it was ready ({status}); see {}",
                    dir.join(format!("worker-{id}.log")).display()
                ));
            }
        }
        if ready.elapsed() > Duration::from_secs(120) {
            return Err("workers did not connect within 120 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let raw = raw_client(&url).await?;
    let (stop_faults, stop_rx) = watch::channel(false);
    let faults_started_ns = mono_ns();
    let failovers_done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let injector = (!opts.no_faults && topology.is_none()).then(|| {
        tokio::spawn(inject_faults(
            server.clone(),
            proxy.clone(),
            raw.clone(),
            stop_rx,
            seed,
            Duration::from_millis(opts.fault_every_ms),
            lease,
        ))
    });

    let failing = topology.clone().map(|topology| {
        tokio::spawn(fail_over_repeatedly(
            topology,
            opts.failovers,
            Duration::from_millis(opts.failover_every_ms),
            failovers_done.clone(),
        ))
    });
    let failovers_wanted = if failing.is_some() { opts.failovers } else { 0 };

    // Run until the target is reached (or time is up, or a worker died).
    let mut last_report = Instant::now();
    let mut reached;
    loop {
        let progress: u64 = (0..opts.processes)
            .map(|id| read_number(&dir.join(format!("progress-{id}"))))
            .sum();
        reached = progress >= opts.acquisitions;
        let failed_over = failovers_done.load(std::sync::atomic::Ordering::Acquire);
        if reached && failed_over >= failovers_wanted {
            break;
        }
        if failing.as_ref().is_some_and(|f| f.is_finished()) && failed_over < failovers_wanted {
            violations.add(
                "failover failed",
                format!("only {failed_over} of {failovers_wanted} failovers done"),
            );
            break;
        }
        if started.elapsed() > max_time {
            violations.add(
                "target not reached",
                format!(
                    "only {progress} of {} acquisitions within --max-time {max_time:?}",
                    opts.acquisitions
                ),
            );
            break;
        }
        let mut died = false;
        for (id, w) in workers.iter_mut().enumerate() {
            if let Some(Ok(Some(status))) = w.as_mut().map(|c| c.try_wait()) {
                violations.add(
                    "worker failed",
                    format!("worker {id} exited early ({status}); see worker-{id}.log"),
                );
                *w = None;
                died = true;
            }
        }
        if died {
            break;
        }
        if last_report.elapsed() > Duration::from_secs(10) {
            last_report = Instant::now();
            eprintln!(
                "soak: +{:.0?} {progress} / {} acquisitions",
                started.elapsed(),
                opts.acquisitions
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Stop the faults, then the workers; every task must finish.
    let _ = stop_faults.send(true);
    let mut faults = match injector {
        Some(injector) => injector.await.map_err(|e| e.to_string())?,
        None => Vec::new(),
    };
    if let Some(failing) = failing {
        let (done, error) = failing.await.map_err(|e| e.to_string())?;
        faults.extend(done);
        if let Some(error) = error {
            violations.add("failover failed", error);
        }
    }
    proxy.set(Mode::Open);
    let stop_ns = mono_ns();
    std::fs::write(dir.join("stop"), "").map_err(|e| e.to_string())?;
    let exit_deadline = Instant::now() + Duration::from_secs(opts.grace_secs + 60);
    for (id, w) in workers.iter_mut().enumerate() {
        let Some(child) = w.as_mut() else { continue };
        loop {
            match child.try_wait() {
                Ok(Some(status)) if status.success() => break,
                Ok(Some(status)) => {
                    violations.add(
                        "worker failed",
                        format!("worker {id} failed ({status}); see worker-{id}.log"),
                    );
                    break;
                }
                Ok(None) if Instant::now() > exit_deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    violations.add(
                        "worker failed",
                        format!("worker {id} did not finish; killed"),
                    );
                    break;
                }
                Ok(None) => tokio::time::sleep(Duration::from_millis(50)).await,
                Err(e) => return Err(format!("worker {id}: {e}")),
            }
        }
    }
    let run_time = started.elapsed();
    let fault_log: String = faults
        .iter()
        .map(|f| {
            format!(
                "mono {} ns (+{:.3} s): {} for {:?}{}\n",
                f.at_ns,
                since(epoch, f.at_ns).as_secs_f64(),
                f.kind.label(),
                f.length,
                if f.ok { "" } else { " (failed)" }
            )
        })
        .collect();
    let _ = std::fs::write(dir.join("faults.log"), fault_log);

    // Merge.
    let mut records: Vec<Record> = Vec::new();
    let mut counters: BTreeMap<String, u64> = BTreeMap::new();
    for id in 0..opts.processes {
        if let Ok(text) = std::fs::read_to_string(dir.join(format!("history-{id}"))) {
            for line in text.lines() {
                records.push(line.parse()?);
            }
        } else {
            violations.add("worker failed", format!("worker {id} left no history"));
        }
        if let Ok(text) = std::fs::read_to_string(dir.join(format!("summary-{id}"))) {
            for line in text.lines() {
                if let Some((k, v)) = line.split_once('\t') {
                    *counters.entry(k.to_owned()).or_default() += v.parse::<u64>().unwrap_or(0);
                }
            }
        }
    }
    let report = check(&raw, &NAMES[..opts.names], &records, &counters, epoch).await?;
    for (kind, details) in &report.violations.0 {
        for detail in details {
            violations.add(kind, detail.clone());
        }
    }
    if report.checked < opts.acquisitions {
        violations.add(
            "target not reached",
            format!(
                "{} acquisitions checked, fewer than the target {}",
                report.checked, opts.acquisitions
            ),
        );
    }
    let _ = raw.quit().await;

    print_summary(&Summary {
        report: &report,
        counters: &counters,
        faults: &faults,
        records: &records,
        epoch,
        faults_started_ns,
        stop_ns,
        run_time,
        opts: &opts,
        seed,
        reached,
    });
    drop(proxy);
    server.lock().kill();
    if violations.is_empty() {
        println!("PASS");
        if !opts.keep {
            let _ = std::fs::remove_dir_all(&dir);
        }
        Ok(true)
    } else {
        violations.print();
        println!(
            "data, logs and histories kept in {} (reproduce with --seed {seed})",
            dir.display()
        );
        Ok(false)
    }
}

/// What the merged history and the counters showed.
#[derive(Default)]
struct Report {
    sections: usize,
    checked: u64,
    /// Sections told lost part-way, checked for overlap up to when they were told.
    checked_until_told: u64,
    lost: usize,
    overlaps: usize,
    fence_disorders: usize,
    lost_updates: u64,
    accepted: u64,
    acknowledged: u64,
    valid_writes: u64,
    stale_rejected_lost: u64,
    stale_rejected_valid: u64,
    rejected_by_valid: u64,
    counter_total: u64,
    valid_accepted: u64,
    violations: Violations,
}

/// Violations by kind.
#[derive(Default)]
struct Violations(BTreeMap<&'static str, Vec<String>>);

impl Violations {
    fn add(&mut self, kind: &'static str, detail: String) {
        self.0.entry(kind).or_default().push(detail);
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn print(&self) {
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

async fn check(
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
             knows about (invariants 6, 11; see worker logs)",
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
struct CounterState {
    /// The counter's value.
    value: u64,
    /// Writes the compare-and-set script accepted.
    accepted: u64,
    /// The fencing counter: the newest fence issued.
    issued: i64,
}

/// Checks one name's guarded counter against the writes its sections saw: no lost update,
/// nothing written that nobody sent, and a valid section's write rejected only by the newer
/// fence of a holder whose lease was lost.
fn judge_counter(name: &str, mine: &[&Record], state: &CounterState, report: &mut Report) {
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

struct Summary<'a> {
    report: &'a Report,
    counters: &'a BTreeMap<String, u64>,
    faults: &'a [Fault],
    records: &'a [Record],
    epoch: u64,
    faults_started_ns: u64,
    stop_ns: u64,
    run_time: Duration,
    opts: &'a Opts,
    seed: u64,
    reached: bool,
}

fn percentile(sorted: &[u64], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    Duration::from_nanos(sorted[i])
}

fn ms(d: Duration) -> String {
    if d >= Duration::from_secs(1) {
        format!("{:.2} s", d.as_secs_f64())
    } else {
        format!("{:.1} ms", d.as_secs_f64() * 1000.0)
    }
}

fn print_summary(s: &Summary) {
    let r = s.report;
    let get = |k: &str| s.counters.get(k).copied().unwrap_or(0);
    println!();
    println!("=== redbaton soak summary (seed {}) ===", s.seed);
    println!(
        "setup                  {} processes x {} tasks, names {:?}, watchdog lease {} ms, \
         command timeout {} ms, calls {}",
        s.opts.processes,
        s.opts.tasks,
        &NAMES[..s.opts.names],
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
