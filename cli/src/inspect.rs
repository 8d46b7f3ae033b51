//! `redbaton status` and `redbaton unlock --force`, for every kind of lock kept in a Redis hash.

use std::fmt;
use std::time::Duration;

use redbaton::{Client, LockState};

use crate::args::{StatusArgs, UnlockArgs};
use crate::exit::Failure;

/// Exit status of `status` for a held lock and of `unlock --force` when it deleted one.
const YES: u8 = 0;
/// Exit status of `status` for a free lock and of `unlock --force` when there was none.
const NO: u8 = 1;

/// The field of a read/write lock's hash that holds its mode, `read` or `write` (Redisson's
/// `RReadWriteLock`); no other kind has it.
const MODE_FIELD: &str = "mode";
/// The suffix of a read/write lock's writer field, `<client uuid>:<number>:write`.
const WRITE_SUFFIX: &str = ":write";

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

/// A lock as `status`, `unlock --force` and `exec`'s conflict message describe it.
pub struct Inspected {
    pub kind: Kind,
    holds: Vec<Hold>,
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
        let rwlock = state.owners.iter().any(|(field, _)| field == MODE_FIELD);
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
            .filter_map(|(field, count)| {
                if kind != Kind::ReadWriteLock {
                    return Some(Hold {
                        owner: field,
                        count,
                        mode: None,
                    });
                }
                if field == MODE_FIELD {
                    return None;
                }
                let (owner, mode) = match field.strip_suffix(WRITE_SUFFIX) {
                    Some(writer) => (writer.to_owned(), "write"),
                    None => (field, "read"),
                };
                Some(Hold {
                    owner,
                    count,
                    mode: Some(mode),
                })
            })
            .collect();
        Inspected {
            kind,
            holds,
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

    /// A read/write lock's mode, read off the same snapshot as its holds: a writer's field
    /// exists exactly while the lock is in write mode (its own read holds may sit beside it).
    fn mode(&self) -> Option<&'static str> {
        if self.kind != Kind::ReadWriteLock || !self.is_locked() {
            return None;
        }
        let writing = self.holds.iter().any(|h| h.mode == Some("write"));
        Some(if writing { "write" } else { "read" })
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
