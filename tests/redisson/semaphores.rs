//! `Semaphore` and `RSemaphore`, `LeasedSemaphore` and `RPermitExpirableSemaphore`: permits
//! add up across both sides (K permits, at most K holders in all), each side's release wakes
//! the other side's waiter by its message, counts read the same, and a leased permit is
//! released by its id from either side.

use std::sync::Mutex;
use std::time::Instant;

use redbaton::PermitId;

use super::*;
use crate::peer::{hex, Java};
use crate::support::RENEWED_LEASE;

/// Longer than every test here: a waiter that gets in sooner was woken by a message (a
/// redbaton semaphore waiter otherwise looks again every 5 s by itself).
const NO_RECHECK: Duration = Duration::from_secs(120);

/// The most held at once in `holds` (`(from, to, permits)`, wall-clock ms, each within its
/// hold), which must never exceed `limit`.
fn most_held(holds: &[(f64, f64, i64)], limit: i64) -> i64 {
    let mut events: Vec<(f64, i64)> = Vec::new();
    for &(from, to, permits) in holds {
        assert!(from <= to);
        events.push((from, permits));
        events.push((to, -permits));
    }
    // At one instant, releases first: touching holds do not overlap.
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut held, mut most) = (0, 0);
    for (at, delta) in events {
        held += delta;
        assert!(
            held <= limit,
            "{held} permits held at once at {at} ms; the limit is {limit}"
        );
        most = most.max(held);
    }
    most
}

/// A Java thread's semaphore command.
async fn sem(java: &Java, op: &str, thread: u32, name: &str, rest: &str) -> peer::Done {
    java.ok(&format!("{op} {thread} {} {rest}", hex(name)))
        .await
}

/// Three permits shared by both sides: counts agree, each side's release wakes the other
/// side's waiter by its message, and three Redisson threads and three redbaton tasks taking
/// them in turn never hold more than three at once.
pub async fn semaphore_permits_add_up(env: &Env, name: &str) {
    let rust = env.rust().await;
    let java = env.java().await;
    let sem_rs = rust
        .semaphore(name)
        .with_recheck_interval(NO_RECHECK)
        .unwrap();
    let channel = sem_rs.channel().to_owned();
    assert_eq!(sem(&java, "sem-set", 1, name, "3").await.value, true);
    assert!(
        !sem_rs.try_set_permits(3).await.unwrap(),
        "set once, by Redisson"
    );
    let avail = |java: Arc<Java>| async move { sem(&java, "sem-avail", 1, name, "").await.value };
    assert_eq!(
        (
            sem_rs.available_permits().await.unwrap(),
            avail(java.clone()).await
        ),
        (3, 3.into())
    );

    sem(&java, "sem-acquire", 1, name, "2").await;
    assert_eq!(sem_rs.available_permits().await.unwrap(), 1);
    assert!(
        sem_rs.try_acquire_many(2).await.unwrap().is_none(),
        "one permit is left"
    );
    let one = sem_rs
        .try_acquire()
        .await
        .unwrap()
        .expect("one permit is left");
    assert_eq!(avail(java.clone()).await, 0);
    assert_eq!(sem(&java, "sem-try", 2, name, "1 -").await.value, false);

    // Redisson's release wakes redbaton's waiter.
    let acquire = sem_rs.clone();
    let waiter = parked_task(
        env,
        &channel,
        async move { acquire.acquire().await.unwrap() },
    )
    .await;
    let released = sem(&java, "sem-release", 1, name, "1").await.t0;
    let (at, two) = within("redbaton's waiter", WOKEN_WITHIN, waiter).await;
    let to_rust = at - released;
    // redbaton's release wakes Redisson's.
    let waiter = parked_java(env, &channel, || {
        java.spawn(format!(
            "sem-try 2 {} 1 {}",
            hex(name),
            NO_RECHECK.as_millis()
        ))
    })
    .await;
    let released = now_ms();
    one.release().await.unwrap();
    let to_java = java_acquired("Redisson's waiter", WOKEN_WITHIN, waiter).await - released;
    assert_eq!(
        sem_rs.available_permits().await.unwrap(),
        0,
        "all three held"
    );
    two.release().await.unwrap();
    sem(&java, "sem-release", 1, name, "2").await;
    assert_eq!(avail(java.clone()).await, 3);

    // Contention: never more than three holders in all.
    let holds: Arc<Mutex<Vec<(f64, f64, i64)>>> = Arc::default();
    let mut workers = Vec::new();
    for worker in 0..6u32 {
        let (holds, java, sem_rs) = (holds.clone(), java.clone(), sem_rs.clone());
        let name = name.to_owned();
        workers.push(tokio::spawn(async move {
            for _ in 0..8 {
                let hold = Duration::from_millis(fastrand::u64(5..25));
                if worker % 2 == 0 {
                    let permit = sem_rs.acquire().await.unwrap();
                    let from = now_ms();
                    tokio::time::sleep(hold).await;
                    let to = now_ms();
                    permit.release().await.unwrap();
                    holds.lock().unwrap().push((from, to, 1));
                } else {
                    let thread = 10 + worker;
                    let from = sem(&java, "sem-acquire", thread, &name, "1").await.t1;
                    tokio::time::sleep(hold).await;
                    let to = sem(&java, "sem-release", thread, &name, "1").await.t0;
                    holds.lock().unwrap().push((from, to, 1));
                }
            }
        }));
    }
    for worker in workers {
        within("a semaphore worker", Duration::from_secs(60), worker).await;
    }
    let most = most_held(&holds.lock().unwrap(), 3);
    assert!(most >= 2, "the workers never contended ({most} at most)");
    assert_eq!(
        sem_rs.available_permits().await.unwrap(),
        3,
        "every permit came back"
    );
    report(&format!(
        "semaphore {name:?} ({:?}): woken by the message, Redisson -> redbaton {to_rust:.1} ms, \
         redbaton -> Redisson {to_java:.1} ms; 48 holds, at most {most} of 3 at once",
        env.mode
    ));
    rust.shutdown().await.unwrap();
}

/// Two leased permits shared by both sides: counts agree, each side's release wakes the other
/// side's waiter by its message, and a permit is released by its id from either side (the
/// other side then fails to release it: Redisson's `IllegalArgumentException` — which its
/// sync `release` wraps in a `RedisException` — and `false`).
pub async fn leased_permits_add_up(env: &Env, name: &str) {
    let rust = env.rust().await;
    let java = env.java().await;
    let leased = rust
        .leased_semaphore(name)
        .with_recheck_interval(NO_RECHECK)
        .unwrap();
    let channel = leased.channel().to_owned();
    assert_eq!(sem(&java, "lsem-set", 1, name, "2").await.value, true);
    assert!(
        !leased.try_set_permits(2).await.unwrap(),
        "set once, by Redisson"
    );

    let java_id = sem(&java, "lsem-acquire", 1, name, "-").await.value;
    let java_id = java_id.as_str().expect("a permit id").to_owned();
    let permit = leased.acquire().await.unwrap();
    assert!(
        leased.try_acquire().await.unwrap().is_none(),
        "both permits are taken"
    );
    assert!(sem(&java, "lsem-try", 1, name, "- -").await.value.is_null());
    assert_eq!(leased.acquired_permits().await.unwrap(), 2);
    assert_eq!(sem(&java, "lsem-acquired", 1, name, "").await.value, 2);
    assert_eq!(sem(&java, "lsem-avail", 1, name, "").await.value, 0);
    assert_eq!(leased.available_permits().await.unwrap(), 0);

    // Redisson's release wakes redbaton's waiter.
    let acquire = leased.clone();
    let waiter = parked_task(env, &channel, async move {
        acquire
            .try_acquire_for(NO_RECHECK)
            .await
            .unwrap()
            .expect("woken")
    })
    .await;
    let released = sem(&java, "lsem-release", 1, name, &java_id).await.t0;
    let (at, second) = within("redbaton's waiter", WOKEN_WITHIN, waiter).await;
    let to_rust = at - released;
    // redbaton's release wakes Redisson's.
    let waiter = parked_java(env, &channel, || {
        java.spawn(format!(
            "lsem-try 2 {} {} -",
            hex(name),
            NO_RECHECK.as_millis()
        ))
    })
    .await;
    let released = now_ms();
    permit.release().await.unwrap();
    let reply = within("Redisson's waiter", WOKEN_WITHIN, waiter)
        .await
        .unwrap();
    let to_java = reply.t1 - released;
    let java_id: PermitId = reply.value.as_str().expect("a permit id").parse().unwrap();

    // Each side releases the other's permit by its id; the owner's own release then fails.
    assert!(
        leased.release_id(&java_id).await.unwrap(),
        "redbaton releases Redisson's permit"
    );
    let twice = java
        .call(&format!("lsem-release 2 {} {java_id}", hex(name)))
        .await;
    assert!(
        twice
            .as_ref()
            .is_err_and(|e| e.message.contains("IllegalArgumentException")),
        "{twice:?}"
    );
    let id = second.id();
    assert_eq!(
        sem(&java, "lsem-tryrelease", 1, name, &id.to_string())
            .await
            .value,
        true
    );
    assert!(
        !leased.release_id(&id).await.unwrap(),
        "already released by Redisson"
    );
    assert_eq!(leased.available_permits().await.unwrap(), 2);
    drop(second); // its release finds nothing to give back
    report(&format!(
        "leased semaphore {name:?} ({:?}): woken by the message, Redisson -> redbaton \
         {to_rust:.1} ms, redbaton -> Redisson {to_java:.1} ms",
        env.mode
    ));
    rust.shutdown().await.unwrap();
}

/// redbaton's watchdog (2 s lease) renews its leased permit for three leases beside a Redisson
/// permit with a fixed lease, which it leaves alone; a Redisson `tryRelease` of redbaton's
/// permit makes its `lost()` fire.
pub async fn leased_watchdog_beside_redisson(env: &Env, name: &str) {
    let rust = env.rust_with(RENEWED_LEASE).await;
    let java = env.java().await;
    let leased = rust.leased_semaphore(name);
    assert!(leased.try_set_permits(2).await.unwrap());
    let java_id = sem(&java, "lsem-acquire", 1, name, "60000").await.value;
    let java_id: PermitId = java_id.as_str().unwrap().parse().unwrap();
    let permit = leased.acquire().await.unwrap();
    let timeouts = leased.timeout_key().to_owned();
    let score = |id: PermitId| {
        let raw = env.raw.clone();
        let timeouts = timeouts.clone();
        async move {
            let score: Option<f64> = raw
                .zscore(
                    &timeouts,
                    fred::types::Value::Bytes(id.as_bytes().to_vec().into()),
                )
                .await
                .unwrap();
            score.expect("the permit is taken")
        }
    };
    let java_ends = score(java_id).await;
    let first = score(permit.id()).await;
    let until = Instant::now() + RENEWED_LEASE * 3;
    while Instant::now() < until {
        assert!(!permit.is_lost(), "redbaton's permit was lost");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let renewed = score(permit.id()).await;
    assert!(
        renewed > first + 2000.0,
        "renewed: lease end {first} then {renewed}"
    );
    assert_eq!(
        score(java_id).await,
        java_ends,
        "Redisson's fixed lease left alone"
    );

    assert_eq!(
        sem(&java, "lsem-tryrelease", 1, name, &permit.id().to_string())
            .await
            .value,
        true
    );
    tokio::time::timeout(RENEWED_LEASE * 2, permit.lost())
        .await
        .expect("lost() fires once Redisson released the permit");
    assert!(leased.release_id(&java_id).await.unwrap());
    rust.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_semaphore_permits_add_up() {
    semaphore_permits_add_up(&Env::single().await, "crawler-slots").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_leased_permits_add_up() {
    leased_permits_add_up(&Env::single().await, "{gpu}-slots").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leased_watchdog_renews_beside_redisson() {
    leased_watchdog_beside_redisson(&Env::single().await, "gpu:renewed").await;
}
