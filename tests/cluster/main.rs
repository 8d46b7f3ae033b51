//! Redis Cluster: a real 3-primary cluster (plus replicas for failover) started by the test.
//! Locks on names in different slots, watchdog renewals across slots, prompt wake-ups in
//! classic and sharded pub/sub, a primary failover while tasks contend, audits that no script
//! runs twice for one reply while a primary fails over, dies or has its connections reset
//! under load, the slot-map-sync race in fred 10.1 that does run one twice, and the baton pass
//! on every primary (classic and sharded pub/sub).

use testkit as support;

mod failover;
mod migration;
mod scripts_once;
mod slots;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redbaton::{Client, PubSubMode};
use support::cluster::{cli, ProxyMode, RedisCluster};
use support::RENEWED_LEASE;

async fn client(cluster: &RedisCluster, mode: PubSubMode, lease: Duration) -> Client {
    Client::builder()
        .url(cluster.url())
        .pubsub(mode)
        .watchdog_lease(lease)
        .command_timeout(Duration::from_secs(2))
        .reconnect_max_delay(Duration::from_millis(500))
        .connect()
        .await
        .unwrap()
}

fn slot(name: &str) -> u16 {
    fred::util::redis_keyslot(name.as_bytes())
}

/// The kinds a slot migration is tried on.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Lock,
    /// A read hold, waited for by a writer (readers share).
    Read,
    Write,
    Fair,
    Fenced,
    Semaphore,
    LeasedSemaphore,
}

const KINDS: [Kind; 7] = [
    Kind::Lock,
    Kind::Read,
    Kind::Write,
    Kind::Fair,
    Kind::Fenced,
    Kind::Semaphore,
    Kind::LeasedSemaphore,
];

impl Kind {
    /// The kind a waiter of a hold of this kind asks for: what the hold excludes.
    fn waiter(self) -> Kind {
        match self {
            Kind::Read => Kind::Write,
            kind => kind,
        }
    }
}

type Release = std::pin::Pin<Box<dyn std::future::Future<Output = redbaton::Result<()>> + Send>>;

/// Takes `name` as `kind` (waiting for it), and how to give it back.
async fn hold(client: &Client, kind: Kind, name: &str) -> redbaton::Result<Release> {
    fn boxed<F>(f: F) -> Release
    where
        F: std::future::Future<Output = redbaton::Result<()>> + Send + 'static,
    {
        Box::pin(f)
    }
    Ok(match kind {
        Kind::Lock => {
            let g = client.lock(name).lock().await?;
            boxed(async move { g.unlock().await })
        }
        Kind::Read => {
            let g = client.read_write_lock(name).read().lock().await?;
            boxed(async move { g.unlock().await })
        }
        Kind::Write => {
            let g = client.read_write_lock(name).write().lock().await?;
            boxed(async move { g.unlock().await })
        }
        Kind::Fair => {
            let g = client.fair_lock(name).lock().await?;
            boxed(async move { g.unlock().await })
        }
        Kind::Fenced => {
            let g = client.fenced_lock(name).lock().await?;
            boxed(async move { g.unlock().await })
        }
        Kind::Semaphore => {
            let semaphore = client.semaphore(name);
            semaphore.try_set_permits(1).await?;
            let permit = semaphore.acquire().await?;
            boxed(async move { permit.release().await })
        }
        Kind::LeasedSemaphore => {
            let semaphore = client.leased_semaphore(name);
            semaphore.try_set_permits(1).await?;
            let permit = semaphore.acquire().await?;
            boxed(async move { permit.release().await })
        }
    })
}
