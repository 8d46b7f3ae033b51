//! The `redbaton` binary across the lock family: `status` and `unlock --force` on a read/write
//! lock, a fair lock and a fenced lock held by library clients, `--key-prefix`, where
//! `--watchdog-lease` is accepted, and semaphores: their status and repair.

mod cli_support;
use testkit as support;

use std::future::Future;
use std::process::Command;
use std::time::Duration;

use cli_support::{bin, redbaton, run};
use fred::prelude::*;
use redbaton::Client;
use support::{eventually, numsub, RedisServer};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The holders' fixed lease: far longer than any bound below, so only an unlock message can
/// wake a waiter in time.
const LEASE: Duration = Duration::from_secs(120);
/// How long a waiter waits before it gives up (and the test fails).
const WAIT: Duration = Duration::from_secs(20);
/// How soon after `unlock --force` started a parked waiter must hold the lock (a message
/// takes milliseconds; generous for a loaded machine, and far below the lease).
const WOKEN_WITHIN: Duration = Duration::from_secs(10);

/// Runs `redbaton` off the runtime's threads: (exit code, stdout, stderr).
async fn cli(cmd: Command) -> (i32, String, String) {
    tokio::task::spawn_blocking(move || run(cmd)).await.unwrap()
}

async fn status_json(url: &str, args: &[&str]) -> (i32, serde_json::Value) {
    let mut all = vec!["status", "--json"];
    all.extend_from_slice(args);
    let (code, out, err) = cli(redbaton(url, &all)).await;
    let json = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out} {err}"));
    (code, json)
}

/// Waits (bounded) until some connection subscribes to `channel`: the waiter is parked.
async fn parked_on(server: &RedisServer, channel: &str) {
    let raw = server.raw().await;
    assert!(
        eventually(Duration::from_secs(20), || async {
            numsub(&raw, channel).await >= 1
        })
        .await,
        "nobody subscribed to {channel}"
    );
}

/// Runs `unlock --force NAME` (exit 0: it deleted a lock) and returns when it started.
async fn force_unlock(url: &str, name: &str) -> Instant {
    let started = Instant::now();
    let (code, _, err) = cli(redbaton(url, &["unlock", "--force", name])).await;
    assert_eq!(code, 0, "unlock --force {name}: {err}");
    started
}

/// Spawns a waiter: `acquire` (a `try_lock_for(WAIT)`) notes when it got the lock, releases it.
fn spawn_waiter<G: Send + 'static>(
    acquire: impl Future<Output = redbaton::Result<Option<G>>> + Send + 'static,
) -> JoinHandle<Option<Instant>> {
    tokio::spawn(async move {
        let guard = acquire.await.unwrap()?;
        let acquired = Instant::now();
        drop(guard);
        Some(acquired)
    })
}

/// Asserts a waiter's `try_lock_for(WAIT)` (spawned as `waiter`, returning when it got the
/// lock) was woken by the force-unlock that started at `unlocked`.
async fn assert_woken(waiter: JoinHandle<Option<Instant>>, unlocked: Instant, what: &str) {
    let woke = waiter
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{what}: the parked waiter was never woken (waited {WAIT:?})"));
    assert!(
        woke.duration_since(unlocked) < WOKEN_WITHIN,
        "{what}: woken {:?} after unlock --force, not by its message",
        woke.duration_since(unlocked)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_unlock_wakes_the_waiters_of_every_kind() {
    let server = RedisServer::start();
    let url = server.url();
    let holder = Client::connect(&url).await.unwrap();
    let other = Client::connect(&url).await.unwrap();

    // A plain lock (RLock) and a fenced lock share the hash and the channel.
    let _held = holder.lock("plain").lock_with_lease(LEASE).await.unwrap();
    let lock = other.lock("plain");
    let waiter = spawn_waiter(async move { lock.try_lock_for(WAIT).await });
    parked_on(&server, other.lock("plain").channel()).await;
    assert_woken(waiter, force_unlock(&url, "plain").await, "lock").await;

    let _held = holder
        .fenced_lock("fenced")
        .lock_with_lease(LEASE)
        .await
        .unwrap();
    let lock = other.fenced_lock("fenced");
    let waiter = spawn_waiter(async move { lock.try_lock_for(WAIT).await });
    parked_on(&server, other.lock("fenced").channel()).await;
    assert_woken(waiter, force_unlock(&url, "fenced").await, "fenced lock").await;

    // A read/write lock in write mode, a reader waiting: woken on `redisson_rwlock:{name}`.
    let _held = holder
        .read_write_lock("rw-w")
        .write()
        .lock_with_lease(LEASE)
        .await
        .unwrap();
    let rw = other.read_write_lock("rw-w");
    let channel = rw.channel().to_owned();
    let waiter = spawn_waiter(async move { rw.read().try_lock_for(WAIT).await });
    parked_on(&server, &channel).await;
    assert_woken(
        waiter,
        force_unlock(&url, "rw-w").await,
        "write-held rwlock",
    )
    .await;

    // In read mode, a writer waiting.
    let _held = holder
        .read_write_lock("rw-r")
        .read()
        .lock_with_lease(LEASE)
        .await
        .unwrap();
    let rw = other.read_write_lock("rw-r");
    let channel = rw.channel().to_owned();
    let waiter = spawn_waiter(async move { rw.write().try_lock_for(WAIT).await });
    parked_on(&server, &channel).await;
    assert_woken(waiter, force_unlock(&url, "rw-r").await, "read-held rwlock").await;

    // A fair lock: its queued waiter listens on a channel of its own.
    let _held = holder
        .fair_lock("fair")
        .lock_with_lease(LEASE)
        .await
        .unwrap();
    let fair = other.fair_lock("fair");
    let waiting = fair.clone();
    let waiter = spawn_waiter(async move { waiting.try_lock_for(WAIT).await });
    let start = Instant::now();
    let queued = loop {
        if let Some(head) = fair.queued().await.unwrap().first() {
            break head.clone();
        }
        assert!(start.elapsed() < Duration::from_secs(20), "never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    parked_on(&server, &format!("{}:{queued}", fair.channel())).await;
    assert_woken(waiter, force_unlock(&url, "fair").await, "fair lock").await;

    holder.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_of_a_read_write_lock_shows_mode_and_owners() {
    let server = RedisServer::start();
    let url = server.url();
    let client = Client::connect(&url).await.unwrap();
    let rw = client.read_write_lock("catalog");

    // Two readers: two owners in read mode; `mode` is no owner.
    let a = rw.read().lock_with_lease(LEASE).await.unwrap();
    let b = rw.read().lock_with_lease(LEASE).await.unwrap();
    let (code, json) = status_json(&url, &["catalog"]).await;
    assert_eq!(code, 0, "{json}");
    assert_eq!(json["kind"], "read_write_lock", "{json}");
    assert_eq!(json["mode"], "read", "{json}");
    assert_eq!(json["hold_count"], 2, "{json}");
    let owners = json["owners"].as_array().unwrap();
    let mut named: Vec<&str> = owners
        .iter()
        .map(|o| o["owner"].as_str().unwrap())
        .collect();
    named.sort();
    let mut expected = [a.owner().to_string(), b.owner().to_string()];
    expected.sort();
    assert_eq!(named, expected, "{json}");
    assert!(owners.iter().all(|o| o["hold"] == "read"), "{json}");
    let (code, text, _) = cli(redbaton(&url, &["status", "catalog"])).await;
    assert_eq!(code, 0);
    assert!(
        text.contains("read/write lock, locked for reading"),
        "{text}"
    );
    assert!(!text.contains("owner mode"), "{text}");
    // exec's conflict message counts owners the same way.
    let (code, _, err) = cli(redbaton(
        &url,
        &["exec", "--wait", "0", "catalog", "--", "true"],
    ))
    .await;
    assert_eq!(code, 75, "{err}");
    assert!(err.contains("2 owner(s)"), "{err}");
    a.unlock().await.unwrap();
    b.unlock().await.unwrap();

    // A writer: its field carries `:write`; the owner is shown as the writer's owner.
    let w = rw.write().lock_with_lease(LEASE).await.unwrap();
    let (code, json) = status_json(&url, &["catalog"]).await;
    assert_eq!(code, 0, "{json}");
    assert_eq!(json["mode"], "write", "{json}");
    assert_eq!(json["owners"].as_array().unwrap().len(), 1, "{json}");
    assert_eq!(json["owners"][0]["owner"], w.owner().to_string().as_str());
    assert_eq!(json["owners"][0]["hold"], "write");
    let (_, text, _) = cli(redbaton(&url, &["status", "catalog"])).await;
    assert!(text.contains("locked for writing"), "{text}");
    let (code, _, err) = cli(redbaton(
        &url,
        &["exec", "--wait", "0", "catalog", "--", "true"],
    ))
    .await;
    assert_eq!(code, 75, "{err}");
    assert!(err.contains("1 owner(s)"), "{err}");
    w.unlock().await.unwrap();

    // A plain lock says what it is too.
    let _l = client.lock("plain").lock_with_lease(LEASE).await.unwrap();
    let (code, json) = status_json(&url, &["plain"]).await;
    assert_eq!(code, 0);
    assert_eq!(json["kind"], "lock", "{json}");
    assert_eq!(json["mode"], serde_json::Value::Null, "{json}");
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_prefix_names_the_services_keys() {
    let server = RedisServer::start();
    let url = server.url();
    let service = Client::builder()
        .url(&url)
        .key_prefix("billing:")
        .connect()
        .await
        .unwrap();
    let guard = service.lock("job").lock_with_lease(LEASE).await.unwrap();

    let (code, _) = status_json(&url, &["job"]).await;
    assert_eq!(code, 1, "without the prefix: another key, free");
    let (code, json) = status_json(&url, &["--key-prefix", "billing:", "job"]).await;
    assert_eq!(code, 0, "{json}");
    assert_eq!(json["key"], "billing:job", "{json}");
    assert_eq!(
        json["owners"][0]["owner"],
        guard.owner().to_string().as_str()
    );
    let (code, _, err) = cli(redbaton(
        &url,
        &[
            "exec",
            "--key-prefix",
            "billing:",
            "--wait",
            "0",
            "job",
            "--",
            "true",
        ],
    ))
    .await;
    assert_eq!(code, 75, "{err}");
    let (code, _, err) = cli(redbaton(
        &url,
        &["unlock", "--force", "--key-prefix", "billing:", "job"],
    ))
    .await;
    assert_eq!(code, 0, "{err}");
    tokio::time::timeout(Duration::from_secs(20), guard.lost())
        .await
        .expect("the service's guard learns it lost the lock");
    service.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_lease_is_an_exec_option_without_a_fixed_lease() {
    let server = RedisServer::start();
    let url = server.url();
    // Where it would do nothing, it is refused as a usage error.
    for args in [
        &["status", "--watchdog-lease", "5s", "x"][..],
        &["unlock", "--force", "--watchdog-lease", "5s", "x"][..],
        &["--watchdog-lease", "5s", "status", "x"][..],
        &[
            "exec",
            "--lease",
            "5s",
            "--watchdog-lease",
            "5s",
            "x",
            "--",
            "true",
        ][..],
    ] {
        let (code, _, err) = cli(redbaton(&url, args)).await;
        assert_eq!(code, 64, "{args:?}: {err}");
    }
    let (_, _, err) = cli(redbaton(
        &url,
        &[
            "exec",
            "--lease",
            "5s",
            "--watchdog-lease",
            "5s",
            "x",
            "--",
            "true",
        ],
    ))
    .await;
    assert!(
        err.contains("--lease"),
        "names the option it conflicts with: {err}"
    );
    // Where it acts: the lock's lease is the watchdog lease.
    let nested = format!("{} --url {url} status --json wl", bin());
    let (code, out, err) = cli(redbaton(
        &url,
        &[
            "exec",
            "--watchdog-lease",
            "3s",
            "wl",
            "--",
            "sh",
            "-c",
            &nested,
        ],
    ))
    .await;
    assert_eq!(code, 0, "{err}");
    let json: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let ttl = json["ttl_ms"].as_u64().unwrap();
    assert!(ttl <= 3_000, "a 3 s watchdog lease: {ttl} ms left");
}

/// Semaphores from the shell (issue 39): `status` shows a plain semaphore's free permits and
/// recorded total, a leased one's permits with their leases; `unlock --force` releases a
/// leased semaphore's permits (waking its waiters) and leaves a plain one's count alone (its
/// permits belong to nobody: exit 65, naming the repair); `permits` sets a live total or
/// adds permits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphores_have_a_status_and_a_repair() {
    let server = RedisServer::start();
    let url = server.url();
    let client = Client::connect(&url).await.unwrap();
    let plain = client.semaphore("slots");
    assert!(plain.try_set_permits(3).await.unwrap());
    let _held = plain.acquire().await.unwrap();
    let (code, json) = status_json(&url, &["slots"]).await;
    assert_eq!(code, 0, "a permit is taken: {json}");
    assert_eq!(json["kind"], "semaphore");
    assert_eq!(json["free"], 2);
    assert_eq!(json["total"], 3);
    assert_eq!(json["taken"], 1);
    let (code, _, err) = cli(redbaton(&url, &["unlock", "--force", "slots"])).await;
    assert_eq!(code, 65, "{err}");
    assert!(err.contains("redbaton permits"), "{err}");
    assert_eq!(plain.available_permits().await.unwrap(), 2, "left alone");
    // A new total on the live semaphore: the permit taken stays counted.
    let (code, _, err) = cli(redbaton(&url, &["permits", "slots", "5"])).await;
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("4 permit(s) free"), "{err}");
    assert_eq!(plain.total_permits().await.unwrap(), Some(5));
    let (code, _, err) = cli(redbaton(&url, &["permits", "slots", "--add", "-1"])).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(plain.available_permits().await.unwrap(), 3);
    let (code, text, _) = cli(redbaton(&url, &["status", "slots"])).await;
    assert_eq!(code, 0);
    assert!(
        text.contains("3 permit(s) free of a total of 4 (1 taken)"),
        "{text}"
    );

    let leased = client.leased_semaphore("gpus");
    assert!(leased.try_set_permits(2).await.unwrap());
    let permit = leased.acquire().await.unwrap();
    let (code, json) = status_json(&url, &["gpus"]).await;
    assert_eq!(code, 0, "{json}");
    assert_eq!(json["kind"], "leased_semaphore");
    assert_eq!(json["free"], 1);
    assert_eq!(json["permits"][0]["id"], permit.id().to_string());
    let lease_ms = json["permits"][0]["lease_ms"].as_u64().unwrap();
    assert!(lease_ms > 1_000 && lease_ms <= 30_000, "{json}");
    // A waiter for both permits, woken by the force.
    let waiter = {
        let leased = leased.clone();
        tokio::spawn(async move { leased.acquire_many(2).await })
    };
    parked_on(&server, leased.channel()).await;
    let (code, _, err) = cli(redbaton(&url, &["unlock", "--force", "gpus"])).await;
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("1 permit(s) released"), "{err}");
    let both = tokio::time::timeout(WOKEN_WITHIN, waiter)
        .await
        .expect("the waiter is woken by the released permit")
        .unwrap()
        .unwrap();
    tokio::time::timeout(WOKEN_WITHIN, permit.lost())
        .await
        .expect("the forced permit's holder is told");
    both.release().await.unwrap();
    let (code, text, _) = cli(redbaton(&url, &["status", "gpus"])).await;
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("2 permit(s) free"), "{text}");
    let (code, _, err) = cli(redbaton(&url, &["permits", "gpus", "4", "--leased"])).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(leased.available_permits().await.unwrap(), 4);
    client.shutdown().await.unwrap();
}

/// A hash held by a peer: its name, its fields, whether its owner is queued for it (a fair
/// lock), and the kind `status` names.
type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, bool, &'a str);

/// Locks held by peers with their own owner formats — Redisson's `<client uuid>:<thread id>`
/// and node-redisson's default `<client uuid>:<lock uuid>` — for every kind kept in a hash:
/// `status` shows each owner field as it is, and `unlock --force` deletes the lock (exit 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_unlock_force_take_peers_owner_fields_as_they_are() {
    let server = RedisServer::start();
    let url = server.url();
    let raw = server.raw().await;
    let fields = [
        "157ddcf5-0cc2-445d-bdea-98160a459bd5:42",
        "0c5f3b0e-3a7d-4c1e-9a57-1b1d2f6a8e44:6f9c2d7a-48e1-4b0f-bc3e-5d8a9e1f2c37",
    ];
    for field in fields {
        let writer = format!("{field}:write");
        // (name, the hash, whether it is queued for as a fair lock, the kind status names)
        let cases: [Case; 4] = [
            ("peer-lock", vec![(field, "2")], false, "lock"),
            ("peer-fair", vec![(field, "1")], true, "fair_lock"),
            (
                "peer-read",
                vec![("mode", "read"), (field, "1")],
                false,
                "read_write_lock",
            ),
            (
                "peer-write",
                vec![("mode", "write"), (writer.as_str(), "1")],
                false,
                "read_write_lock",
            ),
        ];
        for (name, hash, queued, kind) in cases {
            let () = raw.hset(name, hash).await.unwrap();
            let () = raw.pexpire(name, 60_000, None).await.unwrap();
            let queue = format!("redisson_lock_queue:{{{name}}}");
            if queued {
                let _: i64 = raw.rpush(&queue, field).await.unwrap();
            }
            let (code, json) = status_json(&url, &[name]).await;
            assert_eq!(code, 0, "{name} held by {field}: {json}");
            assert_eq!(json["kind"], kind, "{json}");
            let owners: Vec<&str> = json["owners"]
                .as_array()
                .unwrap()
                .iter()
                .map(|o| o["owner"].as_str().unwrap())
                .collect();
            assert_eq!(owners, [field], "{json}");
            let (code, text, err) = cli(redbaton(&url, &["status", name])).await;
            assert_eq!(code, 0, "{err}");
            assert!(text.contains(&format!("owner {field}")), "{text}");
            force_unlock(&url, name).await;
            let _: i64 = raw.del(&queue).await.unwrap();
            let left: i64 = raw.exists(name).await.unwrap();
            assert_eq!(left, 0, "{name}: deleted");
        }
    }
}
