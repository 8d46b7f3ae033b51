//! The examples' Redis: `REDIS_URL` if set, else a private `redis-server` on a free loopback
//! port, stopped when the returned handle is dropped. It is the test kit's launcher
//! (`testkit::RedisServer`, a dev-dependency): ready when the server it started says so, never
//! when the port merely accepts a connection (another process's server may hold that port).

/// A private redis-server, stopped on drop (`None` inside when `REDIS_URL` is used).
pub struct Redis {
    pub url: String,
    _server: Option<testkit::RedisServer>,
}

/// `REDIS_URL`, or a private redis-server started on a free loopback port.
pub fn redis() -> Redis {
    if let Ok(url) = std::env::var("REDIS_URL") {
        return Redis { url, _server: None };
    }
    let server = testkit::RedisServer::start();
    Redis {
        url: server.url(),
        _server: Some(server),
    }
}
