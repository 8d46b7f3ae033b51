//! Security: ACL users and passwords, and a user restricted to exactly the ACL a lock user
//! needs (the one docs/FAILURES.md documents). TLS is in `tests/tls.rs`.

use testkit as support;

use std::time::Duration;

use fred::prelude::*;
use redbaton::{Client, Error};
use support::{command, RedisServer};
use tokio::time::Instant;

async fn set_user(raw: &fred::clients::Client, user: &str, rules: &[&str]) {
    let mut args: Vec<String> = vec!["SETUSER".into(), user.into(), "reset".into()];
    args.extend(rules.iter().map(|r| r.to_string()));
    let _ = command(raw, "ACL", args).await;
}

#[tokio::test]
async fn acl_user_with_password_and_wrong_credentials() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    set_user(&raw, "app", &["on", ">s3cret-pw", "~*", "&*", "+@all"]).await;
    let port = server.port;
    let client = Client::connect(&format!("redis://app:s3cret-pw@127.0.0.1:{port}"))
        .await
        .unwrap();
    let guard = client.lock("acl").lock().await.unwrap();
    guard.unlock().await.unwrap();
    client.shutdown().await.unwrap();

    for url in [
        format!("redis://app:wrong-pw@127.0.0.1:{port}"),
        format!("redis://nobody:wrong-pw@127.0.0.1:{port}"),
    ] {
        let err = Client::connect(&url).await.unwrap_err();
        let message = err.to_string();
        println!("{message}");
        assert!(matches!(err, Error::Auth(_)), "{err:?}");
        assert!(
            !message.contains("wrong-pw"),
            "no password in messages: {message}"
        );
        assert!(message.contains("127.0.0.1"), "{message}");
    }
    // A disabled user is refused the same way.
    set_user(&raw, "app", &["off", ">s3cret-pw", "~*", "&*", "+@all"]).await;
    let err = Client::connect(&format!("redis://app:s3cret-pw@127.0.0.1:{port}"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Auth(_)), "{err:?}");
}

/// The ACL of a lock user, as documented in docs/FAILURES.md ("ACLs: what a Redis user needs"),
/// with the key pattern `locks:*` (the clients use the key prefix `locks:`).
const LOCK_USER_ACL: &[&str] = &[
    "on",
    ">lock-pw",
    "~locks:*",
    // The channel is a script argument, not a key: a channel pattern is all it needs. Redis
    // 6.2 gives a new user every channel (`acl-pubsub-default allchannels`) and refuses a
    // pattern added to that: `resetchannels` first (7.0 starts from none anyway).
    "resetchannels",
    "&redisson_lock__channel:*",
    // Called by the client.
    "+evalsha",
    "+script|load",
    "+hget",
    "+hexists",
    "+exists",
    "+pttl",
    "+subscribe",
    "+unsubscribe",
    "+ping",
    // Called inside the scripts.
    "+hincrby",
    "+pexpire",
    "+del",
    "+publish",
    "+type",
    // The baton pass counts the channel's subscribers before it hands a lock on, and a
    // hand-off in memory counts them in the background.
    "+pubsub|numsub",
];

async fn lock_user(server: &RedisServer, lease: Duration) -> redbaton::Result<Client> {
    Client::builder()
        .url(format!("redis://locker:lock-pw@127.0.0.1:{}", server.port))
        .key_prefix("locks:")
        .watchdog_lease(lease)
        .command_timeout(Duration::from_secs(2))
        .connect()
        .await
}

/// Everything a lock user does: lock, re-enter, inspect, wait and be woken, renew, unlock,
/// force-unlock, shut down while holding. The first error, if any.
async fn lock_user_workload(server: &RedisServer) -> redbaton::Result<()> {
    // Renewed every 333 ms: a loaded machine may delay a round, not a whole lease.
    let lease = Duration::from_secs(1);
    let a = lock_user(server, lease).await?;
    let b = lock_user(server, lease).await?;
    let lock = a.lock("job");
    let outer = lock.lock().await?;
    let inner = outer.reenter().await?;
    let owned = lock.with_owner(outer.owner());
    if owned.hold_count().await? != 2 || !lock.is_locked().await? {
        panic!("hold count and is_locked are wrong");
    }
    if !owned.is_held_in_scope().await? || lock.remaining_ttl().await?.is_none() {
        panic!("ownership or TTL is wrong");
    }
    // Outlive two leases: the watchdog must renew.
    tokio::time::sleep(lease * 2).await;
    if outer.is_lost() {
        return Err(Error::Auth("renewal failed (see the log)".into()));
    }
    if b.lock("job").try_lock().await?.is_some() {
        panic!("exclusion failed");
    }
    inner.unlock().await?;
    outer.unlock().await?;
    // Waiting, and being woken by the unlock message: the holder's fixed 30 s lease would
    // keep the waiter parked far longer than the bound.
    let long = a
        .lock("wake")
        .lock_with_lease(Duration::from_secs(30))
        .await?;
    let waiter = {
        let lock = b.lock("wake");
        tokio::spawn(async move {
            let guard = lock.lock().await?;
            let at = Instant::now();
            guard.unlock().await?;
            Ok::<_, Error>(at)
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released = Instant::now();
    long.unlock().await?;
    let woke = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .map_err(|_| Error::Auth("the waiter was never woken".into()))?
        .unwrap()?;
    if woke.duration_since(released) > Duration::from_secs(5) {
        return Err(Error::Auth("woken by the lease, not by a message".into()));
    }
    // The waiter's subscription is gone from the server, not just from the client.
    let raw = server.raw().await;
    let channel = "redisson_lock__channel:{locks:wake}";
    if !support::eventually(Duration::from_secs(5), || async {
        support::numsub(&raw, channel).await == 0
    })
    .await
    {
        return Err(Error::Auth("a subscription was left behind".into()));
    }
    // A release passes the lock to a parked task of the same client: no unlock message but
    // the last release's, once nobody waits. The waiter asks a fixed lease longer than what
    // the hold has left, so the pass is the script's (which counts the channel's subscribers),
    // not a hand-off in memory (which needs no command at all).
    let holder = a.lock("pass").lock().await?;
    let passed_to = a.lock("pass");
    let next = {
        let lock = passed_to.clone();
        tokio::spawn(async move {
            lock.lock_with_lease(Duration::from_secs(30))
                .await?
                .unlock()
                .await
        })
    };
    if !support::eventually(Duration::from_secs(5), || async {
        passed_to.passable_waiters() == 1
    })
    .await
    {
        return Err(Error::Auth("the local waiter never parked".into()));
    }
    let publishes = || async {
        let calls = support::command_calls(&raw).await;
        calls.get("publish").copied().unwrap_or(0)
    };
    let before = publishes().await;
    holder.unlock().await?;
    tokio::time::timeout(Duration::from_secs(10), next)
        .await
        .map_err(|_| Error::Auth("the lock was never passed on".into()))?
        .unwrap()?;
    if publishes().await != before + 1 {
        return Err(Error::Auth(
            "the release was not passed (see the log)".into(),
        ));
    }
    let held = b.lock("job").lock().await?;
    if !a.lock("job").force_unlock().await? {
        panic!("force_unlock found nothing");
    }
    tokio::time::timeout(Duration::from_secs(5), held.lost())
        .await
        .map_err(|_| Error::Auth("lost() did not fire".into()))?;
    drop(held);
    // Shut down while holding: the owner's holds are released by a script.
    let _kept = a.lock("kept").lock().await?;
    a.shutdown().await?;
    if b.lock("kept").is_locked().await? {
        return Err(Error::Auth("shutdown did not release".into()));
    }
    b.shutdown().await?;
    Ok(())
}

/// A user restricted to exactly the documented ACL can do everything a lock user does, and
/// each rule is needed: without any one of them, something fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_with_exactly_the_documented_acl_works() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    set_user(&raw, "locker", LOCK_USER_ACL).await;
    lock_user_workload(&server).await.unwrap();

    // The ACL restricts: other keys, other commands and other channels are refused.
    let client = lock_user(&server, Duration::from_secs(5)).await.unwrap();
    let denied: Result<Option<String>, _> = client.redis().get("locks:job").await;
    assert!(denied.unwrap_err().details().contains("NOPERM"));
    let outside = Client::builder()
        .url(format!("redis://locker:lock-pw@127.0.0.1:{}", server.port))
        .command_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let err = outside
        .lock("not-under-the-prefix")
        .lock()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Auth(_)), "{err:?}");
    client.shutdown().await.unwrap();
    outside.shutdown().await.unwrap();

    // Each command rule is needed.
    for skip in LOCK_USER_ACL.iter().filter(|r| r.starts_with('+')) {
        let rules: Vec<&str> = LOCK_USER_ACL
            .iter()
            .copied()
            .filter(|r| r != skip)
            .collect();
        set_user(&raw, "locker", &rules).await;
        let outcome = tokio::time::timeout(Duration::from_secs(20), lock_user_workload(&server))
            .await
            .expect("no hang without a permission");
        assert!(outcome.is_err(), "the workload needs {skip}");
        let _: () = raw.flushall(false).await.unwrap();
    }
}

/// A lock user whose ACL lacks `PUBSUB NUMSUB` (an ACL written before the baton pass): the
/// refused pass changes nothing, the release goes the ordinary way at once, and the parked
/// waiter is woken by its message — not held out for the 30 s lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_pass_falls_back_to_an_ordinary_release() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let rules: Vec<&str> = LOCK_USER_ACL
        .iter()
        .copied()
        .filter(|r| *r != "+pubsub|numsub")
        .collect();
    set_user(&raw, "locker", &rules).await;
    let client = lock_user(&server, Duration::from_secs(30)).await.unwrap();
    let lock = client.lock("fallback");
    for round in 0..2 {
        let held = lock.lock().await.unwrap();
        let next = {
            let lock = lock.clone();
            tokio::spawn(async move { lock.lock().await.unwrap().unlock().await })
        };
        assert!(
            support::eventually(Duration::from_secs(10), || async {
                lock.passable_waiters() == 1
            })
            .await,
            "round {round}: the waiter parked"
        );
        held.unlock().await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), next)
            .await
            .unwrap_or_else(|_| panic!("round {round}: the waiter was held out"))
            .unwrap()
            .unwrap();
    }
    assert!(!lock.is_locked().await.unwrap());
    client.shutdown().await.unwrap();
}
