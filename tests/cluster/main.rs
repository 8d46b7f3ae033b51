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
use support::kinds::{hold, Kind, KINDS};
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
