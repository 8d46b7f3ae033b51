//! `redbaton status`, `redbaton unlock --force` and `redbaton permits`: every kind of lock kept
//! in a Redis hash, and both semaphores (a counter under the name).

use std::fmt;
use std::time::Duration;

use fred::interfaces::ClientLike;
use fred::types::{ClusterHash, CustomCommand};
use redbaton::{Client, LockState, PermitId, ReadWriteMode};

use crate::args::{PermitsArgs, StatusArgs, UnlockArgs};
use crate::exit::{self, Failure};

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
    let shown = show_status(&client, &args).await;
    let _ = client.shutdown().await;
    shown
}

async fn show_status(client: &Client, args: &StatusArgs) -> Result<u8, Failure> {
    if let Some(semaphore) = Semaphore::read(client, &args.name).await? {
        if args.json {
            println!("{}", semaphore.json(&args.name));
        } else {
            print!("{}", semaphore.text(&args.name));
        }
        return Ok(if semaphore.in_use() { YES } else { NO });
    }
    let found = Inspected::read(client, &args.name).await?;
    if args.json {
        println!("{}", found.json(&args.name, client.lock(&args.name).key()));
    } else {
        print!("{}", found.text(&args.name));
    }
    Ok(if found.state.is_locked() { YES } else { NO })
}

pub async fn unlock(url: &str, args: UnlockArgs) -> Result<u8, Failure> {
    debug_assert!(args.force, "clap requires --force");
    crate::check_name(&args.name)?;
    let client = crate::connect(url, &args.key, redbaton::DEFAULT_WATCHDOG_LEASE).await?;
    let done = force(&client, &args.name).await;
    let _ = client.shutdown().await;
    done
}

/// `unlock --force`: a leased semaphore's permits released, or the lock deleted.
async fn force(client: &Client, name: &str) -> Result<u8, Failure> {
    if let Some(semaphore) = Semaphore::read(client, name).await? {
        return semaphore.release_all(client, name).await;
    }
    match force_unlock(client, name).await? {
        Some(kind) => {
            eprintln!("redbaton: {kind} {name:?} deleted; its waiters were woken");
            Ok(YES)
        }
        None => {
            eprintln!("redbaton: lock {name:?} was not held");
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

/// Permits listed by `status` at most.
const LISTED_PERMITS: usize = 1000;

/// A semaphore as `status`, `unlock --force` and `permits` see it.
pub struct Semaphore {
    /// Free permits now (after reclaiming ended leases).
    free: i64,
    kind: SemaphoreKind,
}

enum SemaphoreKind {
    /// `RSemaphore`: its recorded total, if any (see `Semaphore::set_permits`).
    Plain { total: Option<i64> },
    /// `RPermitExpirableSemaphore`: the permits taken, with the lease each has left.
    Leased {
        taken: Vec<(PermitId, Option<Duration>)>,
    },
}

/// The Redis type of `key` (`none` when absent).
async fn key_type(client: &Client, key: &str) -> redbaton::Result<String> {
    let command = CustomCommand::new_static("TYPE", ClusterHash::FirstKey, false);
    let kind: String = client.redis().custom(command, vec![key.to_owned()]).await?;
    Ok(kind)
}

impl Semaphore {
    /// Reads the semaphore `name`; `None` when its key is no semaphore's counter (a lock's
    /// hash, or nothing). A string that is no permit count is refused with `WrongType`.
    pub async fn read(client: &Client, name: &str) -> redbaton::Result<Option<Semaphore>> {
        let plain = client.semaphore(name);
        if key_type(client, plain.key()).await? != "string" {
            return Ok(None);
        }
        let leased = client.leased_semaphore(name);
        if key_type(client, leased.timeout_key()).await? == "zset" {
            let taken = leased.permits_taken(LISTED_PERMITS).await?;
            let free = leased.available_permits().await?;
            return Ok(Some(Semaphore {
                free,
                kind: SemaphoreKind::Leased { taken },
            }));
        }
        let free = plain.available_permits().await?;
        let total = plain.total_permits().await?;
        Ok(Some(Semaphore {
            free,
            kind: SemaphoreKind::Plain { total },
        }))
    }

    /// Whether some permit is known to be taken.
    fn in_use(&self) -> bool {
        match &self.kind {
            SemaphoreKind::Plain { total } => total.is_some_and(|total| total > self.free),
            SemaphoreKind::Leased { taken } => !taken.is_empty(),
        }
    }

    fn text(&self, name: &str) -> String {
        match &self.kind {
            SemaphoreKind::Plain { total: Some(total) } => format!(
                "{name:?}: semaphore, {} permit(s) free of a total of {total} ({} taken)\n",
                self.free,
                total - self.free
            ),
            SemaphoreKind::Plain { total: None } => format!(
                "{name:?}: semaphore, {} permit(s) free; no recorded total, so the permits \
                 taken are unknown (they belong to nobody)\n",
                self.free
            ),
            SemaphoreKind::Leased { taken } => {
                let mut out = format!(
                    "{name:?}: leased semaphore, {} permit(s) free, {} taken\n",
                    self.free,
                    taken.len()
                );
                for (id, left) in taken {
                    let lease = match left {
                        Some(left) => format!(
                            "lease {} left",
                            humantime::format_duration(Duration::from_millis(
                                left.as_millis() as u64
                            ))
                        ),
                        None => "no lease".to_owned(),
                    };
                    out += &format!("  permit {id} {lease}\n");
                }
                out
            }
        }
    }

    fn json(&self, name: &str) -> serde_json::Value {
        match &self.kind {
            SemaphoreKind::Plain { total } => serde_json::json!({
                "name": name,
                "kind": "semaphore",
                "free": self.free,
                "total": total,
                "taken": total.map(|total| total - self.free),
            }),
            SemaphoreKind::Leased { taken } => {
                let permits: Vec<_> = taken
                    .iter()
                    .map(|(id, left)| {
                        serde_json::json!({
                            "id": id.to_string(),
                            "lease_ms": left.map(|left| left.as_millis() as u64),
                        })
                    })
                    .collect();
                serde_json::json!({
                    "name": name,
                    "kind": "leased_semaphore",
                    "free": self.free,
                    "taken": taken.len(),
                    "permits": permits,
                })
            }
        }
    }

    /// `unlock --force`: releases every permit of a leased semaphore (waking its waiters);
    /// a plain one's permits belong to nobody, so there is nothing to force.
    async fn release_all(self, client: &Client, name: &str) -> Result<u8, Failure> {
        let SemaphoreKind::Leased { taken } = self.kind else {
            return Err(Failure::new(
                exit::DATA,
                format!(
                    "{name:?} is a semaphore, whose permits belong to nobody: nothing to unlock; \
                     repair its count with `redbaton permits {name} TOTAL` or `--add DELTA`"
                ),
            ));
        };
        let leased = client.leased_semaphore(name);
        let mut released = 0;
        for (id, _) in &taken {
            if leased.release_id(id).await? {
                released += 1;
            }
        }
        if released == 0 {
            eprintln!("redbaton: leased semaphore {name:?} had no permit taken");
            return Ok(NO);
        }
        eprintln!("redbaton: leased semaphore {name:?}: {released} permit(s) released; its waiters were woken");
        Ok(YES)
    }
}

/// `permits NAME TOTAL` / `permits NAME --add DELTA`.
pub async fn permits(url: &str, args: PermitsArgs) -> Result<u8, Failure> {
    crate::check_name(&args.name)?;
    let client = crate::connect(url, &args.key, redbaton::DEFAULT_WATCHDOG_LEASE).await?;
    let set = set_permits(&client, &args).await;
    let _ = client.shutdown().await;
    let free = set?;
    eprintln!(
        "redbaton: semaphore {:?}: {free} permit(s) free now",
        args.name
    );
    Ok(0)
}

async fn set_permits(client: &Client, args: &PermitsArgs) -> Result<i64, Failure> {
    let name = &args.name;
    let kind = key_type(client, client.semaphore(name).key()).await?;
    if kind != "string" && kind != "none" {
        return Err(redbaton::Error::WrongType {
            name: name.clone(),
            detail: format!("the key holds a {kind}, not a semaphore's permit count"),
        }
        .into());
    }
    let leased = args.leased
        || key_type(client, client.leased_semaphore(name).timeout_key()).await? == "zset";
    Ok(match (args.total, args.add, leased) {
        (Some(total), _, true) => client.leased_semaphore(name).set_permits(total).await?,
        (Some(total), _, false) => client.semaphore(name).set_permits(total).await?,
        (None, Some(delta), true) => {
            let sem = client.leased_semaphore(name);
            sem.add_permits(delta).await?;
            sem.available_permits().await?
        }
        (None, Some(delta), false) => {
            let sem = client.semaphore(name);
            sem.add_permits(delta).await?;
            sem.available_permits().await?
        }
        (None, None, _) => unreachable!("clap requires TOTAL or --add"),
    })
}
