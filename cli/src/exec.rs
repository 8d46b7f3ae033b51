//! `redbaton exec NAME -- CMD`: run CMD while holding the lock.

use std::time::Duration;

use nix::sys::signal::Signal;
use redbaton::{Lock, LockGuard, Owner};
use tokio::signal::unix::{signal, Signal as SignalStream, SignalKind};
use tokio::time::{sleep, Instant};

use crate::args::ExecArgs;
use crate::child::{self, Child, Ended};
use crate::exit::{self, Failure, Outcome};
use crate::inspect::Inspected;

/// Names the lock for CMD.
pub const ENV_LOCK: &str = "REDBATON_LOCK";
/// Names the owner (hash field) for CMD; a nested exec of the same lock re-enters as it.
pub const ENV_OWNER: &str = "REDBATON_OWNER";

/// How often the hold is checked in Redis while CMD runs, so a force-unlock or takeover is
/// noticed within about a second whatever the watchdog lease.
const CHECK_EVERY: Duration = Duration::from_millis(500);

/// SIGINT, SIGTERM and SIGHUP, listened to from before the lock is requested.
struct Forwarded {
    int: SignalStream,
    term: SignalStream,
    hup: SignalStream,
}

impl Forwarded {
    fn install() -> Result<Self, Failure> {
        let listen = |kind| {
            signal(kind).map_err(|e| Failure::new(exit::SOFTWARE, format!("signal handler: {e}")))
        };
        Ok(Forwarded {
            int: listen(SignalKind::interrupt())?,
            term: listen(SignalKind::terminate())?,
            hup: listen(SignalKind::hangup())?,
        })
    }

    async fn next(&mut self) -> Signal {
        tokio::select! {
            _ = self.int.recv() => Signal::SIGINT,
            _ = self.term.recv() => Signal::SIGTERM,
            _ = self.hup.recv() => Signal::SIGHUP,
        }
    }
}

pub async fn run(url: &str, args: ExecArgs) -> Outcome {
    let mut signals = match Forwarded::install() {
        Ok(s) => s,
        Err(f) => return Outcome::Failed(f),
    };
    child::become_subreaper();
    if let Err(f) = crate::check_name(&args.name) {
        return Outcome::Failed(f);
    }
    let client = match crate::connect(url, &args.key, args.watchdog_lease).await {
        Ok(c) => c,
        Err(f) => return Outcome::Failed(f),
    };
    let outcome = run_with(&client, &mut signals, &args).await;
    if let Err(e) = client.shutdown().await {
        tracing::debug!(error = %e, "shutdown");
    }
    outcome.into()
}

/// The lock handle: a nested exec of the lock its parent holds acts as the parent's owner.
fn lock_for(client: &redbaton::Client, name: &str) -> Result<Lock, Failure> {
    let lock = client.lock(name);
    if std::env::var(ENV_LOCK).ok().as_deref() != Some(name) {
        return Ok(lock);
    }
    let Ok(owner) = std::env::var(ENV_OWNER) else {
        return Ok(lock);
    };
    let owner: Owner = owner
        .parse()
        .map_err(|e: redbaton::Error| Failure::new(exit::USAGE, format!("{ENV_OWNER}: {e}")))?;
    tracing::debug!(%owner, "re-entering the lock held by the parent exec");
    Ok(lock.with_owner(owner))
}

async fn acquire(lock: &Lock, args: &ExecArgs) -> redbaton::Result<Option<LockGuard>> {
    let wait = args.wait.unwrap_or(Duration::MAX);
    match args.lease {
        Some(lease) => lock.try_lock_with_lease(wait, lease).await,
        None => lock.try_lock_for(wait).await,
    }
}

async fn run_with(
    client: &redbaton::Client,
    signals: &mut Forwarded,
    args: &ExecArgs,
) -> Result<u8, Failure> {
    let lock = lock_for(client, &args.name)?;
    let started = Instant::now();
    let guard = tokio::select! {
        acquired = acquire(&lock, args) => acquired?,
        sig = signals.next() => {
            // Dropping the acquire is cancellation safe: nothing stays held.
            return Err(Failure::new(
                128 + sig as u8,
                format!("{sig} while waiting for lock {:?}; CMD not run", args.name),
            ));
        }
    };
    let Some(guard) = guard else {
        if args.quiet {
            return Err(Failure::quiet(args.conflict_exit_code));
        }
        return Err(conflict(client, args, started.elapsed()).await);
    };
    let owner = guard.owner();
    let owner_text = owner.to_string();
    // A lease can end before CMD would start (a short --lease, a slow reply): then CMD must not
    // run unprotected, not even for a moment.
    if guard.is_lost() {
        // Lost by the local clock: nothing is sent (the key expires with its lease).
        let _ = guard.unlock().await;
        return Err(Failure::new(
            exit::LEASE_LOST,
            format!(
                "lock {:?} was acquired, but its lease ended before CMD could start; CMD not run",
                args.name
            ),
        ));
    }
    tracing::info!(lock = %args.name, owner = %owner_text, "acquired; starting CMD");

    let child = match child::spawn(
        &args.cmd,
        &[
            (ENV_LOCK, args.name.as_str()),
            (ENV_OWNER, owner_text.as_str()),
        ],
    ) {
        Ok(child) => child,
        Err(e) => {
            let _ = guard.unlock().await;
            let program = args.cmd[0].to_string_lossy();
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                exit::NOT_FOUND
            } else {
                exit::NOT_EXECUTABLE
            };
            return Err(Failure::new(code, format!("cannot run {program}: {e}")));
        }
    };

    let outcome = supervise(&child, &guard, &lock.with_owner(owner), signals, args).await;
    child.restore_terminal();
    match outcome {
        Supervised::Ended(ended) => {
            match guard.unlock().await {
                Ok(()) => {}
                // CMD finished, but its lease did not survive it: report it as lost.
                Err(redbaton::Error::NotHeld { .. }) => {
                    return Err(Failure::new(
                        exit::LEASE_LOST,
                        format!(
                            "lock {:?} was lost before CMD finished (it exited with {})",
                            args.name,
                            ended.status()
                        ),
                    ))
                }
                // The next caller would wait for the lease without a word: say so, in the
                // status too.
                Err(e) => {
                    return Err(Failure::new(
                        exit::RELEASE_FAILED,
                        format!(
                            "CMD exited with {}, but lock {:?} could not be released ({e}); it may stay held until its lease ends",
                            ended.status(),
                            args.name
                        ),
                    ))
                }
            }
            Ok(ended.status())
        }
        Supervised::Lost(why) => {
            let _ = guard.unlock().await;
            Err(Failure::new(exit::LEASE_LOST, why))
        }
    }
}

enum Supervised {
    Ended(Ended),
    Lost(String),
}

/// Resolves, with the reason, once Redis says the hold is gone (force-unlocked, expired, taken
/// over). Checks every [`CHECK_EVERY`], each check bounded by that period: a check that fails
/// or times out is not a loss by itself (the watchdog decides when Redis is away).
async fn gone_from_redis(held: &Lock) -> String {
    let mut check = tokio::time::interval(CHECK_EVERY);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    check.tick().await;
    loop {
        check.tick().await;
        match tokio::time::timeout(CHECK_EVERY, held.is_held_in_scope()).await {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => return "it was force-unlocked or expired".to_owned(),
            Ok(Err(e)) => tracing::debug!(error = %e, "hold check failed"),
            Err(_) => tracing::debug!(?CHECK_EVERY, "hold check timed out"),
        }
    }
}

/// Waits for CMD, forwarding signals and watching the lease. Nothing here waits on Redis: the
/// check in Redis runs alongside, so a stalled server delays neither the lost signal (the
/// guard's local clock), nor reaping, nor signal forwarding.
async fn supervise(
    child: &Child,
    guard: &LockGuard,
    held: &Lock,
    signals: &mut Forwarded,
    args: &ExecArgs,
) -> Supervised {
    let mut sigchld = signal(SignalKind::child()).ok();
    let gone = gone_from_redis(held);
    tokio::pin!(gone);
    let why = loop {
        if let Some(ended) = child.reap() {
            return Supervised::Ended(ended);
        }
        tokio::select! {
            // The loss first: when several branches are ready, stopping CMD comes first.
            biased;
            _ = guard.lost() => break "its lease ran out or could not be renewed".to_owned(),
            why = &mut gone => break why,
            sig = signals.next() => {
                tracing::info!(%sig, "forwarding to CMD's process group");
                child.signal_group(sig);
            }
            _ = async { match sigchld.as_mut() { Some(s) => { s.recv().await; } None => std::future::pending().await } } => {}
            _ = sleep(Duration::from_millis(200)) => {}
        }
    };
    if let Some(ended) = child.reap() {
        // CMD ended just as the lease went: its work is done, but unprotected at the end.
        eprintln!(
            "redbaton: lock {:?} lost as CMD ended (status {})",
            args.name,
            ended.status()
        );
    }
    eprintln!(
        "redbaton: lock {:?} lost while CMD ran ({why}); stopping CMD's process group (SIGTERM, SIGKILL after {})",
        args.name,
        humantime::format_duration(args.kill_after)
    );
    child.signal_group(Signal::SIGTERM);
    let kill_at = Instant::now() + args.kill_after;
    let mut killed = false;
    loop {
        child.reap();
        if !child.group_alive() {
            break;
        }
        if Instant::now() >= kill_at {
            if killed {
                // Whatever is left cannot be reaped by us; do not wait forever.
                if Instant::now() >= kill_at + Duration::from_secs(2) {
                    break;
                }
            } else {
                child.signal_group(Signal::SIGKILL);
                killed = true;
            }
        }
        sleep(Duration::from_millis(20)).await;
    }
    Supervised::Lost(format!(
        "lock {:?} lost while CMD ran ({why}); CMD stopped",
        args.name
    ))
}

/// The failure for a lock not acquired within --wait: names its owners and hold count, and
/// the wait asked for (`0s` for `--wait 0`, as the option was given, not the milliseconds the
/// try took).
async fn conflict(client: &redbaton::Client, args: &ExecArgs, waited: Duration) -> Failure {
    let holders = match Inspected::read(client, &args.name).await {
        Ok(found) => found.holders(),
        Err(_) => "owners unknown".to_owned(),
    };
    let wait = args.wait.unwrap_or(waited);
    Failure::new(
        args.conflict_exit_code,
        format!(
            "lock {:?} is held ({holders}); not acquired within {}",
            args.name,
            humantime::format_duration(Duration::from_millis(wait.as_millis() as u64))
        ),
    )
}
