//! What the server says about pub/sub: how many subscriber connections listen on a channel,
//! across the nodes that can hold them (a lock's `state()` reports it).

use fred::error::Error as FredError;
use fred::interfaces::{ClientLike, ClusterInterface};
use fred::types::{ClusterHash, CustomCommand, Value};

use super::Conn;
use crate::PubSubMode;

impl Conn {
    /// Subscriber connections on `channel` in `mode`, across the nodes that can hold them.
    pub(crate) async fn subscribers(
        &self,
        channel: &str,
        mode: PubSubMode,
    ) -> Result<u64, FredError> {
        let redis = &self.redis;
        let numsub = |command: &'static str, hash: ClusterHash| async move {
            let reply: Vec<Value> = redis
                .custom(
                    CustomCommand::new_static("PUBSUB", hash, false),
                    vec![command, channel],
                )
                .await?;
            Ok::<u64, FredError>(reply.get(1).and_then(Value::as_i64).unwrap_or(0).max(0) as u64)
        };
        match mode {
            PubSubMode::Sharded => {
                let slot = fred::util::redis_keyslot(channel.as_bytes());
                numsub("SHARDNUMSUB", ClusterHash::Custom(slot)).await
            }
            PubSubMode::Classic if redis.is_clustered() => {
                // A classic subscription lives on whichever node its connection chose.
                let nodes = redis
                    .cached_cluster_state()
                    .map(|state| state.unique_primary_nodes())
                    .unwrap_or_default();
                let mut total = 0;
                for node in nodes {
                    let reply: Vec<Value> = redis
                        .with_cluster_node(node)
                        .custom(
                            CustomCommand::new_static("PUBSUB", None, false),
                            vec!["NUMSUB", channel],
                        )
                        .await?;
                    total += reply.get(1).and_then(Value::as_i64).unwrap_or(0).max(0) as u64;
                }
                Ok(total)
            }
            PubSubMode::Classic => numsub("NUMSUB", ClusterHash::Random).await,
        }
    }
}
