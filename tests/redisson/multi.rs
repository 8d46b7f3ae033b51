//! `MultiLock` and `RedissonMultiLock` over the same locks: a multi-lock of either side keeps
//! the other side's multi-lock and plain locks out, and its release wakes the other side's
//! waiting multi-lock.

use redbaton::MultiLock;

use super::*;
use crate::peer::multi_name;

/// The channels of every lock: a multi-lock's waiter parks on one of its parts'.
const LOCK_CHANNELS: &str = "redisson_lock__channel:";

pub async fn multi_locks_exclude_and_wake_each_other(env: &Env, names: [&str; 2]) {
    let rust = env.rust().await;
    let java = env.java().await;
    let parts = || names.iter().map(|n| rust.lock(*n)).collect::<Vec<_>>();
    let multi = MultiLock::new(parts());
    let java_name = multi_name(&[("lock", names[0]), ("lock", names[1])]);
    let (j1, j2) = (
        java.lock(1, "multi", &java_name),
        java.lock(2, "multi", &java_name),
    );

    // Redisson's multi-lock holds both parts: redbaton is kept out of each, and of both.
    j1.lock(None).await;
    let owner = java.owner(1).await;
    for name in names {
        let fields = env.fields(name).await;
        assert_eq!(
            fields.get(&owner).map(String::as_str),
            Some("1"),
            "{name}: {fields:?}"
        );
        assert!(
            rust.lock(name).try_lock().await.unwrap().is_none(),
            "{name}"
        );
    }
    assert!(multi.try_lock().await.unwrap().is_none());
    let waiting = multi.clone();
    let waiter = parked_task(
        env,
        LOCK_CHANNELS,
        async move { waiting.lock().await.unwrap() },
    )
    .await;
    let released = j1.unlock().await.unwrap().t0;
    let (at, held) = within("redbaton's multi-lock", WOKEN_WITHIN, waiter).await;
    let to_rust = at - released;

    // redbaton's multi-lock holds both: Redisson's is kept out, then woken.
    assert!(!j2.try_lock(Some(Duration::ZERO), None).await);
    let waiter = parked_java(env, LOCK_CHANNELS, || j2.spawn_try(Some(LEASE), None)).await;
    let released = now_ms();
    held.unlock().await.unwrap();
    let reply = within("Redisson's multi-lock", WOKEN_WITHIN, waiter)
        .await
        .unwrap();
    assert_eq!(reply.value, true);
    let to_java = reply.t1 - released;
    j2.unlock().await.unwrap();

    // One part held alone by redbaton: Redisson's multi-lock fails and leaves the other free.
    let part = rust.lock(names[1]).lock().await.unwrap();
    assert!(!j1.try_lock(Some(Duration::ZERO), None).await);
    assert!(
        !rust.lock(names[0]).is_locked().await.unwrap(),
        "no part left behind"
    );
    part.unlock().await.unwrap();
    report(&format!(
        "multi-lock {names:?} ({:?}): woken by the message, Redisson -> redbaton {to_rust:.1} ms, \
         redbaton -> Redisson {to_java:.1} ms",
        env.mode
    ));
    rust.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_multi_locks_exclude_and_wake_each_other() {
    multi_locks_exclude_and_wake_each_other(&Env::single().await, ["orders:1", "{stock}:1"]).await;
}
