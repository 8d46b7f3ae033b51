//! A real Redis Cluster of `redis-server --cluster-enabled yes` processes on loopback ports,
//! joined with `redis-cli --cluster create`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::RedisServer;

/// Runs `redis-cli -p <port> <args>` (the chosen server's cli) and returns its stdout (empty
/// when it failed).
pub fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new(&super::servers::server().cli_bin)
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("run redis-cli (is it installed?)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A cluster node's options.
pub const NODE_ARGS: &[&str] = &[
    "--cluster-enabled",
    "yes",
    "--cluster-config-file",
    "nodes.conf",
    "--cluster-node-timeout",
    "1000",
    // A replica may take over however stale it is: the tests kill primaries.
    "--cluster-replica-validity-factor",
    "0",
];

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
        // `redis-cli --cluster create` sends each CLUSTER MEET once and then waits, without a
        // bound, for the nodes to agree; on a loaded machine a handshake can time out (after
        // the 1 s node timeout) and the nodes never meet. So its run is bounded, and a
        // cluster that did not form is replaced by a fresh one.
        for attempt in 1..=3 {
            if let Some(cluster) = Self::try_start(primaries, replicas) {
                cluster.wait_healthy(primaries, replicas, Duration::from_secs(30));
                return cluster;
            }
            eprintln!("cluster create attempt {attempt} did not form a cluster; retrying");
        }
        panic!("could not form a cluster in 3 attempts");
    }

    fn try_start(primaries: usize, replicas: usize) -> Option<Self> {
        let total = primaries * (1 + replicas);
        let nodes: Vec<RedisServer> = (0..total)
            .map(|_| RedisServer::start_with(NODE_ARGS))
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let mut create = Command::new(&super::servers::server().cli_bin)
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run redis-cli --cluster create");
        let started = Instant::now();
        let status = loop {
            if let Some(status) = create.try_wait().expect("wait for redis-cli") {
                break Some(status);
            }
            if started.elapsed() > Duration::from_secs(30) {
                let _ = create.kill();
                let _ = create.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        match status {
            Some(status) => {
                assert!(status.success(), "cluster create failed: {status}");
                Some(RedisCluster { nodes })
            }
            // The nodes are killed on drop.
            None => None,
        }
    }

    /// `redis-cluster://127.0.0.1:p1?node=127.0.0.1:p2&...` over the running nodes
    /// (`valkey-cluster://…` on Valkey).
    pub fn url(&self) -> String {
        let ports: Vec<u16> = self.live_ports();
        let scheme = super::servers::scheme();
        let mut url = format!("{scheme}-cluster://127.0.0.1:{}", ports[0]);
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

    /// The node id of the node on `port`.
    pub fn id_of(&self, port: u16) -> String {
        cli(port, &["cluster", "myid"]).trim().to_owned()
    }

    /// Opens the migration of `slot` from the primary on `from` to the one on `to`, as
    /// `redis-cli --cluster reshard` does (IMPORTING on the target first); no key moves yet.
    pub fn begin_migration(&self, slot: u16, from: u16, to: u16) {
        let slot = slot.to_string();
        let set = |port, how, id: &str| {
            let out = cli(port, &["cluster", "setslot", &slot, how, id]);
            assert!(out.contains("OK"), "SETSLOT {slot} {how} on {port}: {out}");
        };
        set(to, "importing", &self.id_of(from));
        set(from, "migrating", &self.id_of(to));
    }

    /// Moves every key of `slot` from the node on `from` to the one on `to` (one `MIGRATE`).
    pub fn move_keys(&self, slot: u16, from: u16, to: u16) {
        let keys = cli(
            from,
            &["cluster", "getkeysinslot", &slot.to_string(), "1000"],
        );
        let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
        if keys.is_empty() {
            return;
        }
        let to = to.to_string();
        let mut args = vec!["migrate", "127.0.0.1", &to, "", "0", "5000", "keys"];
        args.extend(keys.iter().copied());
        let out = cli(from, &args);
        assert!(out.contains("OK"), "MIGRATE {keys:?}: {out}");
    }

    /// Completes the migration of `slot` (its keys moved): `SETSLOT NODE <target>` on the
    /// importing node first, then on every other primary, as `redis-cli --cluster reshard` does.
    pub fn finish_migration(&self, slot: u16, from: u16, to: u16) {
        let owner = self.id_of(to);
        let slot = slot.to_string();
        let mut ports = vec![to, from];
        ports.extend(
            self.topology()
                .into_iter()
                .filter(|n| n.primary && !n.failed && n.port != to && n.port != from)
                .map(|n| n.port),
        );
        for port in ports {
            let out = cli(port, &["cluster", "setslot", &slot, "node", &owner]);
            assert!(out.contains("OK"), "SETSLOT {slot} NODE on {port}: {out}");
        }
    }

    /// Cancels the migration of `slot` (its keys not moved): `SETSLOT STABLE` on both nodes
    /// (`SETSLOT NODE <source>` would leave the source MIGRATING while it holds keys).
    pub fn cancel_migration(&self, slot: u16, from: u16, to: u16) {
        let slot = slot.to_string();
        for port in [to, from] {
            let out = cli(port, &["cluster", "setslot", &slot, "stable"]);
            assert!(out.contains("OK"), "SETSLOT {slot} STABLE on {port}: {out}");
        }
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

/// What a [`NodeProxy`] does with the traffic it carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyMode {
    /// Forwards bytes both ways.
    Open,
    /// Forwards requests but throws the node's replies away: a command runs, and its caller
    /// never hears back.
    DropReplies,
    /// Forwards nothing from clients (their requests wait in the socket); replies still flow.
    HoldRequests,
}

/// A loopback proxy in front of one cluster node, which the node announces as its address
/// (`cluster-announce-port`), so every cluster-aware client connects through it. It can drop
/// replies, hold requests, and reset (RST) the connections it carries.
pub struct NodeProxy {
    /// The port clients connect to (announced by the node).
    pub port: u16,
    /// The node's own port.
    pub node_port: u16,
    mode: std::sync::Arc<tokio::sync::watch::Sender<ProxyMode>>,
    resets: std::sync::Arc<tokio::sync::watch::Sender<u64>>,
    /// Connections accepted and carried so far.
    carried: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// Connections that have ended so far.
    ended: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    accept_task: tokio::task::JoinHandle<()>,
}

impl NodeProxy {
    /// Starts a proxy to the node on `node_port`.
    pub async fn start(node_port: u16) -> NodeProxy {
        use std::sync::Arc;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let mode = Arc::new(tokio::sync::watch::channel(ProxyMode::Open).0);
        let resets = Arc::new(tokio::sync::watch::channel(0u64).0);
        let carried = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let ended = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (accept_mode, accept_resets) = (mode.clone(), resets.clone());
        let (accept_carried, accept_ended) = (carried.clone(), ended.clone());
        let accept_task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", node_port)).await
                else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                // Subscribed before it is counted: a reset that counts it also reaches it.
                let (mode, resets, ended) = (
                    accept_mode.subscribe(),
                    accept_resets.subscribe(),
                    accept_ended.clone(),
                );
                accept_carried.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                tokio::spawn(async move {
                    carry(client, server, mode, resets).await;
                    ended.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                });
            }
        });
        NodeProxy {
            port,
            node_port,
            mode,
            resets,
            carried,
            ended,
            accept_task,
        }
    }

    /// Changes what the proxy does, for current and new connections.
    pub fn set(&self, mode: ProxyMode) {
        self.mode.send_replace(mode);
    }

    /// How many connections the proxy has accepted so far.
    pub fn connections(&self) -> usize {
        self.carried.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Resets every connection the proxy carries now, and waits until they are closed: the
    /// client side gets a TCP RST (as from a crashed peer or a middlebox), the node side an
    /// ordinary close. New connections are carried as before.
    pub async fn reset(&self) {
        use std::sync::atomic::Ordering;
        let carried = self.carried.load(Ordering::Acquire);
        self.resets.send_modify(|n| *n += 1);
        let start = Instant::now();
        while self.ended.load(Ordering::Acquire) < carried {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the proxy's connections did not close"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl Drop for NodeProxy {
    fn drop(&mut self) {
        self.accept_task.abort();
        self.resets.send_modify(|n| *n += 1);
    }
}

/// Carries one connection until either side closes or the proxy resets it.
async fn carry(
    mut client: tokio::net::TcpStream,
    mut server: tokio::net::TcpStream,
    mut mode: tokio::sync::watch::Receiver<ProxyMode>,
    mut resets: tokio::sync::watch::Receiver<u64>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // `resets` is not marked seen here: it was subscribed before the connection was counted,
    // so a reset sent between that and this task's first poll must still end it (marking it
    // seen here lost such a reset, and `reset()` then waited for a connection that stayed up).
    let mut up = vec![0u8; 16 * 1024];
    let mut down = vec![0u8; 16 * 1024];
    loop {
        let now = *mode.borrow_and_update();
        tokio::select! {
            read = client.read(&mut up), if now != ProxyMode::HoldRequests => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if server.write_all(&up[..n]).await.is_err() {
                        return;
                    }
                }
            },
            read = server.read(&mut down) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if *mode.borrow() != ProxyMode::DropReplies
                        && client.write_all(&down[..n]).await.is_err()
                    {
                        return;
                    }
                }
            },
            changed = mode.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = resets.changed() => {
                // Closing with a zero linger sends RST instead of FIN.
                let _ = client.set_zero_linger();
                return;
            }
        }
    }
}

impl RedisCluster {
    /// Puts a [`NodeProxy`] in front of every node and makes each node announce its proxy's
    /// port, then waits until every node's view lists only proxies. After this, `topology()`
    /// and friends report proxy ports.
    pub async fn announce_proxies(&self) -> Vec<NodeProxy> {
        let mut proxies = Vec::new();
        for node in &self.nodes {
            let proxy = NodeProxy::start(node.port).await;
            let bus = (node.port + 10000).to_string();
            assert!(cli(
                node.port,
                &["config", "set", "cluster-announce-bus-port", &bus]
            )
            .contains("OK"));
            let announced = proxy.port.to_string();
            assert!(cli(
                node.port,
                &["config", "set", "cluster-announce-port", &announced]
            )
            .contains("OK"));
            proxies.push(proxy);
        }
        let proxy_ports: Vec<u16> = proxies.iter().map(|p| p.port).collect();
        let start = Instant::now();
        loop {
            let all_announced = self.nodes.iter().all(|node| {
                let nodes: Vec<NodeInfo> = cli(node.port, &["cluster", "nodes"])
                    .lines()
                    .filter_map(parse_node_line)
                    .collect();
                nodes.len() == self.nodes.len()
                    && nodes.iter().all(|n| proxy_ports.contains(&n.port))
            });
            if all_announced {
                return proxies;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "nodes did not announce their proxies: {}",
                cli(self.nodes[0].port, &["cluster", "nodes"])
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
