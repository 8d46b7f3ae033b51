//! Fault injection against real redis-server processes (loopback only): a holder killed with
//! SIGKILL, the subscriber connection killed, Redis restarted, Redis stalled, the network
//! stalled or cut, cancellation storms, drops and shutdowns while holding, and the clock.
//!
//! Leases are short (1–3 s) so the suite stays fast; every bound is generous for a loaded
//! 2-core machine yet far below what the broken behaviour would take.

use testkit as support;

mod cancellation;
mod clock;
mod crashes;
mod stalls;

use std::io::BufRead;
use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use parking_lot::Mutex;
use redbaton::{Client, Error};
use support::child::{after_tag, child_arg, spawn_child, test_name};
use support::proxy::{Mode, Proxy};
use support::{command, command_calls, eventually, numsub, RedisServer, RENEWED_LEASE};
use tokio::time::Instant;

async fn client_with(url: &str, lease: Duration, timeout: Duration) -> Client {
    Client::builder()
        .url(url)
        .watchdog_lease(lease)
        .command_timeout(timeout)
        .connect_timeout(Duration::from_secs(2))
        .reconnect_max_delay(Duration::from_millis(200))
        .connect()
        .await
        .unwrap()
}

async fn hexists(raw: &fred::clients::Client, key: &str, field: &str) -> bool {
    raw.hexists(key, field).await.unwrap()
}
