//! The fenced lock (Redisson's `RFencedLock`) against a real redis-server: what is special to
//! it — the fencing token. Tokens increase on every acquire (re-entries included) and never
//! on a refused attempt; the wire layout is RLock's hash plus the token counter; a plain
//! `Lock` and a `FencedLock` on one name exclude and wake each other; and the reason it
//! exists: a holder that paused past its lease is fenced off by a store that refuses tokens
//! lower than the highest it has seen. What it shares with every kind is in tests/family.rs.

use testkit as support;

use std::collections::HashMap;
use std::time::Duration;

use fred::prelude::*;
use redbaton::{Client, Error, FencedGuard};
use support::{command, eventually, numsub, RedisServer, RENEWED_LEASE};
use tokio::time::Instant;

async fn client(server: &RedisServer) -> Client {
    Client::connect(&server.url()).await.unwrap()
}

/// The token counter's value and TTL (`None` when absent).
async fn counter(raw: &fred::clients::Client, key: &str) -> (Option<i64>, i64) {
    let value: Option<i64> = raw.get(key).await.unwrap();
    let pttl: i64 = raw.pttl(key).await.unwrap();
    (value, pttl)
}

/// Like Redisson's `testTokenIncrease`: every successful acquire — each of the five methods,
/// re-entries, other clients, later holds — takes the next token: 1, 2, 3, ...; the counter
/// outlives the lock, and `FencedLock::token()` reads the latest one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_increase_on_every_acquire_including_reentry() {
    let server = RedisServer::start();
    let a = client(&server).await;
    let b = client(&server).await;
    let lock = a.fenced_lock("tokens");
    assert_eq!(
        lock.token().await.unwrap(),
        None,
        "no token before the first"
    );

    let wait = Duration::from_secs(1);
    let lease = Duration::from_secs(30);
    let g1: FencedGuard = lock.lock().await.unwrap();
    let (g2, g3, g4, g5) = g1
        .run(|| async {
            let g2 = lock.try_lock().await.unwrap().expect("re-enters");
            let g3 = lock.try_lock_for(wait).await.unwrap().expect("re-enters");
            let g4 = lock.lock_with_lease(lease).await.unwrap();
            let g5 = lock
                .try_lock_with_lease(wait, lease)
                .await
                .unwrap()
                .expect("re-enters");
            (g2, g3, g4, g5)
        })
        .await
        .unwrap();
    let tokens: Vec<u64> = [&g1, &g2, &g3, &g4, &g5]
        .iter()
        .map(|g| g.token())
        .collect();
    assert_eq!(
        tokens,
        [1, 2, 3, 4, 5],
        "one token per acquire, re-entries included"
    );
    assert_eq!(lock.with_owner(g1.owner()).hold_count().await.unwrap(), 5);
    assert_eq!(lock.token().await.unwrap(), Some(5));
    for g in [g3, g1, g5, g2, g4] {
        g.unlock().await.unwrap();
    }
    assert!(!lock.is_locked().await.unwrap());
    assert_eq!(
        lock.token().await.unwrap(),
        Some(5),
        "the counter outlives the lock"
    );

    // Another client, and a later hold of the first: the sequence goes on.
    let other = b.fenced_lock("tokens").lock().await.unwrap();
    assert_eq!(other.token(), 6);
    other.unlock().await.unwrap();
    let later = lock.lock().await.unwrap();
    assert_eq!(later.token(), 7);
    assert_eq!(b.fenced_lock("tokens").token().await.unwrap(), Some(7));
    later.unlock().await.unwrap();

    // Tokens are per name.
    let elsewhere = a.fenced_lock("tokens-2").lock().await.unwrap();
    assert_eq!(elsewhere.token(), 1);
    elsewhere.unlock().await.unwrap();
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// Refused attempts — `try_lock`, a `try_lock_for` that times out, and a waiter's attempts
/// and re-checks while it waits — never take a token: the waiter's hold gets the very next
/// one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_attempt_never_increments() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let a = client(&server).await;
    let b = client(&server).await;
    let held = a.fenced_lock("refused").lock().await.unwrap();
    assert_eq!(held.token(), 1);
    let theirs = b.fenced_lock("refused");
    assert!(theirs.try_lock().await.unwrap().is_none());
    assert!(theirs
        .try_lock_for(Duration::from_millis(300))
        .await
        .unwrap()
        .is_none());
    assert!(theirs
        .try_lock_with_lease(Duration::from_millis(100), Duration::from_secs(5))
        .await
        .unwrap()
        .is_none());
    let waiter = tokio::spawn(async move {
        let guard = theirs.lock().await.unwrap();
        let token = guard.token();
        guard.unlock().await.unwrap();
        token
    });
    assert!(
        eventually(Duration::from_secs(5), || async {
            numsub(&raw, "redisson_lock__channel:{refused}").await == 1
        })
        .await
    );
    let key = "redisson_lock_token:{refused}";
    assert_eq!(
        counter(&raw, key).await.0,
        Some(1),
        "refusals took no token"
    );
    held.unlock().await.unwrap();
    let token = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("woken by the unlock")
        .unwrap();
    assert_eq!(token, 2, "the waiter's hold takes the next token");
    assert_eq!(counter(&raw, key).await.0, Some(2));
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// Redisson's layout: the RLock hash (`<uuid>:<n>` → count, with the lease as its expiry),
/// RLock's channel, and the string counter `redisson_lock_token:{name}` without a TTL —
/// which neither the watchdog's renewals nor the unlock give one. Names with braces keep
/// their own hash tag; the key prefix is part of the name the counter is derived from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wire_layout_matches_redisson() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let lease = RENEWED_LEASE;
    let a = Client::builder()
        .url(server.url())
        .watchdog_lease(lease)
        .connect()
        .await
        .unwrap();
    let lock = a.fenced_lock("order:7");
    assert_eq!(lock.key(), "order:7");
    assert_eq!(lock.channel(), "redisson_lock__channel:{order:7}");
    let outer = lock.lock().await.unwrap();
    let inner = outer.reenter().await.unwrap();
    let key_type: String = raw.r#type("order:7").await.unwrap();
    assert_eq!(key_type, "hash");
    let fields: HashMap<String, i64> = raw.hgetall("order:7").await.unwrap();
    let owner = outer.owner().to_string();
    assert_eq!(fields, HashMap::from([(owner.clone(), 2)]));
    assert!(owner.starts_with(a.id()) && owner[a.id().len()..].starts_with(':'));
    let pttl: i64 = raw.pttl("order:7").await.unwrap();
    assert!(
        pttl > 0 && pttl <= lease.as_millis() as i64,
        "the lease is the hash's expiry: {pttl}"
    );
    let token_key = "redisson_lock_token:{order:7}";
    let token_type: String = raw.r#type(token_key).await.unwrap();
    assert_eq!(token_type, "string");
    assert_eq!(counter(&raw, token_key).await, (Some(2), -1), "no TTL");
    // Renewed past two leases: the counter still has no TTL.
    tokio::time::sleep(lease * 2).await;
    assert!(!outer.is_lost());
    assert_eq!(counter(&raw, token_key).await, (Some(2), -1));
    inner.unlock().await.unwrap();
    outer.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());
    assert_eq!(
        counter(&raw, token_key).await,
        (Some(2), -1),
        "unlock keeps it"
    );

    // A name with braces: its hash tag decides the slot, no second pair is added.
    let braced = a.fenced_lock("{tenant}:order");
    assert_eq!(braced.channel(), "redisson_lock__channel:{tenant}:order");
    braced.lock().await.unwrap().unlock().await.unwrap();
    assert_eq!(
        counter(&raw, "redisson_lock_token:{tenant}:order").await,
        (Some(1), -1)
    );
    // A key prefix is part of the lock's key, so of the counter's name.
    let prefixed = Client::builder()
        .url(server.url())
        .key_prefix("app:")
        .connect()
        .await
        .unwrap();
    prefixed
        .fenced_lock("order:7")
        .lock()
        .await
        .unwrap()
        .unlock()
        .await
        .unwrap();
    assert_eq!(
        counter(&raw, "redisson_lock_token:{app:order:7}").await,
        (Some(1), -1)
    );
    // Nothing else was written.
    let mut keys: Vec<String> = raw.custom(cmd("KEYS"), vec!["*"]).await.unwrap();
    keys.sort();
    assert_eq!(
        keys,
        [
            "redisson_lock_token:{app:order:7}",
            "redisson_lock_token:{order:7}",
            "redisson_lock_token:{tenant}:order",
        ]
    );
    a.shutdown().await.unwrap();
    prefixed.shutdown().await.unwrap();
}

fn cmd(name: &'static str) -> fred::types::CustomCommand {
    fred::types::CustomCommand::new_static(name, None, false)
}

/// A counter that a Redisson peer (or an earlier deployment) advanced goes on from where it
/// is; one of another type, or not a number, is refused with a typed error and nothing is
/// written — no hold, no token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_counter_goes_on_from_any_value_and_bad_counters_are_refused() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let a = client(&server).await;
    let lock = a.fenced_lock("counted");
    let token_key = "redisson_lock_token:{counted}";
    let _: () = raw.set(token_key, 41, None, None, false).await.unwrap();
    let held = lock.lock().await.unwrap();
    assert_eq!(held.token(), 42);
    held.unlock().await.unwrap();

    let _: i64 = raw.del(token_key).await.unwrap();
    let _: () = raw.hset(token_key, ("f", "v")).await.unwrap();
    let refused = lock.try_lock().await;
    assert!(
        matches!(refused, Err(Error::WrongType { .. })),
        "a hash counter: {refused:?}"
    );
    assert!(matches!(lock.token().await, Err(Error::WrongType { .. })));
    let _: i64 = raw.del(token_key).await.unwrap();
    let _: () = raw
        .set(token_key, "not a number", None, None, false)
        .await
        .unwrap();
    let refused = lock.try_lock().await;
    assert!(
        matches!(&refused, Err(Error::WrongType { detail, .. }) if detail.contains("counter")),
        "a counter that is not a number: {refused:?}"
    );
    assert!(lock.token().await.is_err());
    assert!(!lock.is_locked().await.unwrap(), "no hold was left behind");
    let value: String = raw.get(token_key).await.unwrap();
    assert_eq!(value, "not a number", "the counter is left alone");

    // A counter below zero (set by hand) would hand out tokens below 1, which fence nothing:
    // refused before anything is taken — no hold left to block others for a lease.
    let _: () = raw.set(token_key, -5, None, None, false).await.unwrap();
    for _ in 0..2 {
        let refused = lock.try_lock().await;
        assert!(
            matches!(&refused, Err(Error::WrongType { detail, .. }) if detail.contains("counter")),
            "a negative counter: {refused:?}"
        );
    }
    assert!(!lock.is_locked().await.unwrap(), "no hold was left behind");
    assert_eq!(counter(&raw, token_key).await, (Some(-5), -1));
    let other = client(&server).await;
    let plain = other.lock("counted").try_lock().await.unwrap();
    assert!(plain.is_some(), "nobody holds the lock");
    plain.unwrap().unlock().await.unwrap();
    other.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
}

/// A `Lock` and a `FencedLock` on one name are one lock (the same hash): each excludes the
/// other's holders and wakes the other's waiters. One owner holding both re-enters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_and_a_fenced_lock_on_one_name_exclude_and_wake_each_other() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let a = client(&server).await;
    let b = client(&server).await;

    // Fenced holds: a plain lock is refused, then woken by the fenced unlock.
    let fenced = a.fenced_lock("shared").lock().await.unwrap();
    assert!(b.lock("shared").try_lock().await.unwrap().is_none());
    let plain = b.lock("shared");
    let waiter = tokio::spawn(async move {
        let guard = plain.lock().await.unwrap();
        let at = Instant::now();
        guard.unlock().await.unwrap();
        at
    });
    assert!(
        eventually(Duration::from_secs(5), || async {
            numsub(&raw, "redisson_lock__channel:{shared}").await == 1
        })
        .await
    );
    let released = Instant::now();
    fenced.unlock().await.unwrap();
    let woke = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the plain waiter is woken")
        .unwrap();
    assert!(
        woke.duration_since(released) < Duration::from_secs(3),
        "woken by the message, not the 30 s lease"
    );

    // Plain holds: the fenced lock is refused (no token taken), then woken.
    let plain = a.lock("shared").lock().await.unwrap();
    let fenced = b.fenced_lock("shared");
    assert!(fenced.try_lock().await.unwrap().is_none());
    assert_eq!(fenced.token().await.unwrap(), Some(1), "refused: no token");
    let waiter = tokio::spawn(async move {
        let guard = fenced.lock().await.unwrap();
        let token = guard.token();
        guard.unlock().await.unwrap();
        (Instant::now(), token)
    });
    assert!(
        eventually(Duration::from_secs(5), || async {
            numsub(&raw, "redisson_lock__channel:{shared}").await == 1
        })
        .await
    );
    let released = Instant::now();
    plain.unlock().await.unwrap();
    let (woke, token) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the fenced waiter is woken")
        .unwrap();
    assert!(woke.duration_since(released) < Duration::from_secs(3));
    assert_eq!(token, 2);

    // One owner holding both (the fenced lock taken in the plain hold's scope): one hash
    // field, count 2.
    let plain = a.lock("shared").lock().await.unwrap();
    let fenced = plain
        .run(|| async { a.fenced_lock("shared").lock().await })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(fenced.token(), 3);
    assert_eq!(fenced.owner(), plain.owner());
    assert_eq!(
        a.lock("shared")
            .with_owner(plain.owner())
            .hold_count()
            .await
            .unwrap(),
        2
    );
    assert!(b.fenced_lock("shared").try_lock().await.unwrap().is_none());
    fenced.unlock().await.unwrap();
    assert!(a.lock("shared").is_locked().await.unwrap());
    plain.unlock().await.unwrap();
    assert!(!a.lock("shared").is_locked().await.unwrap());
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// The storage side of fencing, as a Redis script: write `value` only with a token at least
/// as high as the highest this store has seen. 1 = written, 0 = refused (stale token).
const GUARDED_WRITE: &str = r#"
local highest = tonumber(redis.call('get', KEYS[1]) or '0')
local token = tonumber(ARGV[1])
if token < highest then
    return 0
end
redis.call('set', KEYS[1], token)
redis.call('set', KEYS[2], ARGV[2])
return 1
"#;

/// Writes `value` to the test store with `token`: whether the store took it.
async fn guarded_write(raw: &fred::clients::Client, token: u64, value: &str) -> bool {
    let written: i64 = raw
        .eval(
            GUARDED_WRITE,
            vec!["store:invoice:7:highest-token", "store:invoice:7"],
            vec![token.to_string(), value.to_owned()],
        )
        .await
        .unwrap();
    written == 1
}

/// Why the fenced lock exists. A holder with a short fixed lease pauses (a GC pause, a
/// stalled network) past its lease; a second holder takes the lock with a higher token and
/// writes. When the first one resumes, its write carries the older token and the store
/// refuses it, while the new holder's writes go through. The stale guard had said so
/// (`lost()`), and its unlock is `NotHeld`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_holder_is_fenced_off_by_its_token() {
    let server = RedisServer::start();
    let store = server.raw().await;
    let a = client(&server).await;
    let b = client(&server).await;

    let first = a
        .fenced_lock("invoice:7")
        .lock_with_lease(Duration::from_millis(500))
        .await
        .unwrap();
    assert!(guarded_write(&store, first.token(), "draft by A").await);

    // A pauses; meanwhile its lease ends and B takes the lock.
    let second = b
        .fenced_lock("invoice:7")
        .try_lock_for(Duration::from_secs(10))
        .await
        .unwrap()
        .expect("B gets the lock once A's lease ended");
    assert!(
        second.token() > first.token(),
        "{} > {}",
        second.token(),
        first.token()
    );
    assert!(guarded_write(&store, second.token(), "final by B").await);

    // A resumes and writes as if it still held the lock: refused.
    assert!(
        !guarded_write(&store, first.token(), "late write by A").await,
        "the stale holder's write must be refused"
    );
    let value: String = store.get("store:invoice:7").await.unwrap();
    assert_eq!(value, "final by B");
    assert!(guarded_write(&store, second.token(), "amended by B").await);

    // A could have known: its guard reports the lost lease, and its unlock changes nothing.
    tokio::time::timeout(Duration::from_secs(1), first.lost())
        .await
        .expect("lost() fired");
    assert!(first.is_lost());
    assert!(matches!(first.unlock().await, Err(Error::NotHeld { .. })));
    assert!(b.fenced_lock("invoice:7").is_locked().await.unwrap());
    second.unlock().await.unwrap();
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// The fenced lock's ACL (docs/FAILURES.md, "ACLs"): the lock user's rules plus
/// `~redisson_lock_token:*`, `+incr` (the acquire script) and `+get` (`FencedLock::token()`); each
/// of the three is needed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_lock_user_needs_the_token_key_incr_and_get() {
    const FENCED_ACL: &[&str] = &[
        // The lock user's rules (docs/FAILURES.md, "ACLs").
        "on",
        ">lock-pw",
        "~locks:*",
        "resetchannels",
        "&redisson_lock__channel:*",
        "+evalsha",
        "+script|load",
        "+hget",
        "+hexists",
        "+exists",
        "+pttl",
        "+subscribe",
        "+unsubscribe",
        "+ping",
        "+hincrby",
        "+pexpire",
        "+del",
        "+publish",
        "+type",
        // The fenced lock's additions.
        "~redisson_lock_token:*",
        "+incr",
        "+get",
    ];
    let server = RedisServer::start();
    let raw = server.raw().await;
    let set_user = |rules: Vec<&'static str>| {
        let raw = raw.clone();
        async move {
            let mut args = vec![
                "SETUSER".to_owned(),
                "locker".to_owned(),
                "reset".to_owned(),
            ];
            args.extend(rules.iter().map(|r| r.to_string()));
            command(&raw, "ACL", args).await;
        }
    };
    let workload = || async {
        let connect = || {
            Client::builder()
                .url(format!("redis://locker:lock-pw@127.0.0.1:{}", server.port))
                .key_prefix("locks:")
                .command_timeout(Duration::from_secs(2))
                .connect()
        };
        let a = connect().await?;
        let b = connect().await?;
        let lock = a.fenced_lock("job");
        let outer = lock.lock().await?;
        let inner = outer.reenter().await?;
        if inner.token() <= outer.token() || lock.token().await? != Some(inner.token()) {
            panic!("tokens are wrong");
        }
        let theirs = b.fenced_lock("job");
        let waiter = tokio::spawn(async move {
            let guard = theirs.lock().await?;
            let token = guard.token();
            guard.unlock().await?;
            Ok::<_, Error>(token)
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        inner.unlock().await?;
        outer.unlock().await?;
        let token = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken")
            .unwrap()?;
        assert_eq!(token, 3);
        a.shutdown().await?;
        b.shutdown().await?;
        Ok::<_, Error>(())
    };
    set_user(FENCED_ACL.to_vec()).await;
    workload().await.unwrap();
    for skip in ["~redisson_lock_token:*", "+incr", "+get"] {
        let _: () = raw.flushall(false).await.unwrap();
        set_user(FENCED_ACL.iter().copied().filter(|r| *r != skip).collect()).await;
        let outcome = tokio::time::timeout(Duration::from_secs(20), workload())
            .await
            .expect("no hang without a permission");
        // NOPERM from the client's own command, and a refusal inside a script (INCR), which
        // Redis and Valkey word as script errors, each in its own words: `Error::Auth`.
        assert!(
            matches!(&outcome, Err(Error::Auth(_))),
            "without {skip}: {outcome:?}"
        );
    }
}
