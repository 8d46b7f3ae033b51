//! Leases: a crashed holder's permit comes back, the watchdog renews, `lost()`, update_lease_time.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holders_permit_comes_back_after_its_lease() {
    // A holder whose runtime dies (no release, no shutdown, no renewal): its permit comes
    // back once its 600 ms watchdog lease ends, and a parked waiter gets it without any
    // message (it parks until the first lease ends).
    let server = RedisServer::start();
    let raw = server.raw().await;
    let url = server.url();
    let setup = client(&url).await;
    setup
        .leased_semaphore("crash")
        .try_set_permits(1)
        .await
        .unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let holder = lease_client(&url, Duration::from_millis(600)).await;
            std::mem::forget(holder.leased_semaphore("crash").acquire().await.unwrap());
            std::mem::forget(holder);
        });
        drop(rt); // every task of the holder, its watchdog included, stops here
    })
    .join()
    .unwrap();
    let crashed_at = Instant::now();
    assert_eq!(get(&raw, "crash").await.as_deref(), Some("0"));
    let waiter = setup
        .leased_semaphore("crash")
        .with_recheck_interval(NO_RECHECK)
        .unwrap();
    let permit = tokio::time::timeout(Duration::from_secs(20), waiter.acquire())
        .await
        .expect("the crashed holder's permit came back")
        .unwrap();
    assert!(
        crashed_at.elapsed() < NO_RECHECK / 4,
        "the waiter looked again when the lease ended"
    );
    assert_eq!(waiter.acquired_permits().await.unwrap(), 1, "only ours");
    permit.release().await.unwrap();
    assert_eq!(waiter.available_permits().await.unwrap(), 1);
    setup.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_keeps_a_permit_past_several_leases() {
    let server = RedisServer::start();
    watchdog_keeps_a_permit(&server.url(), "renewed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_when_the_permit_is_gone() {
    let server = RedisServer::start();
    let holder = lease_client(&server.url(), Duration::from_millis(900)).await;
    let other = client(&server.url()).await;
    let sem = holder.leased_semaphore("gone");
    sem.try_set_permits(2).await.unwrap();

    // Released by its id elsewhere: the next renewal finds it gone.
    let permit = sem.acquire().await.unwrap();
    assert!(other
        .leased_semaphore("gone")
        .release_id(&permit.id())
        .await
        .unwrap());
    tokio::time::timeout(Duration::from_secs(10), permit.lost())
        .await
        .expect("lost() fires");
    assert!(permit.is_lost());
    assert!(matches!(permit.release().await, Err(Error::NotHeld { .. })));
    assert_eq!(
        sem.available_permits().await.unwrap(),
        2,
        "nothing released twice"
    );

    // A fixed lease that runs out.
    let permit = sem
        .acquire_with_lease(Duration::from_millis(300))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), permit.lost())
        .await
        .expect("lost() fires when the lease ends");
    assert!(permit.is_lost());
    assert!(matches!(permit.release().await, Err(Error::NotHeld { .. })));
    // The holder's deadline (from before it sent the acquire) comes before the server's
    // (from when the script ran): the permit is reclaimed a moment later, and only once.
    assert!(
        eventually(Duration::from_secs(10), || async {
            sem.available_permits().await.unwrap() == 2
        })
        .await,
        "reclaimed"
    );
    assert_eq!(sem.acquired_permits().await.unwrap(), 0);
    assert_eq!(sem.available_permits().await.unwrap(), 2, "reclaimed once");

    // A watchdog permit whose client cannot reach Redis any more: lost within its lease by
    // the local clock.
    let proxy = Proxy::start(server.port).await;
    let cut_off = lease_client(&proxy.url(), Duration::from_millis(900)).await;
    let permit = cut_off.leased_semaphore("gone").acquire().await.unwrap();
    proxy.set(Mode::Stalled);
    tokio::time::timeout(Duration::from_secs(10), permit.lost())
        .await
        .expect("lost() fires when renewal fails for a whole lease");
    assert!(
        eventually(Duration::from_secs(10), || async {
            sem.available_permits().await.unwrap() == 2
        })
        .await
    );
    std::mem::forget(permit);
    std::mem::forget(cut_off);
    holder.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

#[tokio::test]
async fn update_lease_time_sets_a_held_permits_lease_as_redisson_does() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server.url()).await;
    let sem = client.leased_semaphore("leases");
    sem.try_set_permits(3).await.unwrap();
    let lease_end = |id: [u8; 16]| {
        let raw = raw.clone();
        let key = sem.timeout_key().to_owned();
        async move {
            taken(&raw, &key)
                .await
                .into_iter()
                .find(|(member, _)| member[..] == id[..])
                .map(|(_, score)| score)
        }
    };

    // Our own permit, lengthened: the score is the server's now + the new lease.
    let ours = sem
        .acquire_with_lease(Duration::from_secs(60))
        .await
        .unwrap();
    let before = server_ms(&raw).await;
    let lease = Duration::from_secs(600);
    assert!(sem.update_lease_time(&ours.id(), lease).await.unwrap());
    let end = lease_end(*ours.id().as_bytes()).await.expect("still taken");
    let after = server_ms(&raw).await;
    assert!(
        (before + 600_000..=after + 600_000).contains(&end),
        "lease end {end} is not 600 s after {before}..{after}"
    );

    // A Java peer's permit without a lease, given one of 1 s: it comes back by itself.
    let peer_id = [7u8; 16];
    assert_eq!(
        peer_acquire(&raw, &sem, &[peer_id], None)
            .await
            .as_str()
            .as_deref(),
        Some("OK")
    );
    assert_eq!(lease_end(peer_id).await, Some(SENTINEL));
    let id = PermitId::from_bytes(peer_id);
    assert!(sem
        .update_lease_time(&id, Duration::from_secs(1))
        .await
        .unwrap());
    assert!(
        eventually(Duration::from_secs(20), || async {
            sem.acquired_permits().await.unwrap() == 1
        })
        .await,
        "the shortened lease ended and the permit was reclaimed"
    );
    // Ended and reclaimed: never revived.
    assert!(!sem
        .update_lease_time(&id, Duration::from_secs(60))
        .await
        .unwrap());
    assert_eq!(lease_end(peer_id).await, None);
    assert_eq!(sem.available_permits().await.unwrap(), 2);

    // Released, or never taken: false.
    let released = ours.id();
    ours.release().await.unwrap();
    assert!(!sem
        .update_lease_time(&released, Duration::from_secs(60))
        .await
        .unwrap());
    assert!(!sem
        .update_lease_time(&PermitId::from_bytes([9; 16]), Duration::from_secs(60))
        .await
        .unwrap());

    // Bad input: a typed error, nothing sent.
    for lease in [Duration::ZERO, Duration::MAX] {
        let refused = sem.update_lease_time(&released, lease).await;
        assert!(
            matches!(refused, Err(Error::InvalidArgument(_))),
            "{lease:?}: {refused:?}"
        );
    }
    client.shutdown().await.unwrap();
}
