//! The command line: clap definitions and the duration parser.

use std::ffi::OsString;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// The exit-status table, shown by `--help` and `exec --help`.
macro_rules! exit_table {
    () => {
        "Exit status of exec:
  CMD's own     CMD ran; 128+N when signal N killed it
  75            lock not acquired within --wait (see --conflict-exit-code)
  76            lease lost while CMD ran (its process group was stopped),
                or before it could start (CMD not run)
  74            CMD ran, but the lock could not be released (it may stay held
                until its lease ends); CMD's status is in the message
  126 / 127     CMD not executable / not found (the lock was released)
  64            usage error (bad option, bad duration, missing `--` before CMD)
  65            invalid NAME, or the key is not a lock (WRONGTYPE)
  69            Redis unreachable
  77            authentication refused
  70            anything else
status exits 0 when locked (a semaphore: some permit taken) and 1 when free; unlock --force
exits 0 when it deleted a lock (released a leased semaphore's permits) and 1 when there was
none; permits exits 0 once set; errors use the codes above."
    };
}

/// Text shown after `--help`: examples and the exit-status table.
const AFTER_HELP: &str = concat!(
    "Examples:
  redbaton exec nightly-report -- ./report.sh          # wait for the lock, then run
  redbaton exec --wait 0 nightly-report -- ./report.sh # skip if another host runs it
  redbaton exec --wait 30s deploy -- make deploy        # give up after 30 s (exit 75)
  redbaton status deploy --json                         # exit 0 if locked, 1 if free
  redbaton unlock --force deploy                        # delete a stuck lock
  redbaton status gpu-slots                             # a semaphore: permits, holders, leases
  redbaton permits crawler-slots 8                      # a semaphore's new total
  redbaton demo                                         # flash-sale demo, private Redis

CMD runs in a process group of its own with REDBATON_LOCK and REDBATON_OWNER set; a nested
`redbaton exec` of the same NAME re-enters the lock. SIGINT, SIGTERM and SIGHUP are forwarded
to CMD's group.

",
    exit_table!()
);

/// Text shown after `exec --help`.
const EXEC_AFTER_HELP: &str = concat!(
    "Examples:
  redbaton exec --wait 0 backup -- sh -c 'pg_dump db > /backup/db.sql'
  redbaton exec --wait 10m deploy -- ./deploy.sh v1.2.3

",
    exit_table!()
);

/// Run commands under a Redis lock shared with Redisson (Java) services.
#[derive(Debug, Parser)]
#[command(name = "redbaton", version, after_help = AFTER_HELP)]
pub struct Cli {
    /// Redis URL: redis://[user:password@]host:port[/db], rediss://, redis-cluster://,
    /// redis-sentinel://. Default: $REDIS_URL, else redis://127.0.0.1:6379 (demo: a private
    /// redis-server).
    #[arg(long, global = true)]
    pub url: Option<String>,

    /// More logging on stderr (-v info, -vv debug, -vvv trace); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,

    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Acquire NAME, run CMD while holding it, release it when CMD ends.
    Exec(ExecArgs),
    /// Show the lock NAME's kind, who holds it, for how long, and who waits (exit 0 locked,
    /// 1 free).
    Status(StatusArgs),
    /// Delete the lock NAME whoever holds it and wake its waiters (exit 0 held, 1 free); a
    /// leased semaphore: release every permit taken.
    Unlock(UnlockArgs),
    /// Set a semaphore's total number of permits (held ones stay counted), or add to its free
    /// permits: the repair of a count.
    Permits(PermitsArgs),
    /// The flash-sale demo: worker processes selling stock with and without the lock.
    Demo(DemoArgs),
    /// One demo worker process (started by `demo`).
    #[command(hide = true)]
    DemoWorker(WorkerArgs),
}

/// `exec`
#[derive(Debug, Args)]
#[command(after_help = EXEC_AFTER_HELP)]
pub struct ExecArgs {
    /// The lock's name (any non-empty string up to 64 KiB; the Redis key).
    pub name: String,
    /// How long to wait for the lock: `500ms`, `30s`, `2m`, or seconds; `0` tries once.
    /// Default: forever.
    #[arg(short, long, value_parser = parse_duration)]
    pub wait: Option<Duration>,
    /// A fixed lease instead of the watchdog: CMD outliving it counts as a lost lease.
    #[arg(short, long, value_parser = parse_lease)]
    pub lease: Option<Duration>,
    /// After a lost lease, how long CMD gets between SIGTERM and SIGKILL.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub kill_after: Duration,
    /// Exit status when the lock is not acquired within --wait (0 makes a busy lock no
    /// failure, as `flock -E 0` does).
    #[arg(short = 'E', long, default_value_t = 75)]
    pub conflict_exit_code: u8,
    /// Say nothing when the lock is not acquired within --wait (for cron with -E 0: a
    /// skipped run writes nothing to stderr). Errors are still reported.
    #[arg(short, long)]
    pub quiet: bool,
    /// The watchdog lease: how long the lock outlives a crashed redbaton; renewed every third
    /// of it while CMD runs (at least 100ms). Not with --lease, which replaces the watchdog.
    #[arg(long, value_parser = parse_lease, default_value = "30s", conflicts_with = "lease")]
    pub watchdog_lease: Duration,
    #[command(flatten)]
    pub key: KeyArgs,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub cmd: Vec<OsString>,
}

/// `status`
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The lock's name.
    pub name: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub key: KeyArgs,
}

/// `unlock`
#[derive(Debug, Args)]
pub struct UnlockArgs {
    /// Required: this deletes the lock whoever holds it (only the owner releases normally).
    #[arg(long, required = true)]
    pub force: bool,
    /// The lock's name.
    pub name: String,
    #[command(flatten)]
    pub key: KeyArgs,
}

/// `permits`
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("change").required(true).args(["total", "add"])))]
pub struct PermitsArgs {
    /// The semaphore's name.
    pub name: String,
    /// The new total, permits held now included: the free count moves by the difference
    /// from the total set last (a plain semaphore needs the total redbaton records; one set
    /// by a Redisson peer is refused: use --add).
    pub total: Option<u32>,
    /// Add DELTA free permits instead (negative removes): the repair of permits lost with a
    /// crashed holder of a plain semaphore.
    #[arg(
        long,
        value_name = "DELTA",
        allow_negative_numbers = true,
        conflicts_with = "total"
    )]
    pub add: Option<i64>,
    /// A leased semaphore (Redisson's RPermitExpirableSemaphore): the total counts the
    /// permits taken now, after reclaiming those whose lease ended. Found by itself while
    /// some permit is taken.
    #[arg(long)]
    pub leased: bool,
    #[command(flatten)]
    pub key: KeyArgs,
}

/// How a lock's name becomes its Redis key: the options of every command that names a lock.
#[derive(Debug, Default, Args)]
pub struct KeyArgs {
    /// The prefix the services sharing the lock put before its name to form its key (their
    /// `Config::key_prefix`, e.g. `billing:`). Default: none (Redisson's keys).
    #[arg(
        long,
        value_name = "PREFIX",
        default_value = "",
        hide_default_value = true
    )]
    pub key_prefix: String,
}

/// `demo`
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Worker processes.
    #[arg(short, long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub processes: u32,
    /// Tasks per worker process.
    #[arg(short, long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub tasks: u32,
    /// Items in stock.
    #[arg(short, long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub stock: u32,
    /// How long each purchase "thinks" between reading and writing the stock.
    #[arg(long, value_parser = parse_duration, default_value = "1ms")]
    pub think: Duration,
}

/// `demo-worker`
#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// Tasks in this process.
    #[arg(long)]
    pub tasks: u32,
    /// Think time.
    #[arg(long, value_parser = parse_duration)]
    pub think: Duration,
    /// Run without the lock.
    #[arg(long)]
    pub unlocked: bool,
    /// Key prefix of this run's keys.
    #[arg(long)]
    pub run: String,
}

/// A human duration (`500ms`, `30s`, `2m`, `1h 30m`), or a bare number of seconds (`10`, `0.5`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<f64>() {
        return Duration::try_from_secs_f64(secs)
            .map_err(|_| format!("{text:?} is not a duration of zero or more seconds"));
    }
    humantime::parse_duration(text).map_err(|e| {
        format!("{text:?} is not a duration ({e}); use e.g. 500ms, 30s, 2m or a number of seconds")
    })
}

/// A lease: a duration of at least one millisecond.
pub fn parse_lease(text: &str) -> Result<Duration, String> {
    let lease = parse_duration(text)?;
    if lease < Duration::from_millis(1) {
        return Err(format!("{text:?} is shorter than the shortest lease, 1ms"));
    }
    Ok(lease)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("-1").is_err());
        assert!(parse_duration("NaN").is_err());
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_lease("0").is_err());
        assert_eq!(parse_lease("1ms"), Ok(Duration::from_millis(1)));
    }

    #[test]
    fn cli_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
