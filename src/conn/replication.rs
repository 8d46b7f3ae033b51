//! Replica sync: which `WAIT`, if any, follows a script that changes a lock (see
//! [`ReplicaSync`]), and how many replicas each primary has that can acknowledge one — read
//! from `INFO replication` at connect and every second after.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Weak;
use std::time::Duration;

use fred::interfaces::{ClientLike, ClusterInterface};
use fred::types::config::Server;
use fred::types::InfoKind;
use parking_lot::RwLock;

use super::Conn;
use crate::config::{ReplicaSync, AUTO_REPLICA_TIMEOUT};

/// How often [`ReplicaSync::Auto`] re-reads the primaries' replicas.
const REPLICA_SCAN: Duration = Duration::from_secs(1);

/// How many replicas to wait for, for how long.
#[derive(Clone, Copy)]
pub(crate) struct Wait {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
}

/// What `WAIT`, if any, follows a script that changes a lock. Decided again for every send:
/// after a redirection or a failover the slot's primary, and so its replicas, may differ.
pub(super) struct Replication {
    pub(super) sync: ReplicaSync,
    /// Connected replicas per primary ([`ReplicaSync::Auto`]); `None` is the one node of a
    /// client that is not clustered.
    pub(super) replicas: RwLock<HashMap<Option<Server>, u32>>,
    /// Whether any primary in `replicas` has a replica: when none has, [`ReplicaSync::Auto`]
    /// costs one atomic load per call (no lock, no slot lookup).
    pub(super) any_replicas: AtomicBool,
}

impl Replication {
    /// The `WAIT` a change of the keys in `slot` (`None`: not clustered) needs, if any; made
    /// on `asking` (the node importing the slot) when set, else on the slot's owner.
    pub(super) fn wait_for(
        &self,
        redis: &fred::clients::Client,
        slot: Option<u16>,
        asking: Option<&Server>,
    ) -> Option<Wait> {
        match self.sync {
            ReplicaSync::Off => None,
            ReplicaSync::Replicas { min, timeout } => Some(Wait {
                replicas: min,
                timeout,
            }),
            ReplicaSync::Auto => {
                if !self.any_replicas.load(Ordering::Acquire) {
                    return None;
                }
                let node = asking.cloned().or_else(|| {
                    slot.and_then(|slot| {
                        redis
                            .cached_cluster_state()
                            .and_then(|state| state.get_server(slot).cloned())
                    })
                });
                // A primary not counted yet (just promoted) is taken as having none until the
                // next count: `Auto` never blocks a connection on a replica it has not seen.
                let connected = self.replicas.read().get(&node).copied().unwrap_or(0);
                (connected > 0).then_some(Wait {
                    replicas: 1,
                    timeout: AUTO_REPLICA_TIMEOUT,
                })
            }
        }
    }
}

impl Conn {
    /// Re-reads how many replicas each primary has (`INFO replication`).
    pub(super) async fn count_replicas(&self) {
        let nodes: Vec<Option<Server>> = if self.clustered {
            self.redis
                .cached_cluster_state()
                .map(|state| state.unique_primary_nodes().into_iter().map(Some).collect())
                .unwrap_or_default()
        } else {
            vec![None]
        };
        let connected = self.redis.active_connections();
        let mut counts = HashMap::with_capacity(nodes.len());
        for node in nodes {
            // Only primaries fred is connected to: a command addressed to a node it has no
            // connection to (killed, not yet dropped from its slot map) makes fred restart
            // every connection of the client. A node not asked keeps its last count.
            if let Some(server) = node.as_ref().filter(|n| !connected.contains(n)) {
                tracing::trace!(?server, "not connected: its replica count stays as it was");
                if let Some(known) = self.replication.replicas.read().get(&node) {
                    counts.insert(node, *known);
                }
                continue;
            }
            let info = match &node {
                Some(server) => {
                    self.redis
                        .with_cluster_node(server.clone())
                        .info::<String>(Some(InfoKind::Replication))
                        .await
                }
                None => self.redis.info::<String>(Some(InfoKind::Replication)).await,
            };
            match info {
                Ok(info) => {
                    counts.insert(node, online_replicas(&info));
                }
                Err(e) => {
                    // Keep what was known: a node that is briefly away keeps its replicas.
                    tracing::debug!(?node, error = %e, "could not read the replication state");
                    if let Some(known) = self.replication.replicas.read().get(&node) {
                        counts.insert(node, *known);
                    }
                }
            }
        }
        let any = counts.values().any(|&n| n > 0);
        *self.replication.replicas.write() = counts;
        self.replication.any_replicas.store(any, Ordering::Release);
    }
}

/// The replicas an `INFO replication` reply lists as `state=online`: those that can
/// acknowledge a `WAIT`. `connected_slaves` also counts replicas still in a full resync
/// (`wait_bgsave`, `send_bulk`), which acknowledge nothing until it ends — waiting for one
/// would refuse every acquire on a healthy primary meanwhile (as `min-replicas-to-write`, which
/// counts the same way, would not).
fn online_replicas(info: &str) -> u32 {
    let replica_line = |line: &&str| {
        line.strip_prefix("slave")
            .and_then(|rest| rest.split_once(':'))
            .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    let online = |line: &str| line.split(',').any(|field| field.trim() == "state=online");
    info.lines()
        .filter(replica_line)
        .filter(|l| online(l))
        .count() as u32
}

/// Keeps the replica counts current while the connection lives.
pub(super) async fn follow_replicas(conn: Weak<Conn>) {
    loop {
        tokio::time::sleep(REPLICA_SCAN).await;
        let Some(conn) = conn.upgrade() else { break };
        if conn.is_closed() {
            break;
        }
        conn.count_replicas().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_online_replicas_count() {
        let info = "# Replication\r\nrole:master\r\nconnected_slaves:3\r\n\
                    slave0:ip=127.0.0.1,port=7001,state=online,offset=42,lag=0\r\n\
                    slave1:ip=127.0.0.1,port=7002,state=wait_bgsave,offset=0,lag=0\r\n\
                    slave2:ip=127.0.0.1,port=7003,state=send_bulk,offset=0,lag=1\r\n\
                    slave_read_repl_offset:42\r\nmaster_repl_offset:42\r\n";
        assert_eq!(online_replicas(info), 1);
        assert_eq!(online_replicas("role:master\r\nconnected_slaves:0\r\n"), 0);
    }
}
