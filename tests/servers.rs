//! The servers users run (Redis 6.2, Redis 7.0, Valkey 8.1): the client says which one it is
//! connected to, and what a server cannot do is refused by name at connect. Each test runs on
//! the server `REDBATON_TEST_SERVER` names (testkit/src/servers.rs) and asserts what that
//! server must do.

use testkit as support;

use std::time::Duration;

use redbaton::{Client, Error, PubSubMode};
use support::servers::{self, Feature, Kind};
use support::RedisServer;

/// The client reads the server's name and version at connect, and they are those of the
/// server the tests were told to run: the whole suite's choice of server is real.
#[tokio::test]
async fn the_client_names_the_server_it_is_connected_to() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    let reported = client.server().expect("the server said what it is");
    let expected = match servers::server().kind {
        Kind::Redis62 => "Redis 6.2.",
        Kind::Redis70 => "Redis 7.0.",
        Kind::Valkey81 => "Valkey 8.1.",
    };
    assert!(
        reported.to_string().starts_with(expected),
        "{reported} on {}",
        servers::server().name
    );
    assert_eq!(reported.is_valkey(), servers::server().is_valkey());
    client.shutdown().await.unwrap();
}

/// Sharded pub/sub where the server has it: a waiter is woken by the holder's `SPUBLISH`.
/// Where it has not (Redis 6.2), connect refuses it by name — `Error::Unsupported` naming the
/// server's version and the commands — instead of a client whose every wait would fail
/// later on `SSUBSCRIBE`, or whose releases would fail inside their scripts on `SPUBLISH`.
#[tokio::test]
async fn sharded_pubsub_works_or_is_refused_at_connect() {
    let server = RedisServer::start();
    let connect = || {
        Client::builder()
            .url(server.url())
            .pubsub(PubSubMode::Sharded)
            .connect()
    };
    if servers::server().lacks(Feature::ShardedPubSub).is_some() {
        match connect().await {
            Err(Error::Unsupported {
                server: who,
                detail,
            }) => {
                assert!(who.starts_with("Redis 6.2."), "{who}");
                assert!(who.contains(&format!("127.0.0.1:{}", server.port)), "{who}");
                assert!(detail.contains("SSUBSCRIBE"), "{detail}");
                assert!(detail.contains("PubSubMode::Classic"), "{detail}");
            }
            other => panic!("sharded pub/sub on {}: {other:?}", servers::server().name),
        }
        // Classic pub/sub on the same server is fine.
        let classic = Client::connect(&server.url()).await.unwrap();
        classic.shutdown().await.unwrap();
        return;
    }
    let holder = connect().await.unwrap();
    let waiter = connect().await.unwrap();
    let guard = holder.lock("sharded:wake").lock().await.unwrap();
    support::assert_release_wakes(guard, waiter.lock("sharded:wake"), "sharded").await;
    let raw = server.raw().await;
    let calls = support::command_calls(&raw).await;
    assert!(
        calls.get("ssubscribe").copied().unwrap_or(0) >= 1,
        "the waiter subscribed with SSUBSCRIBE: {calls:?}"
    );
    holder.shutdown().await.unwrap();
    waiter.shutdown().await.unwrap();
}

/// What the connect's version check costs a user without `INFO` in their ACL: nothing. It asks
/// with `HELLO`, which every user may send, so a user limited to exactly the lock user's
/// documented rules (tests/security.rs) still connects, and the client still knows the server.
#[tokio::test]
async fn a_user_without_info_still_connects_and_the_version_is_known() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    support::command(
        &raw,
        "ACL",
        [
            "SETUSER",
            "narrow",
            "reset",
            "on",
            ">pw",
            "~*",
            "&*",
            "+evalsha",
            "+script|load",
            "+ping",
        ]
        .map(String::from)
        .to_vec(),
    )
    .await;
    let client = tokio::time::timeout(
        Duration::from_secs(10),
        Client::connect(&format!(
            "{}://narrow:pw@127.0.0.1:{}",
            servers::scheme(),
            server.port
        )),
    )
    .await
    .expect("connect in time")
    .unwrap();
    assert!(client.server().is_some(), "HELLO answered");
    client.shutdown().await.unwrap();
}
