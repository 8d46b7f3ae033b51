//! `FencedLock` and `RFencedLock`: one token counter, so the tokens of both sides increase
//! together, re-entries included; a refused attempt takes none.

use super::*;
use crate::peer::hex;

/// Tokens handed out by both sides, in the order taken, strictly increasing; each side reads
/// the other's latest.
pub async fn tokens_increase_across_both_sides(env: &Env, name: &str) {
    let rust = env.rust().await;
    let java = env.java().await;
    let fenced = rust.fenced_lock(name);
    let j = java.lock(1, "fenced", name);
    let token = |done: peer::Done| done.value.as_u64().expect("a token");
    let java_token = || async { token(java.ok(&format!("token 1 {}", hex(name))).await) };
    let mut tokens: Vec<(&str, u64)> = Vec::new();

    // Redisson: lockAndGetToken, then a re-entry by lock() (it takes a token too).
    let t = token(java.ok(&format!("locktoken 1 {}", hex(name))).await);
    tokens.push(("Redisson lockAndGetToken", t));
    j.lock(None).await;
    tokens.push(("Redisson re-entry", java_token().await));
    assert_eq!(fenced.token().await.unwrap(), Some(java_token().await));
    j.unlock().await.unwrap();
    j.unlock().await.unwrap();

    // redbaton: a hold and its re-entry.
    let outer = fenced.lock().await.unwrap();
    tokens.push(("redbaton lock", outer.token()));
    assert_eq!(
        java_token().await,
        outer.token(),
        "Redisson reads redbaton's token"
    );
    let inner = outer.reenter().await.unwrap();
    tokens.push(("redbaton re-entry", inner.token()));
    // A refused attempt takes no token, on either side.
    let refused = java.ok(&format!("trytoken 2 {} 0 -", hex(name))).await;
    assert!(
        refused.value.is_null(),
        "Redisson got a token while redbaton holds"
    );
    assert_eq!(
        java_token().await,
        inner.token(),
        "the refused attempt took none"
    );
    inner.unlock().await.unwrap();
    outer.unlock().await.unwrap();

    // Redisson: tryLockAndGetToken with a lease.
    let t = token(
        java.ok(&format!("trytoken 1 {} 1000 10000", hex(name)))
            .await,
    );
    tokens.push(("Redisson tryLockAndGetToken", t));
    assert!(fenced.try_lock().await.unwrap().is_none());
    assert_eq!(
        fenced.token().await.unwrap(),
        Some(t),
        "the refused attempt took none"
    );
    j.unlock().await.unwrap();

    // redbaton again, with a fixed lease.
    let held = fenced
        .try_lock_with_lease(Duration::from_secs(1), Duration::from_secs(10))
        .await
        .unwrap()
        .expect("free");
    tokens.push(("redbaton try_lock_with_lease", held.token()));
    held.unlock().await.unwrap();

    assert!(
        tokens.windows(2).all(|w| w[0].1 < w[1].1),
        "tokens out of order: {tokens:?}"
    );
    report(&format!(
        "fenced {name:?} ({:?}): tokens {tokens:?}",
        env.mode
    ));
    rust.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_increase_across_both_sides_single() {
    tokens_increase_across_both_sides(&Env::single().await, "{ledger}:7").await;
}
