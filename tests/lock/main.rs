//! The core lock against a real redis-server: reentry, exclusion, wake-ups, leases,
//! the watchdog, lost leases, ownership, scripts, wrong types, cancellation, wire layout.

use testkit as support;
use testkit::captured;

mod cancellation;
mod exclusion;
mod leases;
mod wake_ups;
mod wire;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::prelude::*;
use redbaton::{Client, Error};
use support::{command_calls, eventually, numsub, RedisServer, RENEWED_LEASE};

async fn client(server: &RedisServer) -> Client {
    Client::connect(&server.url()).await.unwrap()
}

async fn short_lease_client(server: &RedisServer, lease: Duration) -> Client {
    Client::builder()
        .url(server.url())
        .watchdog_lease(lease)
        .connect()
        .await
        .unwrap()
}
