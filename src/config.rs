//! Client settings and the builder that applies them.

use std::fmt;
use std::time::Duration;

use crate::{Error, Result};

/// The default watchdog lease, as in Redisson (`lockWatchdogTimeout`).
pub const DEFAULT_WATCHDOG_LEASE: Duration = Duration::from_secs(30);

/// How long a queued fair-lock waiter may go without taking its turn before the others skip
/// it, by default (Redisson's `fairLockWaitTimeout`, 5 minutes).
pub const DEFAULT_FAIR_LOCK_WAIT: Duration = Duration::from_secs(300);

/// How many baton passes in a row a lock makes by default before an ordinary release (see
/// [`Config::baton_passes`]).
pub const DEFAULT_BATON_PASSES: u32 = 64;

/// How often, by default, the watchdog asks Redis whether each hold is still there between
/// renewals (see [`Config::lease_check_interval`]).
pub const DEFAULT_LEASE_CHECK_INTERVAL: Duration = Duration::from_millis(500);

/// The shortest watchdog lease accepted: renewal runs every third of it.
pub const MIN_WATCHDOG_LEASE: Duration = Duration::from_millis(100);

/// The shortest fixed lease accepted. A hold is known valid only until its acquire's send
/// time plus the lease less the clock-drift allowance (1 % + 2 ms), and one whose validity
/// ended before its reply came is never handed out (it is released and tried again): a
/// shorter lease would leave no time to hold the lock at all.
pub const MIN_LEASE: Duration = Duration::from_millis(10);

/// The longest lease accepted. `PEXPIRE` takes signed 64-bit milliseconds added to the
/// server's clock; half of that range is refused by no Redis.
pub const MAX_LEASE: Duration = Duration::from_millis(i64::MAX as u64 / 2);

/// How waiters learn that a lock was released. Both sides of a lock — every redbaton and
/// Redisson client sharing it — must use the same mode, or they sleep through each other's
/// wake-ups (mutual exclusion still holds; waits fall back to the lease's PTTL).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum PubSubMode {
    /// `PUBLISH`/`SUBSCRIBE`: what Redisson uses on single nodes and Sentinel.
    #[default]
    Classic,
    /// `SPUBLISH`/`SSUBSCRIBE` (Redis 7): a message stays on the lock's shard instead of
    /// being broadcast to every node of a cluster. Redisson uses it on Redis 7 clusters.
    Sharded,
}

impl PubSubMode {
    pub(crate) fn publish_command(self) -> &'static str {
        match self {
            PubSubMode::Classic => "PUBLISH",
            PubSubMode::Sharded => "SPUBLISH",
        }
    }
}

/// Whether lock, unlock and renewal scripts wait for replicas before they count (Redis's
/// `WAIT`, sent right behind each script on the same connection and node).
///
/// Redis replicates asynchronously: a hold taken on a primary that dies before its replicas
/// received it is gone once a replica is promoted, and another client can take the lock while
/// the first still holds a guard. With replica sync, an acquire counts only once replicas
/// acknowledged it (an unacknowledged one is released again and retried within the caller's
/// wait, then fails with [`Error::NotReplicated`]), and a renewal extends a guard's validity
/// only once acknowledged, so [`lost`](crate::Guard::lost) never trusts an expiry the replica
/// that would take over does not have.
///
/// What it cannot do: a failover that promotes a replica which had *not* acknowledged (Redis
/// does not promise to pick one that had), or one that loses acknowledged writes (a replica
/// restarted without persistence), still loses holds; clocks that jump still end leases early
/// or late. Where a stale holder must never write, use a [`FencedLock`](crate::FencedLock) and
/// let the resource check its tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ReplicaSync {
    /// Never wait for replicas.
    Off,
    /// Wait for at least one replica wherever the key's primary has replicas connected
    /// (learnt from `INFO replication`, re-read every second), for at most
    /// [`AUTO_REPLICA_TIMEOUT`]. A primary without replicas pays nothing. The default.
    #[default]
    Auto,
    /// Wait for `min` replicas, for at most `timeout`, whatever the primary reports; fewer
    /// means not replicated (also on a primary without replicas).
    Replicas {
        /// How many replicas must acknowledge.
        min: u32,
        /// The longest to wait for them.
        timeout: Duration,
    },
}

/// How long [`ReplicaSync::Auto`] waits for a replica's acknowledgement.
pub const AUTO_REPLICA_TIMEOUT: Duration = Duration::from_secs(1);

/// Everything a [`Client`](crate::Client) needs: where Redis is and how locks behave.
///
/// ```
/// use std::time::Duration;
/// let mut config = redbaton::Config::new("redis://127.0.0.1:6379");
/// config.watchdog_lease = Duration::from_secs(10);
/// assert_eq!(config.command_timeout, Duration::from_secs(5));
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct Config {
    /// Where Redis is. Every form takes an optional `user:password@` before the host (the
    /// password percent-encoded if it has special characters; it is never shown in messages,
    /// logs or `Debug`). The schemes:
    ///
    /// | scheme | topology |
    /// | --- | --- |
    /// | `redis://host[:port][/db]` | a single node (port 6379 by default) |
    /// | `rediss://host[:port][/db]` | the same over TLS |
    /// | `valkey://`, `valkeys://`, `valkey-cluster://`, `valkeys-cluster://`, `valkey-sentinel://`, `valkeys-sentinel://` | the same as their `redis…` twins (for Valkey, or any server) |
    /// | `redis-cluster://host:port?node=host:port&node=…` | a cluster; the host and every `node` are seed nodes, the rest are discovered |
    /// | `rediss-cluster://…` | the same over TLS |
    /// | `redis-sentinel://host[:port][/db]?sentinelServiceName=name&node=host:port&…` | the primary that Sentinel names `name` (required), followed through failovers; the host (port 26379 by default) and every `node` are sentinels |
    /// | `rediss-sentinel://…` | the same over TLS |
    /// | `redis+unix:///path` | refused with [`Error::InvalidArgument`]: redbaton builds fred without its `unix-sockets` feature (untested if another crate of your build enables it) |
    ///
    /// - `/db` selects a database (0–255, default 0) on a single node and behind Sentinel; a
    ///   cluster has only database 0 and ignores it. Redisson clients sharing a lock must use
    ///   the same database.
    /// - Sentinel: `sentinelServiceName` is required, `node` repeats. The URL's credentials
    ///   are used for the sentinels and the data nodes alike; `sentinelUsername` and
    ///   `sentinelPassword` are ignored unless fred's `sentinel-auth` feature is enabled in
    ///   your build (redbaton does not enable it).
    /// - TLS schemes need the `tls` feature (on by default); without it they are refused
    ///   rather than reached in plain text. `tls_ca_file` sets a private CA.
    /// - Any other scheme, or a URL fred cannot parse (a bad port, a `node` without a port, a
    ///   database path that is not a number), makes connecting fail with
    ///   [`Error::InvalidArgument`] before anything is sent.
    ///
    /// No default: [`Config::new`] takes it ([`Config::default`] uses
    /// `redis://127.0.0.1:6379`).
    pub url: String,
    /// The lease of locks taken without an explicit one; renewed every third of it (default
    /// [`DEFAULT_WATCHDOG_LEASE`], 30 s).
    pub watchdog_lease: Duration,
    /// How often the watchdog asks Redis, between renewals, whether every hold of this client
    /// is still there (one batched read-only script per round; default
    /// [`DEFAULT_LEASE_CHECK_INTERVAL`], 500 ms). A hold removed behind its holder's back — a
    /// force-unlock by another client, Redis restarted empty — is then told lost through
    /// [`Guard::lost`](crate::Guard::lost) within about this long, or within a round trip
    /// while this client has tasks waiting on that lock (the unlock message says so). Never
    /// longer than a third of the watchdog lease: every renewal checks too.
    pub lease_check_interval: Duration,
    /// Prepended to every lock name to form its key (default empty, so keys match Redisson's).
    pub key_prefix: String,
    /// The longest any single round trip of the library to Redis may take (default 5 s). Keep
    /// it well under a third of [`watchdog_lease`](Self::watchdog_lease) (connecting warns
    /// otherwise): a renewal that stalls for it must still leave time for the next one. The
    /// client of your own ([`Client::redis`](crate::Client::redis)) has no such timeout.
    pub command_timeout: Duration,
    /// The longest establishing a connection may take (default 5 s).
    pub connect_timeout: Duration,
    /// The longest pause between reconnection attempts (they back off exponentially up to it;
    /// default 2 s).
    pub reconnect_max_delay: Duration,
    /// Classic or sharded pub/sub for wake-ups (default [`PubSubMode::Classic`]).
    pub pubsub: PubSubMode,
    /// How long a [`FairLock`](crate::FairLock) waiter that waits without a deadline (or
    /// longer than this) stays queued after its predecessor's turn before the others count
    /// it as dead and skip it (Redisson's `fairLockWaitTimeout`; default 5 minutes). A shorter
    /// wait frees the queue sooner from a crashed waiter; a live waiter that is skipped
    /// queues again at the back. See [`FairLock`](crate::FairLock).
    pub fair_lock_wait: Duration,
    /// For `rediss://` URLs: a PEM file of the CA certificate(s) that signed the server's
    /// certificate. When set, the client trusts **only** these certificates (a private CA
    /// for Redis is the usual case); when `None`, it trusts the system's root certificates
    /// (which `SSL_CERT_FILE`/`SSL_CERT_DIR` can also point elsewhere). Setting it for a URL
    /// without TLS is refused. Default `None`.
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub tls_ca_file: Option<std::path::PathBuf>,
    /// Whether lock scripts wait for replicas (see [`ReplicaSync`]; default
    /// [`ReplicaSync::Auto`]).
    pub replica_sync: ReplicaSync,
    /// With the `metrics` feature: whether metrics carry the lock's name as a `name` label
    /// (default `false`). Each name becomes a time series of its own for the life of the
    /// process, so turn it on only for a small, fixed set of names. Without the feature it has
    /// no effect.
    pub metrics_label_names: bool,
    /// The baton pass: how many times in a row a [`Lock`](crate::Lock) released by its last
    /// hold may be handed straight to the next task of this client parked on it (one script
    /// does both; no unlock message, no second round trip, no chance for the releaser to win
    /// it back). After that many, the release is an ordinary one with an unlock message, so
    /// waiters elsewhere get their chance. A hand-off happens only while no other client is
    /// subscribed to the lock's channel; once one was found, the next few releases of that
    /// lock are ordinary ones (default 64; `0` turns it off).
    ///
    /// Where the hold allows, the hand-off is made in memory instead, with no round trip: the
    /// waiting task is handed the hold itself (the same owner field and lease, which Redis
    /// keeps), counted in the same run; a run of such hand-offs also ends after 50 ms, and
    /// other clients' waiters are learnt from a count of the channel's subscribers read in the
    /// background.
    pub baton_passes: u32,
}

impl Config {
    /// Settings with defaults for everything but the URL.
    pub fn new(url: impl Into<String>) -> Self {
        Config {
            url: url.into(),
            watchdog_lease: DEFAULT_WATCHDOG_LEASE,
            lease_check_interval: DEFAULT_LEASE_CHECK_INTERVAL,
            key_prefix: String::new(),
            command_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            reconnect_max_delay: Duration::from_secs(2),
            pubsub: PubSubMode::Classic,
            #[cfg(feature = "tls")]
            tls_ca_file: None,
            fair_lock_wait: DEFAULT_FAIR_LOCK_WAIT,
            replica_sync: ReplicaSync::Auto,
            metrics_label_names: false,
            baton_passes: DEFAULT_BATON_PASSES,
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.watchdog_lease < MIN_WATCHDOG_LEASE || self.watchdog_lease > MAX_LEASE {
            return Err(Error::InvalidArgument(format!(
                "watchdog lease {:?} is outside {:?}..={:?}",
                self.watchdog_lease, MIN_WATCHDOG_LEASE, MAX_LEASE
            )));
        }
        if let ReplicaSync::Replicas { min, timeout } = self.replica_sync {
            if min == 0 || timeout.is_zero() || timeout >= self.command_timeout {
                return Err(Error::InvalidArgument(format!(
                    "replica sync of {min} replica(s) within {timeout:?}: both must be positive, \
                     and the timeout shorter than the command timeout {:?}",
                    self.command_timeout
                )));
            }
        }
        for (what, value) in [
            ("command timeout", self.command_timeout),
            ("connect timeout", self.connect_timeout),
            ("reconnect delay", self.reconnect_max_delay),
            ("fair lock wait", self.fair_lock_wait),
            ("lease check interval", self.lease_check_interval),
        ] {
            if value.is_zero() || value > Duration::from_secs(24 * 3600) {
                return Err(Error::InvalidArgument(format!(
                    "{what} {value:?} must be between 1 ms and 24 h"
                )));
            }
        }
        Ok(())
    }

    /// The URL with any password replaced by `***`, for messages and logs.
    pub fn redacted_url(&self) -> String {
        redact_url(&self.url)
    }
}

impl Default for Config {
    fn default() -> Self {
        Config::new("redis://127.0.0.1:6379")
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Destructured without `..`, so that a new setting cannot be left out of `Debug`.
        let Config {
            url: _,
            watchdog_lease,
            lease_check_interval,
            key_prefix,
            command_timeout,
            connect_timeout,
            reconnect_max_delay,
            pubsub,
            fair_lock_wait,
            #[cfg(feature = "tls")]
            tls_ca_file,
            replica_sync,
            metrics_label_names,
            baton_passes,
        } = self;
        let mut d = f.debug_struct("Config");
        // The URL's password is never shown.
        d.field("url", &self.redacted_url())
            .field("watchdog_lease", watchdog_lease)
            .field("lease_check_interval", lease_check_interval)
            .field("key_prefix", key_prefix)
            .field("command_timeout", command_timeout)
            .field("connect_timeout", connect_timeout)
            .field("reconnect_max_delay", reconnect_max_delay)
            .field("pubsub", pubsub);
        #[cfg(feature = "tls")]
        d.field("tls_ca_file", tls_ca_file);
        d.field("fair_lock_wait", fair_lock_wait)
            .field("replica_sync", replica_sync)
            .field("metrics_label_names", metrics_label_names)
            .field("baton_passes", baton_passes)
            .finish()
    }
}

/// Hides the password of `scheme://user:password@host`.
pub(crate) fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => {
            let userinfo = &rest[..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}{}:***{}", &url[..scheme_end + 3], user, &rest[at..])
        }
        None => url.to_owned(),
    }
}

/// Builds a [`Client`](crate::Client) step by step; see
/// [`Client::builder`](crate::Client::builder).
///
/// ```no_run
/// # async fn run() -> redbaton::Result<()> {
/// use std::time::Duration;
/// let client = redbaton::Client::builder()
///     .url("redis://127.0.0.1:6379")
///     .watchdog_lease(Duration::from_secs(10))
///     .command_timeout(Duration::from_secs(2))
///     .connect()
///     .await?;
/// # client.shutdown().await }
/// ```
#[derive(Clone, Debug, Default)]
pub struct Builder {
    pub(crate) config: Config,
}

impl Builder {
    pub(crate) fn new() -> Self {
        Builder::default()
    }

    /// Where Redis is (see [`Config::url`]).
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.config.url = url.into();
        self
    }

    /// The watchdog lease (default 30 s, at least 100 ms).
    pub fn watchdog_lease(mut self, lease: Duration) -> Self {
        self.config.watchdog_lease = lease;
        self
    }

    /// How often holds are checked in Redis between renewals (default 500 ms; see
    /// [`Config::lease_check_interval`]).
    pub fn lease_check_interval(mut self, every: Duration) -> Self {
        self.config.lease_check_interval = every;
        self
    }

    /// A prefix for every lock key (default none).
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.config.key_prefix = prefix.into();
        self
    }

    /// The longest one round trip may take (default 5 s).
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.config.command_timeout = timeout;
        self
    }

    /// The longest connecting may take (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.config.connect_timeout = timeout;
        self
    }

    /// The longest pause between reconnection attempts (default 2 s).
    pub fn reconnect_max_delay(mut self, delay: Duration) -> Self {
        self.config.reconnect_max_delay = delay;
        self
    }

    /// Classic (default) or sharded pub/sub.
    pub fn pubsub(mut self, mode: PubSubMode) -> Self {
        self.config.pubsub = mode;
        self
    }

    /// Trust only the CA certificate(s) in this PEM file for `rediss://` (see
    /// [`Config::tls_ca_file`]).
    ///
    /// ```no_run
    /// # async fn run() -> redbaton::Result<()> {
    /// let client = redbaton::Client::builder()
    ///     .url("rediss://redis.internal:6380")
    ///     .tls_ca_file("/etc/redis/ca.crt")
    ///     .connect()
    ///     .await?;
    /// # client.shutdown().await }
    /// ```
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_ca_file(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.config.tls_ca_file = Some(path.into());
        self
    }

    /// How long a queued fair-lock waiter may miss its turn before it is skipped (default
    /// 5 minutes; see [`Config::fair_lock_wait`]).
    pub fn fair_lock_wait(mut self, wait: Duration) -> Self {
        self.config.fair_lock_wait = wait;
        self
    }

    /// Whether lock scripts wait for replicas (default [`ReplicaSync::Auto`]).
    pub fn replica_sync(mut self, sync: ReplicaSync) -> Self {
        self.config.replica_sync = sync;
        self
    }

    /// With the `metrics` feature: label metrics with lock names (default off; see
    /// [`Config::metrics_label_names`]).
    pub fn metrics_label_names(mut self, label: bool) -> Self {
        self.config.metrics_label_names = label;
        self
    }

    /// How many baton passes in a row a lock may make before an ordinary release (default 64;
    /// `0` turns them off; see [`Config::baton_passes`]).
    pub fn baton_passes(mut self, passes: u32) -> Self {
        self.config.baton_passes = passes;
        self
    }

    /// The settings collected so far.
    pub fn config(&self) -> &Config {
        &self.config
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact_url("redis://user:s3cret@host:6379/0"),
            "redis://user:***@host:6379/0"
        );
        assert_eq!(
            redact_url("rediss://:pw@h:1?x=y@z"),
            "rediss://:***@h:1?x=y@z"
        );
        assert_eq!(redact_url("redis://h:1"), "redis://h:1");
        let config = Config::new("redis://u:topsecret@h:1");
        assert!(!format!("{config:?}").contains("topsecret"));
    }

    #[test]
    fn debug_shows_every_setting() {
        let shown = format!("{:?}", Config::default());
        for field in [
            "url",
            "watchdog_lease",
            "lease_check_interval",
            "key_prefix",
            "command_timeout",
            "connect_timeout",
            "reconnect_max_delay",
            "pubsub",
            #[cfg(feature = "tls")]
            "tls_ca_file",
            "fair_lock_wait",
            "replica_sync",
            "metrics_label_names",
            "baton_passes",
        ] {
            assert!(shown.contains(field), "{field} missing from {shown}");
        }
    }

    /// Every setting's documentation says its default (issue 39: a reader had to look them
    /// up in `Config::new`).
    #[test]
    fn every_setting_documents_its_default() {
        let source = include_str!("config.rs");
        let start = source.find("pub struct Config {").expect("the struct");
        let body = &source[start..];
        let body = &body[..body.find("\n}\n").expect("its end")];
        let mut doc = String::new();
        let mut fields = 0;
        for line in body.lines().skip(1) {
            let line = line.trim();
            if let Some(text) = line.strip_prefix("///") {
                doc.push_str(text);
                doc.push(' ');
            } else if let Some(field) = line.strip_prefix("pub ") {
                let name = field.split(':').next().unwrap_or(field);
                assert!(
                    doc.to_lowercase().contains("default"),
                    "Config::{name}'s documentation does not say its default: {doc}"
                );
                fields += 1;
                doc.clear();
            }
        }
        assert!(fields >= 13, "only {fields} settings found");
    }

    #[test]
    fn out_of_range_settings_are_refused() {
        let mut config = Config::default();
        assert!(config.validate().is_ok());
        config.watchdog_lease = Duration::from_millis(10);
        assert!(matches!(config.validate(), Err(Error::InvalidArgument(_))));
        config.watchdog_lease = DEFAULT_WATCHDOG_LEASE;
        config.command_timeout = Duration::ZERO;
        assert!(matches!(config.validate(), Err(Error::InvalidArgument(_))));
        config = Config::default();
        config.fair_lock_wait = Duration::ZERO;
        assert!(matches!(config.validate(), Err(Error::InvalidArgument(_))));
    }
}
