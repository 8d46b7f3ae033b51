//! What the worker processes and the parent share: the lock names, the side keys, the clock,
//! the guarded-counter script, and the line format of a critical section's record.

use std::fmt;
use std::time::Duration;

/// The lock names tasks pick from (the first `--names` of them); the third carries a hash
/// tag, which changes how its channel is named.
pub const NAMES: [&str; 8] = [
    "soak:a", "soak:b", "{soak}:c", "soak:d", "soak:e", "soak:f", "soak:g", "soak:h",
];

/// The kinds of lock a mixed soak (`--java`) shares with Java Redisson workers, one name
/// each; every one of them excludes (a leased semaphore of one permit is a lock too).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameKind {
    Lock,
    Fair,
    Fenced,
    Write,
    Leased,
}

impl NameKind {
    /// The kind's name in the Java driver and in the summary's call labels.
    pub fn label(self) -> &'static str {
        match self {
            NameKind::Lock => "lock",
            NameKind::Fair => "fair",
            NameKind::Fenced => "fenced",
            NameKind::Write => "write",
            NameKind::Leased => "leased",
        }
    }
}

/// The names of a mixed soak and their kinds (the fenced lock's carries a hash tag).
pub const MIXED: [(&str, NameKind); 5] = [
    ("mixed:lock", NameKind::Lock),
    ("mixed:fair", NameKind::Fair),
    ("{mixed}:fenced", NameKind::Fenced),
    ("mixed:write", NameKind::Write),
    ("mixed:leased", NameKind::Leased),
];

const MIXED_NAMES: [&str; 5] = [MIXED[0].0, MIXED[1].0, MIXED[2].0, MIXED[3].0, MIXED[4].0];

/// The names a run uses: the mixed ones, or the first `n` of [`NAMES`] (all plain locks).
/// A record's name is an index into this list.
pub fn names(mixed: bool, n: usize) -> &'static [&'static str] {
    if mixed {
        &MIXED_NAMES
    } else {
        &NAMES[..n]
    }
}

/// The kind of the name at `index` of [`names`].
pub fn kind_of(mixed: bool, index: usize) -> NameKind {
    if mixed {
        MIXED[index].1
    } else {
        NameKind::Lock
    }
}

/// The fencing counter of `name` (INCR inside each section).
pub fn fence_key(name: &str) -> String {
    format!("soak:fence:{name}")
}

/// The guarded counter of `name`: a hash with `value`, `fence` (of the last accepted write),
/// `accepted` and `rejected`.
pub fn counter_key(name: &str) -> String {
    format!("soak:counter:{name}")
}

/// Compare-and-set on the guarded counter: a write is accepted only while its fence is the
/// newest one issued for the name. "Newest issued" rather than "highest written": a stalled
/// holder whose lease was lost may take its fence late (a newer holder then already read the
/// counter), and only the issued fence tells that its read is stale.
///
/// Reply `{code, newest}`: code 1 accepted, 0 rejected (a newer fence exists), 2 refused
/// because the fence is *ahead* of the fencing counter (the counter lost data).
pub const CAS_SCRIPT: &str = r#"
local newest = tonumber(redis.call('GET', KEYS[1]) or '0')
local fence = tonumber(ARGV[1])
if fence > newest then
    return {2, newest}
end
if fence < newest then
    redis.call('HINCRBY', KEYS[2], 'rejected', 1)
    return {0, newest}
end
redis.call('HSET', KEYS[2], 'value', ARGV[2], 'fence', ARGV[1])
redis.call('HINCRBY', KEYS[2], 'accepted', 1)
return {1, newest}
"#;

/// Nanoseconds on `CLOCK_MONOTONIC`: one clock for every process of the machine, so
/// sections recorded by different workers compare.
pub fn mono_ns() -> u64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC is always available on Linux");
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
}

/// A `mono_ns` reading as a duration since `epoch_ns`.
pub fn since(epoch_ns: u64, ns: u64) -> Duration {
    Duration::from_nanos(ns.saturating_sub(epoch_ns))
}

/// How the counter write of a section ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteOutcome {
    /// Accepted: its fence was the newest.
    Accepted,
    /// Rejected: a newer fence (`Record::newest`) had been issued.
    Rejected,
    /// Refused: the fence was ahead of the fencing counter.
    Ahead,
    /// No reply (error or timeout): it may or may not have run.
    Unknown,
    /// Not sent: the fence or the read failed.
    NotSent,
}

impl WriteOutcome {
    fn code(self) -> char {
        match self {
            WriteOutcome::Accepted => 'A',
            WriteOutcome::Rejected => 'R',
            WriteOutcome::Ahead => 'F',
            WriteOutcome::Unknown => 'U',
            WriteOutcome::NotSent => 'N',
        }
    }

    fn from_code(c: &str) -> Option<Self> {
        Some(match c {
            "A" => WriteOutcome::Accepted,
            "R" => WriteOutcome::Rejected,
            "F" => WriteOutcome::Ahead,
            "U" => WriteOutcome::Unknown,
            "N" => WriteOutcome::NotSent,
            _ => return None,
        })
    }
}

/// One critical section as a worker saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Index into the run's [`names`].
    pub name: usize,
    /// `mono_ns` when the section began (the acquire had returned).
    pub start_ns: u64,
    /// `mono_ns` when the section ended (before the release).
    pub end_ns: u64,
    /// The fencing number; `None` when the INCR got no reply.
    pub fence: Option<i64>,
    /// `mono_ns` when the holder was told its lease was lost (its guard's `lost()`
    /// resolved); `None` when it was not told by the end.
    pub lost_ns: Option<u64>,
    /// The counter write's outcome.
    pub write: WriteOutcome,
    /// The newest fence the counter script saw (0 when it did not reply).
    pub newest: i64,
    /// How long the acquire took, in ns (0 for a second section of the same hold).
    pub wait_ns: u64,
    /// Which call acquired it (`lock`, `try_lock`, `reentrant:wf`, …).
    pub op: String,
    /// Through the proxy (`true`) or straight to the server.
    pub proxied: bool,
    /// Worker process and task that ran it.
    pub worker: usize,
    /// Task number within the worker.
    pub task: usize,
    /// The owner field of the hold the section ran under (`-` when unknown: a Java worker's,
    /// another kind's). A run of hand-offs in memory keeps one field, so a force-unlock's
    /// checker follows a struck hold's run by it.
    pub owner: String,
    /// The release found the hold gone although its holder had not been told (a force-unlock
    /// struck it, say).
    pub gone: bool,
}

impl Record {
    /// The holder was told its lease was lost by the end of the section.
    pub fn lost(&self) -> bool {
        self.lost_ns.is_some()
    }
}

impl fmt::Display for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {} {} {} {} {} {} {} {} {} {} {} {}",
            self.name,
            self.start_ns,
            self.end_ns,
            self.fence.unwrap_or(-1),
            self.lost_ns.map_or(-1, |ns| ns as i64),
            self.write.code(),
            self.newest,
            self.wait_ns,
            self.op,
            u8::from(self.proxied),
            self.worker,
            self.task,
            self.owner,
            u8::from(self.gone)
        )
    }
}

impl std::str::FromStr for Record {
    type Err = String;

    fn from_str(line: &str) -> Result<Self, Self::Err> {
        let bad = || format!("bad history line {line:?}");
        let f: Vec<&str> = line.split(' ').collect();
        if f.len() != 14 {
            return Err(bad());
        }
        let num = |i: usize| f[i].parse::<i64>().map_err(|_| bad());
        let unsigned = |i: usize| f[i].parse::<u64>().map_err(|_| bad());
        let name = unsigned(0)? as usize;
        if name >= NAMES.len() {
            return Err(bad());
        }
        let fence = num(3)?;
        let lost_ns = num(4)?;
        Ok(Record {
            name,
            start_ns: unsigned(1)?,
            end_ns: unsigned(2)?,
            fence: (fence >= 0).then_some(fence),
            lost_ns: (lost_ns >= 0).then_some(lost_ns as u64),
            write: WriteOutcome::from_code(f[5]).ok_or_else(bad)?,
            newest: num(6)?,
            wait_ns: unsigned(7)?,
            op: f[8].to_owned(),
            proxied: f[9] == "1",
            worker: unsigned(10)? as usize,
            task: unsigned(11)? as usize,
            owner: f[12].to_owned(),
            gone: f[13] == "1",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_survives_its_line() {
        let r = Record {
            name: 2,
            start_ns: 5,
            end_ns: 9,
            fence: None,
            lost_ns: Some(8),
            write: WriteOutcome::Rejected,
            newest: 44,
            wait_ns: 3,
            op: "reentrant:fw".into(),
            proxied: true,
            worker: 1,
            task: 7,
            owner: "c0ffee:12".into(),
            gone: true,
        };
        assert_eq!(r.to_string().parse::<Record>(), Ok(r.clone()));
        let java = "2 5 9 -1 8 R 44 3 java:lock:lock 1 3 7 - 1"
            .parse::<Record>()
            .unwrap();
        assert_eq!((java.owner.as_str(), java.gone), ("-", true));
        // The release's columns are not optional: a line without them is refused.
        assert!("2 5 9 -1 8 R 44 3 java:lock:lock 1 3 7"
            .parse::<Record>()
            .is_err());
        let told_nothing = Record { lost_ns: None, ..r };
        assert_eq!(told_nothing.to_string().parse::<Record>(), Ok(told_nothing));
        assert!("1 2 3".parse::<Record>().is_err());
    }
}
