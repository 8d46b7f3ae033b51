//! Paths the design promises (docs/DESIGN.md) that other tests only pass through by chance, forced
//! here one at a time: the default command timeout (invariant 12), a lone server paying no `WAIT`
//! (invariant 13), a woken waiter that gives up passing its wake-up on (invariant 4), and
//! the skipped re-check of a waiter whose channel was already confirmed (invariant 2).

use testkit as support;

use std::time::{Duration, Instant};

use redbaton::{Client, Error, ReplicaSync};
use support::proxy::{Mode, Proxy};
use support::{command_calls, eventually, script_calls, RedisServer};

/// `WAIT` calls the server has run so far.
async fn waits(raw: &fred::clients::Client) -> u64 {
    command_calls(raw).await.get("wait").copied().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_default_client_fails_a_stalled_call_with_timeout_in_about_five_seconds() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port).await;
    // Nothing set but the URL: the deadline is the library's default, not the test's.
    let client = Client::connect(&proxy.url()).await.unwrap();
    let guard = client.lock("stalled").lock().await.unwrap();
    proxy.set(Mode::Stalled);

    let started = Instant::now();
    let acquire = tokio::time::timeout(Duration::from_secs(60), client.lock("stalled-too").lock())
        .await
        .expect("lock() against a stalled server waited past a minute");
    let took = started.elapsed();
    assert!(
        matches!(acquire, Err(Error::Timeout(_))),
        "lock(): {acquire:?}"
    );
    assert!(
        took >= Duration::from_secs(4) && took <= Duration::from_secs(15),
        "lock() failed after {took:?}, not about the 5 s default"
    );

    let started = Instant::now();
    let release = tokio::time::timeout(Duration::from_secs(60), guard.unlock())
        .await
        .expect("unlock() against a stalled server waited past a minute");
    let took = started.elapsed();
    assert!(
        matches!(release, Err(Error::Timeout(_))),
        "unlock(): {release:?}"
    );
    assert!(
        took >= Duration::from_secs(4) && took <= Duration::from_secs(15),
        "unlock() failed after {took:?}, not about the 5 s default"
    );
    proxy.set(Mode::Open);
    drop(client);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_server_pays_no_wait() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    // The default replica sync (Auto); a short lease so that renewals run within the test.
    let client = Client::builder()
        .url(server.url())
        .watchdog_lease(Duration::from_secs(3))
        .connect()
        .await
        .unwrap();
    let before = command_calls(&raw).await;
    let evalsha =
        |calls: &std::collections::HashMap<String, u64>| calls.get("evalsha").copied().unwrap_or(0);

    // Acquire, re-enter, contend, wait, renew and release: every script that changes a lock.
    let lock = client.lock("lone");
    let guard = lock.lock().await.unwrap();
    let again = guard.reenter().await.unwrap();
    assert!(client.lock("lone").try_lock().await.unwrap().is_none());
    let waiter = client.lock("lone");
    let waiting = tokio::spawn(async move { waiter.lock().await.unwrap().unlock().await });
    let after_acquire = evalsha(&command_calls(&raw).await);
    // A renewal is due every lease/3 = 1 s: wait until the watchdog has sent some.
    let renewed = eventually(Duration::from_secs(15), || async {
        evalsha(&command_calls(&raw).await) >= after_acquire + 3
    })
    .await;
    assert!(renewed, "the watchdog renewed nothing");
    again.unlock().await.unwrap();
    guard.unlock().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter was woken")
        .unwrap()
        .unwrap();

    let after = command_calls(&raw).await;
    assert!(
        evalsha(&after) > evalsha(&before) + 5,
        "scripts ran: {after:?}"
    );
    assert_eq!(
        after.get("wait").copied().unwrap_or(0),
        before.get("wait").copied().unwrap_or(0),
        "a lone server was sent WAIT: {after:?}"
    );

    // The count can see a WAIT: a client told to wait for a replica sends one per change.
    let syncing = Client::builder()
        .url(server.url())
        .replica_sync(ReplicaSync::Replicas {
            min: 1,
            timeout: Duration::from_millis(100),
        })
        .connect()
        .await
        .unwrap();
    let refused = syncing.lock("lone").try_lock().await;
    assert!(
        matches!(refused, Err(Error::NotReplicated { .. })),
        "{refused:?}"
    );
    assert!(waits(&raw).await > 0, "the WAIT was not counted");
    syncing.shutdown().await.unwrap();
    client.shutdown().await.unwrap();
}

/// Runs `commands` (one a line) through `redis-cli` on one connection: a `MULTI` block here
/// runs as one step on the server.
fn cli_script(port: u16, commands: &str) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new(&support::servers::server().cli_bin)
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run redis-cli (is it installed?)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(commands.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Frees what `free` frees, publishes `message` on `channel` and pauses every writer, in one
/// transaction: the release's wake-up reaches the subscribers, and the re-check it causes is
/// held by the server until [`unpause`].
fn release_and_pause(port: u16, free: &str, channel: &str, message: &str) {
    let out = cli_script(
        port,
        &format!("MULTI\n{free}\nPUBLISH {channel} {message}\nCLIENT PAUSE 60000 WRITE\nEXEC\n"),
    );
    assert!(out.contains("QUEUED"), "the release transaction: {out}");
}

fn unpause(port: u16) {
    support::cluster::cli(port, &["CLIENT", "UNPAUSE"]);
}

/// Script calls the server holds back while writes are paused (a woken waiter's re-check).
fn held_attempts(port: u16) -> usize {
    support::cluster::cli(port, &["CLIENT", "LIST"])
        .lines()
        .filter(|l| l.contains(" flags=b ") && l.contains(" cmd=evalsha "))
        .count()
}

/// Waits (bounded) until the server has held back a script call.
async fn until_attempt_held(port: u16) {
    assert!(
        eventually(Duration::from_secs(10), || async {
            held_attempts(port) > 0
        })
        .await,
        "the woken waiter's re-check never reached the server"
    );
}

/// Waits (bounded) until the server has run `n` more script calls than `base`.
async fn until_scripts(raw: &fred::clients::Client, base: u64, n: u64) {
    let ran = eventually(Duration::from_secs(10), || async {
        script_calls(raw).await >= base + n
    })
    .await;
    assert!(ran, "expected {n} script calls");
}

/// Waits (bounded) until `n` waiters of this client are parked on `lock`, past their looks.
async fn until_parked(lock: &redbaton::Lock, n: usize) {
    assert!(
        eventually(Duration::from_secs(10), || async {
            lock.passable_waiters() == n
        })
        .await,
        "{n} waiters did not park: {} did",
        lock.passable_waiters()
    );
}

/// How a woken waiter leaves while its re-check is held by the server.
#[derive(Clone, Copy, Debug)]
enum Leaving {
    /// A timeout around `lock()` ends while the re-check is held.
    OuterTimeout,
    /// Its task is dropped while the re-check is held.
    Dropped,
    /// Its own wait ends while the re-check is held; the re-check then fails (command
    /// timeout) and it gives up after it.
    OwnDeadline,
}

/// Two waiters of one client park on a lock held (by a raw hash with a 60 s expiry) elsewhere;
/// the release wakes the first, which leaves while its re-check is held. The second must be
/// woken by the wake-up passed on, not by the 60 s expiry.
async fn lock_waker_leaves(leaving: Leaving) {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = Client::builder()
        .url(server.url())
        .command_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    let name = format!("passon-{leaving:?}");
    support::command(
        &raw,
        "HSET",
        vec![name.clone(), "elsewhere:1".into(), "1".into()],
    )
    .await;
    support::command(&raw, "PEXPIRE", vec![name.clone(), "60000".into()]).await;
    let base = script_calls(&raw).await;

    // The first waiter parks first (its first attempt and its re-check ran), so the
    // release's one wake-up is its.
    let lock = client.lock(&name);
    let first = tokio::spawn(async move {
        match leaving {
            Leaving::OuterTimeout => tokio::time::timeout(Duration::from_secs(3), lock.lock())
                .await
                .ok()
                .map(|r| r.map(Some)),
            Leaving::Dropped => Some(lock.lock().await.map(Some)),
            Leaving::OwnDeadline => Some(lock.try_lock_for(Duration::from_secs(3)).await),
        }
    });
    until_scripts(&raw, base, 2).await;
    until_parked(&client.lock(&name), 1).await;
    let lock = client.lock(&name);
    let second = tokio::spawn(async move {
        let guard = lock.lock().await.unwrap();
        let got = Instant::now();
        guard.unlock().await.unwrap();
        got
    });
    // Its channel was confirmed: one attempt, no re-check.
    until_scripts(&raw, base, 3).await;
    // Parked too, so registered: the release cannot come before its group is there (it would
    // then re-check on its own, and get the lock whether the wake-up was passed on or not).
    until_parked(&client.lock(&name), 2).await;

    let channel = format!("redisson_lock__channel:{{{name}}}");
    release_and_pause(server.port, &format!("DEL {name}"), &channel, "0");
    until_attempt_held(server.port).await;
    match leaving {
        Leaving::Dropped => first.abort(),
        // Its timeout (3 s from its start) ends while the re-check is held.
        Leaving::OuterTimeout => {}
        // Its re-check fails after the 1 s command timeout, past its 3 s wait.
        Leaving::OwnDeadline => {}
    }
    let left = tokio::time::timeout(Duration::from_secs(20), first)
        .await
        .expect("the first waiter left");
    match (leaving, &left) {
        (Leaving::Dropped, Err(e)) if e.is_cancelled() => {}
        (Leaving::OuterTimeout, Ok(None)) => {}
        (Leaving::OwnDeadline, Ok(Some(Ok(None) | Err(_)))) => {}
        _ => panic!("{leaving:?}: the first waiter did not leave as planned: {left:?}"),
    }
    let unpaused = Instant::now();
    unpause(server.port);
    let got = tokio::time::timeout(Duration::from_secs(40), second)
        .await
        .unwrap_or_else(|_| panic!("{leaving:?}: the second waiter still parked 40 s on"))
        .unwrap();
    assert!(
        got.duration_since(unpaused) < Duration::from_secs(10),
        "{leaving:?}: the wake-up was lost: the second waiter got the lock {:?} after the \
         release (the lock's expiry was 60 s)",
        got.duration_since(unpaused)
    );
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_woken_waiter_cut_by_an_outer_timeout_passes_the_wake_up_on() {
    lock_waker_leaves(Leaving::OuterTimeout).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_woken_waiter_dropped_during_its_recheck_passes_the_wake_up_on() {
    lock_waker_leaves(Leaving::Dropped).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_woken_waiter_whose_wait_ends_during_its_recheck_passes_the_wake_up_on() {
    lock_waker_leaves(Leaving::OwnDeadline).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_waiter_dropped_during_its_recheck_passes_the_wake_up_on() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = Client::connect(&server.url()).await.unwrap();
    // No permit free; waiters re-check by themselves only every minute.
    let sem = client
        .semaphore("passon-sem")
        .with_recheck_interval(Duration::from_secs(60))
        .unwrap();
    sem.try_set_permits(1).await.unwrap();
    // Held (by this test) until the test ends.
    let _taken = sem.try_acquire().await.unwrap().expect("the only permit");
    let base = script_calls(&raw).await;

    // The first waiter, parked first, asks for two permits; the second for one.
    let first = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.acquire_many(2).await })
    };
    until_scripts(&raw, base, 2).await;
    let second = {
        let sem = sem.clone();
        tokio::spawn(async move {
            let permit = sem.acquire().await.unwrap();
            let got = Instant::now();
            permit.release().await.unwrap();
            got
        })
    };
    until_scripts(&raw, base, 3).await;

    // One permit comes back: the first waiter is woken, and dropped while its re-check
    // (which could only find too few) is held.
    release_and_pause(
        server.port,
        &format!("INCRBY {} 1", sem.key()),
        sem.channel(),
        "1",
    );
    until_attempt_held(server.port).await;
    first.abort();
    assert!(tokio::time::timeout(Duration::from_secs(10), first)
        .await
        .expect("the first waiter left")
        .unwrap_err()
        .is_cancelled());
    let unpaused = Instant::now();
    unpause(server.port);
    let got = tokio::time::timeout(Duration::from_secs(90), second)
        .await
        .expect("the second waiter still parked 90 s on")
        .unwrap();
    assert!(
        got.duration_since(unpaused) < Duration::from_secs(10),
        "the wake-up was lost: the second waiter took the free permit {:?} after the \
         release (its re-check interval is 60 s)",
        got.duration_since(unpaused)
    );
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_between_the_first_attempt_and_registration_on_a_shared_channel_wakes() {
    // `x` and `{x}` share `redisson_lock__channel:{x}`. A waiter of `x` keeps the channel
    // subscribed and confirmed, so a waiter of `{x}` may skip its re-check: it then relies on
    // every release after its first attempt reaching it. Here `{x}` is released after that
    // attempt ran but before its refusal reached the waiter (the proxy holds the reply), so
    // the message comes while the waiter is not registered yet.
    let server = RedisServer::start();
    let raw = server.raw().await;
    let proxy = Proxy::start(server.port).await;
    let client = Client::builder()
        .url(proxy.url())
        .command_timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap();
    for name in ["x", "{x}"] {
        support::command(
            &raw,
            "HSET",
            vec![name.into(), "elsewhere:1".into(), "1".into()],
        )
        .await;
        support::command(&raw, "PEXPIRE", vec![name.into(), "60000".into()]).await;
    }
    let scripts = || script_calls(&raw);
    let base = scripts().await;
    let lock = client.lock("x");
    let x_waiter = tokio::spawn(async move { lock.try_lock_for(Duration::from_secs(90)).await });
    // Its first attempt and its re-check (after the subscription was confirmed) ran.
    assert!(
        eventually(Duration::from_secs(10), || async {
            scripts().await >= base + 2
        })
        .await
    );

    proxy.set(Mode::CommandRepliesHeld);
    let lock = client.lock("{x}");
    let braced_waiter = tokio::spawn(async move {
        let guard = lock.lock().await.unwrap();
        let got = Instant::now();
        guard.unlock().await.unwrap();
        got
    });
    assert!(
        eventually(Duration::from_secs(10), || async {
            scripts().await >= base + 3
        })
        .await,
        "the first attempt on {{x}} did not run"
    );
    // `{x}` is released as its holder would: the hash goes, the channel hears `0`.
    let delivered = proxy.pubsub_bytes();
    let released = Instant::now();
    support::command(&raw, "DEL", vec!["{x}".into()]).await;
    support::command(
        &raw,
        "PUBLISH",
        vec!["redisson_lock__channel:{x}".into(), "0".into()],
    )
    .await;
    // The message reached the client's subscriber connection while the attempt's reply is
    // still held. (Not the waiter of `x`'s re-check, as evidence: scripts of one node travel
    // in groups, one group in flight at a time, so it waits behind the held attempt.)
    assert!(
        eventually(Duration::from_secs(10), || async {
            proxy.pubsub_bytes() > delivered
        })
        .await,
        "the release's message did not reach the client"
    );
    proxy.set(Mode::Open);

    let got = tokio::time::timeout(Duration::from_secs(90), braced_waiter)
        .await
        .expect("the waiter of {x} still parked 90 s on")
        .unwrap();
    assert!(
        got.duration_since(released) < Duration::from_secs(10),
        "the release was missed: the waiter of {{x}} got it {:?} after it (the lock's \
         expiry was 60 s)",
        got.duration_since(released)
    );
    x_waiter.abort();
    client.shutdown().await.unwrap();
}
