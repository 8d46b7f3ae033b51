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

/// One owner's hold.
struct Hold {
    /// `<client uuid>:<number>`, as `REDBATON_OWNER` and `Guard::owner` show it.
    owner: String,
    count: u64,
    /// A read/write lock's `read` or `write`.
    mode: Option<&'static str>,
}

/// A read/write lock's mode as `status` words it.
fn mode_name(mode: ReadWriteMode) -> &'static str {
    match mode {
        ReadWriteMode::Read => "read",
        ReadWriteMode::Write => "write",
    }
}

/// A lock as `status`, `unlock --force` and `exec`'s conflict message describe it.
pub struct Inspected {
    pub kind: Kind,
    holds: Vec<Hold>,
    /// A read/write lock's mode while it is held.
    mode: Option<ReadWriteMode>,
    ttl: Option<Duration>,
    /// Subscriber connections on a plain lock's channel; `None` for the other kinds, whose
    /// waiters listen elsewhere (a fair lock's are its queue).
    subscribers: Option<u64>,
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
        Ok(Inspected::new(kind, state, queued))
    }

    fn new(kind: Kind, state: LockState, queued: Vec<String>) -> Inspected {
        let holds = state
            .owners
            .into_iter()
            .map(|hold| Hold {
                owner: hold.owner.to_string(),
                count: hold.count,
                mode: hold.mode.map(mode_name),
            })
            .collect();
        Inspected {
            kind,
            holds,
            mode: state.mode,
            ttl: state.ttl,
            subscribers: (kind == Kind::Lock).then_some(state.subscribers),
            queued,
        }
    }

    fn is_locked(&self) -> bool {
        !self.holds.is_empty()
    }

    fn hold_count(&self) -> u64 {
        self.holds.iter().map(|h| h.count).sum()
    }

    /// A read/write lock's mode, `read` or `write`, while it is held.
    fn mode(&self) -> Option<&'static str> {
        self.mode.map(mode_name)
    }

    /// Who holds it, in a few words: `read/write lock in write mode, 1 owner(s), hold count 2`.
    pub fn holders(&self) -> String {
        let kind = match self.mode() {
            Some(mode) => format!("{} in {mode} mode, ", self.kind),
            None if self.kind == Kind::Lock => String::new(),
            None => format!("{}, ", self.kind),
        };
        format!(
            "{kind}{} owner(s), hold count {}",
            self.holds.len(),
            self.hold_count()
        )
    }

    fn text(&self, name: &str) -> String {
        let mut out = String::new();
        match self.ttl.filter(|_| self.is_locked()) {
            Some(ttl) => {
                let ttl = Duration::from_millis(ttl.as_millis() as u64);
                let locked = match self.mode() {
                    Some("write") => "locked for writing",
                    Some(_) => "locked for reading",
                    None => "locked",
                };
                let kind = match self.kind {
                    Kind::Lock => String::new(),
                    other => format!("{other}, "),
                };
                out += &format!(
                    "{name:?}: {kind}{locked}, lease {} left, hold count {}\n",
                    humantime::format_duration(ttl),
                    self.hold_count()
                );
                for hold in &self.holds {
                    let mode = hold.mode.map(|m| format!(" {m}")).unwrap_or_default();
                    out += &format!("  owner {}{mode} count {}\n", hold.owner, hold.count);
                }
            }
            None => out += &format!("{name:?}: free\n"),
        }
        if let Some(subscribers) = self.subscribers {
            out += &format!("  waiting subscriber connections: {subscribers}\n");
        }
        if !self.queued.is_empty() {
            out += &format!("  queued owners: {}\n", self.queued.join(", "));
        }
        out
    }

    fn json(&self, name: &str, key: &str) -> serde_json::Value {
        let owners: Vec<_> = self
            .holds
            .iter()
            .map(|hold| {
                let mut owner = serde_json::json!({ "owner": hold.owner, "count": hold.count });
                if let Some(mode) = hold.mode {
                    owner["hold"] = mode.into();
                }
                owner
            })
            .collect();
        serde_json::json!({
            "name": name,
            "key": key,
            "kind": self.kind.id(),
            "locked": self.is_locked(),
            "mode": self.mode(),
            "owners": owners,
            "hold_count": self.hold_count(),
            "ttl_ms": self.ttl.filter(|_| self.is_locked()).map(|t| t.as_millis() as u64),
            "subscribers": self.subscribers,
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
    Ok(if found.is_locked() { YES } else { NO })
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
