//! The hub's unit tests: how a channel's messages wake its groups' waiters (permits, lock releases, expiry news), on a paused clock.

use super::*;
use std::sync::atomic::AtomicUsize;

use fred::types::Value;

fn permits_channel(waiters: usize) -> (Channel, Arc<Group>) {
    test_channel(Wake::Permits, waiters)
}

fn test_channel(wake: Wake, waiters: usize) -> (Channel, Arc<Group>) {
    let group = Arc::new(Group {
        key: "sem".into(),
        wakes: Wakes::new(waiters),
        batons: Arc::default(),
        lease_end: Mutex::new(None),
        lease_moved: Notify::new(),
    });
    let channel = Channel {
        name: "redisson_sc:{sem}".into(),
        wake,
        confirmed: AtomicBool::new(true),
        confirm: Notify::new(),
        refused: Mutex::new(None),
        groups: Mutex::new(vec![group.clone()]),
        delivered: AtomicU32::new(0),
    };
    (channel, group)
}

/// What a waiter that has not looked since it registered passes as `seen`.
const NEVER_LOOKED: u32 = u32::MAX;

async fn woken(group: &Group, within: Duration) -> bool {
    woken_after(group, NEVER_LOOKED, within).await
}

async fn woken_after(group: &Group, seen: u32, within: Duration) -> bool {
    tokio::time::timeout(within, group.wakes.wait(Wake::Permits, seen))
        .await
        .is_ok()
}

#[tokio::test]
async fn permits_wake_waiters_that_were_not_parked_yet() {
    // Three waiters are busy with their attempts when "3" arrives: none is parked. Each
    // must still find its wake-up when it parks (a Notify keeps only one).
    let (channel, group) = permits_channel(3);
    channel.deliver(&Value::from("3"));
    for i in 0..3 {
        assert!(
            woken(&group, Duration::from_secs(5)).await,
            "waiter {i} lost its wake-up"
        );
    }
    assert!(
        !woken(&group, Duration::from_millis(100)).await,
        "three permits, three wake-ups"
    );
}

#[tokio::test]
async fn a_message_wakes_as_many_parked_waiters_as_permits() {
    let (channel, group) = permits_channel(5);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..5 {
        let (group, tx) = (group.clone(), tx.clone());
        tokio::spawn(async move {
            group.wakes.wait(Wake::Permits, NEVER_LOOKED).await;
            let _ = tx.send(i);
        });
    }
    tokio::task::yield_now().await;
    channel.deliver(&Value::from("2"));
    for _ in 0..2 {
        tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("woken")
            .unwrap();
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(100), rx.recv())
            .await
            .is_err(),
        "two permits woke a third waiter"
    );
    // Messages that are not a positive count wake nobody.
    for message in ["0", "-3", "x"] {
        channel.deliver(&Value::from(message));
    }
    assert!(tokio::time::timeout(Duration::from_millis(100), rx.recv())
        .await
        .is_err());
    // More permits than waiters wake every one of them, and no more are kept.
    channel.deliver(&Value::from("100"));
    for _ in 0..3 {
        tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("woken")
            .unwrap();
    }
    assert!(group.wakes.pending() <= 5);
}

/// Waiters of a lock channel, each counting its wake-ups and parking again.
fn lock_waiters(group: &Arc<Group>, n: usize) -> Arc<AtomicUsize> {
    let woken = Arc::new(AtomicUsize::new(0));
    for _ in 0..n {
        let (group, woken) = (group.clone(), woken.clone());
        tokio::spawn(async move {
            loop {
                group.wakes.wait(Wake::Lock, NEVER_LOOKED).await;
                woken.fetch_add(1, Ordering::SeqCst);
            }
        });
    }
    woken
}

#[tokio::test(start_paused = true)]
async fn a_closer_expiry_wakes_every_lock_waiter_when_it_comes() {
    let (channel, group) = test_channel(Wake::Lock, 3);
    let woken = lock_waiters(&group, 3);
    tokio::task::yield_now().await;
    channel.deliver(&Value::from("-1000"));
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(woken.load(Ordering::SeqCst), 0, "not before the lease ends");
    // Later news wins, here a later end (a reader came in meanwhile, then left).
    channel.deliver(&Value::from("-500"));
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(woken.load(Ordering::SeqCst), 0, "the end moved to 1.4 s");
    tokio::time::sleep(Duration::from_millis(200)).await;
    // All three, plus the wake-up kept for a waiter still busy with its attempt.
    assert_eq!(
        woken.load(Ordering::SeqCst),
        4,
        "every waiter, once the lease ended"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(woken.load(Ordering::SeqCst), 4, "once");
}

#[tokio::test(start_paused = true)]
async fn a_release_drops_the_news_of_the_expiry() {
    let (channel, group) = test_channel(Wake::Lock, 2);
    let woken = lock_waiters(&group, 2);
    tokio::task::yield_now().await;
    channel.deliver(&Value::from("-1000"));
    channel.deliver(&Value::from("0"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(woken.load(Ordering::SeqCst), 1, "the unlock woke one");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        woken.load(Ordering::SeqCst),
        1,
        "no wake-up at the end of a lease that was released"
    );
    // Messages that are neither 0, 1 nor a negative number wake nobody, now or later.
    for message in ["2", "-x", "-", "x"] {
        channel.deliver(&Value::from(message));
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(woken.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_wake_up_passed_on_reaches_a_waiter_that_has_not_looked_and_then_stops() {
    // a parks, then b; "1" wakes a (first in line). a looks, cannot use the permit and
    // passes the wake-up on: b, who has not looked, must get it, and a must not take it
    // back. Once b has looked and passed it on too, nobody is woken: no ping-pong.
    let (channel, group) = permits_channel(2);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for name in ["a", "b"] {
        let (group, tx) = (group.clone(), tx.clone());
        tokio::spawn(async move {
            group.wakes.wait(Wake::Permits, NEVER_LOOKED).await;
            let _ = tx.send(name);
        });
        tokio::task::yield_now().await;
    }
    channel.deliver(&Value::from("1"));
    let first = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
    assert_eq!(first.expect("woken").unwrap(), "a");
    let looked = group.wakes.messages();
    group.wakes.pass_on(Wake::Permits);
    assert!(
        !woken_after(&group, looked, Duration::from_millis(100)).await,
        "a took back the wake-up it passed on"
    );
    let second = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
    assert_eq!(second.expect("b got the wake-up").unwrap(), "b");
    group.wakes.pass_on(Wake::Permits);
    assert!(!woken_after(&group, looked, Duration::from_millis(100)).await);
    // A new message is news to both.
    channel.deliver(&Value::from("2"));
    assert!(woken_after(&group, looked, Duration::from_secs(5)).await);
    assert!(woken_after(&group, looked, Duration::from_secs(5)).await);
}
