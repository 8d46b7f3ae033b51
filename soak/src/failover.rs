//! The soak's failover topologies: the locks live on a Sentinel deployment (a primary, a
//! replica and one sentinel) or a Redis Cluster (three primaries with a replica each), and
//! the parent SIGKILLs primaries on a schedule while the replicas are promoted. The fences
//! and guarded counters stay on the soak's own standalone server (the *ledger*), which never
//! fails over: what is judged is the locks, not the counters' own replication.
//!
//! Sentinel: after each failover the killed server is started again, empty, as a replica of
//! the promoted one; the next kill waits until it is in sync and the sentinel knows it, so
//! every kill has a replica to promote. Cluster: each failover kills the primary of a
//! different shard (its replica takes over); killed nodes stay down.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The Sentinel service name.
pub const MASTER_NAME: &str = "soak";

/// `redis-cli -p <port> <args>`: its stdout, empty when it failed.
pub fn cli(port: u16, args: &[&str]) -> String {
    Command::new(&crate::servers::server().cli_bin)
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// Waits for `cond` up to `limit`.
fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    while !cond() {
        if started.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

/// A `redis-server` without persistence (a killed node comes back empty), logging to `dir`.
pub struct Node {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl Node {
    fn start(dir: &Path, port: u16, extra: &[String]) -> Result<Node, String> {
        let dir = dir.join(format!("node-{port}"));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let mut node = Node {
            port,
            dir,
            child: None,
        };
        node.spawn(extra)?;
        Ok(node)
    }

    fn spawn(&mut self, extra: &[String]) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("redis.log"))
            .map_err(|e| e.to_string())?;
        let child = Command::new(&crate::servers::server().server_bin)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(extra)
            .stdout(Stdio::from(log.try_clone().map_err(|e| e.to_string())?))
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|e| format!("cannot run redis-server: {e}"))?;
        let pid = child.id();
        self.child = Some(child);
        // Ready when the process started answers there itself (the test kit's one rule): a
        // PONG alone may come from another process's server on a port reused meanwhile.
        if wait_until(Duration::from_secs(20), || {
            testkit::served_by(self.port, pid)
        }) {
            Ok(())
        } else {
            Err(format!("redis-server on {} did not start", self.port))
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Where the locks live, and how its primaries are killed.
pub enum Topology {
    Sentinel {
        nodes: Vec<Node>,
        sentinel: Node,
        primary: u16,
    },
    Cluster {
        nodes: Vec<Node>,
        killed: usize,
    },
}

impl Topology {
    /// A primary, a replica and one sentinel (quorum 1: no split votes).
    pub fn sentinel(dir: &Path) -> Result<Topology, String> {
        let primary = Node::start(dir, free_port(), &[])?;
        let replica = Node::start(
            dir,
            free_port(),
            &[
                "--replicaof".into(),
                "127.0.0.1".into(),
                primary.port.to_string(),
            ],
        )?;
        let port = free_port();
        let sdir = dir.join(format!("sentinel-{port}"));
        std::fs::create_dir_all(&sdir).map_err(|e| e.to_string())?;
        let conf = sdir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {0}\nlogfile {0}/sentinel.log\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {1} 1\n\
                 sentinel down-after-milliseconds {MASTER_NAME} 3000\n\
                 sentinel failover-timeout {MASTER_NAME} 5000\n",
                sdir.display(),
                primary.port
            ),
        )
        .map_err(|e| e.to_string())?;
        let child = Command::new(&crate::servers::server().server_bin)
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run redis-server --sentinel: {e}"))?;
        let sentinel = Node {
            port,
            dir: sdir,
            child: Some(child),
        };
        let topology = Topology::Sentinel {
            primary: primary.port,
            nodes: vec![primary, replica],
            sentinel,
        };
        topology.wait_replicated(Duration::from_secs(30))?;
        Ok(topology)
    }

    /// Three primaries with one replica each.
    pub fn cluster(dir: &Path) -> Result<Topology, String> {
        let extra: Vec<String> = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "1000",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let nodes = (0..6)
            .map(|_| Node::start(dir, free_port(), &extra))
            .collect::<Result<Vec<_>, _>>()?;
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new(&crate::servers::server().cli_bin)
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .map_err(|e| format!("redis-cli --cluster create: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "cluster create failed: {}",
                String::from_utf8_lossy(&out.stdout)
            ));
        }
        let topology = Topology::Cluster { nodes, killed: 0 };
        topology.wait_replicated(Duration::from_secs(60))?;
        Ok(topology)
    }

    /// The URL the lock clients use.
    pub fn url(&self) -> String {
        match self {
            Topology::Sentinel { sentinel, .. } => format!(
                "{}-sentinel://127.0.0.1:{}?sentinelServiceName={MASTER_NAME}",
                crate::servers::scheme(),
                sentinel.port
            ),
            Topology::Cluster { nodes, .. } => {
                let scheme = crate::servers::scheme();
                let mut url = format!("{scheme}-cluster://127.0.0.1:{}", nodes[0].port);
                for n in &nodes[1..] {
                    url.push_str(&format!("&node=127.0.0.1:{}", n.port));
                }
                url.replacen('&', "?", 1)
            }
        }
    }

    /// Every primary has a replica in sync (and, on Sentinel, the sentinel knows it).
    fn wait_replicated(&self, limit: Duration) -> Result<(), String> {
        let ok = wait_until(limit, || match self {
            Topology::Sentinel {
                primary, sentinel, ..
            } => {
                let info = cli(*primary, &["info", "replication"]);
                let replicas = cli(sentinel.port, &["sentinel", "replicas", MASTER_NAME]);
                let addr = cli(
                    sentinel.port,
                    &["sentinel", "get-master-addr-by-name", MASTER_NAME],
                );
                info.contains("role:master")
                    && info.contains("state=online")
                    && addr.lines().nth(1).map(str::trim) == Some(&primary.to_string())
                    && replicas.contains("slave")
                    && !replicas.contains("s_down")
                    && !replicas.contains("disconnected")
            }
            Topology::Cluster { nodes, .. } => {
                let live: Vec<&Node> = nodes.iter().filter(|n| n.child.is_some()).collect();
                live.iter()
                    .all(|n| cli(n.port, &["cluster", "info"]).contains("cluster_state:ok"))
                    && {
                        let primaries = cluster_primaries(live[0].port);
                        // Replicas in sync, not merely attached (`WAIT` counts only those).
                        primaries.len() == 3
                            && primaries.iter().all(|(port, replicated)| {
                                *replicated
                                    && cli(*port, &["info", "replication"]).contains("state=online")
                            })
                    }
            }
        });
        if ok {
            Ok(())
        } else {
            Err(format!("{} not replicated within {limit:?}", self.name()))
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Topology::Sentinel { .. } => "sentinel",
            Topology::Cluster { .. } => "cluster",
        }
    }

    /// Makes the Sentinel replica resync in full — `REPLICAOF NO ONE` and back gives it a
    /// replication id of its own, which its primary does not know, so no partial resync — and
    /// waits until it is in sync again. Returns the window in which the primary listed it not
    /// yet online (the transfer waits `repl-diskless-sync-delay`, 5 s); `None` on a cluster.
    pub fn resync(&mut self) -> Result<Option<(u64, u64)>, String> {
        let Topology::Sentinel { nodes, primary, .. } = self else {
            return Ok(None);
        };
        let primary = *primary;
        let replica = nodes
            .iter()
            .map(|n| n.port)
            .find(|&p| p != primary)
            .ok_or("no replica")?;
        let full_syncs = || stat(primary, "sync_full");
        let before = full_syncs();
        cli(primary, &["config", "set", "repl-diskless-sync", "yes"]);
        cli(primary, &["config", "set", "repl-diskless-sync-delay", "5"]);
        cli(replica, &["replicaof", "no", "one"]);
        cli(replica, &["replicaof", "127.0.0.1", &primary.to_string()]);
        let window = resync_window(primary, Duration::from_secs(60))?;
        if full_syncs() <= before {
            return Err(format!(
                "the replica on {replica} resynced, but not in full (sync_full {before})"
            ));
        }
        self.wait_replicated(Duration::from_secs(60))?;
        Ok(Some(window))
    }

    /// SIGKILLs a primary and waits until its replica serves in its place (and, on Sentinel,
    /// the killed server is back as a replica, in sync: a full resync, whose window is
    /// returned). Returns how long the promotion took.
    pub fn fail_over(&mut self) -> Result<(Duration, Option<(u64, u64)>), String> {
        match self {
            Topology::Sentinel {
                nodes,
                sentinel,
                primary,
            } => {
                let killed = *primary;
                let survivor = nodes
                    .iter()
                    .map(|n| n.port)
                    .find(|&p| p != killed)
                    .ok_or("no replica")?;
                let node = nodes
                    .iter_mut()
                    .find(|n| n.port == killed)
                    .ok_or("no primary")?;
                node.kill();
                let started = Instant::now();
                let sport = sentinel.port;
                let promoted = || {
                    let addr = cli(sport, &["sentinel", "get-master-addr-by-name", MASTER_NAME]);
                    addr.lines().nth(1).map(str::trim) == Some(&survivor.to_string())
                        && cli(survivor, &["role"]).starts_with("master")
                };
                if !wait_until(Duration::from_secs(15), promoted) {
                    // A failover that aborted waits twice the failover timeout to retry.
                    eprintln!("soak: no promotion in 15 s; asking the sentinel to fail over");
                    cli(sport, &["sentinel", "failover", MASTER_NAME]);
                    if !wait_until(Duration::from_secs(30), promoted) {
                        return Err("the sentinel did not promote the replica".into());
                    }
                }
                let took = started.elapsed();
                *primary = survivor;
                // Back, empty, as a replica of the promoted server.
                node.spawn(&[
                    "--replicaof".into(),
                    "127.0.0.1".into(),
                    survivor.to_string(),
                ])?;
                let window = resync_window(survivor, Duration::from_secs(60)).ok();
                self.wait_replicated(Duration::from_secs(60))?;
                Ok((took, window))
            }
            Topology::Cluster { nodes, killed } => {
                let live = nodes
                    .iter()
                    .find(|n| n.child.is_some())
                    .ok_or("no live node")?
                    .port;
                let primaries = cluster_primaries(live);
                // A shard not failed over yet: its primary is an original one with a replica.
                let (victim, _) = primaries
                    .iter()
                    .find(|(_, replicated)| *replicated)
                    .copied()
                    .ok_or("no primary with a replica left")?;
                let node = nodes
                    .iter_mut()
                    .find(|n| n.port == victim)
                    .ok_or("primary not ours")?;
                node.kill();
                *killed += 1;
                let started = Instant::now();
                let others: Vec<u16> = nodes
                    .iter()
                    .filter(|n| n.child.is_some())
                    .map(|n| n.port)
                    .collect();
                let healed = wait_until(Duration::from_secs(30), || {
                    others
                        .iter()
                        .all(|p| cli(*p, &["cluster", "info"]).contains("cluster_state:ok"))
                        && cluster_primaries(others[0])
                            .iter()
                            .all(|(p, _)| *p != victim)
                });
                if !healed {
                    return Err(format!("the cluster did not replace primary {victim}"));
                }
                Ok((started.elapsed(), None))
            }
        }
    }
}

/// A counter of `INFO stats` on `port` (0 when it cannot be read).
fn stat(port: u16, name: &str) -> u64 {
    cli(port, &["info", "stats"])
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// Watches `primary`'s `INFO replication` until a replica is listed `state=online`: from when
/// it was first listed in another state (a full resync: `wait_bgsave`, `send_bulk`) to then,
/// in `mono_ns`. An error when none was seen resyncing.
fn resync_window(primary: u16, limit: Duration) -> Result<(u64, u64), String> {
    let started = Instant::now();
    let mut from = None;
    while started.elapsed() < limit {
        let info = cli(primary, &["info", "replication"]);
        let states: Vec<&str> = info
            .lines()
            .filter(|l| l.starts_with("slave") && l.contains("state="))
            .filter_map(|l| l.split(',').find_map(|f| f.trim().strip_prefix("state=")))
            .collect();
        let now = crate::record::mono_ns();
        if states.contains(&"online") {
            return from
                .map(|from| (from, now))
                .ok_or_else(|| "the replica came online without a resync seen".to_owned());
        }
        if !states.is_empty() && from.is_none() {
            from = Some(now);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(format!("no replica of {primary} online within {limit:?}"))
}

/// `(port, has a live replica)` of every live primary with slots, by `CLUSTER NODES` on
/// `port`, in a stable order (by port).
fn cluster_primaries(port: u16) -> Vec<(u16, bool)> {
    let nodes = cli(port, &["cluster", "nodes"]);
    let rows: Vec<Vec<&str>> = nodes
        .lines()
        .map(|l| l.split_whitespace().collect())
        .filter(|f: &Vec<&str>| f.len() >= 8 && !f[2].contains("fail"))
        .collect();
    let mut primaries: Vec<(u16, bool)> = rows
        .iter()
        .filter(|f| f[2].contains("master") && f.len() > 8)
        .filter_map(|f| {
            let port = f[1].split([':', '@']).nth(1)?.parse().ok()?;
            let replicated = rows
                .iter()
                .any(|r| r[2].contains("slave") && r[3] == f[0] && r[7] == "connected");
            Some((port, replicated))
        })
        .collect();
    primaries.sort_unstable();
    primaries
}
