//! The parent: starts redis-server and the fault proxy, runs the worker processes, injects
//! faults until enough acquisitions were checked, then merges the workers' histories, checks
//! them and prints the summary.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::interfaces::ClientLike;
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::failover::Topology;
use crate::faults::{fail_over_repeatedly, inject_faults, raw_client, Timing};
use crate::java_peer::{driver_command, QUICK_JVM};
use crate::proxy::{Mode, Proxy};
use crate::record::{kind_of, mono_ns, names, since, NameKind, Record, MIXED};
use crate::server::Server;
use crate::verdict::{check, print_summary, resync_violations, strike, Summary, Violations};
use crate::worker::{Forced, FAIR_LOCK_WAIT};
use crate::{Opts, TopologyKind};

fn read_number(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// The command timeout of worker `id`'s clients: the last worker's is short on the standalone
/// topology (see `--short-timeout-ms`).
fn timeout_of(opts: &Opts, id: usize, lock_url: Option<&str>) -> u64 {
    let short = opts.short_timeout_ms;
    if id + 1 == opts.processes && lock_url.is_none() && short > 0 {
        short.min(opts.command_timeout_ms)
    } else {
        opts.command_timeout_ms
    }
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
        .args([
            "--command-timeout-ms",
            &timeout_of(opts, id, lock_url).to_string(),
        ])
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
    if opts.java > 0 {
        command.arg("--mixed");
    }
    // The first worker runs the operator, on the standalone topology with faults on.
    if id == 0 && lock_url.is_none() && !opts.no_faults && opts.force_every_ms > 0 {
        command.args(["--operator-every-ms", &opts.force_every_ms.to_string()]);
    }
    command.spawn().expect("spawn a worker process")
}

/// A Java Redisson worker (interop/java's `Driver soak`) on the mixed names, through `port`
/// (the server's, or the proxy's when `proxied`).
fn spawn_java_worker(
    opts: &Opts,
    id: usize,
    dir: &Path,
    port: u16,
    proxied: bool,
    seed: u64,
) -> Child {
    let log = std::fs::File::create(dir.join(format!("worker-{id}.log"))).expect("a worker log");
    let names: Vec<String> = MIXED
        .iter()
        .map(|(name, kind)| {
            let hex: String = name.bytes().map(|b| format!("{b:02x}")).collect();
            format!("{hex}:{}", kind.label())
        })
        .collect();
    let mut command = driver_command(QUICK_JVM, "soak");
    command
        .args(["--nodes", &format!("127.0.0.1:{port}")])
        .args(["--id", &id.to_string()])
        .arg("--dir")
        .arg(dir)
        .args(["--seed", &seed.to_string()])
        .args(["--tasks", &opts.tasks.to_string()])
        .args(["--watchdog", &opts.java_lease_ms.to_string()])
        .args(["--timeout", &opts.command_timeout_ms.max(3000).to_string()])
        .args(["--fair-wait", &FAIR_LOCK_WAIT.as_millis().to_string()])
        .args(["--grace-secs", &opts.grace_secs.to_string()])
        .args(["--proxied", if proxied { "1" } else { "0" }])
        .args(["--names", &names.join(",")])
        .stdin(Stdio::null())
        .stdout(Stdio::from(log.try_clone().expect("a worker log")))
        .stderr(Stdio::from(log));
    command.spawn().expect("spawn a Java worker process")
}

/// After every worker finished, every mixed name comes free within `bound`: no hash is left,
/// and the leased semaphore's permit is back. What stays is a hold nobody knows about, by any
/// process of either side. Returns one line per name still held.
async fn mixed_strays(raw: &fred::clients::Client, bound: Duration) -> Vec<String> {
    use fred::interfaces::{KeysInterface, SortedSetsInterface};
    let started = Instant::now();
    loop {
        let mut held = Vec::new();
        for (name, kind) in MIXED {
            if kind == NameKind::Leased {
                let timeouts = format!("{{{name}}}:timeout");
                let taken: Result<i64, _> = raw.zcard(&timeouts).await;
                let free: Result<Option<i64>, _> = raw.get(name).await;
                match (taken, free) {
                    (Ok(0), Ok(Some(1))) => {}
                    (taken, free) => held.push(format!("{name}: {taken:?} taken, {free:?} free")),
                }
            } else {
                match raw.exists::<i64, _>(name).await {
                    Ok(0) => {}
                    found => held.push(format!("{name}: still held ({found:?})")),
                }
            }
        }
        if held.is_empty() || started.elapsed() > bound {
            return held;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
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
    let mixed = opts.java > 0;
    let run_names = names(mixed, opts.names);
    let total = opts.processes + opts.java;
    println!(
        "soak: target {} acquisitions on {}; {} processes x {} tasks (half through the proxy) + {} \
         Java Redisson processes on {:?}; watchdog lease {lease:?}; faults {}; seed {seed}; data in {}",
        opts.acquisitions,
        crate::servers::server().name,
        opts.processes,
        opts.tasks,
        opts.java,
        run_names,
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
    if mixed {
        // The leased semaphore's one permit, set once for both sides.
        use fred::interfaces::KeysInterface;
        let setup = raw_client(&url).await?;
        for (n, name) in run_names.iter().enumerate() {
            if kind_of(true, n) == NameKind::Leased {
                let _: Option<String> = setup
                    .set(*name, 1, None, Some(fred::types::SetOptions::NX), false)
                    .await
                    .map_err(|e| format!("set {name}'s permits: {e}"))?;
            }
        }
        let _ = setup.quit().await;
    }

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
    // The Java workers follow, every other one behind the proxy.
    for j in 0..opts.java {
        let proxied = j % 2 == 1;
        let through = if proxied { proxy.port } else { port };
        let id = opts.processes + j;
        workers.push(Some(spawn_java_worker(
            &opts, id, &dir, through, proxied, seed,
        )));
    }
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
    while (0..total).any(|id| !dir.join(format!("ready-{id}")).exists()) {
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
            Timing {
                every: Duration::from_millis(opts.fault_every_ms),
                lease,
                command_timeout: Duration::from_millis(timeout_of(&opts, opts.processes - 1, None)),
            },
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
        let progress: u64 = (0..total)
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
    let mut forced: Vec<Forced> = Vec::new();
    let mut refusals: Vec<u64> = Vec::new();
    for id in 0..total {
        if let Ok(text) = std::fs::read_to_string(dir.join(format!("forced-{id}"))) {
            for line in text.lines() {
                forced.push(line.parse()?);
            }
        }
        if let Ok(text) = std::fs::read_to_string(dir.join(format!("refusals-{id}"))) {
            for line in text.lines() {
                refusals.push(
                    line.parse()
                        .map_err(|_| format!("bad refusal line {line:?}"))?,
                );
            }
        }
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
    if mixed {
        // Longer than the longest fixed lease and two of either side's watchdog leases.
        let longest = Duration::from_millis(3000 + 2 * opts.lease_ms.max(opts.java_lease_ms));
        for stray in mixed_strays(&raw, longest + Duration::from_secs(5)).await {
            violations.add("stray holds", stray);
        }
    }
    // The holds a force-unlock struck count as lost from the force on.
    let struck = strike(&mut records, &forced);
    for found in resync_violations(&faults, &refusals, &records, epoch) {
        violations.add("acquires held up while the only replica resynced", found);
    }
    let report = check(&raw, run_names, &records, &counters, epoch).await?;
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
        forced: (forced.len(), struck),
        refusals: refusals.len(),
        short_timeout_ms: timeout_of(&opts, opts.processes - 1, lock_url.as_deref()),
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
