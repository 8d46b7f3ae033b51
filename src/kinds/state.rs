//! [`LockState`]: what Redis says about one lock hash right now (the tool's `status`).

use std::time::Duration;

use fred::types::Value;

use crate::conn::{lua_script, LuaScript};
use crate::kinds::rwlock::WRITE_SUFFIX;
use crate::kinds::{Hooks, Named};
use crate::{Error, Lock, ReadWriteLock, Result};

lua_script!(STATE, "lock/state.lua");

/// Scripts of this module, loaded at connect.
pub(crate) static SCRIPTS: &[&LuaScript] = &[&STATE];

/// The field of a read/write lock's hash that holds its mode (Redisson's `RReadWriteLock`).
const MODE_FIELD: &str = "mode";

/// A lock's owners, remaining lease and waiting subscribers, read at one moment.
///
/// The owners and the lease are read atomically (one script); the subscriber count is read
/// right after, with `PUBSUB NUMSUB` (or `PUBSUB SHARDNUMSUB` in sharded mode).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockState {
    /// Each hold: its owner with its reentry count, sorted by owner (a read/write lock's
    /// read holds before its write hold). Empty when the lock is free.
    pub owners: Vec<Holder>,
    /// A read/write lock's mode; `None` for the other kinds and for a free lock.
    pub mode: Option<ReadWriteMode>,
    /// The lease left; `None` when the lock is free.
    pub ttl: Option<Duration>,
    /// How many subscriber connections listen on the lock's channel. A redbaton or Redisson
    /// process with waiters holds one subscription per lock, however many tasks wait in it.
    /// On a cluster with classic pub/sub a subscriber may sit on any node, so every primary
    /// is asked and the counts are added up; with sharded pub/sub the channel's shard is.
    pub subscribers: u64,
}

/// One owner's hold of a lock, as [`LockState::owners`] lists it.
///
/// Ordered by owner, then half (the fields are in that order): an owner's read hold comes
/// before its write hold, whatever their counts.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub struct Holder {
    /// Who holds it: the owner's hash field as it is stored (without a writer's `:write`).
    /// redbaton's and Redisson's are `<client uuid>:<number>`, which parses as an
    /// [`Owner`](crate::Owner);
    /// another peer's may not (node-redisson's default is `<client uuid>:<lock uuid>`), and is
    /// listed as it is, so that a lock held by any peer can be inspected and broken.
    pub owner: String,
    /// For a read/write lock, the half held: a writer that also reads (a downgrade under
    /// way) is listed once for each. `None` for the other kinds.
    pub mode: Option<ReadWriteMode>,
    /// How many times over (its reentry count).
    pub count: u64,
}

/// A read/write lock's mode, or the half of it a hold is of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ReadWriteMode {
    /// Shared: held by readers.
    Read,
    /// Exclusive: held by a writer (whose own read holds may sit beside it).
    Write,
}

impl LockState {
    /// Whether anyone holds the lock.
    pub fn is_locked(&self) -> bool {
        !self.owners.is_empty()
    }

    /// The sum of all owners' reentry counts.
    pub fn hold_count(&self) -> u64 {
        self.owners.iter().map(|h| h.count).sum()
    }
}

impl Lock {
    /// Reads the lock's owners with their counts, its remaining lease and the number of
    /// subscriber connections on its channel.
    ///
    /// Any kind kept in a lock hash can be read this way (a fair or fenced lock is one, and
    /// so is a read/write lock: then [`mode`](LockState::mode) is set, and the subscribers are
    /// those of this `Lock`'s channel; [`ReadWriteLock::state`] counts the read/write lock's).
    /// A key that is not a lock (another type, a hash without an expiry, or with a field no
    /// lock has) is refused with [`Error::WrongType`].
    ///
    /// ```no_run
    /// # async fn run(lock: redbaton::Lock) -> redbaton::Result<()> {
    /// let state = lock.state().await?;
    /// for hold in &state.owners {
    ///     println!("{} holds it {} time(s); {:?} left", hold.owner, hold.count, state.ttl);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn state(&self) -> Result<LockState> {
        read_state(self.named(), self.channel()).await
    }
}

impl ReadWriteLock {
    /// Reads the lock's mode, its holds (each reader's and the writer's, with their counts),
    /// its remaining lease and the number of subscriber connections on its channel
    /// (`redisson_rwlock:{name}`), as [`Lock::state`] does for a lock.
    ///
    /// ```no_run
    /// # async fn run(rw: redbaton::ReadWriteLock) -> redbaton::Result<()> {
    /// let state = rw.state().await?;
    /// if state.mode == Some(redbaton::ReadWriteMode::Read) {
    ///     println!("{} reader(s)", state.owners.len());
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn state(&self) -> Result<LockState> {
        read_state(self.read().named(), self.channel()).await
    }
}

/// The state of the lock hash `named`, its waiters counted on `channel`.
async fn read_state(named: &Named, channel: &str) -> Result<LockState> {
    named.check()?;
    let conn = &named.client.conn;
    let reply: Vec<Value> = conn
        .eval(&STATE, &[&named.key], Vec::new())
        .await
        .map_err(|e| named.error(&e))?;
    let malformed = || Error::Redis(format!("unexpected state reply for {:?}", named.name()));
    let pttl = reply
        .first()
        .and_then(Value::as_i64)
        .ok_or_else(malformed)?;
    let mut owners = Vec::new();
    let mut mode = None;
    let ttl = if pttl == -2 {
        None
    } else {
        let Some(Value::Array(fields)) = reply.get(1) else {
            return Err(malformed());
        };
        let pairs = fields.chunks(2).map(|pair| match pair {
            [field, value] => Ok((field.as_string().ok_or_else(malformed)?, value)),
            _ => Err(malformed()),
        });
        let pairs = pairs.collect::<Result<Vec<_>>>()?;
        // The mode field makes it a read/write lock, whose writer's field has a suffix.
        if let Some((_, value)) = pairs.iter().find(|(field, _)| field == MODE_FIELD) {
            mode = match value.as_str().as_deref() {
                Some("read") => Some(ReadWriteMode::Read),
                Some("write") => Some(ReadWriteMode::Write),
                _ => return Err(not_a_lock(named, &format!("mode {value:?}"))),
            };
        }
        for (field, count) in pairs {
            if field == MODE_FIELD && mode.is_some() {
                continue;
            }
            let (owner, half) = match (mode, field.strip_suffix(WRITE_SUFFIX)) {
                (None, _) => (field.as_str(), None),
                (Some(_), Some(writer)) => (writer, Some(ReadWriteMode::Write)),
                (Some(_), None) => (field.as_str(), Some(ReadWriteMode::Read)),
            };
            let count = count.as_i64().filter(|c| *c > 0);
            let (Some(count), true) = (count, is_owner_field(owner)) else {
                return Err(not_a_lock(named, &format!("field {field:?}")));
            };
            owners.push(Holder {
                owner: owner.to_owned(),
                mode: half,
                count: count as u64,
            });
        }
        owners.sort();
        Some(Duration::from_millis(pttl.max(0) as u64))
    };
    let subscribers = (named.client.conn)
        .subscribers(channel, named.client.config.pubsub)
        .await
        .map_err(|e| named.error(&e))?;
    Ok(LockState {
        owners,
        mode,
        ttl,
        subscribers,
    })
}

/// Whether `field` is an owner's field: `<client id>:<holder>`, both parts non-empty. Every
/// Redisson-style peer writes one (the holder part is a thread id, an owner number, or another
/// peer's own token), so it is taken as it is rather than parsed as redbaton's
/// [`Owner`](crate::Owner).
fn is_owner_field(field: &str) -> bool {
    field
        .split_once(':')
        .is_some_and(|(client, holder)| !client.is_empty() && !holder.is_empty())
}

/// The error for a lock hash with `what` in it, which no lock has.
fn not_a_lock(named: &Named, what: &str) -> Error {
    Error::WrongType {
        name: named.name().to_owned(),
        detail: format!("a hash with {what}, which no lock has"),
    }
}
