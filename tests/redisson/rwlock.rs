//! `ReadWriteLock` and `RReadWriteLock`, across the halves: readers of both sides share, a
//! writer of either side excludes the other side's readers and its release wakes them all, a
//! reader's release wakes the other side's writer, and each side's read unlock leaves the other
//! side's read hold alone (Redisson recomputes the hash's expiry from the reader timeout keys,
//! which redbaton's readers write as Redisson's do). Writer against writer is the `write_lock`
//! kind of `locks.rs`.

use std::time::Instant;

use redbaton::ReadWriteMode;

use super::*;
use crate::support::RENEWED_LEASE;

/// Readers of both sides hold at once; each one's read unlock leaves the other's hold, and its
/// expiry, in place.
pub async fn readers_share_across_both_sides(env: &Env, name: &str) {
    let rust = env.rust().await;
    let java = env.java().await;
    let rw = rust.read_write_lock(name);
    let (jr, jw) = (java.lock(1, "read", name), java.lock(2, "write", name));

    jr.lock(None).await;
    let mine = rw.read().try_lock().await.unwrap().expect("readers share");
    let java_owner = java.owner(1).await;
    let state = rw.state().await.unwrap();
    assert_eq!(state.mode, Some(ReadWriteMode::Read));
    let mut owners: Vec<String> = state.owners.iter().map(|h| h.owner.clone()).collect();
    owners.sort();
    let mut expected = vec![java_owner.clone(), mine.owner().to_string()];
    expected.sort();
    assert_eq!(owners, expected, "both readers hold");
    assert!(jr.is_locked().await && !jw.is_locked().await);
    assert!(rw.read().is_locked().await.unwrap() && !rw.write().is_locked().await.unwrap());
    assert!(
        !jw.try_lock(Some(Duration::ZERO), None).await,
        "readers keep Redisson's writer out"
    );
    assert!(
        rw.write().try_lock().await.unwrap().is_none(),
        "and redbaton's"
    );

    // Redisson's read unlock keeps redbaton's read hold, with redbaton's lease.
    jr.unlock().await.unwrap();
    let pttl: i64 = env.raw.pttl(name).await.unwrap();
    assert!(
        pttl > 20_000,
        "the hash keeps redbaton's reader's lease: PTTL {pttl}"
    );
    let state = rw.state().await.unwrap();
    assert_eq!(state.owners.len(), 1, "{state:?}");
    assert_eq!(state.owners[0].owner, mine.owner().to_string());
    assert!(
        !jw.try_lock(Some(Duration::ZERO), None).await,
        "still read-held"
    );

    // And redbaton's read unlock keeps Redisson's.
    jr.lock(None).await;
    mine.unlock().await.unwrap();
    let pttl: i64 = env.raw.pttl(name).await.unwrap();
    assert!(
        pttl > 20_000,
        "the hash keeps Redisson's reader's lease: PTTL {pttl}"
    );
    assert!(jr.is_held().await, "Redisson's reader still holds");
    assert!(
        rw.write().try_lock().await.unwrap().is_none(),
        "still read-held"
    );
    jr.unlock().await.unwrap();
    assert!(
        !rw.read().is_locked().await.unwrap() && !jr.is_locked().await,
        "free"
    );
    rust.shutdown().await.unwrap();
}

/// A writer of each side keeps the other side's readers out; its release wakes two parked
/// readers of the other side at once (the write unlock's `1` wakes every waiter).
pub async fn a_writers_release_wakes_every_reader(env: &Env, name: &str) {
    let rust = env.rust().await;
    let java = env.java().await;
    let rw = rust.read_write_lock(name);
    let channel = rw.channel().to_owned();

    // Redisson writes; two redbaton readers wait.
    let jw = java.lock(1, "write", name);
    jw.lock(None).await;
    assert!(
        rw.read().try_lock().await.unwrap().is_none(),
        "Redisson writes"
    );
    env.no_subscribers(&channel).await;
    let mut readers = Vec::new();
    for _ in 0..2 {
        let read = rw.read();
        // The second shares the first one's subscription: no new subscriber, two more tries.
        let before = env.scripts().await;
        readers.push(tokio::spawn(async move {
            let held = read.lock().await.unwrap();
            (now_ms(), held)
        }));
        env.parked(&channel, before).await;
    }
    let released = jw.unlock().await.unwrap().t0;
    let mut woken = Vec::new();
    for reader in readers {
        let (at, held) = within("a redbaton reader", WOKEN_WITHIN, reader).await;
        woken.push(at - released);
        held.unlock().await.unwrap();
    }

    // redbaton writes; two Redisson readers wait.
    let writing = rw.write().lock().await.unwrap();
    let readers: Vec<_> = (2..4).map(|t| java.lock(t, "read", name)).collect();
    assert!(
        !readers[0].try_lock(Some(Duration::ZERO), None).await,
        "redbaton writes"
    );
    env.no_subscribers(&channel).await;
    let mut waiting = Vec::new();
    for reader in &readers {
        let before = env.scripts().await;
        waiting.push(reader.spawn_lock(None));
        env.parked(&channel, before).await;
    }
    let released = now_ms();
    writing.unlock().await.unwrap();
    for waiter in waiting {
        woken.push(java_acquired("a Redisson reader", WOKEN_WITHIN, waiter).await - released);
    }
    for reader in &readers {
        reader.unlock().await.unwrap();
    }
    report(&format!(
        "rwlock {name:?} ({:?}): a write unlock woke every reader of the other side, \
         after {woken:.1?} ms",
        env.mode
    ));
    rust.shutdown().await.unwrap();
}

/// A reader of each side keeps the other side's writer out, and its release wakes it.
pub async fn a_readers_release_wakes_the_writer(env: &Env, name: &str) {
    let rust = env.rust().await;
    let java = env.java().await;
    let rw = rust.read_write_lock(name);
    let channel = rw.channel().to_owned();

    let jr = java.lock(1, "read", name);
    jr.lock(None).await;
    let write = rw.write();
    let writer = parked_task(env, &channel, async move { write.lock().await.unwrap() }).await;
    let released = jr.unlock().await.unwrap().t0;
    let (at, held) = within("redbaton's writer", WOKEN_WITHIN, writer).await;
    let to_rust = at - released;
    held.unlock().await.unwrap();

    let reading = rw.read().lock().await.unwrap();
    let jw = java.lock(2, "write", name);
    let writer = parked_java(env, &channel, || jw.spawn_lock(None)).await;
    let released = now_ms();
    reading.unlock().await.unwrap();
    let to_java = java_acquired("Redisson's writer", WOKEN_WITHIN, writer).await - released;
    jw.unlock().await.unwrap();
    report(&format!(
        "rwlock {name:?} ({:?}): a read unlock woke the other side's writer, Redisson -> \
         redbaton {to_rust:.1} ms, redbaton -> Redisson {to_java:.1} ms",
        env.mode
    ));
    rust.shutdown().await.unwrap();
}

/// Readers of both sides on one hash, each renewed by its own watchdog (2 s leases) for three
/// leases while a writer waits; when one side's reader leaves, the other's hold lives on.
pub async fn both_readers_watchdogs(env: &Env, name: &str) {
    let rust = env.rust_with(RENEWED_LEASE).await;
    let java = env.java_with(RENEWED_LEASE).await;
    let rw = rust.read_write_lock(name);
    let jr = java.lock(1, "read", name);
    jr.lock(None).await;
    let mine = rw.read().lock().await.unwrap();
    let fields = [java.owner(1).await, mine.owner().to_string()];
    let watch = |what: &'static str, fields: Vec<String>| {
        let raw = env.raw.clone();
        async move {
            let until = Instant::now() + RENEWED_LEASE * 3;
            while Instant::now() < until {
                let pttl: i64 = raw.pttl(name).await.unwrap();
                let held: std::collections::HashMap<String, String> =
                    raw.hgetall(name).await.unwrap();
                for field in &fields {
                    assert!(
                        pttl > 0 && held.get(field).map(String::as_str) == Some("1"),
                        "{what}: {field} lost: PTTL {pttl}, {held:?}"
                    );
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    watch("both readers", fields.to_vec()).await;
    assert!(!mine.is_lost() && jr.is_held().await);
    jr.unlock().await.unwrap();
    watch("redbaton's reader alone", vec![fields[1].clone()]).await;
    assert!(!mine.is_lost());
    jr.lock(None).await;
    mine.unlock().await.unwrap();
    watch("Redisson's reader alone", vec![fields[0].clone()]).await;
    assert!(
        jr.is_held().await,
        "Redisson's reader outlived three leases alone"
    );
    jr.unlock().await.unwrap();
    rust.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_readers_share_across_both_sides() {
    readers_share_across_both_sides(&Env::single().await, "catalog").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_a_writers_release_wakes_every_reader() {
    a_writers_release_wakes_every_reader(&Env::single().await, "{catalog}:w").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_a_readers_release_wakes_the_writer() {
    a_readers_release_wakes_the_writer(&Env::single().await, "catalog:r").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_readers_watchdogs_renew_their_own() {
    both_readers_watchdogs(&Env::single().await, "catalog:renewed").await;
}
