//! `redbaton`: run a command while holding a Redis lock (Redisson-compatible), inspect or
//! break locks, and run the flash-sale demo. `redbaton --help` lists the exit statuses.

mod args;
mod child;
mod demo;
mod exec;
mod exit;
mod inspect;
mod ready;
mod server;
mod worker;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use redbaton::Client;

use crate::args::{Cli, Command, KeyArgs};
use crate::exit::{Failure, Outcome};

/// The URL used when neither `--url` nor `REDIS_URL` gives one.
const DEFAULT_URL: &str = "redis://127.0.0.1:6379";

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            let code = if err.use_stderr() { exit::USAGE } else { 0 };
            let _ = err.print();
            let args: Vec<String> = std::env::args().collect();
            if err.kind() == clap::error::ErrorKind::UnknownArgument
                && args.iter().any(|a| a == "exec")
                && !args.iter().any(|a| a == "--")
            {
                eprintln!("redbaton: put `--` before CMD: redbaton exec NAME -- CMD [ARGS...]");
            }
            return ExitCode::from(code);
        }
    };
    init_tracing(cli.verbose);
    // One thread: the runtime runs on the main thread, which forks CMD, so CMD's parent-death
    // signal fires exactly when this process ends (it is tied to the forking thread).
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("redbaton: cannot start the async runtime: {e}");
            return ExitCode::from(exit::SOFTWARE);
        }
    };
    let outcome = runtime.block_on(run(cli));
    // Background tasks (a dropped guard's release) get no further chance; the lock expires.
    runtime.shutdown_timeout(Duration::from_secs(1));
    outcome.exit()
}

async fn run(cli: Cli) -> Outcome {
    let url = cli
        .url
        .clone()
        .or_else(|| std::env::var("REDIS_URL").ok().filter(|u| !u.is_empty()))
        .unwrap_or_else(|| DEFAULT_URL.to_owned());
    match cli.command {
        Command::Exec(args) => exec::run(&url, args).await,
        Command::Status(args) => inspect::status(&url, args).await.into(),
        Command::Unlock(args) => inspect::unlock(&url, args).await.into(),
        Command::Permits(args) => inspect::permits(&url, args).await.into(),
        Command::Demo(args) => demo::run(cli.url, args).await.into(),
        Command::DemoWorker(args) => worker::run(&url, args).await.into(),
    }
}

/// Connects, turning a refused URL, lease or prefix into a usage error and an unreachable
/// server into a sentence naming it.
pub async fn connect(
    url: &str,
    key: &KeyArgs,
    watchdog_lease: Duration,
) -> Result<Client, Failure> {
    let builder = Client::builder()
        .url(url)
        .key_prefix(&key.key_prefix)
        .watchdog_lease(watchdog_lease);
    let server = builder.config().redacted_url();
    builder.connect().await.map_err(|e| match e {
        redbaton::Error::InvalidArgument(detail) => Failure::new(exit::USAGE, detail),
        redbaton::Error::Connection(detail) => {
            // The library puts the (redacted) URL first; the sentence names it once.
            let detail = detail
                .strip_prefix(&server)
                .map_or(detail.as_str(), |rest| rest.trim_start_matches(": "));
            Failure::new(
                exit::UNAVAILABLE,
                format!("cannot connect to Redis at {server}: {detail}"),
            )
        }
        other => other.into(),
    })
}

/// Refuses an empty lock name before anything is sent (exit 65).
pub fn check_name(name: &str) -> Result<(), Failure> {
    if name.is_empty() {
        return Err(Failure::new(exit::DATA, "the lock NAME must not be empty"));
    }
    if name.len() > redbaton::MAX_NAME_LEN {
        return Err(Failure::new(
            exit::DATA,
            format!(
                "the lock NAME is {} bytes long; at most {} are allowed",
                name.len(),
                redbaton::MAX_NAME_LEN
            ),
        ));
    }
    Ok(())
}

/// Logging on stderr: `-v`'s level, or `RUST_LOG`'s `target=level,…` directives (parsed as
/// `tracing_subscriber`'s `Targets`, not `EnvFilter`: its regular expressions alone were a
/// tenth of the CLI's build).
fn init_tracing(verbose: u8) {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::prelude::*;
    let default = match verbose {
        0 => Targets::new().with_default(LevelFilter::ERROR),
        1 => Targets::new()
            .with_target("redbaton", LevelFilter::INFO)
            .with_default(LevelFilter::INFO),
        2 => Targets::new()
            .with_target("redbaton", LevelFilter::DEBUG)
            .with_default(LevelFilter::INFO),
        _ => Targets::new().with_default(LevelFilter::TRACE),
    };
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|directives| directives.parse::<Targets>().ok())
        .unwrap_or(default);
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_target(false),
        )
        .with(filter)
        .init();
}
