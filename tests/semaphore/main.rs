//! The semaphore (Redisson's `RSemaphore`) against a real redis-server: wire layout and
//! messages, at most N holders under contention, wake-ups of exactly as many waiters as
//! permits appeared, cancellation, bad input, wrong types, a Redisson peer, a cluster.

use testkit as support;

mod permits;
mod wake_ups;
mod wire;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fred::clients::SubscriberClient;
use fred::prelude::*;
use fred::types::Message;
use redbaton::{Client, Error, Semaphore, SemaphorePermit, MAX_PERMITS};
use support::proxy::{Mode, Proxy};
use support::{command_calls, eventually, max_held, numsub, RedisServer};

async fn client(url: &str) -> Client {
    Client::connect(url).await.unwrap()
}

/// Permits one waiter's recheck timer would only give after this long: anything sooner is a
/// wake-up by message.
const NO_RECHECK: Duration = Duration::from_secs(120);

/// Whether permits were taken, kept taken (given back by a `release(n)` of the test, as a
/// Redisson user does).
fn kept(permit: Option<SemaphorePermit>) -> bool {
    permit.map(SemaphorePermit::forget).is_some()
}

async fn get(raw: &fred::clients::Client, key: &str) -> Option<String> {
    raw.get(key).await.unwrap()
}

/// A raw subscriber on `channel`, confirmed.
async fn subscribe(
    url: &str,
    channel: &str,
) -> (SubscriberClient, tokio::sync::broadcast::Receiver<Message>) {
    let subscriber = Builder::from_config(Config::from_url(url).unwrap())
        .build_subscriber_client()
        .unwrap();
    subscriber.init().await.unwrap();
    let messages = subscriber.message_rx();
    subscriber.subscribe(channel).await.unwrap();
    let _: Value = subscriber.ping(None).await.unwrap();
    (subscriber, messages)
}

/// Every message received within `quiet` of the last one.
async fn drain(
    messages: &mut tokio::sync::broadcast::Receiver<Message>,
    quiet: Duration,
) -> Vec<String> {
    let mut seen = Vec::new();
    while let Ok(Ok(message)) = tokio::time::timeout(quiet, messages.recv()).await {
        seen.push(message.value.as_string().unwrap());
    }
    seen
}
