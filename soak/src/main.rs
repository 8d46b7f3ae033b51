//! Mutual exclusion at scale, under faults: a soak of many client processes against a real
//! `redis-server` that is paused, flushed, cut off, stalled and killed on a schedule.
//!
//! ```text
//! cargo run --release -p redbaton-soak -- --acquisitions 100000
//! ```
//!
//! The soak starts its own `redis-server` (AOF with `appendfsync always` in a directory on
//! tmpfs when there is one, so a SIGKILL and a restart on the same port keep every
//! acknowledged write) and a loopback proxy in front of it that can stall and cut
//! connections. It re-runs itself as several worker processes; each has one client straight
//! to the server and one through the proxy (watchdog lease 1.5 s), and many tasks taking a
//! few locks (one name with a hash tag) with `lock`, `try_lock`, `try_lock_for`, fixed leases
//! and nested holds mixing watchdog and fixed leases, holding them for random short times.
//! Meanwhile the parent kills the subscriber connections, flushes the script cache, pauses all
//! clients, stalls the proxy (up to 1.6 leases) and cuts it, and kills and restarts the
//! server — about one fault a second; the third fault, and every 100th after it, pauses writes
//! for longer than four command timeouts of the last worker, whose clients have a short one
//! (`--short-timeout-ms`): every call of that worker in flight is given up past its bound and
//! finished when the server answers, for every kind the run takes. An operator client in the
//! first worker force-unlocks a held `Lock` name every `--force-every-ms` or so and then holds
//! it itself. Tasks also take the stale identities a hold handed on in memory must not let
//! back in (invariant 16, docs/DESIGN.md): a future first polled inside a hold's scope and
//! finished after its release outside every scope (`escaped`) or inside another hold's scope
//! through a `FuturesUnordered` in a `select!` loop (`reparented`), and the released hold's
//! owner named with `with_owner` — whatever they get is a section of its own in the history.
//! On `--topology sentinel` the wait before the first failover begins with a full resync of
//! the replica (`REPLICAOF NO ONE` and back), and every failover ends with one.
//!
//! Every critical section is recorded: start and end on `CLOCK_MONOTONIC` (one clock for all
//! processes), a fencing number taken inside it (INCR), when — if at all by its end — its
//! guard's `lost()` told the holder the lease was lost, and the outcome of a non-atomic read–sleep–write of a guarded counter, whose write is
//! a compare-and-set on the fence. Once enough sections were checked the workers stop and the
//! parent merges their histories and checks them with the same checker as
//! `tests/torture.rs`:
//!
//! - mutual exclusion, directly: no section begins while another holder still believes it
//!   holds (until its section ended or its `lost()` resolved, whichever came first), so a
//!   holder told late — after another entered — fails the run; the fences of the sections
//!   never told lost increase. The counter checks below cannot see an exclusion failure on
//!   their own: the fence turns a stale write into a rejection;
//! - no lost update: the counter holds exactly the accepted writes, and every write the
//!   workers saw accepted. A write is accepted only while its fence is the newest *issued*
//!   (not merely the highest written): a holder whose lease was lost may take its fence late,
//!   after a newer holder read the counter, and only the issued fence shows its read is stale;
//! - a valid section's write is rejected only by a newer fence of a holder whose lease was
//!   lost (a stalled proxy delivered its INCR late), never by another valid holder;
//! - a fresh acquire counts exactly one hold in Redis (sampled): a higher count is a hold
//!   nobody knows about, left by a script that ran although its caller saw an error;
//! - every task finishes, and no hold outlives its lease once every task released;
//! - a force-unlock breaks only what it struck: the section running across it (or ending
//!   after it with its release finding the hold gone — a Java holder whose acquire's reply
//!   came after the force's, as Redisson reads nothing after that reply) and the rest of
//!   that hold's run of hand-offs in memory (the same owner field, within `RUN_AFTER_FORCE`
//!   of the force) count as lost from the force on; every other section must exclude the
//!   operator's as any other;
//! - no acquire is refused as not replicated while the only replica is in a full resync and
//!   the clients had time to see it (`ReplicaSync::Auto` waits for online replicas only).
//!
//! The server is the one `REDBATON_TEST_SERVER` names, as in the tests (`redis-7.0`, the
//! default; `redis-6.2` or `valkey-8.1` from scripts/install-servers.sh), for the standalone,
//! Sentinel and Cluster topologies alike.
//!
//! The run directory keeps the server's log, each worker's log (errors and phantom holds,
//! stamped with `CLOCK_MONOTONIC`), the fault log and the histories when a run fails.
//!
//! It prints a summary and exits with 1 on any violation (2 when it could not run at all).
//! `--sabotage 1` runs 1 % of the sections without the lock: the checker must then fail (CI
//! runs it and requires the failure).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod failover;
mod faults;
use testkit::history;
use testkit::java_peer;
mod parent;
use testkit::proxy;
mod record;
mod server;
use testkit::servers;
mod verdict;
mod worker;

/// Mutual exclusion at scale, under faults (see the example's docs).
#[derive(Parser, Debug, Clone)]
#[command(name = "soak")]
pub struct Opts {
    /// Stop once this many acquisitions (critical sections with a valid lease) were checked.
    #[arg(long, default_value_t = 100_000)]
    pub acquisitions: u64,
    /// Worker processes.
    #[arg(long, default_value_t = 4)]
    pub processes: usize,
    /// How many lock names the tasks share (1 to 8: soak:a, soak:b, {soak}:c, soak:d, …).
    #[arg(long, default_value_t = 4)]
    pub names: usize,
    /// Tasks per worker process (half use the client behind the proxy).
    #[arg(long, default_value_t = 12)]
    pub tasks: usize,
    /// Seed of every random choice (names, calls, hold times, faults); random when absent.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Run without injecting faults.
    #[arg(long)]
    pub no_faults: bool,
    /// The watchdog lease of every client, in ms (renewed every third of it).
    #[arg(long, default_value_t = 1500)]
    pub lease_ms: u64,
    /// The clients' command timeout, in ms.
    #[arg(long, default_value_t = 2000)]
    pub command_timeout_ms: u64,
    /// The command timeout of the last worker's clients on the standalone topology, in ms
    /// (0: `--command-timeout-ms` like the others): the pause past the call bound lasts four
    /// of these and 500 ms, so it is past the bound of every call that worker makes — of every
    /// kind the run takes — and short for the rest of the run.
    #[arg(long, default_value_t = 300)]
    pub short_timeout_ms: u64,
    /// The mean time between two faults, in ms.
    #[arg(long, default_value_t = 1000)]
    pub fault_every_ms: u64,
    /// Give up (a violation) when the target is not reached in this many seconds; default
    /// 120 + acquisitions / 20.
    #[arg(long)]
    pub max_time_secs: Option<u64>,
    /// How long tasks may take to finish once told to stop, in seconds.
    #[arg(long, default_value_t = 60)]
    pub grace_secs: u64,
    /// Where to make the run's directory (the server's data, the logs, the histories),
    /// removed after a passing run. Default `/dev/shm` (tmpfs) if present, else the system's
    /// temporary directory.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Keep the directory after a passing run.
    #[arg(long)]
    pub keep: bool,
    /// Percent of sections run WITHOUT taking the lock: a self-test that the checker catches
    /// broken mutual exclusion (the run must then fail).
    #[arg(long, default_value_t = 0.0)]
    pub sabotage: f64,
    /// The calls tasks mix, comma-separated: lock, try_lock, try_lock_for,
    /// lock_with_lease, try_lock_with_lease, and nested holds reentrant:ww, reentrant:wf,
    /// reentrant:fw, reentrant:ff (outer/inner lease: w watchdog, f fixed; a fixed inner
    /// lease is shorter than the outer one). Default all.
    #[arg(long, default_value = "all")]
    pub calls: String,
    /// Where the locks live: `standalone` (the fault-injected server above), or `sentinel`
    /// (a primary, a replica, one sentinel) / `cluster` (three primaries with a replica
    /// each), whose primaries are SIGKILLed `--failovers` times while replicas are promoted.
    /// With a failover topology the fences and counters stay on the standalone server, and
    /// no other faults are injected.
    #[arg(long, value_enum, default_value_t = TopologyKind::Standalone)]
    pub topology: TopologyKind,
    /// Failovers to cause (`--topology sentinel|cluster`; a cluster takes at most 3: one
    /// per shard).
    #[arg(long, default_value_t = 5)]
    pub failovers: usize,
    /// The pause between one failover's end (replica back in sync) and the next kill, in ms.
    #[arg(long, default_value_t = 3000)]
    pub failover_every_ms: u64,
    /// The clients' replica sync: `auto` (the default) or `off`.
    #[arg(long, default_value = "auto")]
    pub replica_sync: String,
    /// Java Redisson worker processes beside the redbaton ones (the driver in interop/java,
    /// built by scripts/install-java-peer.sh; every other one behind the proxy). With any, every
    /// process shares one name of each kind — lock, fair, fenced, write lock, leased semaphore
    /// of one permit — instead of `--names` plain locks: a mixed fleet.
    #[arg(long, default_value_t = 0)]
    pub java: usize,
    /// How often (mean, in ms) an operator client force-unlocks a held `Lock` name and then
    /// holds it itself, on the standalone topology with faults on; 0: never. The checker
    /// lets the holds a force struck (and the run of hand-offs in memory it broke) overlap
    /// from the force on, and nothing else.
    #[arg(long, default_value_t = 700)]
    pub force_every_ms: u64,
    /// The Java workers' `lockWatchdogTimeout`, in ms: Redisson tells a holder nothing when a
    /// watchdog lease is lost, so it must outlast every fault a direct Java worker meets.
    #[arg(long, default_value_t = 5000)]
    pub java_lease_ms: u64,
    #[command(subcommand)]
    pub mode: Option<Mode>,
}

/// Where the soak's locks live.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TopologyKind {
    /// One server, with the fault schedule.
    Standalone,
    /// Sentinel failovers.
    Sentinel,
    /// Cluster primary failovers.
    Cluster,
}

#[derive(Subcommand, Debug, Clone)]
pub enum Mode {
    /// One worker process (started by the soak itself).
    #[command(hide = true)]
    Worker(worker::WorkerArgs),
}

fn main() -> ExitCode {
    let opts = Opts::parse();
    if !(0.0..=100.0).contains(&opts.sabotage) {
        eprintln!("soak: --sabotage is a percentage (0 to 100)");
        return ExitCode::from(2);
    }
    if opts.lease_ms < 100 || opts.command_timeout_ms == 0 || opts.fault_every_ms == 0 {
        eprintln!("soak: --lease-ms must be at least 100; timeouts and intervals above 0");
        return ExitCode::from(2);
    }
    if !(1..=8).contains(&opts.names) {
        eprintln!("soak: --names must be 1 to 8");
        return ExitCode::from(2);
    }
    if opts.processes == 0 || opts.tasks == 0 {
        eprintln!("soak: --processes and --tasks must be at least 1");
        return ExitCode::from(2);
    }
    if !["auto", "off"].contains(&opts.replica_sync.as_str()) {
        eprintln!("soak: --replica-sync is auto or off");
        return ExitCode::from(2);
    }
    if opts.java > 0 && opts.topology != TopologyKind::Standalone {
        eprintln!("soak: --java runs on the standalone topology only");
        return ExitCode::from(2);
    }
    if opts.topology == TopologyKind::Cluster && !(1..=3).contains(&opts.failovers) {
        eprintln!("soak: a cluster takes 1 to 3 failovers (one per shard)");
        return ExitCode::from(2);
    }
    if let Err(e) = worker::parse_calls(&opts.calls) {
        eprintln!("soak: --calls: {e}");
        return ExitCode::from(2);
    }
    match opts.mode.clone() {
        Some(Mode::Worker(args)) => worker::main(args),
        None => parent::main(opts),
    }
}
