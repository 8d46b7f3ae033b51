//! Client settings and the builder that applies them.

use std::fmt;
use std::time::Duration;

use crate::{Client, Error, Result};

/// The default watchdog lease, as in Redisson (`lockWatchdogTimeout`).
pub const DEFAULT_WATCHDOG_LEASE: Duration = Duration::from_secs(30);

/// The shortest watchdog lease accepted: renewal runs every third of it.
pub const MIN_WATCHDOG_LEASE: Duration = Duration::from_millis(100);

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

/// Everything a [`Client`] needs: where Redis is and how locks behave.
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
    /// A fred URL: `redis://`, `rediss://` (TLS), `redis-cluster://`, `redis-sentinel://`,
    /// with optional `user:password@`.
    pub url: String,
    /// The lease of locks taken without an explicit one; renewed every third of it.
    pub watchdog_lease: Duration,
    /// Prepended to every lock name to form its key (default empty, so keys match Redisson's).
    pub key_prefix: String,
    /// The longest any single round trip to Redis may take.
    pub command_timeout: Duration,
    /// The longest establishing a connection may take.
    pub connect_timeout: Duration,
    /// The longest pause between reconnection attempts (they back off exponentially up to it).
    pub reconnect_max_delay: Duration,
    /// Classic or sharded pub/sub for wake-ups.
    pub pubsub: PubSubMode,
    /// For `rediss://` URLs: a PEM file of the CA certificate(s) that signed the server's
    /// certificate. When set, the client trusts **only** these certificates (a private CA
    /// for Redis is the usual case); when `None`, it trusts the system's root certificates
    /// (which `SSL_CERT_FILE`/`SSL_CERT_DIR` can also point elsewhere). Setting it for a URL
    /// without TLS is refused.
    pub tls_ca_file: Option<std::path::PathBuf>,
}

impl Config {
    /// Settings with defaults for everything but the URL.
    pub fn new(url: impl Into<String>) -> Self {
        Config {
            url: url.into(),
            watchdog_lease: DEFAULT_WATCHDOG_LEASE,
            key_prefix: String::new(),
            command_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            reconnect_max_delay: Duration::from_secs(2),
            pubsub: PubSubMode::Classic,
            tls_ca_file: None,
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.watchdog_lease < MIN_WATCHDOG_LEASE || self.watchdog_lease > MAX_LEASE {
            return Err(Error::InvalidArgument(format!(
                "watchdog lease {:?} is outside {:?}..={:?}",
                self.watchdog_lease, MIN_WATCHDOG_LEASE, MAX_LEASE
            )));
        }
        for (what, value) in [
            ("command timeout", self.command_timeout),
            ("connect timeout", self.connect_timeout),
            ("reconnect delay", self.reconnect_max_delay),
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
        f.debug_struct("Config")
            .field("url", &self.redacted_url())
            .field("watchdog_lease", &self.watchdog_lease)
            .field("key_prefix", &self.key_prefix)
            .field("command_timeout", &self.command_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("reconnect_max_delay", &self.reconnect_max_delay)
            .field("pubsub", &self.pubsub)
            .field("tls_ca_file", &self.tls_ca_file)
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

/// Builds a [`Client`] step by step; see [`Client::builder`].
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
    config: Config,
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
    pub fn tls_ca_file(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.config.tls_ca_file = Some(path.into());
        self
    }

    /// The settings collected so far.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Connects with these settings.
    pub async fn connect(self) -> Result<Client> {
        Client::connect_with(self.config).await
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
    fn out_of_range_settings_are_refused() {
        let mut config = Config::default();
        assert!(config.validate().is_ok());
        config.watchdog_lease = Duration::from_millis(10);
        assert!(matches!(config.validate(), Err(Error::InvalidArgument(_))));
        config.watchdog_lease = DEFAULT_WATCHDOG_LEASE;
        config.command_timeout = Duration::ZERO;
        assert!(matches!(config.validate(), Err(Error::InvalidArgument(_))));
    }
}
