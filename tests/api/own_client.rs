//! `Client::redis()`: the user's own fred client (DESIGN.md invariant 17, "the library's
//! connections are its own"). What a user sends on it — a blocking `BLPOP` longer than the
//! library's command timeout and than the watchdog lease — delays no lock call and no
//! renewal, and comes back as the command's own answer, never cut by the library's timeout.
//! A fred error converts into `redbaton::Error` with `?`.

use testkit as support;

use std::time::{Duration, Instant};

use fred::prelude::*;
use fred::types::{ClusterHash, CustomCommand};
use redbaton::{Client, Error};
use support::{RedisServer, RENEWED_LEASE};

/// The user's blocking command: longer than the library's command timeout below, and longer
/// than the watchdog lease.
const BLOCK: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_blpop_delays_no_lock_call_nor_renewal_and_returns_nil() {
    let server = RedisServer::start();
    let client = Client::builder()
        .url(server.url())
        .watchdog_lease(RENEWED_LEASE)
        .command_timeout(Duration::from_secs(4))
        .connect()
        .await
        .unwrap();
    // Held across the blocking command: renewed every 667 ms, it is lost if renewals wait
    // behind the BLPOP for a lease (2 s).
    let held = client.lock("held").lock().await.unwrap();

    let redis = client.redis().clone();
    let blpop = tokio::spawn(async move {
        let started = Instant::now();
        // `custom`, for the server's own answer: fred's typed `blpop` reports a nil as an
        // error of kind Timeout.
        let command = CustomCommand::new_static("BLPOP", ClusterHash::FirstKey, true);
        let args = vec!["user:queue".to_owned(), BLOCK.as_secs().to_string()];
        let popped: Result<Value, _> = redis.custom(command, args).await;
        (popped, started.elapsed())
    });
    // Let the BLPOP reach the server before the lock calls.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let started = Instant::now();
    let other = client.lock("other").try_lock().await.unwrap();
    let took = started.elapsed();
    assert!(other.is_some(), "a free lock is taken");
    assert!(
        took < Duration::from_millis(1500),
        "try_lock took {took:?} beside the user's BLPOP of {BLOCK:?}"
    );
    other.unwrap().unlock().await.unwrap();

    let (popped, blocked) = blpop.await.unwrap();
    match popped {
        Ok(Value::Null) => {}
        other => panic!("BLPOP returned {other:?} after {blocked:?}, not nil after {BLOCK:?}"),
    }
    assert!(
        blocked >= BLOCK - Duration::from_millis(100),
        "BLPOP came back after {blocked:?}, before its {BLOCK:?}"
    );
    assert!(
        !held.is_lost(),
        "the hold was lost while the user's BLPOP blocked"
    );
    held.unlock().await.unwrap();
    client.shutdown().await.unwrap();
}

/// What a user writes mixing fred calls into a `redbaton::Result` function.
async fn bump_under_lock(client: &Client, counter: &str) -> redbaton::Result<i64> {
    let guard = client.lock("bump").lock().await?;
    let n: i64 = client.redis().incr(counter).await?;
    guard.unlock().await?;
    Ok(n)
}

#[tokio::test]
async fn fred_errors_convert_with_the_question_mark() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    assert_eq!(bump_under_lock(&client, "counter").await.unwrap(), 1);
    let () = client
        .redis()
        .set("text", "not a number", None, None, false)
        .await
        .unwrap();
    match bump_under_lock(&client, "text").await {
        Err(Error::Redis(detail)) => assert!(detail.contains("not an integer"), "{detail}"),
        other => panic!("{other:?}"),
    }
    let wrong: redbaton::Result<i64> = async { Ok(client.redis().hlen("text").await?) }.await;
    assert!(matches!(wrong, Err(Error::WrongType { .. })), "{wrong:?}");
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_users_client_is_closed_by_shutdown() {
    let server = RedisServer::start();
    let connect = || {
        Client::builder()
            .url(server.url())
            .command_timeout(Duration::from_secs(1))
            .connect()
    };
    let client = connect().await.unwrap();
    let _: i64 = client.redis().incr("n").await.unwrap();
    client.shutdown().await.unwrap();
    let after = tokio::time::timeout(Duration::from_secs(10), client.redis().incr::<i64, _>("n"))
        .await
        .expect("a command after shutdown fails rather than waits");
    assert!(after.is_err(), "{after:?}");

    // Never used before shutdown: closed as soon as it is asked for.
    let unused = connect().await.unwrap();
    unused.shutdown().await.unwrap();
    let after = tokio::time::timeout(Duration::from_secs(10), unused.redis().incr::<i64, _>("n"))
        .await
        .expect("a command after shutdown fails rather than waits");
    assert!(after.is_err(), "{after:?}");
}
