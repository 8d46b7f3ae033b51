//! TLS with a private CA (certificates made with `openssl` here) and refused TLS handshakes.
//! Built only with the `tls` feature (`required-features` in Cargo.toml).

use testkit as support;
use testkit::tls as certs;

use std::time::Duration;

use certs::TestCerts;
use fred::prelude::*;
use redbaton::{Client, Error};
use support::{free_port, RedisServer};
use tokio::time::Instant;

/// A server with a TLS port next to its plain port.
fn tls_server(certs: &TestCerts) -> (RedisServer, u16) {
    let tls_port = free_port();
    let server = RedisServer::start_with(&[
        "--tls-port",
        &tls_port.to_string(),
        "--tls-cert-file",
        &certs.path("server.crt"),
        "--tls-key-file",
        &certs.path("server.key"),
        "--tls-ca-cert-file",
        &certs.path("ca.crt"),
        "--tls-auth-clients",
        "no",
    ]);
    (server, tls_port)
}

fn builder(url: &str) -> redbaton::Builder {
    Client::builder()
        .url(url)
        .connect_timeout(Duration::from_secs(2))
        .command_timeout(Duration::from_secs(2))
}

/// Locks, waits, is woken and unlocks through `a` and `b`.
async fn lock_wait_wake_unlock(a: &Client, b: &Client, name: &str) {
    let guard = a.lock(name).lock().await.unwrap();
    support::assert_release_wakes(guard, b.lock(name), name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_private_ca() {
    if !support::servers::supports(support::servers::Feature::Tls, None) {
        return;
    }
    let certs = TestCerts::new("ok");
    let (server, tls_port) = tls_server(&certs);
    let url = format!("rediss://127.0.0.1:{tls_port}");
    let a = builder(&url)
        .tls_ca_file(certs.ca())
        .connect()
        .await
        .unwrap();
    let b = builder(&url)
        .tls_ca_file(certs.ca())
        .connect()
        .await
        .unwrap();
    lock_wait_wake_unlock(&a, &b, "tls").await;
    let guard = a.lock("tls").lock().await.unwrap();
    assert!(b.lock("tls").force_unlock().await.unwrap());
    tokio::time::timeout(Duration::from_secs(15), guard.lost())
        .await
        .expect("lost after force_unlock");
    // The lock really went over the TLS port: the server counts TLS clients in INFO.
    let raw = server.raw().await;
    let clients: String = raw
        .info(Some(fred::types::InfoKind::Clients))
        .await
        .unwrap();
    assert!(clients.contains("connected_clients:"), "{clients}");
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// Each way a TLS connection can be refused gives a clear error, quickly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_tls_is_a_clear_error() {
    if !support::servers::supports(support::servers::Feature::Tls, None) {
        return;
    }
    let certs = TestCerts::new("refused");
    let other_ca = TestCerts::new("other");
    let (server, tls_port) = tls_server(&certs);
    let tls_url = format!("rediss://127.0.0.1:{tls_port}");

    let cases: Vec<(&str, redbaton::Builder, &[&str])> = vec![
        (
            "system roots do not trust the test CA",
            builder(&tls_url),
            &["certificate is not trusted: InvalidCertificate(UnknownIssuer)"],
        ),
        (
            "a CA file of another CA",
            builder(&tls_url).tls_ca_file(other_ca.ca()),
            &["certificate is not trusted"],
        ),
        (
            "TLS to a plain-text port",
            builder(&format!("rediss://127.0.0.1:{}", server.port)).tls_ca_file(certs.ca()),
            &["does the server speak TLS on this port?"],
        ),
        (
            "plain text to a TLS port",
            builder(&format!("redis://127.0.0.1:{tls_port}")),
            &["127.0.0.1"],
        ),
    ];
    for (what, builder, needles) in cases {
        let started = Instant::now();
        let err = builder.connect().await.unwrap_err();
        let message = err.to_string();
        println!("{what}: {message}");
        assert!(
            matches!(err, Error::Connection(_)),
            "{what}: a connection error, got {err:?}"
        );
        assert!(
            needles.iter().any(|n| message.contains(n)),
            "{what}: the message says why: {message}"
        );
        assert!(
            message.contains("127.0.0.1"),
            "{what}: names the server: {message}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(6),
            "{what}: {:?}",
            started.elapsed()
        );
    }

    // Misconfiguration is refused before connecting.
    let plain = builder(&server.url())
        .tls_ca_file(certs.ca())
        .connect()
        .await;
    assert!(
        matches!(&plain, Err(Error::InvalidArgument(m)) if m.contains("rediss://")),
        "{plain:?}"
    );
    let missing = builder(&tls_url)
        .tls_ca_file(certs.dir.join("missing.pem"))
        .connect()
        .await;
    assert!(
        matches!(&missing, Err(Error::InvalidArgument(m)) if m.contains("missing.pem")),
        "{missing:?}"
    );
    let not_pem = builder(&tls_url)
        .tls_ca_file(certs.dir.join("server.ext"))
        .connect()
        .await;
    assert!(
        matches!(&not_pem, Err(Error::InvalidArgument(m)) if m.contains("no PEM certificate")),
        "{not_pem:?}"
    );
}
