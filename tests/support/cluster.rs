//! A real Redis Cluster of `redis-server --cluster-enabled yes` processes on loopback ports,
//! joined with `redis-cli --cluster create`.

use std::process::Command;
use std::time::{Duration, Instant};

use super::RedisServer;

/// Runs `redis-cli -p <port> <args>` and returns its stdout (empty when it failed).
pub fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("run redis-cli (is it installed?)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub id: String,
    pub port: u16,
    pub primary: bool,
    /// The primary's id, for a replica.
    pub primary_id: Option<String>,
    pub failed: bool,
    /// Slot ranges served (primaries only).
    pub slots: Vec<(u16, u16)>,
}

/// A cluster of `primaries` primaries with `replicas` replicas each, killed on drop.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts and joins the cluster and waits until every node reports `cluster_state:ok`.
    pub fn start(primaries: usize, replicas: usize) -> Self {
        let total = primaries * (1 + replicas);
        let nodes: Vec<RedisServer> = (0..total)
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "1000",
                    // A replica may take over however stale it is: the tests kill primaries.
                    "--cluster-replica-validity-factor",
                    "0",
                ])
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = RedisCluster { nodes };
        cluster.wait_healthy(primaries, replicas, Duration::from_secs(30));
        cluster
    }

    /// `redis-cluster://127.0.0.1:p1?node=127.0.0.1:p2&...` over the running nodes.
    pub fn url(&self) -> String {
        let ports: Vec<u16> = self.live_ports();
        let mut url = format!("redis-cluster://127.0.0.1:{}", ports[0]);
        for (i, port) in ports[1..].iter().enumerate() {
            url.push(if i == 0 { '?' } else { '&' });
            url.push_str(&format!("node=127.0.0.1:{port}"));
        }
        url
    }

    fn live_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(|n| n.port)
            .collect()
    }

    /// `CLUSTER NODES` as seen by a live node.
    pub fn topology(&self) -> Vec<NodeInfo> {
        for port in self.live_ports() {
            let text = cli(port, &["cluster", "nodes"]);
            if text.trim().is_empty() {
                continue;
            }
            return text.lines().filter_map(parse_node_line).collect();
        }
        panic!("no live cluster node answers CLUSTER NODES");
    }

    /// Waits until every live node says `cluster_state:ok`, sees `primaries` healthy primaries
    /// each with `replicas` replicas, and every node agrees on who the primaries are.
    pub fn wait_healthy(&self, primaries: usize, replicas: usize, timeout: Duration) {
        let start = Instant::now();
        loop {
            if self.is_healthy(primaries, replicas) {
                return;
            }
            assert!(
                start.elapsed() < timeout,
                "cluster not healthy after {timeout:?}: {:?}",
                self.topology()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn is_healthy(&self, primaries: usize, replicas: usize) -> bool {
        let mut views = Vec::new();
        for port in self.live_ports() {
            if !cli(port, &["cluster", "info"]).contains("cluster_state:ok") {
                return false;
            }
            let nodes: Vec<NodeInfo> = cli(port, &["cluster", "nodes"])
                .lines()
                .filter_map(parse_node_line)
                .collect();
            let mut live_primaries: Vec<(u16, Vec<(u16, u16)>)> = nodes
                .iter()
                .filter(|n| n.primary && !n.failed && !n.slots.is_empty())
                .map(|n| (n.port, n.slots.clone()))
                .collect();
            live_primaries.sort();
            if live_primaries.len() != primaries {
                return false;
            }
            for (port, _) in &live_primaries {
                let id = &nodes.iter().find(|n| n.port == *port).unwrap().id;
                let count = nodes
                    .iter()
                    .filter(|n| !n.failed && n.primary_id.as_ref() == Some(id))
                    .count();
                if count < replicas {
                    return false;
                }
            }
            let me = nodes.iter().find(|n| n.port == port);
            if me.is_some_and(|n| !n.primary)
                && !cli(port, &["info", "replication"]).contains("master_link_status:up")
            {
                return false;
            }
            views.push(live_primaries);
        }
        views.windows(2).all(|w| w[0] == w[1])
    }

    /// The port of the primary serving `slot`.
    pub fn primary_for_slot(&self, slot: u16) -> u16 {
        self.serving(slot).expect("a primary serves every slot")
    }

    /// The port of the healthy primary serving `slot`, if any (none during a failover).
    pub fn serving(&self, slot: u16) -> Option<u16> {
        self.topology()
            .into_iter()
            .find(|n| {
                n.primary && !n.failed && n.slots.iter().any(|(a, b)| *a <= slot && slot <= *b)
            })
            .map(|n| n.port)
    }

    /// The port of a replica of the primary on `primary_port`.
    pub fn replica_of(&self, primary_port: u16) -> u16 {
        let topology = self.topology();
        let id = topology
            .iter()
            .find(|n| n.port == primary_port)
            .map(|n| n.id.clone())
            .expect("known primary");
        topology
            .iter()
            .find(|n| !n.failed && n.primary_id.as_ref() == Some(&id))
            .map(|n| n.port)
            .expect("the primary has a replica")
    }

    /// The server process on `port`.
    pub fn node_mut(&mut self, port: u16) -> &mut RedisServer {
        self.nodes
            .iter_mut()
            .find(|n| n.port == port)
            .expect("a node on that port")
    }
}

fn parse_node_line(line: &str) -> Option<NodeInfo> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.len() < 8 {
        return None;
    }
    let port = fields[1]
        .split('@')
        .next()?
        .rsplit(':')
        .next()?
        .parse()
        .ok()?;
    let flags = fields[2];
    let slots = fields[8..]
        .iter()
        .filter(|s| !s.starts_with('['))
        .filter_map(|s| match s.split_once('-') {
            Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
            None => s.parse().ok().map(|n| (n, n)),
        })
        .collect();
    Some(NodeInfo {
        id: fields[0].to_owned(),
        port,
        primary: flags.contains("master"),
        primary_id: (fields[3] != "-").then(|| fields[3].to_owned()),
        failed: flags.contains("fail") && !flags.contains("fail?") || flags.contains("noaddr"),
        slots,
    })
}
