//! The contenders: every lock the bench compares ([`Kind`]) and one process's state of each
//! ([`Ctx`]), behind one lock/unlock interface.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fred::interfaces::{ClientLike, KeysInterface};
use fred::types::scripts::Script;
use fred::types::{Expiration, SetOptions, Value};

use crate::fred_client::fred_client;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// redbaton at its defaults: the baton pass is on.
    Redbaton,
    /// redbaton with `baton_passes(0)`: every release is an ordinary one (the behaviour before
    /// the baton pass), measured beside `Redbaton` in the same run.
    RedbatonNoBaton,
    /// redbaton with holds checked at renewals only (`lease_check_interval` 24 h): beside
    /// `Redbaton` in the uncontended and many-keys runs, what the checks between renewals cost.
    RedbatonNoCheck,
    /// redbaton's own acquire and release scripts sent straight through fred, no library:
    /// what the protocol costs without redbaton's layer.
    Scripts,
    Naive,
    NaiveJitter,
    Rslock,
    /// rslock with retries U(0,10) ms apart instead of U(0,200) ms.
    RslockTuned,
    Rlock,
    /// rlock polling every 10 ms instead of 100 ms.
    RlockTuned,
    Redisson,
}

impl Kind {
    pub(crate) const ALL: [Kind; 11] = [
        Kind::Redbaton,
        Kind::RedbatonNoBaton,
        Kind::RedbatonNoCheck,
        Kind::Scripts,
        Kind::Naive,
        Kind::NaiveJitter,
        Kind::Rslock,
        Kind::RslockTuned,
        Kind::Rlock,
        Kind::RlockTuned,
        Kind::Redisson,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Redbaton => "redbaton",
            Kind::RedbatonNoBaton => "redbaton-nobaton",
            Kind::RedbatonNoCheck => "redbaton-nocheck",
            Kind::Scripts => "redbaton-scripts",
            Kind::Naive => "naive-10ms",
            Kind::NaiveJitter => "naive-jitter",
            Kind::Rslock => "rslock",
            Kind::RslockTuned => "rslock-10ms",
            Kind::Rlock => "rlock",
            Kind::RlockTuned => "rlock-10ms",
            Kind::Redisson => "redisson",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == s.trim())
    }

    /// How a waiter of this contender learns that the lock is free.
    pub(crate) fn waits_by(self) -> &'static str {
        match self {
            Kind::Redbaton => "baton pass in process, else pub/sub wake one",
            Kind::RedbatonNoBaton => "pub/sub, wake one",
            Kind::RedbatonNoCheck => "as redbaton; holds checked at renewals only",
            Kind::Scripts => "poll 10 ms (no library)",
            Kind::Naive => "poll 10 ms",
            Kind::NaiveJitter => "poll U(0,20) ms",
            Kind::Rslock => "poll U(0,200) ms",
            Kind::RslockTuned => "poll U(0,10) ms (tuned)",
            Kind::Rlock => "poll 100 ms",
            Kind::RlockTuned => "poll 10 ms (tuned)",
            Kind::Redisson => "poll 100 ms",
        }
    }

    /// Commands this contender sends over the network besides scripts, pub/sub and PING
    /// (everything else it causes runs inside its scripts).
    pub(crate) fn direct_commands(self) -> &'static [&'static str] {
        match self {
            Kind::Naive
            | Kind::NaiveJitter
            | Kind::Rslock
            | Kind::RslockTuned
            | Kind::Rlock
            | Kind::RlockTuned => &["set"],
            Kind::Redbaton
            | Kind::RedbatonNoBaton
            | Kind::RedbatonNoCheck
            | Kind::Scripts
            | Kind::Redisson => &[],
        }
    }
}

/// Per-process state of one contender, shared by its tasks.
pub(crate) enum Ctx {
    Redbaton(redbaton::Client),
    Naive {
        redis: fred::clients::Client,
        release: Script,
        jitter: bool,
    },
    Scripts {
        redis: fred::clients::Client,
        acquire: Script,
        release: Script,
        /// Stands in for the client uuid of redbaton's owner fields.
        uuid: String,
    },
    Rslock(Box<rslock::LockManager>),
    /// The lock and the options its acquires use.
    Rlock(Box<rlock::async_lock::RLock>, rlock::AcquireOptions),
    Redisson(Box<redisson::AsyncRedissonClient>),
}

/// One hold, whatever the contender.
pub(crate) enum Held {
    Redbaton(redbaton::LockGuard),
    Naive { key: String, token: String },
    Scripts { key: String, field: String },
    Rslock(rslock::LockGuard),
    Rlock(rlock::async_lock::RLockGuard),
    Redisson(redisson::AsyncRLock),
}

/// The compare-and-delete every article pairs with `SET NX PX`.
const NAIVE_RELEASE: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0";

/// Connections in redisson's pool: enough for every task of every scenario.
const REDISSON_POOL: u32 = 96;

static TOKENS: AtomicU64 = AtomicU64::new(0);

impl Ctx {
    pub(crate) async fn connect(kind: Kind, url: &str) -> Ctx {
        match kind {
            Kind::Redbaton => Ctx::Redbaton(redbaton::Client::connect(url).await.expect("connect")),
            Kind::RedbatonNoBaton => Ctx::Redbaton(
                redbaton::Client::builder()
                    .url(url)
                    .baton_passes(0)
                    .connect()
                    .await
                    .expect("connect"),
            ),
            Kind::RedbatonNoCheck => Ctx::Redbaton(
                redbaton::Client::builder()
                    .url(url)
                    .lease_check_interval(std::time::Duration::from_secs(24 * 3600))
                    .connect()
                    .await
                    .expect("connect"),
            ),
            Kind::Naive | Kind::NaiveJitter => {
                let redis = fred_client(url).await;
                let release = Script::from_lua(NAIVE_RELEASE);
                release.load(&redis).await.expect("script load");
                Ctx::Naive {
                    redis,
                    release,
                    jitter: kind == Kind::NaiveJitter,
                }
            }
            Kind::Scripts => {
                let redis = fred_client(url).await;
                let acquire = Script::from_lua(include_str!("../../lua/lock/acquire.lua"));
                let release = Script::from_lua(include_str!("../../lua/lock/release.lua"));
                acquire.load(&redis).await.expect("script load");
                release.load(&redis).await.expect("script load");
                Ctx::Scripts {
                    redis,
                    acquire,
                    release,
                    uuid: format!("{:032x}", fastrand::u128(..)),
                }
            }
            Kind::Rslock => Ctx::Rslock(Box::new(rslock::LockManager::new(vec![url.to_owned()]))),
            Kind::RslockTuned => {
                let mut manager = rslock::LockManager::new(vec![url.to_owned()]);
                manager.set_retry(3, Duration::from_millis(10));
                Ctx::Rslock(Box::new(manager))
            }
            Kind::Rlock | Kind::RlockTuned => {
                let options = if kind == Kind::RlockTuned {
                    rlock::AcquireOptions::builder()
                        .retry_interval(Duration::from_millis(10))
                        .build()
                        .expect("rlock options")
                } else {
                    rlock::AcquireOptions::default()
                };
                Ctx::Rlock(
                    Box::new(rlock::async_lock::RLock::new(url).await.expect("rlock")),
                    options,
                )
            }
            Kind::Redisson => Ctx::Redisson(Box::new(
                redisson::AsyncRedissonClient::new(
                    // Its default pool runs dry under 64 tasks ("no connection available").
                    redisson::RedissonConfig::single_server(url).with_pool_size(REDISSON_POOL),
                )
                .await
                .expect("redisson"),
            )),
        }
    }

    /// Waits for the lock as the contender's blocking acquire does at its defaults.
    pub(crate) async fn lock(&self, name: &str) -> Held {
        match self {
            Ctx::Redbaton(client) => Held::Redbaton(client.lock(name).lock().await.expect("lock")),
            Ctx::Naive { redis, jitter, .. } => {
                let token = format!(
                    "{}:{}",
                    std::process::id(),
                    TOKENS.fetch_add(1, Ordering::Relaxed)
                );
                loop {
                    let reply: Value = redis
                        .set(
                            name,
                            token.as_str(),
                            Some(Expiration::PX(30_000)),
                            Some(SetOptions::NX),
                            false,
                        )
                        .await
                        .expect("set");
                    if !reply.is_null() {
                        return Held::Naive {
                            key: name.to_owned(),
                            token,
                        };
                    }
                    let pause = if *jitter {
                        fastrand::u64(0..=20_000)
                    } else {
                        10_000
                    };
                    tokio::time::sleep(Duration::from_micros(pause)).await;
                }
            }
            Ctx::Scripts {
                redis,
                acquire,
                uuid,
                ..
            } => {
                let field = format!("{uuid}:{}", TOKENS.fetch_add(1, Ordering::Relaxed));
                loop {
                    let reply: Vec<i64> = acquire
                        .evalsha(redis, name, vec!["30000", field.as_str()])
                        .await
                        .expect("acquire");
                    if reply.first() == Some(&1) {
                        return Held::Scripts {
                            key: name.to_owned(),
                            field,
                        };
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            Ctx::Rslock(manager) => Held::Rslock(
                manager
                    .acquire(name.as_bytes(), Duration::from_secs(30))
                    .await
                    .expect("rslock"),
            ),
            Ctx::Rlock(rlock, options) => Held::Rlock(
                rlock
                    .acquire_mutex_with_options(name, options.clone())
                    .await
                    .expect("rlock"),
            ),
            Ctx::Redisson(client) => {
                let lock = client.get_lock(name);
                lock.lock().await.expect("redisson lock");
                Held::Redisson(lock)
            }
        }
    }

    pub(crate) async fn unlock(&self, held: Held) {
        match (self, held) {
            (_, Held::Redbaton(guard)) => guard.unlock().await.expect("unlock"),
            (Ctx::Naive { redis, release, .. }, Held::Naive { key, token }) => {
                let _: i64 = release
                    .evalsha(redis, key.as_str(), token.as_str())
                    .await
                    .expect("release");
            }
            (Ctx::Scripts { redis, release, .. }, Held::Scripts { key, field }) => {
                let channel = format!("redisson_lock__channel:{{{key}}}");
                let _: i64 = release
                    .evalsha(
                        redis,
                        key.as_str(),
                        vec![field.as_str(), "1", "0", "0", "PUBLISH", channel.as_str()],
                    )
                    .await
                    .expect("release");
            }
            (_, Held::Rslock(guard)) => guard.release().await,
            (_, Held::Rlock(mut guard)) => guard.release().await.expect("rlock release"),
            (_, Held::Redisson(lock)) => {
                lock.unlock().await.expect("redisson unlock");
            }
            _ => unreachable!("a hold is released by the contender that took it"),
        }
    }

    pub(crate) async fn shutdown(self) {
        match self {
            Ctx::Redbaton(client) => client.shutdown().await.expect("shutdown"),
            Ctx::Naive { redis, .. } | Ctx::Scripts { redis, .. } => {
                let _ = redis.quit().await;
            }
            Ctx::Rslock(_) => {}
            Ctx::Rlock(rlock, _) => rlock.shutdown().await,
            Ctx::Redisson(client) => {
                let _ = client.shutdown().await;
            }
        }
    }
}
