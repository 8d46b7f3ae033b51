//! The wire layout, the Redisson peer in both directions, hand-offs seen by MONITOR.

use super::*;
use crate::support::monitor::{self, Monitor};

#[tokio::test]
async fn wire_layout_matches_redisson() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server).await;
    let lock = client.fair_lock("deploy:1");
    assert_eq!(lock.queue_key(), "redisson_lock_queue:{deploy:1}");
    assert_eq!(lock.timeout_key(), "redisson_lock_timeout:{deploy:1}");
    assert_eq!(lock.channel(), "redisson_lock__channel:{deploy:1}");
    assert_eq!(
        lock.waiter_channel(),
        None,
        "no owner outside a hold's scope"
    );
    let owner: redbaton::Owner = format!("{}:7", client.id()).parse().unwrap();
    assert_eq!(
        lock.with_owner(owner.clone()).waiter_channel(),
        Some(format!("redisson_lock__channel:{{deploy:1}}:{owner}"))
    );
    assert_eq!(
        client.fair_lock("{app}:x").queue_key(),
        "redisson_lock_queue:{app}:x"
    );

    // The hold is the RLock hash: field <uuid>:<number> → count, with the lease.
    let guard = lock.lock().await.unwrap();
    let fields: std::collections::HashMap<String, i64> = raw.hgetall("deploy:1").await.unwrap();
    assert_eq!(fields.len(), 1);
    assert_eq!(fields.get(&guard.owner().to_string()), Some(&1));
    let pttl: i64 = raw.pttl("deploy:1").await.unwrap();
    assert!(
        pttl > 25_000 && pttl <= 30_000,
        "watchdog lease, got {pttl}"
    );
    assert!(
        queue(&raw, &lock).await.is_empty(),
        "a free lock is taken unqueued"
    );

    // Waiters queue in the list, with timeouts in the zset: the first one's is now + the
    // holder's PTTL + its wait (300 s by default), the next one's the previous one's + its
    // own wait (a timed wait queues with that wait).
    let (release_w1, released) = tokio::sync::oneshot::channel::<()>();
    let before = now_ms();
    let (w1, w1_task) = spawn_as(&lock, |lock| async move {
        let guard = lock.lock().await.unwrap();
        let _ = released.await;
        guard.unlock().await.unwrap();
    })
    .await;
    assert!(queue_becomes(&raw, &lock, &[&w1]).await);
    let after = now_ms();
    let s1 = score(&raw, &lock, &w1).await.unwrap() as i64;
    assert!(
        s1 >= before + 300_000 + 20_000 && s1 <= after + 300_000 + 30_000,
        "timeout of the first waiter: {} ms from now",
        s1 - after
    );
    let (w2, w2_task) = spawn_as(&lock, |lock| async move {
        lock.try_lock_for(Duration::from_secs(60))
            .await
            .unwrap()
            .expect("served within a minute")
            .unlock()
            .await
            .unwrap();
    })
    .await;
    assert!(queue_becomes(&raw, &lock, &[&w1, &w2]).await);
    let s2 = score(&raw, &lock, &w2).await.unwrap() as i64;
    assert_eq!(s2, s1 + 60_000, "the previous timeout + its own wait");

    // Each waiter listens on its own channel, none on the plain lock's.
    let prefix = "redisson_lock__channel:{deploy:1}";
    for field in [&w1, &w2] {
        let channel = format!("{prefix}:{field}");
        assert!(
            eventually(Duration::from_secs(10), || async {
                numsub(&raw, &channel).await == 1
            })
            .await,
            "{channel} subscribed"
        );
    }
    assert_eq!(numsub(&raw, prefix).await, 0);
    // Both through the client's one shared subscriber connection.
    let pubsub_clients: String = raw
        .custom(
            fred::types::CustomCommand::new_static("CLIENT", None, false),
            vec!["LIST", "TYPE", "pubsub"],
        )
        .await
        .unwrap();
    assert_eq!(
        pubsub_clients.lines().count(),
        1,
        "one subscriber connection per client: {pubsub_clients}"
    );

    // A release publishes "0" to the head's channel only.
    let subscriber = Builder::from_config(Config::from_url(&server.url()).unwrap())
        .build_subscriber_client()
        .unwrap();
    subscriber.init().await.unwrap();
    let mut messages = subscriber.message_rx();
    subscriber.psubscribe(format!("{prefix}*")).await.unwrap();
    let _: Value = subscriber.ping(None).await.unwrap();
    guard.unlock().await.unwrap();
    let message = tokio::time::timeout(Duration::from_secs(5), messages.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&*message.channel, format!("{prefix}:{w1}"));
    assert_eq!(message.value.as_str().as_deref(), Some("0"));

    // The head took it: it left the queue, and the timeouts behind it moved up by its wait.
    assert!(queue_becomes(&raw, &lock, &[&w2]).await);
    assert!(
        eventually(Duration::from_secs(10), || async {
            raw.hexists::<bool, _, _>("deploy:1", &w1).await.unwrap()
        })
        .await
    );
    assert_eq!(score(&raw, &lock, &w1).await, None);
    assert_eq!(score(&raw, &lock, &w2).await.unwrap() as i64, s2 - 300_000);

    // Its release wakes the next on its own channel.
    release_w1.send(()).unwrap();
    let message = tokio::time::timeout(Duration::from_secs(5), messages.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&*message.channel, format!("{prefix}:{w2}"));
    w1_task.await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), w2_task)
        .await
        .unwrap()
        .unwrap();
    assert!(queue(&raw, &lock).await.is_empty());
    let members: i64 = raw.zcard(lock.timeout_key()).await.unwrap();
    assert_eq!(members, 0);
    assert!(
        eventually(Duration::from_secs(10), || async {
            numsub(&raw, &format!("{prefix}:{w1}")).await == 0
                && numsub(&raw, &format!("{prefix}:{w2}")).await == 0
        })
        .await
    );
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_and_fair_locks_on_one_name_exclude_each_other() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server).await;
    let plain = client.lock("shared-name");
    let fair = client.fair_lock("shared-name");

    let held = plain.lock().await.unwrap();
    let (_, refused) = spawn_as(&fair, |fair| async move {
        (
            fair.try_lock().await.unwrap().is_none(),
            fair.try_lock_for(Duration::from_millis(300))
                .await
                .unwrap()
                .is_none(),
        )
    })
    .await;
    assert_eq!(refused.await.unwrap(), (true, true));
    assert!(
        queue_becomes(&raw, &fair, &[]).await,
        "the timed-out fair waiter left"
    );
    held.unlock().await.unwrap();

    let held = fair.lock().await.unwrap();
    let plain_task = plain.clone();
    let refused = tokio::spawn(async move {
        (
            plain_task.try_lock().await.unwrap().is_none(),
            plain_task
                .try_lock_for(Duration::from_millis(300))
                .await
                .unwrap()
                .is_none(),
        )
    });
    assert_eq!(refused.await.unwrap(), (true, true));
    held.unlock().await.unwrap();
    let again = tokio::spawn(async move { plain.try_lock().await.unwrap().is_some() });
    assert!(again.await.unwrap(), "free again for the plain lock");
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redisson_peer_queued_behind_us_is_woken_on_its_own_channel() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server).await;
    let lock = client.fair_lock("mixed-a");
    let guard = lock.lock().await.unwrap();

    let peer = FairPeer::new(&server.url(), "mixed-a").await;
    let mut inbox = peer.subscribe(7).await;
    let ttl = peer.try_lock(7, 30_000, 300_000).await;
    assert!(matches!(ttl, Some(t) if t > 0), "the peer queues: {ttl:?}");
    assert!(queue_becomes(&raw, &lock, &[&peer.lock_name(7)]).await);

    // One of ours queues behind the peer.
    let (ours, taker) = spawn_lock_taker(&lock).await;
    assert!(queue_becomes(&raw, &lock, &[&peer.lock_name(7), &ours]).await);

    guard.unlock().await.unwrap();
    assert_eq!(
        inbox.next(PROMPT).await.as_deref(),
        Some("0"),
        "our release wakes the peer on its own channel"
    );
    assert_eq!(
        peer.try_lock(7, 30_000, 300_000).await,
        None,
        "the peer takes it"
    );
    let count: Option<i64> = raw.hget("mixed-a", peer.lock_name(7)).await.unwrap();
    assert_eq!(count, Some(1));
    assert!(queue_becomes(&raw, &lock, &[&ours]).await);

    // The peer's release wakes ours in turn.
    let released = Instant::now();
    assert_eq!(peer.unlock(7).await, Some(1));
    let took = tokio::time::timeout(Duration::from_secs(10), taker)
        .await
        .unwrap()
        .unwrap();
    assert!(took.duration_since(released) < PROMPT);
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn we_queued_behind_a_redisson_peer_are_served_in_its_order() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server).await;
    let lock = client.fair_lock("mixed-b");
    let peer = FairPeer::new(&server.url(), "mixed-b").await;
    assert_eq!(
        peer.try_lock(1, 30_000, 300_000).await,
        None,
        "the peer holds"
    );

    // Queue: ours, a peer thread, ours.
    let (first, first_task) = spawn_lock_taker(&lock).await;
    assert!(queue_becomes(&raw, &lock, &[&first]).await);
    assert!(peer.try_lock(2, 30_000, 5_000).await.is_some());
    let (last, last_task) = spawn_lock_taker(&lock).await;
    let expected = [first.as_str(), &peer.lock_name(2), last.as_str()];
    assert!(queue_becomes(&raw, &lock, &expected).await);
    let s_last = score(&raw, &lock, &last).await.unwrap() as i64;
    let s_peer = score(&raw, &lock, &peer.lock_name(2)).await.unwrap() as i64;
    let s_first = score(&raw, &lock, &first).await.unwrap() as i64;
    assert_eq!(
        s_peer,
        s_first + 5_000,
        "the peer queued behind our timeout"
    );
    assert_eq!(s_last, s_peer + 300_000, "we queued behind the peer's");

    // A non-queuing try of the peer is refused and does not queue.
    assert!(!peer.try_lock_no_queue(3, 30_000).await);
    assert_eq!(queue(&raw, &lock).await, expected);

    // The peer thread gives up the Redisson way: ours behind it move up by its wait.
    peer.acquire_failed(2, 5_000).await;
    assert!(queue_becomes(&raw, &lock, &[&first, &last]).await);
    assert_eq!(
        score(&raw, &lock, &last).await.unwrap() as i64,
        s_last - 5_000
    );

    // The peer's release wakes our head on its own channel.
    let released = Instant::now();
    assert_eq!(peer.unlock(1).await, Some(1));
    let took = tokio::time::timeout(Duration::from_secs(10), first_task)
        .await
        .unwrap()
        .unwrap();
    assert!(took.duration_since(released) < PROMPT);
    let took_last = tokio::time::timeout(Duration::from_secs(10), last_task)
        .await
        .unwrap()
        .unwrap();
    assert!(took_last >= took);
    assert!(queue(&raw, &lock).await.is_empty());
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_shows_a_hand_off_on_the_heads_own_channel() {
    // One fair hand-off as the server sees it: the release script publishes "0" on the head's
    // own channel (nothing on the plain lock's), then the woken head's acquire takes the lock.
    let server = RedisServer::start();
    let raw = server.raw().await;
    let holder_client = client(&server).await;
    let lock = holder_client.fair_lock("handoff");
    let holder = lock.lock().await.unwrap();
    let waiter_client = client(&server).await;
    let (head, taker) = spawn_lock_taker(&waiter_client.fair_lock("handoff")).await;
    assert!(queue_becomes(&raw, &lock, &[&head]).await);
    let channel = format!("redisson_lock__channel:{{handoff}}:{head}");
    assert!(
        eventually(Duration::from_secs(10), || async {
            numsub(&raw, &channel).await == 1
        })
        .await
    );

    let mut monitor = Monitor::start(&server, &raw).await;

    holder.unlock().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), taker)
        .await
        .expect("the head is served")
        .unwrap();
    // The head took the lock: its HSET (inside its acquire script) shows in MONITOR.
    let took = |lines: &[String]| {
        lines
            .iter()
            .filter_map(|l| monitor::command(l))
            .any(|(addr, w)| addr == "lua" && w[0] == "hset" && w.get(2) == Some(&head))
    };
    monitor.read_until(Duration::from_secs(10), took).await;
    monitor.stop();
    let lines = &monitor.lines;

    let parsed: Vec<(usize, String, Vec<String>)> = lines
        .iter()
        .enumerate()
        .filter_map(|(i, l)| monitor::command(l).map(|(a, w)| (i, a, w)))
        .collect();
    let publish = parsed
        .iter()
        .find(|(_, addr, w)| addr == "lua" && w[0].eq_ignore_ascii_case("publish"))
        .expect("the release published");
    assert_eq!(publish.2[1], channel, "published on the head's own channel");
    assert_eq!(publish.2[2], "0");
    assert_eq!(
        parsed
            .iter()
            .filter(|(_, addr, w)| addr == "lua" && w[0].eq_ignore_ascii_case("publish"))
            .count(),
        1,
        "one publish (the head's), none on the plain lock's channel"
    );
    // The woken head's acquire: an EVALSHA from a client with the 3 fair-lock keys and the
    // head's field, after the publish, whose script takes the lock.
    let acquire = parsed
        .iter()
        .find(|(i, addr, w)| {
            *i > publish.0
                && addr != "lua"
                && w[0].eq_ignore_ascii_case("evalsha")
                && w.get(2).map(String::as_str) == Some("3")
                && w.get(3).map(String::as_str) == Some("handoff")
                && w.get(7) == Some(&head)
        })
        .expect("the head's acquire after the publish");
    let hset = parsed
        .iter()
        .find(|(i, addr, w)| *i > acquire.0 && addr == "lua" && w[0] == "hset")
        .expect("the head's acquire took the lock");
    assert_eq!(hset.2[2], head);
    // The release before the publish, for the excerpt.
    let release = parsed
        .iter()
        .rev()
        .find(|(i, addr, w)| {
            *i < publish.0 && addr != "lua" && w[0].eq_ignore_ascii_case("evalsha")
        })
        .expect("the release script")
        .0;
    println!("MONITOR excerpt of one fair hand-off:");
    for line in &lines[release..=(hset.0 + 1).min(lines.len() - 1)] {
        println!("{line}");
    }
    waiter_client.shutdown().await.unwrap();
    holder_client.shutdown().await.unwrap();
}
