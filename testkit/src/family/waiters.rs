//! Waiters: parked and woken without polling, as many as can enter, each in turn.

use super::*;

/// Spawns a waiter that takes `lock`, reports `index` on `acquired`, and keeps the hold until
/// `release` is notified (then unlocks).
fn spawn_holder<L: AnyLock + Clone>(
    lock: L,
    index: usize,
    acquired: tokio::sync::mpsc::UnboundedSender<usize>,
    release: Arc<tokio::sync::Notify>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let held = lock.lock().await.unwrap();
        let released = release.notified();
        acquired.send(index).unwrap();
        released.await;
        held.unlock().await.unwrap();
    })
}

/// Invariants 2 and 3 of docs/DESIGN.md (a waiter parks on its channel and is woken by the
/// release). While the rival holds, a waiter subscribes to the kind's channel and then sends
/// nothing for 1.5 s (no polling: the lease is 30 s); the rival's release wakes it within seconds —
/// only the message can do that. Its subscription is gone afterwards.
pub async fn wake_up_without_polling<K: Family>() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let holder = client(&server).await;
    let waiters = client(&server).await;
    let kind = K::KIND;
    let rival = K::rival(&holder, NAME).lock().await.unwrap();
    let lock = K::make(&waiters, NAME);
    let channel = lock.channel();
    let waiter = {
        let lock = lock.clone();
        tokio::spawn(async move {
            let held = lock.lock().await.unwrap();
            let at = Instant::now();
            held.unlock().await.unwrap();
            at
        })
    };
    assert!(
        eventually(Duration::from_secs(5), || async {
            channels(&raw).await.iter().any(|c| c.starts_with(&channel))
        })
        .await,
        "{kind}: the waiter subscribes to its channel ({channel}); subscribed: {:?}",
        channels(&raw).await
    );
    let parked = quiet_script_calls(&raw).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        script_calls(&raw).await,
        parked,
        "{kind}: a parked waiter sends nothing"
    );
    assert!(!waiter.is_finished(), "{kind}: still waiting");
    let released = Instant::now();
    rival.unlock().await.unwrap();
    let acquired = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("woken")
        .unwrap();
    let handoff = acquired.duration_since(released);
    assert!(
        handoff < Duration::from_secs(3),
        "{kind}: woken after {handoff:?}: by the lease (30 s), not by the message"
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            channels(&raw).await.is_empty()
        })
        .await,
        "{kind}: the subscription is dropped: {:?}",
        channels(&raw).await
    );
    holder.shutdown().await.unwrap();
    waiters.shutdown().await.unwrap();
}

/// Invariant 4 of docs/DESIGN.md (wake as many as can enter). Five waiters of one process park
/// behind the rival; one release of the rival wakes exactly as many as the kind's rule says —
/// `One`: the release and one winning attempt run, nothing else; `All`: every waiter re-checks
/// once. An exclusive kind then has exactly one holder (the others park again); a shared kind has
/// all five.
pub async fn wake_one_or_all<K: Family>() {
    assert!(
        K::EXCLUSIVE || K::WAKE == WakeRule::All,
        "a shared kind must wake all: any number of its waiters may enter"
    );
    const WAITERS: usize = 5;
    let server = RedisServer::start();
    let raw = server.raw().await;
    // Scripts run, not calls: the woken waiters' attempts may travel together in one call.
    let runs = ScriptRuns::start(&server, &raw).await;
    let holder = client(&server).await;
    let waiters = client(&server).await;
    let kind = K::KIND;
    let rival = K::rival(&holder, NAME).lock().await.unwrap();
    let (acquired_tx, mut acquired_rx) = tokio::sync::mpsc::unbounded_channel();
    let release = Arc::new(tokio::sync::Notify::new());
    let tasks: Vec<_> = (0..WAITERS)
        .map(|i| {
            spawn_holder(
                K::make(&waiters, NAME),
                i,
                acquired_tx.clone(),
                release.clone(),
            )
        })
        .collect();
    assert!(
        eventually(Duration::from_secs(5), || async {
            !channels(&raw).await.is_empty()
        })
        .await
    );
    let before = runs
        .settled(Duration::from_millis(400), Duration::from_secs(10))
        .await;
    rival.unlock().await.unwrap();
    let expected_holders = if K::EXCLUSIVE { 1 } else { WAITERS };
    for n in 0..expected_holders {
        tokio::time::timeout(Duration::from_secs(5), acquired_rx.recv())
            .await
            .unwrap_or_else(|_| panic!("{kind}: only {n} waiters were woken and entered"));
    }
    let after = runs
        .settled(Duration::from_millis(400), Duration::from_secs(10))
        .await;
    let attempts = after - before - 1;
    // `All` also leaves one wake-up stored for a waiter that was busy with an attempt when
    // the message came (it must re-check, or it would miss the release): when the waiters
    // that lost park again, one of them takes it and re-checks once more.
    let expected_attempts = match K::WAKE {
        WakeRule::One => 1..=1,
        WakeRule::All if K::EXCLUSIVE => WAITERS as u64..=WAITERS as u64 + 1,
        WakeRule::All => WAITERS as u64..=WAITERS as u64,
    };
    assert!(
        expected_attempts.contains(&attempts),
        "{kind}: {attempts} attempts after one release, expected {expected_attempts:?} (wake rule {:?})",
        K::WAKE
    );
    assert!(
        acquired_rx.try_recv().is_err(),
        "{kind}: {expected_holders} holder(s) expected, more entered"
    );
    for task in &tasks {
        task.abort();
    }
    holder.shutdown().await.unwrap();
    waiters.shutdown().await.unwrap();
}

/// Invariants 3 and 4 of docs/DESIGN.md (no waiter is left behind): four waiters queued behind the
/// rival all get the lock after its release, each woken by the previous holder's release (the
/// leases are 30 s) — in arrival order for a FIFO kind.
pub async fn every_waiter_gets_its_turn<K: Family>() {
    const WAITERS: usize = 4;
    let server = RedisServer::start();
    let raw = server.raw().await;
    let holder = client(&server).await;
    let waiters = client(&server).await;
    let kind = K::KIND;
    let rival = K::rival(&holder, NAME).lock().await.unwrap();
    let (acquired_tx, mut acquired_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let lock = K::make(&waiters, NAME);
        let acquired_tx = acquired_tx.clone();
        tasks.push(tokio::spawn(async move {
            let held = lock.lock().await.unwrap();
            acquired_tx.send(i).unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
            held.unlock().await.unwrap();
        }));
        if K::FIFO {
            // Arrival order is what FIFO promises: let each one queue before the next.
            quiet_script_calls(&raw).await;
        }
    }
    quiet_script_calls(&raw).await;
    rival.unlock().await.unwrap();
    let mut order = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while order.len() < WAITERS {
        match tokio::time::timeout_at(deadline, acquired_rx.recv()).await {
            Ok(Some(i)) => order.push(i),
            _ => panic!("{kind}: waiters left behind; got the lock in order {order:?}"),
        }
    }
    if K::FIFO {
        assert_eq!(
            order,
            (0..WAITERS).collect::<Vec<_>>(),
            "{kind}: FIFO order"
        );
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert!(!K::make(&waiters, NAME).is_locked().await.unwrap());
    holder.shutdown().await.unwrap();
    waiters.shutdown().await.unwrap();
}
