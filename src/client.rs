//! [`Client`]: the connections, the hub, the watchdog and the client's unique id.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use fred::interfaces::ClientLike;
use fred::prelude::{Builder as FredBuilder, Config as FredConfig, ReconnectPolicy};
use fred::types::config::TcpConfig;

use crate::config::{redact_url, Builder, Config};
use crate::conn::{Composite, Conn, Replicas, Subscriber, UserRedis};
use crate::engine::call::{bounded, CALL_BOUND};
use crate::engine::client_inner::ClientInner;
use crate::engine::holds::{Holds, Loss};
use crate::engine::hub::Hub;
use crate::engine::watchdog::Watchdog;
use crate::kinds;
use crate::metrics::ClientMetrics;
use crate::{Error, Lock, Result};

/// A connection to Redis that hands out every kind: [`Lock`](Client::lock),
/// [`FairLock`](Client::fair_lock), [`ReadWriteLock`](Client::read_write_lock),
/// [`FencedLock`](Client::fenced_lock), [`Semaphore`](Client::semaphore) and
/// [`LeasedSemaphore`](Client::leased_semaphore) handles (a [`MultiLock`](crate::MultiLock) or
/// [`RedLock`](crate::RedLock) is built from `Lock`s).
///
/// A client owns one command connection (per node), one subscriber connection shared by all
/// its waiters (the hub), one watchdog task renewing all its leases, and a random UUID (v4)
/// that, with an owner number, names each hold in Redis. Cloning is cheap and shares all of
/// it. For commands of your own, [`redis`](Client::redis) hands out a fred client with
/// connections of its own.
///
/// # Ending: call [`shutdown`](Client::shutdown)
///
/// Call `shutdown().await` before the program (or its tokio runtime) ends: it releases every
/// lock and permit still held, then closes the connections. Without it, a dropped guard, a
/// dropped permit and the client's last handle each clean up in a **background task** — a
/// guard's release, a permit's give-back — which runs only while the runtime runs. When
/// `main` returns right after, the runtime ends and those tasks never run: the locks stay
/// held until their leases end (30 s by default, [`Config::watchdog_lease`]), and waiters
/// elsewhere wait that long. (The watchdog stops with the process, so a lock is never held
/// longer than one lease.)
///
/// ```no_run
/// # async fn run() -> redbaton::Result<()> {
/// let client = redbaton::Client::connect("redis://127.0.0.1:6379").await?;
/// let guard = client.lock("nightly-report").lock().await?;
/// // ... the work ...
/// drop(guard); // released in the background: fine while the runtime runs on
/// client.shutdown().await // waits for that release (and releases anything still held)
/// # }
/// ```
#[derive(Clone)]
pub struct Client {
    inner: Arc<ClientInner>,
}

/// The composite script of every kind's scripts: a group's scripts of one slot travel as one
/// call of it (built here, where the kinds are known; the connection layer knows no kind).
static COMPOSITE: LazyLock<Composite> = LazyLock::new(|| Composite::new(&kinds::scripts()));

/// URL schemes fred understands; anything else is refused before any lookup happens. Each
/// `valkey…` scheme means what its `redis…` twin does.
const SCHEMES: &[&str] = &[
    "redis",
    "rediss",
    "redis-cluster",
    "rediss-cluster",
    "redis-sentinel",
    "rediss-sentinel",
    "redis+unix",
    "valkey",
    "valkeys",
    "valkey-cluster",
    "valkeys-cluster",
    "valkey-sentinel",
    "valkeys-sentinel",
];

fn fred_builder(config: &Config) -> Result<FredBuilder> {
    let scheme = config.url.split_once("://").map(|(s, _)| s);
    if !scheme.is_some_and(|s| SCHEMES.contains(&s)) {
        return Err(Error::InvalidArgument(format!(
            "bad Redis URL {}: the scheme must be one of {}",
            redact_url(&config.url),
            SCHEMES.join(", ")
        )));
    }
    #[cfg_attr(not(feature = "tls"), allow(unused_mut))] // only the CA file changes it
    let mut fred_config = FredConfig::from_url(&config.url).map_err(|e| {
        Error::InvalidArgument(format!(
            "bad Redis URL {}: {}",
            redact_url(&config.url),
            e.details()
        ))
    })?;
    #[cfg(feature = "tls")]
    if let Some(ca_file) = &config.tls_ca_file {
        if fred_config.tls.is_none() {
            return Err(Error::InvalidArgument(format!(
                "tls_ca_file is set but {} does not use TLS (use rediss://)",
                redact_url(&config.url)
            )));
        }
        fred_config.tls = Some(tls_trusting(ca_file)?.into());
    }
    // Without a TLS implementation fred would only log a warning and talk plain text to a
    // server the user asked to reach over TLS.
    #[cfg(not(feature = "tls"))]
    if fred_uses_tls(&config.url) {
        return Err(Error::InvalidArgument(format!(
            "{} asks for TLS, but redbaton was built without its `tls` feature",
            redact_url(&config.url)
        )));
    }
    let mut builder = FredBuilder::from_config(fred_config);
    let command_timeout = config.command_timeout;
    let connect_timeout = config.connect_timeout;
    builder
        .with_connection_config(|c| {
            c.connection_timeout = connect_timeout;
            c.internal_command_timeout = command_timeout;
            // Never re-send a command whose reply was lost: a lock or unlock script must not
            // run twice (invariant 11, docs/DESIGN.md).
            c.max_command_attempts = 1;
            // A redirect comes back as an error to re-send (fred 10.1 would otherwise end its
            // router on an ASK, and re-send a MOVED command as a second write).
            c.max_redirections = 0;
            c.tcp = TcpConfig {
                nodelay: Some(true),
                ..TcpConfig::default()
            };
        })
        .with_performance_config(|p| {
            // fred's default is no timeout at all (invariant 12, docs/DESIGN.md).
            p.default_command_timeout = command_timeout;
            // fred's default of 32 lags (and drops messages) under bursts of unlocks.
            p.broadcast_channel_capacity = 4096;
        })
        // fred's builder has no reconnect policy by default: a dropped connection would stay
        // dropped.
        .set_policy(ReconnectPolicy::new_exponential(
            0,
            50,
            config.reconnect_max_delay.as_millis().max(50) as u32,
            2,
        ));
    Ok(builder)
}

/// Whether `url` asks for TLS.
fn fred_uses_tls(url: &str) -> bool {
    url.split_once("://")
        .is_some_and(|(scheme, _)| scheme.starts_with("rediss") || scheme.starts_with("valkeys"))
}

/// A rustls connector that trusts only the certificates in the PEM file `ca_file`.
#[cfg(feature = "tls")]
fn tls_trusting(ca_file: &std::path::Path) -> Result<fred::types::config::TlsConnector> {
    use fred::rustls;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;

    let bad =
        |what: String| Error::InvalidArgument(format!("TLS CA file {}: {what}", ca_file.display()));
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(ca_file).map_err(|e| bad(e.to_string()))?;
    for cert in certs {
        let cert = cert.map_err(|e| bad(e.to_string()))?;
        roots.add(cert).map_err(|e| bad(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(bad("no PEM certificate in it".to_owned()));
    }
    // The provider is named explicitly: the process-wide default is ambiguous when another
    // crate enables a second rustls provider.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tls.into())
}

impl Client {
    /// Connects with default settings to `url` (see [`Config::url`] for the forms).
    ///
    /// ```no_run
    /// # async fn run() -> redbaton::Result<()> {
    /// let client = redbaton::Client::connect("redis://127.0.0.1:6379").await?;
    /// let lock = client.lock("order:42");
    /// let guard = lock.lock().await?;
    /// guard.unlock().await?;
    /// client.shutdown().await
    /// # }
    /// ```
    pub async fn connect(url: &str) -> Result<Client> {
        Client::connect_with(Config::new(url)).await
    }

    /// Starts a [`Builder`] for settings beyond the URL.
    pub fn builder() -> Builder {
        Builder::new()
    }

    /// Connects with `config`.
    pub async fn connect_with(config: Config) -> Result<Client> {
        config.validate()?;
        if config.command_timeout >= config.watchdog_lease / 3 {
            // A renewal may then take longer than the period between renewals: one stalled
            // round trip can cost a lease (the guard is told, but the work stops).
            tracing::warn!(
                command_timeout = ?config.command_timeout,
                watchdog_lease = ?config.watchdog_lease,
                "the command timeout is not well under a third of the watchdog lease: a stalled \
                 renewal can lose a lease before the next one is sent"
            );
        }
        let builder = fred_builder(&config)?;
        // The user's client: the same server, credentials, TLS and reconnection, but no
        // command timeout of the library's (fred's default: none), so a blocking command
        // lasts as long as it asks (invariant 17).
        let mut user_builder = builder.clone();
        user_builder.with_performance_config(|p| p.default_command_timeout = Duration::ZERO);
        let where_ = redact_url(&config.url);
        // A TLS client talking to a plain-text port gets no answer at all: say so.
        let tls_hint = if fred_uses_tls(&config.url) {
            " (TLS handshake unanswered: does the server speak TLS on this port?)"
        } else {
            ""
        };
        let connect_error = |e: fred::error::Error| {
            match Error::from_redis(&e, "", config.connect_timeout) {
                Error::Auth(detail) => Error::Auth(format!("{where_}: {detail}")),
                Error::Timeout(_) => Error::Connection(format!(
                    "{where_}: no connection within {:?}{tls_hint}",
                    config.connect_timeout
                )),
                Error::Connection(detail) if detail.contains("InvalidCertificate") => {
                    Error::Connection(format!(
                        "{where_}: TLS handshake refused, the server's certificate is not trusted: {detail}"
                    ))
                }
                Error::Connection(detail) | Error::Redis(detail) => {
                    Error::Connection(format!("{where_}: {detail}"))
                }
                other => other,
            }
        };
        let init_timeout = config.connect_timeout + config.command_timeout;
        let connect_timed_out = || {
            Error::Connection(format!(
                "{where_}: no connection within {init_timeout:?}{tls_hint}"
            ))
        };

        let redis = builder.build().map_err(connect_error)?;
        // Built now (no connection yet): it connects when first asked for.
        let user = user_builder.build().map_err(connect_error)?;
        let init = async {
            redis.init().await?;
            // Before anything else is sent, what the server is: what it cannot serve is
            // refused here, by name, rather than met later as a script's or a command's error.
            crate::conn::server::ask(&redis).await
        };
        let server = match tokio::time::timeout(init_timeout, init).await {
            Ok(Ok(server)) => server,
            Ok(Err(e)) => {
                let _ = redis.quit().await;
                return Err(connect_error(e));
            }
            Err(_) => {
                let _ = redis.quit().await;
                return Err(connect_timed_out());
            }
        };
        match &server {
            Some(server) => {
                if let Err(e) = server.check(config.pubsub, &where_) {
                    let _ = redis.quit().await;
                    return Err(e);
                }
            }
            None => tracing::warn!(
                url = %where_,
                "the server answered neither HELLO nor INFO: its version is unknown, so it is \
                 not checked"
            ),
        }
        let conn = Conn::start(
            redis,
            config.command_timeout,
            config.pubsub.publish_command(),
            config.replica_sync,
            &COMPOSITE,
        )
        .await;
        if let Err(e) = conn.load(&kinds::scripts()).await {
            let _ = conn.redis().quit().await;
            return Err(connect_error(e));
        }
        let id: Arc<str> = uuid::Uuid::new_v4().to_string().into();
        let metrics = ClientMetrics::new(config.metrics_label_names);
        let holds = Holds::new(id.clone(), config.watchdog_lease, metrics);
        let subscriber = builder.build_subscriber_client().map_err(connect_error)?;
        let started = Hub::start(Subscriber::new(subscriber, config.pubsub), holds.clone());
        let hub = match tokio::time::timeout(init_timeout, started).await {
            Ok(Ok(hub)) => hub,
            Ok(Err(e)) => {
                let _ = conn.redis().quit().await;
                return Err(connect_error(e));
            }
            Err(_) => {
                let _ = conn.redis().quit().await;
                return Err(connect_timed_out());
            }
        };

        let watchdog = Watchdog::start(conn.clone(), holds.clone(), config.lease_check_interval);
        let inner = Arc::new(ClientInner {
            id,
            conn,
            hub,
            holds,
            watchdog,
            config,
            passes_refused: Default::default(),
            owners: crate::engine::scope::OwnerNumbers::new(),
            outstanding_permits: Default::default(),
            user: UserRedis::new(user),
            server,
        });
        tracing::debug!(client = %inner.id, url = %redact_url(&inner.config.url), "connected");
        Ok(Client { inner })
    }

    /// A handle on the lock called `name` (cheap; nothing is sent until it is used).
    ///
    /// Any non-empty string of up to 64 KiB is a valid name; others make every operation
    /// return [`Error::InvalidArgument`].
    pub fn lock(&self, name: impl AsRef<str>) -> Lock {
        Lock::new(self.inner.clone(), name.as_ref())
    }

    /// A handle on the fenced lock called `name`: a [`Lock`] whose every acquisition hands out
    /// a fencing token (see [`FencedLock`](crate::FencedLock)).
    pub fn fenced_lock(&self, name: impl AsRef<str>) -> crate::FencedLock {
        crate::FencedLock::new(self.inner.clone(), name.as_ref())
    }

    /// A handle on the fair lock called `name`: a [`Lock`] served first come, first served
    /// (see [`FairLock`](crate::FairLock)).
    pub fn fair_lock(&self, name: impl AsRef<str>) -> crate::FairLock {
        crate::FairLock::new(self.inner.clone(), name.as_ref())
    }

    /// A handle on the read/write lock called `name`: Redisson's `RReadWriteLock` (see
    /// [`ReadWriteLock`](crate::ReadWriteLock)).
    pub fn read_write_lock(&self, name: impl AsRef<str>) -> crate::ReadWriteLock {
        crate::ReadWriteLock::new(self.inner.clone(), name.as_ref())
    }

    /// A handle on the semaphore called `name`: Redisson's `RSemaphore`, a counter of free
    /// permits. **Its permits are not owned**: a holder that crashes loses its permits for
    /// good (see [`Semaphore`](crate::Semaphore)); when that matters, use
    /// [`leased_semaphore`](Client::leased_semaphore).
    pub fn semaphore(&self, name: impl AsRef<str>) -> crate::Semaphore {
        crate::Semaphore::new(self.inner.clone(), name.as_ref())
    }

    /// A handle on the leased semaphore called `name`: Redisson's
    /// `RPermitExpirableSemaphore`, whose permits have ids and leases renewed by the watchdog,
    /// so a crashed holder's permit comes back (see
    /// [`LeasedSemaphore`](crate::LeasedSemaphore)).
    pub fn leased_semaphore(&self, name: impl AsRef<str>) -> crate::LeasedSemaphore {
        crate::LeasedSemaphore::new(self.inner.clone(), name.as_ref())
    }

    /// This client's unique id: the first half of every owner field it writes.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// The SHA1 of the composite script a group's scripts of one slot travel in (one
    /// `EVALSHA` of it runs several scripts). For tests that count the scripts a server ran;
    /// not part of the stable API.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn composite_sha1() -> &'static str {
        COMPOSITE.script.sha1()
    }

    /// The settings this client runs with.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// A fred client of your own, for commands redbaton does not wrap: connections of its
    /// own (one per node, opened on the first call, in the background), so nothing you send
    /// on it delays a lock call or a lease renewal, and no lock traffic waits behind it. Its
    /// traits are in the re-exported [`fred`](crate::fred) (fred 10), e.g.
    /// `use redbaton::fred::interfaces::KeysInterface;`, and a fred error converts into
    /// [`Error`] with `?`.
    ///
    /// ```no_run
    /// # async fn run(client: redbaton::Client) -> redbaton::Result<()> {
    /// use redbaton::fred::interfaces::ClientLike;
    /// use redbaton::fred::types::{ClusterHash, CustomCommand, Value};
    /// let blpop = CustomCommand::new_static("BLPOP", ClusterHash::FirstKey, true);
    /// let job: Value = client.redis().custom(blpop, vec!["jobs", "7"]).await?; // nil after 7 s
    /// # let _ = job; Ok(()) }
    /// ```
    ///
    /// It is built from this client's settings — the URL (server, credentials, database,
    /// topology), TLS, connect timeout, reconnection — but has **no command timeout**: a
    /// `BLPOP` of 7 s lasts 7 s and returns nil, as from any fred client. Bound a call
    /// yourself where you need to (`tokio::time::timeout`, or fred's `with_options` with
    /// `Options { timeout, .. }`). It connects on first use, and a command waits for that
    /// connection through every reconnection (a server that now refuses its credentials keeps
    /// it waiting): unbounded but for your own bound. Like the library's connection it never re-sends a command
    /// whose reply was lost, and on a cluster follows no redirection (a command that meets
    /// `MOVED` fails, and the next goes to the slot's new owner).
    ///
    /// fred's typed blocking pops (`blpop`, `brpop`, `bzpopmin`, …) report the server's nil
    /// (nothing came within the command's own timeout) as an error of kind `Timeout`, "Request
    /// timed out." — fred's way, not a timeout of redbaton's; send the command with `custom`
    /// for a plain nil.
    ///
    /// Cloning it is cheap and shares its connections. It is closed by
    /// [`shutdown`](Client::shutdown), or when this client's last handle (and guard) is
    /// dropped; its commands then fail after the command timeout.
    pub fn redis(&self) -> &fred::clients::Client {
        self.inner.user.get(&self.inner.conn)
    }

    /// Stops the watchdog and the subscriber and closes the connections.
    ///
    /// Locks still held are released explicitly (each one logged at `warn`), their guards
    /// report [`lost`](crate::LockGuard::lost), and waiting `lock()` calls return
    /// [`Error::ShutDown`]. Every later operation returns [`Error::ShutDown`]. Calling it
    /// twice is harmless.
    ///
    /// A call still in flight on a lock (an acquire, a release, a baton pass to a waiter) is
    /// waited for, up to eight command timeouts, and a hold it took is released too. If one
    /// is still in flight then (the server stalls), it returns [`Error::Timeout`]: a hold
    /// that call takes ends with its lease.
    pub async fn shutdown(&self) -> Result<()> {
        let inner = &self.inner;
        let conn = &inner.conn;
        if !conn.close() {
            return Ok(());
        }
        inner.watchdog.stop();
        inner.user.close(conn.runtime(), conn.command_timeout());
        // Waiters leave first (returning ShutDown) and undo what their wait left in Redis (a
        // fair lock's place in the queue) while the connection is still open.
        inner.hub.wake_all();
        let leave_by = tokio::time::Instant::now() + conn.command_timeout();
        if !inner.holds.none_waiting(leave_by).await {
            tracing::debug!("shutdown: waiters still leaving after the command timeout");
        }
        // Each hold is released under its owner's turn: a call in flight on it (an acquire,
        // a dropped guard's release) finishes first, so nothing is released twice or left
        // behind. Such a call is awaited for its whole bound, plus one more for a baton pass
        // that lands meanwhile and is undone under the next owner's turn: quitting earlier
        // would leave what it wrote to its lease, unknown to anyone.
        let in_flight = conn.command_timeout() * (2 * CALL_BOUND);
        let deadline = tokio::time::Instant::now() + in_flight;
        let releases = inner.holds.entries().into_iter().map(|entry| async move {
            let Some(turn) = inner
                .holds
                .turn(&entry.key, &entry.field, &entry.ops, deadline)
                .await
            else {
                tracing::warn!(key = %entry.key, owner = %entry.field, "shutdown: a call on the lock was still in flight; a hold it left ends with its lease");
                return Some(Error::Timeout(in_flight));
            };
            let guards = turn.end(Loss::ShutDown);
            if guards == 0 {
                return None;
            }
            // Only this client's holds: another client may hold the same owner too.
            let released = bounded(entry.ops.release(conn, &entry.field, guards, 0, Replicas::Await), conn).await;
            drop(turn);
            match released {
                Ok(_) => {
                    tracing::warn!(key = %entry.key, owner = %entry.field, guards, "shutdown released a lock still held");
                    None
                }
                Err(e) => {
                    tracing::warn!(key = %entry.key, error = %e, "shutdown could not release a lock; it expires with its lease");
                    Some(e.to_error(conn, entry.ops.name()))
                }
            }
        });
        let (released, permits) = futures::future::join(
            futures::future::join_all(releases),
            inner.outstanding_permits.give_all_back(),
        )
        .await;
        let first_error = released.into_iter().flatten().next().or(permits);
        inner.hub.shutdown().await;
        if let Err(e) = conn.redis().quit().await {
            tracing::debug!(error = %e, "quit");
        }
        tracing::debug!(client = %inner.id, "shut down");
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// What the server said it is at connect (`HELLO`): its name and version, e.g.
    /// `Redis 7.0.15` or `Valkey 8.1.8`. `None` when it would not say (commands renamed away).
    pub fn server(&self) -> Option<&crate::ServerVersion> {
        self.inner.server.as_ref()
    }

    /// The default watchdog lease of this client.
    pub fn watchdog_lease(&self) -> Duration {
        self.inner.holds.watchdog_lease()
    }
}

// Here rather than in config.rs, which the connection below the client depends on: settings
// know nothing of the client they make.
impl Builder {
    /// Connects with these settings.
    pub async fn connect(self) -> Result<Client> {
        Client::connect_with(self.config).await
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("id", &self.inner.id)
            .field("config", &self.inner.config)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The forms `Config::url` documents are taken, and the ones it says are refused are
    /// refused before anything is sent.
    #[test]
    fn documented_url_forms() {
        for url in [
            "redis://127.0.0.1",
            "redis://user:p%40ss@127.0.0.1:6379/3",
            "valkey://127.0.0.1:6379/1",
            "redis-cluster://127.0.0.1:7000?node=127.0.0.1:7001&node=127.0.0.1:7002",
            "redis-sentinel://127.0.0.1?sentinelServiceName=mymaster&node=127.0.0.1:26380",
            "redis-sentinel://127.0.0.1:26379/2?sentinelServiceName=mymaster",
            "valkey-cluster://127.0.0.1:7000?node=127.0.0.1:7001",
            "valkey-sentinel://127.0.0.1:26379?sentinelServiceName=mymaster&node=127.0.0.1:26380",
        ] {
            assert!(fred_builder(&Config::new(url)).is_ok(), "{url}");
        }
        for url in [
            "redis+unix:///tmp/redis.sock",
            "unix:///tmp/redis.sock",
            "valkey-cluster:/127.0.0.1:7000",
            "redis-sentinel://127.0.0.1:26379",
            "valkey-sentinel://127.0.0.1:26379",
            "redis://127.0.0.1/not-a-number",
            "redis-cluster://127.0.0.1:7000?node=127.0.0.1",
        ] {
            let result = fred_builder(&Config::new(url)).map(|_| ());
            assert!(
                matches!(result, Err(Error::InvalidArgument(_))),
                "{url}: {result:?}"
            );
        }
    }

    /// With the `tls` feature a TLS URL gets a TLS configuration.
    #[cfg(feature = "tls")]
    #[test]
    fn tls_urls_are_accepted_with_the_tls_feature() {
        for url in [
            "rediss://127.0.0.1:6380",
            "rediss-cluster://127.0.0.1:6380",
            "rediss-sentinel://127.0.0.1:26379?sentinelServiceName=mymaster",
            "valkeys://127.0.0.1:6380",
            "valkeys-cluster://127.0.0.1:6380",
            "valkeys-sentinel://127.0.0.1:26379?sentinelServiceName=mymaster",
        ] {
            assert!(fred_builder(&Config::new(url)).is_ok(), "{url}");
        }
    }

    /// Without it a TLS URL is refused instead of being reached in plain text.
    #[cfg(not(feature = "tls"))]
    #[test]
    fn tls_urls_are_refused_without_the_tls_feature() {
        for url in [
            "rediss://:pw@127.0.0.1:6380",
            "rediss-cluster://127.0.0.1:6380",
            "valkeys://127.0.0.1:6380",
            "valkeys-cluster://:pw@127.0.0.1:6380",
            "valkeys-sentinel://127.0.0.1:26379?sentinelServiceName=mymaster",
        ] {
            match fred_builder(&Config::new(url)) {
                Err(Error::InvalidArgument(message)) => {
                    assert!(message.contains("`tls` feature"), "{message}");
                    assert!(!message.contains("pw"), "password shown: {message}");
                }
                other => panic!("{url}: {:?}", other.map(|_| ())),
            }
        }
        assert!(fred_builder(&Config::new("redis://127.0.0.1:6379")).is_ok());
    }
}
