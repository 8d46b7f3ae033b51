//! A Sentinel deployment on loopback ports: one master, one replica, three sentinels.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::cluster::cli;
use super::{free_port, RedisServer};

/// The monitored master's name.
pub const MASTER_NAME: &str = "mymaster";

/// A `redis-server --sentinel` process, killed on drop.
pub struct Sentinel {
    pub port: u16,
    child: Child,
    dir: PathBuf,
}

impl Sentinel {
    fn start(master_port: u16) -> Sentinel {
        Sentinel::start_with(master_port, 2, 5000)
    }

    /// A sentinel monitoring `master_port` with this quorum and failover timeout.
    pub fn start_with(master_port: u16, quorum: u32, failover_timeout_ms: u64) -> Sentinel {
        for _ in 0..5 {
            let port = free_port();
            let dir = super::fresh_dir("redbaton-sentinel");
            std::fs::create_dir_all(&dir).unwrap();
            let conf = dir.join("sentinel.conf");
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {0}\nlogfile {0}/sentinel.log\n\
                     sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} {quorum}\n\
                     sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
                     sentinel failover-timeout {MASTER_NAME} {failover_timeout_ms}\n\
                     sentinel parallel-syncs {MASTER_NAME} 1\n",
                    dir.display()
                ),
            )
            .unwrap();
            let mut child = Command::new(&super::servers::server().server_bin)
                .arg(&conf)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn redis-server --sentinel");
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(10) {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                if super::served_by(port, child.id()) {
                    return Sentinel { port, child, dir };
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_dir_all(&dir);
        }
        panic!("could not start a sentinel");
    }
}

impl Sentinel {
    /// The sentinel's log so far (its events: `+sdown`, `+odown`, `+failover-*`, ...).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("sentinel.log")).unwrap_or_default()
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One master, one replica of it, three sentinels monitoring it with quorum 2.
pub struct SentinelSetup {
    pub master: RedisServer,
    pub replica: RedisServer,
    pub sentinels: Vec<Sentinel>,
}

impl SentinelSetup {
    /// Starts everything and waits until the replica is in sync and every sentinel knows
    /// the replica and the other two sentinels.
    pub fn start() -> Self {
        let master = RedisServer::start();
        let master_port = master.port.to_string();
        let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &master_port]);
        let sentinels: Vec<Sentinel> = (0..3).map(|_| Sentinel::start(master.port)).collect();
        let setup = SentinelSetup {
            master,
            replica,
            sentinels,
        };
        let start = Instant::now();
        while !setup.is_ready() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "sentinel setup not ready"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        setup
    }

    fn is_ready(&self) -> bool {
        let replication = cli(self.master.port, &["info", "replication"]);
        if !replication.contains("state=online") {
            return false;
        }
        self.sentinels.iter().all(|s| {
            let master = cli(s.port, &["sentinel", "master", MASTER_NAME]);
            let fields: Vec<&str> = master.lines().collect();
            let field = |name: &str| {
                fields
                    .iter()
                    .position(|l| *l == name)
                    .and_then(|i| fields.get(i + 1))
                    .map(|v| v.to_string())
            };
            field("num-slaves").as_deref() == Some("1")
                && field("num-other-sentinels").as_deref() == Some("2")
        })
    }

    /// `redis-sentinel://127.0.0.1:s1?sentinelServiceName=mymaster&node=...`
    /// (`valkey-sentinel://…` on Valkey)
    pub fn url(&self) -> String {
        let mut url = format!(
            "{}-sentinel://127.0.0.1:{}?sentinelServiceName={MASTER_NAME}",
            super::servers::scheme(),
            self.sentinels[0].port
        );
        for s in &self.sentinels[1..] {
            url.push_str(&format!("&node=127.0.0.1:{}", s.port));
        }
        url
    }

    /// The master port every sentinel reports, once they agree.
    pub fn master_port(&self) -> Option<u16> {
        let mut ports = self.sentinels.iter().map(|s| {
            let out = cli(
                s.port,
                &["sentinel", "get-master-addr-by-name", MASTER_NAME],
            );
            out.lines()
                .nth(1)
                .and_then(|p| p.trim().parse::<u16>().ok())
        });
        let first = ports.next()??;
        ports.all(|p| p == Some(first)).then_some(first)
    }
}
