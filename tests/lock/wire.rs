//! The wire layout, a Redisson-written lock, the scripts, wrong-type keys and bad input.

use super::*;

#[tokio::test]
async fn wire_layout_matches_redisson() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server).await;
    let lock = client.lock("order:42");
    assert_eq!(lock.channel(), "redisson_lock__channel:{order:42}");
    assert_eq!(
        client.lock("{user}:1").channel(),
        "redisson_lock__channel:{user}:1"
    );
    let guard = lock.lock().await.unwrap();
    let _again = guard.reenter().await.unwrap();
    let fields: HashMap<String, i64> = raw.hgetall("order:42").await.unwrap();
    assert_eq!(fields.len(), 1);
    let (field, count) = fields.into_iter().next().unwrap();
    assert_eq!(count, 2);
    let (uuid, number) = field.rsplit_once(':').unwrap();
    assert_eq!(uuid, client.id());
    assert_eq!(uuid::Uuid::parse_str(uuid).unwrap().get_version_num(), 4);
    number.parse::<u64>().expect("owner number is decimal");
    assert_eq!(field, guard.owner().to_string());
    let pttl: i64 = raw.pttl("order:42").await.unwrap();
    assert!(
        pttl > 25_000 && pttl <= 30_000,
        "watchdog lease 30 s, got {pttl}"
    );

    // The release publishes "0" on the channel.
    let subscriber = Builder::from_config(Config::from_url(&server.url()).unwrap())
        .build_subscriber_client()
        .unwrap();
    subscriber.init().await.unwrap();
    let mut messages = subscriber.message_rx();
    subscriber.subscribe(lock.channel()).await.unwrap();
    let _: Value = subscriber.ping(None).await.unwrap();
    drop(_again);
    guard.unlock().await.unwrap();
    let message = tokio::time::timeout(Duration::from_secs(5), messages.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&*message.channel, "redisson_lock__channel:{order:42}");
    assert_eq!(message.value.as_str().as_deref(), Some("0"));
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn redisson_written_lock_excludes_and_wakes_us() {
    // A hold written exactly as Redisson writes it (HINCRBY + PEXPIRE, field uuid:thread)
    // excludes us; Redisson's release (DEL + PUBLISH "0") wakes us.
    let server = RedisServer::start();
    let raw = server.raw().await;
    let _: () = raw
        .hset("shared", ("157ddcf5-0cc2-445d-bdea-98160a459bd5:1", 1))
        .await
        .unwrap();
    let _: () = raw.pexpire("shared", 30_000, None).await.unwrap();
    let client = client(&server).await;
    let lock = client.lock("shared");
    assert!(lock.try_lock().await.unwrap().is_none());
    let waiter = {
        let lock = lock.clone();
        tokio::spawn(async move {
            let start = Instant::now();
            let guard = lock.lock().await.unwrap();
            let waited = start.elapsed();
            guard.unlock().await.unwrap();
            waited
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _: i64 = raw.del("shared").await.unwrap();
    let _: i64 = raw
        .publish("redisson_lock__channel:{shared}", "0")
        .await
        .unwrap();
    let waited = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("woken by the message, not the 30 s lease")
        .unwrap();
    assert!(waited < Duration::from_secs(10), "{waited:?}");
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn scripts_are_reloaded_after_script_flush() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server).await;
    let lock = client.lock("flushed");
    lock.lock().await.unwrap().unlock().await.unwrap();
    let _: () = raw.script_flush(false).await.unwrap();
    let guard = lock.lock().await.unwrap();
    let _: () = raw.script_flush(false).await.unwrap();
    guard.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_key_that_is_not_a_lock_gives_wrong_type() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = client(&server).await;
    let _: () = raw
        .set("text", "user data", None, None, false)
        .await
        .unwrap();
    let lock = client.lock("text");
    assert!(matches!(lock.lock().await, Err(Error::WrongType { .. })));
    assert!(matches!(
        lock.try_lock().await,
        Err(Error::WrongType { .. })
    ));
    let owned = lock.with_owner(format!("{}:1", client.id()).parse().unwrap());
    assert!(matches!(
        owned.hold_count().await,
        Err(Error::WrongType { .. })
    ));
    assert!(matches!(
        lock.force_unlock().await,
        Err(Error::WrongType { .. })
    ));
    assert!(matches!(
        lock.remaining_ttl().await,
        Err(Error::WrongType { .. })
    ));
    let v: String = raw.get("text").await.unwrap();
    assert_eq!(v, "user data", "user data is never touched");
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_arguments_are_refused_before_anything_is_sent() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let empty = client.lock("");
    assert!(matches!(empty.lock().await, Err(Error::InvalidArgument(_))));
    let huge = client.lock("x".repeat(redbaton::MAX_NAME_LEN + 1));
    assert!(matches!(
        huge.try_lock().await,
        Err(Error::InvalidArgument(_))
    ));
    let ok = client.lock("fine");
    assert!(matches!(
        ok.lock_with_lease(Duration::ZERO).await,
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        ok.try_lock_with_lease(Duration::ZERO, Duration::MAX).await,
        Err(Error::InvalidArgument(_))
    ));
    assert!(!ok.is_locked().await.unwrap());
    let e = Client::connect("nonsense://127.0.0.1:1").await.unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn unreachable_redis_is_a_connection_error() {
    let port = support::free_port();
    let e = Client::builder()
        .url(format!("redis://127.0.0.1:{port}"))
        .connect_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Connection(_)), "{e:?}");
    assert!(e.to_string().contains(&port.to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_whose_reply_was_lost_is_never_sent_twice() {
    // Invariant 11 (docs/DESIGN.md): the lock script ran, its reply never came back, the connection
    // broke and came back. A client that re-sent the command would leave a phantom reentry count of
    // 2.
    use support::proxy::{Mode, Proxy};
    let server = RedisServer::start();
    let raw = server.raw().await;
    let proxy = Proxy::start(server.port).await;
    let client = Client::builder()
        .url(proxy.url())
        .command_timeout(Duration::from_secs(3))
        .reconnect_max_delay(Duration::from_millis(100))
        .connect()
        .await
        .unwrap();
    let lock = client.lock("resent");
    let evalsha_before = command_calls(&raw)
        .await
        .get("evalsha")
        .copied()
        .unwrap_or(0);
    proxy.set(Mode::RepliesLost);
    let attempt = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.try_lock().await.map(|g| g.map(|g| g.owner())) })
    };
    // The script has run on the server once its hold is visible; then cut the connection.
    assert!(
        eventually(Duration::from_secs(5), || async {
            let n: i64 = raw.exists("resent").await.unwrap();
            n == 1
        })
        .await
    );
    proxy.set(Mode::Cut);
    tokio::time::sleep(Duration::from_millis(150)).await;
    // Reconnecting is possible again while the attempt may still be pending: a client that
    // re-sends in-flight commands after a reconnect would do it now.
    proxy.set(Mode::Open);
    let outcome = attempt.await.unwrap();
    assert!(
        matches!(outcome, Err(Error::Connection(_)) | Err(Error::Timeout(_))),
        "{outcome:?}"
    );
    // Nobody knows whether the script ran: the client settles the owner's count back to
    // what it accounts for (nothing), so the hold it may have taken does not linger.
    assert!(
        eventually(Duration::from_secs(5), || async {
            let n: i64 = raw.exists("resent").await.unwrap();
            n == 0
        })
        .await,
        "a hold of unknown outcome was settled"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let evalsha = command_calls(&raw)
        .await
        .get("evalsha")
        .copied()
        .unwrap_or(0)
        - evalsha_before;
    assert_eq!(
        evalsha, 2,
        "the lock script ran once and the settle once; more means a script was sent twice"
    );
    client.shutdown().await.unwrap();
}
