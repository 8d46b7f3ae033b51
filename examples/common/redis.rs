//! The examples' Redis: `REDIS_URL` if set, else a private `redis-server` on a free loopback
//! port, killed when the returned handle is dropped.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A private redis-server, killed on drop (`None` inside when `REDIS_URL` is used).
pub struct Redis {
    pub url: String,
    child: Option<Child>,
}

impl Drop for Redis {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `REDIS_URL`, or a private redis-server started on a free loopback port.
pub fn redis() -> Redis {
    if let Ok(url) = std::env::var("REDIS_URL") {
        return Redis { url, child: None };
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port");
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server is not installed: apt-get install -y redis-server");
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "redis-server did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Redis {
        url: format!("redis://127.0.0.1:{port}"),
        child: Some(child),
    }
}
