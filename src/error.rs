//! The one error type of the crate.

use std::time::Duration;

/// Everything that can go wrong with a lock, as variants a caller can match on.
///
/// Messages never contain a password: connection errors name the server only.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The caller does not hold the lock it tried to release: it expired, was force-unlocked,
    /// was lost by the watchdog, or was never taken by this owner.
    #[error("lock {name:?} is not held by this owner (expired, force-unlocked or never taken)")]
    NotHeld {
        /// The lock's name.
        name: String,
    },
    /// The lease was lost while a `run` ([`Guard::run`](crate::Guard::run),
    /// [`Lock::run`](crate::Lock::run) and the other kinds' and guards' `run`) was running its
    /// closure's future: a fixed lease ran out by the local clock, the lock was force-unlocked
    /// or taken over (learnt at the watchdog's next renewal, every third of the lease), or the
    /// watchdog could not renew it for a whole lease.
    ///
    /// The future was dropped at the await point it had reached — what it did before that
    /// stays done — and this owner no longer holds the lock, so another may hold it now. The
    /// loss may have happened on the server up to one renewal period before the client learnt
    /// of it, and the future ran on meanwhile: work that must never overlap another holder's
    /// also needs a fencing token ([`FencedLock`](crate::FencedLock)) checked where it writes.
    #[error("the lease of lock {name:?} was lost; the work under it was cancelled")]
    LeaseLost {
        /// The lock's name (a multi-lock's: its parts' names, comma-separated).
        name: String,
    },
    /// The key exists but is not a lock: another Redis type, or a hash without the expiry
    /// every lock carries.
    #[error("key {name:?} is not a lock: {detail}")]
    WrongType {
        /// The lock's name.
        name: String,
        /// What Redis or the check said.
        detail: String,
    },
    /// The owner asked for a lock that only its own holds keep from it, so waiting would never
    /// end: a [`ReadWriteLock`](crate::ReadWriteLock)'s reader asking for the write lock (a
    /// read hold cannot be upgraded). Nothing was taken.
    #[error("lock {name:?}: {detail}")]
    WouldDeadlock {
        /// The lock's name.
        name: String,
        /// Why.
        detail: String,
    },
    /// An argument was refused before anything was sent to Redis.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Redis could not be reached, or the connection broke while a command was in flight.
    #[error("connection error: {0}")]
    Connection(String),
    /// A round trip took longer than the configured command timeout (the duration; zero for
    /// a fred error converted with `From`, whose bound redbaton does not know).
    #[error("{}", timed_out(.0))]
    Timeout(Duration),
    /// Redis refused the credentials (or the ACL user lacks a permission).
    #[error("authentication refused: {0}")]
    Auth(String),
    /// Any other error reply from Redis.
    #[error("redis error: {0}")]
    Redis(String),
    /// Fewer replicas than required acknowledged a lock script (see
    /// [`ReplicaSync`](crate::ReplicaSync)): an acquire was released again, a release or
    /// renewal may not survive a failover.
    #[error("only {acked} of {wanted} replica(s) acknowledged in time")]
    NotReplicated {
        /// Replicas that acknowledged.
        acked: u32,
        /// Replicas required.
        wanted: u32,
    },
    /// The client was shut down; it sends nothing more.
    #[error("the client was shut down")]
    ShutDown,
    /// The server cannot do what was asked, and nothing was sent for it: a Redis older than
    /// the oldest supported one ([`OLDEST_REDIS`](crate::OLDEST_REDIS)), or a setting it
    /// lacks the commands for ([`PubSubMode::Sharded`](crate::PubSubMode::Sharded) before
    /// Redis 7.0). Refused at connect; see [`ServerVersion`](crate::ServerVersion).
    #[error("unsupported server {server}: {detail}")]
    Unsupported {
        /// The server and where it is, e.g. `Redis 6.2.14 at redis://10.0.0.5:6379`.
        server: String,
        /// What it lacks, and what to do instead.
        detail: String,
    },
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// [`Error::Timeout`]'s message.
fn timed_out(after: &Duration) -> String {
    if after.is_zero() {
        "timed out waiting for Redis".to_owned()
    } else {
        format!("timed out after {after:?} waiting for Redis")
    }
}

/// A fred error as redbaton's, so that a function returning [`Result`] can use `?` on the
/// fred calls it makes through [`Client::redis`](crate::Client::redis): a reply `WRONGTYPE`
/// is [`Error::WrongType`] (with an empty name: fred's error names no key), a timeout
/// [`Error::Timeout`] (of zero: the bound is the caller's), a refused password
/// [`Error::Auth`], a lost or refused connection [`Error::Connection`], a bad argument
/// [`Error::InvalidArgument`], any other error reply [`Error::Redis`].
///
/// ```no_run
/// use redbaton::fred::interfaces::KeysInterface;
///
/// async fn bump(client: &redbaton::Client) -> redbaton::Result<i64> {
///     let guard = client.lock("counter").lock().await?;
///     let n: i64 = client.redis().incr("counter:value").await?; // a fred error, converted
///     guard.unlock().await?;
///     Ok(n)
/// }
/// ```
impl From<fred::error::Error> for Error {
    fn from(err: fred::error::Error) -> Self {
        Error::from_redis(&err, "", Duration::ZERO)
    }
}

impl Error {
    /// Maps a fred error to ours. `timeout` is the configured command timeout, quoted in
    /// [`Error::Timeout`].
    pub(crate) fn from_redis(err: &fred::error::Error, name: &str, timeout: Duration) -> Self {
        use fred::error::ErrorKind;
        let details = err.details();
        if details.contains("WRONGTYPE") {
            return Error::WrongType {
                name: name.to_owned(),
                detail: details.trim_start_matches("WRONGTYPE ").to_owned(),
            };
        }
        if details.starts_with("NOAUTH")
            || details.starts_with("WRONGPASS")
            || details.starts_with("NOPERM")
            || is_denied_in_script(details)
        {
            return Error::Auth(details.to_owned());
        }
        if is_tryagain(err) {
            // Sent again for a command timeout already: the slot's migration goes on. Not
            // run, and transient: a release goes on being retried in the background.
            return Error::Connection(format!("cluster slot migrating: {details}"));
        }
        if is_redirect(err) {
            // A cluster redirection (failover, resharding) that fred was told not to follow:
            // the command did not run, and the next one goes to the slot's new owner.
            return Error::Connection(format!("cluster redirection: {details}"));
        }
        if is_rewrite(err) {
            // fred would have had to write the command a second time (after a lost connection
            // or a redirect) and was told not to: whether it ran is unknown.
            return Error::Connection(format!("not re-sent: {details}"));
        }
        if is_unrouted(err) {
            // fred had no connection to send it on (disconnected, reconnecting): the command
            // was not sent. Kind `Unknown` in fred 10.1, but transient like any I/O error.
            return Error::Connection(format!("not connected: {details}"));
        }
        let connection = || Error::Connection(in_words(details));
        match err.kind() {
            ErrorKind::Timeout => Error::Timeout(timeout),
            ErrorKind::Auth => Error::Auth(details.to_owned()),
            ErrorKind::IO
            | ErrorKind::Canceled
            | ErrorKind::Routing
            | ErrorKind::Cluster
            | ErrorKind::Sentinel
            | ErrorKind::Protocol => connection(),
            // fred has this kind only when it is built with a TLS implementation.
            #[cfg(feature = "tls")]
            ErrorKind::Tls => connection(),
            ErrorKind::Config | ErrorKind::Url | ErrorKind::InvalidArgument => {
                Error::InvalidArgument(details.to_owned())
            }
            _ => Error::Redis(details.to_owned()),
        }
    }

    /// Whether retrying later may succeed: the server was unreachable or slow.
    pub(crate) fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::Connection(_) | Error::Timeout(_) | Error::NotReplicated { .. }
        )
    }
}

/// A command a script called was refused by the user's ACL (a command, key or channel it
/// lacks), in the words of each server: Redis 6.2 and 7.0 say "The user executing the script
/// can't …", Valkey 8 "ACL failure in script: …".
fn is_denied_in_script(details: &str) -> bool {
    details.contains("The user executing the script can't")
        || details.contains("ACL failure in script")
}

/// A connection error's detail as words: fred quotes an I/O error in Rust's debug form
/// (`Os { code: 111, kind: ConnectionRefused, message: "Connection refused" }`, or
/// `Custom { kind: …, error: … }`), and a reader needs only its message. A leading capital is
/// lowered ("connection refused" continues a sentence); an acronym or a name ("TLS …",
/// `InvalidCertificate`) keeps its capitals.
fn in_words(detail: &str) -> String {
    let message = ["message: ", "error: "].iter().find_map(|field| {
        let start = detail.find(field)? + field.len();
        let rest = &detail[start..];
        let (rest, end) = match rest.strip_prefix('"') {
            Some(quoted) => (quoted, quoted.find('"')?),
            None => (rest, rest.find(" }")?),
        };
        Some(&rest[..end])
    });
    let text = message.unwrap_or(detail);
    let mut first_word = text.split(' ').next().unwrap_or_default().chars();
    match first_word.next() {
        Some(first) if first.is_uppercase() && !first_word.any(char::is_uppercase) => {
            first.to_lowercase().collect::<String>() + &text[first.len_utf8()..]
        }
        _ => text.to_owned(),
    }
}

/// fred's reply when a command met a cluster redirection (MOVED or ASK: a failover, a slot
/// migration) with `max_redirections = 0`: the server did not run it, and fred re-read the
/// slot map for MOVED. (With redirections allowed, fred 10.1 answers an ASK by ending its
/// router task: the client would stop working for good.)
pub(crate) fn is_redirect(err: &fred::error::Error) -> bool {
    err.details() == "Too many redirections."
}

/// fred's reply when a command would need a second write, which `max_command_attempts = 1`
/// forbids. It comes both after a redirect and for a command that was in flight on a
/// connection found broken during a cluster resync — one that may have run.
pub(crate) fn is_rewrite(err: &fred::error::Error) -> bool {
    err.details() == "Too many failed write attempts."
}

/// A cluster node refused a command on several keys of a slot being migrated, some of which
/// have left and some not: it did not run, and may once the keys have all moved.
pub(crate) fn is_tryagain(err: &fred::error::Error) -> bool {
    err.details().starts_with("TRYAGAIN")
}

/// fred had no connection to route a command to (a node it is not connected to, or while it
/// reconnects): the command was not written, so it did not run.
pub(crate) fn is_unrouted(err: &fred::error::Error) -> bool {
    err.details().starts_with("Failed to route command")
}

/// A blocking command (here `WAIT`) ended by the server without its answer: a failover
/// turned the primary into a replica, or `CLIENT UNBLOCK` was sent.
pub(crate) fn is_unblocked(err: &fred::error::Error) -> bool {
    err.details().starts_with("UNBLOCKED")
}

/// The server's script cache lacks the script (restart, `SCRIPT FLUSH`, failover): it did
/// not run.
pub(crate) fn is_noscript(err: &fred::error::Error) -> bool {
    err.details().starts_with("NOSCRIPT")
}

#[cfg(test)]
mod tests {
    use super::{in_words, is_denied_in_script};

    /// Each server's words for a script's call refused by the ACL (seen from Redis 6.2.14,
    /// 7.0.15 and Valkey 8.1.8), and a script error that is not one.
    #[test]
    fn refusals_inside_scripts_are_recognised_in_each_servers_words() {
        for refused in [
            "ERR The user executing the script can't run this command or subcommand script: 1f71dc1c, on @user_script:1.",
            "ERR Error running script (call to f_733db981): @user_script:1: @user_script: 1: The user executing the script can't access at least one of the keys mentioned in the command arguments",
            "ERR ACL failure in script: User u has no permissions to run the 'incr' command script: 1f71dc1c, on @user_script:1.",
            "ERR ACL failure in script: No permissions to access a key script: 733db981, on @user_script:1.",
        ] {
            assert!(is_denied_in_script(refused), "{refused}");
        }
        assert!(!is_denied_in_script(
            "ERR Error running script (call to f_a9623578): @user_script:27: @user_script: 27: Unknown Redis command called from Lua script"
        ));
    }

    #[test]
    fn io_errors_read_as_words() {
        assert_eq!(
            in_words(r#"Os { code: 111, kind: ConnectionRefused, message: "Connection refused" }"#),
            "connection refused"
        );
        assert_eq!(
            in_words(
                r#"Custom { kind: Uncategorized, error: "failed to lookup address information: Name or service not known" }"#
            ),
            "failed to lookup address information: Name or service not known"
        );
        assert_eq!(
            in_words("Custom { kind: InvalidData, error: InvalidCertificate(UnknownIssuer) }"),
            "InvalidCertificate(UnknownIssuer)"
        );
        assert_eq!(
            in_words("Connection reset by peer"),
            "connection reset by peer"
        );
        assert_eq!(in_words("TLS handshake refused"), "TLS handshake refused");
    }
}
