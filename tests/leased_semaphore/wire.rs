//! The wire layout, refused input and keys, and the Redisson peer with binary ids.

use super::*;

async fn subscribe(
    url: &str,
    channel: &str,
) -> (SubscriberClient, tokio::sync::broadcast::Receiver<Message>) {
    let subscriber = Builder::from_config(Config::from_url(url).unwrap())
        .build_subscriber_client()
        .unwrap();
    subscriber.init().await.unwrap();
    let messages = subscriber.message_rx();
    subscriber.subscribe(channel).await.unwrap();
    let _: Value = subscriber.ping(None).await.unwrap();
    (subscriber, messages)
}

async fn drain(
    messages: &mut tokio::sync::broadcast::Receiver<Message>,
    quiet: Duration,
) -> Vec<String> {
    let mut seen = Vec::new();
    while let Ok(Ok(message)) = tokio::time::timeout(quiet, messages.recv()).await {
        seen.push(message.value.as_string().unwrap());
    }
    seen
}

#[tokio::test]
async fn wire_layout_and_messages_match_redisson() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server.url()).await;
    let sem = client.leased_semaphore("gpu");
    assert_eq!(sem.key(), "gpu");
    assert_eq!(sem.timeout_key(), "{gpu}:timeout");
    assert_eq!(sem.channel(), "redisson_sc:{gpu}");
    let tagged = client.leased_semaphore("{a}:b");
    assert_eq!(tagged.timeout_key(), "{a}:b:timeout");
    assert_eq!(tagged.channel(), "redisson_sc:{a}:b");
    let (_subscriber, mut messages) = subscribe(&server.url(), "redisson_sc:{gpu}").await;

    assert!(
        sem.try_acquire().await.unwrap().is_none(),
        "not initialised"
    );
    assert!(sem.try_set_permits(2).await.unwrap());
    assert!(!sem.try_set_permits(9).await.unwrap());
    assert_eq!(get(&raw, "gpu").await.as_deref(), Some("2"));

    let before = server_ms(&raw).await;
    let watched = sem.acquire().await.unwrap();
    let fixed = sem
        .acquire_with_lease(Duration::from_secs(10))
        .await
        .unwrap();
    let after = server_ms(&raw).await;
    assert_eq!(get(&raw, "gpu").await.as_deref(), Some("0"), "free count");
    let kind: String = raw.r#type("{gpu}:timeout").await.unwrap();
    assert_eq!(kind, "zset");
    let mut permits = taken(&raw, "{gpu}:timeout").await;
    permits.sort_by_key(|(_, score)| *score);
    assert_eq!(permits.len(), 2);
    // Members are the ids' 16 raw bytes; scores the lease ends in epoch ms.
    assert_eq!(permits[0].0, fixed.id().as_bytes());
    assert_eq!(permits[1].0, watched.id().as_bytes());
    assert!(
        permits[0].1 >= before + 10_000 && permits[0].1 <= after + 10_000,
        "fixed lease end {} not in [{}, {}]",
        permits[0].1,
        before + 10_000,
        after + 10_000
    );
    assert!(
        permits[1].1 >= before + 30_000 && permits[1].1 <= after + 30_000,
        "watchdog lease end"
    );
    assert_eq!(sem.available_permits().await.unwrap(), 0);
    assert_eq!(sem.acquired_permits().await.unwrap(), 2);

    watched.release().await.unwrap();
    fixed.release().await.unwrap();
    assert_eq!(get(&raw, "gpu").await.as_deref(), Some("2"));
    let exists: i64 = raw.exists("{gpu}:timeout").await.unwrap();
    assert_eq!(exists, 0, "no permit taken");
    sem.add_permits(3).await.unwrap();
    sem.add_permits(-7).await.unwrap();
    assert_eq!(sem.available_permits().await.unwrap(), -2);
    sem.add_permits(4).await.unwrap();
    // Set: the count; releases: the new free count; add: the delta, when positive; an
    // acquire publishes nothing.
    let seen = drain(&mut messages, Duration::from_millis(500)).await;
    assert_eq!(seen, ["2", "1", "2", "3", "4"]);

    // An expiry on the counter is copied onto the permits' set by an acquire.
    let _: () = raw.pexpire("gpu", 60_000, None).await.unwrap();
    let permit = sem.acquire().await.unwrap();
    let pttl: i64 = raw.pttl("{gpu}:timeout").await.unwrap();
    assert!(pttl > 50_000 && pttl <= 60_000, "pttl {pttl}");
    permit.release().await.unwrap();
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_count_a_redisson_peer_could_not_read_is_refused() {
    // Redisson reads the counter as a Java int, and every taken permit comes back to it: no
    // call may let free and taken permits together leave that range.
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server.url()).await;
    let sem = client.leased_semaphore("range");
    let max = i64::from(redbaton::MAX_PERMITS);
    let refused = |r: Result<(), Error>| {
        matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("2147483647")) || {
            eprintln!("not refused: {r:?}");
            false
        }
    };
    assert!(sem.try_set_permits(1).await.unwrap());
    let permit = sem.try_acquire().await.unwrap().expect("one free");
    assert!(
        refused(sem.add_permits(max).await),
        "its release would take the count past the top"
    );
    assert_eq!(get(&raw, "range").await.as_deref(), Some("0"), "unchanged");
    sem.add_permits(max - 1).await.unwrap();
    permit.release().await.unwrap();
    assert_eq!(sem.available_permits().await.unwrap(), max);
    assert!(refused(sem.add_permits(1).await), "add past the top");

    sem.add_permits(-max).await.unwrap();
    sem.add_permits(-max).await.unwrap();
    sem.add_permits(-1).await.unwrap();
    assert!(refused(sem.add_permits(-1).await), "add past the bottom");
    assert_eq!(
        get(&raw, "range").await.as_deref(),
        Some("-2147483648"),
        "unchanged"
    );
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_input_and_keys_of_other_types_are_refused() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server.url()).await;
    let sem = client.leased_semaphore("input");
    let invalid = |r: Result<(), Error>| matches!(r, Err(Error::InvalidArgument(_)));
    assert!(invalid(
        sem.acquire_with_lease(Duration::ZERO).await.map(drop)
    ));
    assert!(invalid(
        sem.try_acquire_with_lease(Duration::ZERO, Duration::MAX)
            .await
            .map(drop)
    ));
    assert!(invalid(sem.try_set_permits(u32::MAX).await.map(drop)));
    assert!(invalid(sem.add_permits(i64::MIN).await));
    assert!(invalid(sem.with_recheck_interval(Duration::ZERO).map(drop)));
    assert!(invalid(
        client.leased_semaphore("").try_acquire().await.map(drop)
    ));
    assert!(invalid("not-hex".parse::<PermitId>().map(drop)));
    assert!(!sem
        .release_id(&PermitId::from_bytes([7; 16]))
        .await
        .unwrap());

    // A counter or a permit set of another type: refused, and left as it was.
    let _: () = raw.hset("hash", ("f", "1")).await.unwrap();
    let _: () = raw.set("zfree", "2", None, None, false).await.unwrap();
    let _: () = raw
        .set("{zfree}:timeout", "x", None, None, false)
        .await
        .unwrap();
    let _: () = raw.set("text", "lots", None, None, false).await.unwrap();
    for name in ["hash", "zfree", "text"] {
        let sem = client.leased_semaphore(name);
        let wrong = |r: Result<(), Error>| matches!(r, Err(Error::WrongType { .. }));
        assert!(
            wrong(sem.try_acquire().await.map(drop)),
            "{name}: try_acquire"
        );
        assert!(
            wrong(sem.available_permits().await.map(drop)),
            "{name}: available"
        );
        assert!(
            wrong(
                sem.release_id(&PermitId::from_bytes([1; 16]))
                    .await
                    .map(drop)
            ),
            "{name}: release_id"
        );
    }
    for name in ["hash", "text"] {
        let sem = client.leased_semaphore(name);
        let wrong = |r: Result<(), Error>| matches!(r, Err(Error::WrongType { .. }));
        assert!(wrong(sem.try_set_permits(1).await.map(drop)), "{name}");
        assert!(wrong(sem.add_permits(1).await), "{name}");
    }
    let fields: std::collections::HashMap<String, String> = raw.hgetall("hash").await.unwrap();
    assert_eq!(fields.len(), 1);
    assert_eq!(get(&raw, "zfree").await.as_deref(), Some("2"));
    assert_eq!(get(&raw, "{zfree}:timeout").await.as_deref(), Some("x"));
    assert_eq!(get(&raw, "text").await.as_deref(), Some("lots"));
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redisson_peer_shares_permits_both_ways_with_binary_ids() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server.url()).await;
    let sem = client
        .leased_semaphore("shared")
        .with_recheck_interval(NO_RECHECK)
        .unwrap();
    sem.try_set_permits(2).await.unwrap();
    // Ids that are not UTF-8 (0xff, 0x80, a lone continuation byte) and contain NULs.
    let java_a: [u8; 16] = [
        0, 0xff, 0x80, 0xc3, 0, 1, 2, 3, 0xfe, 0xbf, 0, 0, 9, 8, 7, 6,
    ];
    let java_b: [u8; 16] = [0xff; 16];

    // The peer takes both permits (one without a lease, one with); we are refused and park.
    let reply = peer_acquire(&raw, &sem, &[java_a, java_b], None).await;
    assert_eq!(reply.as_str().as_deref(), Some("OK"));
    assert_eq!(sem.acquired_permits().await.unwrap(), 2);
    assert!(sem.try_acquire().await.unwrap().is_none());
    let before = support::script_calls(&raw).await;
    let waiter = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.acquire().await })
    };
    support::parked_fresh(&raw, "redisson_sc:{shared}", before).await;
    // The peer's release (publishing the new free count) wakes us at once.
    let released_at = Instant::now();
    assert_eq!(peer_release(&raw, &sem, &java_a).await, 1);
    let ours = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("woken by the peer's release")
        .unwrap()
        .unwrap();
    assert!(released_at.elapsed() < NO_RECHECK / 4);

    // We release the peer's other permit by its binary id.
    let java_b_id = PermitId::from_bytes(java_b);
    assert_eq!(java_b_id.to_string(), "ff".repeat(16));
    assert!(sem.release_id(&java_b_id).await.unwrap());
    assert!(!sem.release_id(&java_b_id).await.unwrap(), "only once");

    // The other way: we hold one, take the other; the peer is refused and told when our
    // first lease ends (the server's clock plus our 30 s watchdog lease).
    let second = sem.acquire().await.unwrap();
    let reply = peer_acquire(&raw, &sem, &[java_a], Some(Duration::from_secs(5))).await;
    let text = reply.as_str().unwrap().to_string();
    let earliest: i64 = text
        .strip_prefix(':')
        .unwrap_or_else(|| panic!("refused with the earliest lease end, got {text:?}"))
        .parse::<f64>()
        .unwrap() as i64;
    let server_now = server_ms(&raw).await;
    assert!(
        earliest > server_now + 20_000 && earliest <= server_now + 30_000,
        "{earliest} vs {server_now}"
    );
    // The peer releases our permit by the id we show; our permit learns it is lost.
    assert_eq!(peer_release(&raw, &sem, ours.id().as_bytes()).await, 1);
    let reply = peer_acquire(&raw, &sem, &[java_a], Some(Duration::from_millis(300))).await;
    assert_eq!(reply.as_str().as_deref(), Some("OK"), "the peer got it");
    assert!(matches!(ours.release().await, Err(Error::NotHeld { .. })));

    // The peer's permit with a 300 ms lease ends; our acquire reclaims it.
    second.release().await.unwrap();
    let a = sem
        .try_acquire()
        .await
        .unwrap()
        .expect("our released permit");
    let b = tokio::time::timeout(Duration::from_secs(20), sem.acquire())
        .await
        .expect("the peer's permit is reclaimed when its lease ends")
        .unwrap();
    assert_eq!(sem.acquired_permits().await.unwrap(), 2);
    // And the peer reclaims ours when their fixed lease ends (by its own clock).
    a.release().await.unwrap();
    b.release().await.unwrap();
    let short = sem
        .acquire_with_lease(Duration::from_millis(200))
        .await
        .unwrap();
    let also = sem.acquire().await.unwrap();
    assert!(
        eventually(Duration::from_secs(10), || async {
            let reply = peer_acquire(&raw, &sem, &[java_b], Some(Duration::from_secs(5))).await;
            reply.as_str().as_deref() == Some("OK")
        })
        .await,
        "the peer reclaims our permit once its lease ends"
    );
    assert!(short.is_lost());
    assert_eq!(peer_release(&raw, &sem, &java_b).await, 1);
    also.release().await.unwrap();
    assert_eq!(sem.available_permits().await.unwrap(), 2);
    let left: i64 = raw.zcard("{shared}:timeout").await.unwrap();
    assert_eq!(left, 0);
    client.shutdown().await.unwrap();
}
