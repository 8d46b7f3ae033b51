//! `redbaton status` and `redbaton unlock --force`, for every kind of lock kept in a Redis hash.

use std::fmt;
use std::time::Duration;

use redbaton::{Client, LockState, ReadWriteMode};

use crate::args::{StatusArgs, UnlockArgs};
use crate::exit::Failure;

/// Exit status of `status` for a held lock and of `unlock --force` when it deleted one.
const YES: u8 = 0;
/// Exit status of `status` for a free lock and of `unlock --force` when there was none.
const NO: u8 = 1;

/// The kinds of lock a hash can be, as far as Redis tells them apart: a fenced lock is a
/// [`Kind::Lock`] (the same hash and channel), and a fair lock is only known by its queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `RLock` / `RFencedLock` (or a fair lock nobody queues for).
    Lock,
    /// `RFairLock` with owners queued for it.
    FairLock,
    /// `RReadWriteLock`.
    ReadWriteLock,
}

impl Kind {
    /// The name in `status --json`.
    fn id(self) -> &'static str {
        match self {
            Kind::Lock => "lock",
            Kind::FairLock => "fair_lock",
            Kind::ReadWriteLock => "read_write_lock",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Lock => "lock",
            Kind::FairLock => "fair lock",
            Kind::ReadWriteLock => "read/write lock",
        })
    }
}

/// A read/write lock's mode, or a hold's half, as `status` words it.
fn mode_name(mode: ReadWriteMode) -> &'static str {
    match mode {
        ReadWriteMode::Read => "read",
        ReadWriteMode::Write => "write",
    }
}

/// A lock as `status`, `unlock --force` and `exec`'s conflict message describe it: the
/// library's [`LockState`] of its hash, with the kind and queue only the CLI tells apart.
pub struct Inspected {
    pub kind: Kind,
    state: LockState,
    /// A fair lock's queued owners, the next first.
    queued: Vec<String>,
}

impl Inspected {
    /// Reads the lock `name`. A key that is not a lock is refused with `WrongType`.
    pub async fn read(client: &Client, name: &str) -> redbaton::Result<Inspected> {
        let state = client.lock(name).state().await?;
        let rwlock = state.mode.is_some();
        let queued = if rwlock {
            Vec::new()
        } else {
            client.fair_lock(name).queued().await?
        };
        let kind = match (rwlock, queued.is_empty()) {
            (true, _) => Kind::ReadWriteLock,
            (false, false) => Kind::FairLock,
            (false, true) => Kind::Lock,
        };
        Ok(Inspected {
            kind,
            state,
            queued,
        })
    }

    /// Subscriber connections on a plain lock's channel; `None` for the other kinds, whose
    /// waiters listen elsewhere (a fair lock's are its queue).
    fn subscribers(&self) -> Option<u64> {
        (self.kind == Kind::Lock).then_some(self.state.subscribers)
    }

    /// The lease left while the lock is held.
    fn ttl(&self) -> Option<Duration> {
        self.state.ttl.filter(|_| self.state.is_locked())
    }

    /// Who holds it, in a few words: `read/write lock in write mode, 1 owner(s), hold count 2`.
    pub fn holders(&self) -> String {
        let kind = match self.state.mode {
            Some(mode) => format!("{} in {} mode, ", self.kind, mode_name(mode)),
            None if self.kind == Kind::Lock => String::new(),
            None => format!("{}, ", self.kind),
        };
        format!(
            "{kind}{} owner(s), hold count {}",
            self.state.owners.len(),
            self.state.hold_count()
        )
    }

    fn text(&self, name: &str) -> String {
        let mut out = String::new();
        match self.ttl() {
            Some(ttl) => {
                let ttl = Duration::from_millis(ttl.as_millis() as u64);
                let locked = match self.state.mode {
                    Some(ReadWriteMode::Write) => "locked for writing",
                    Some(ReadWriteMode::Read) => "locked for reading",
                    None => "locked",
                };
                let kind = match self.kind {
                    Kind::Lock => String::new(),
                    other => format!("{other}, "),
                };
                out += &format!(
                    "{name:?}: {kind}{locked}, lease {} left, hold count {}\n",
                    humantime::format_duration(ttl),
                    self.state.hold_count()
                );
                for hold in &self.state.owners {
                    let mode = hold
                        .mode
                        .map(|m| format!(" {}", mode_name(m)))
                        .unwrap_or_default();
                    out += &format!("  owner {}{mode} count {}\n", hold.owner, hold.count);
                }
            }
            None => out += &format!("{name:?}: free\n"),
        }
        if let Some(subscribers) = self.subscribers() {
            out += &format!("  waiting subscriber connections: {subscribers}\n");
        }
        if !self.queued.is_empty() {
            out += &format!("  queued owners: {}\n", self.queued.join(", "));
        }
        out
    }

    fn json(&self, name: &str, key: &str) -> serde_json::Value {
        let owners: Vec<_> = self
            .state
            .owners
            .iter()
            .map(|hold| {
                let mut owner =
                    serde_json::json!({ "owner": hold.owner.to_string(), "count": hold.count });
                if let Some(mode) = hold.mode {
                    owner["hold"] = mode_name(mode).into();
                }
                owner
            })
            .collect();
        serde_json::json!({
            "name": name,
            "key": key,
            "kind": self.kind.id(),
            "locked": self.state.is_locked(),
            "mode": self.state.mode.map(mode_name),
            "owners": owners,
            "hold_count": self.state.hold_count(),
            "ttl_ms": self.ttl().map(|t| t.as_millis() as u64),
            "subscribers": self.subscribers(),
            "queued": self.queued,
        })
    }
}

pub async fn status(url: &str, args: StatusArgs) -> Result<u8, Failure> {
    crate::check_name(&args.name)?;
    let client = crate::connect(url, &args.key, redbaton::DEFAULT_WATCHDOG_LEASE).await?;
    let found = Inspected::read(&client, &args.name).await;
    let key = client.lock(&args.name).key().to_owned();
    let _ = client.shutdown().await;
    let found = found?;
    if args.json {
        println!("{}", found.json(&args.name, &key));
    } else {
        print!("{}", found.text(&args.name));
    }
    Ok(if found.state.is_locked() { YES } else { NO })
}

pub async fn unlock(url: &str, args: UnlockArgs) -> Result<u8, Failure> {
    debug_assert!(args.force, "clap requires --force");
    crate::check_name(&args.name)?;
    let client = crate::connect(url, &args.key, redbaton::DEFAULT_WATCHDOG_LEASE).await?;
    let deleted = force_unlock(&client, &args.name).await;
    let _ = client.shutdown().await;
    match deleted? {
        Some(kind) => {
            eprintln!(
                "redbaton: {kind} {:?} deleted; its waiters were woken",
                args.name
            );
            Ok(YES)
        }
        None => {
            eprintln!("redbaton: lock {:?} was not held", args.name);
            Ok(NO)
        }
    }
}

/// Deletes the lock `name` whoever holds it, through its own kind's force-unlock: each
/// publishes where that kind's waiters listen (a read/write lock on `redisson_rwlock:{name}`,
/// a fair lock to its queue's head), so they wake now rather than when their lease timers end.
/// Returns the kind deleted, `None` when nothing was held.
async fn force_unlock(client: &Client, name: &str) -> redbaton::Result<Option<Kind>> {
    let kind = Inspected::read(client, name).await?.kind;
    let deleted = match kind {
        // Each half deletes only in its own mode (and checks it in its script): the write
        // half wakes every waiter, the read half one per process, as their releases do.
        Kind::ReadWriteLock => {
            let rw = client.read_write_lock(name);
            rw.write().force_unlock().await? || rw.read().force_unlock().await?
        }
        Kind::FairLock => client.fair_lock(name).force_unlock().await?,
        Kind::Lock => client.lock(name).force_unlock().await?,
    };
    Ok(deleted.then_some(kind))
}
