//! The subscriber connection a client's hub listens on: (un)subscriptions in the client's
//! pub/sub mode, the barrier that proves them processed, and the cluster's slot map a sharded
//! subscription follows. The hub (`crate::engine::hub`) decides what to subscribe; this is
//! how it is sent.

use std::time::Duration;

use fred::clients::SubscriberClient;
use fred::error::Error as FredError;
use fred::interfaces::{ClientLike, ClusterInterface, EventInterface, PubsubInterface};
use fred::types::cluster::ClusterRouting;
use fred::types::config::Server;
use fred::types::{ClusterHash, CustomCommand, Message, Value};
use tokio::sync::broadcast::Receiver;

use crate::config::PubSubMode;

/// How many times a shard subscription is sent while the cluster redirects it.
const SUBSCRIBE_TRIES: u64 = 5;

/// What a connected subscriber reports (see [`Subscriber::connect`]).
pub(crate) struct Streams {
    pub(crate) messages: Receiver<Message>,
    pub(crate) reconnects: Receiver<Server>,
    pub(crate) errors: Receiver<(FredError, Option<Server>)>,
}

/// A client's subscriber connection.
pub(crate) struct Subscriber {
    client: SubscriberClient,
    mode: PubSubMode,
}

impl Subscriber {
    /// `client` (not connected yet), subscribing in `mode`.
    pub(crate) fn new(client: SubscriberClient, mode: PubSubMode) -> Subscriber {
        Subscriber { client, mode }
    }

    /// Connects: the stream of messages, of reconnections after this first connection, and of
    /// the connection's errors (a dropped connection reports one at once, its reconnection only
    /// after the reconnect policy's delay).
    pub(crate) async fn connect(&self) -> Result<Streams, FredError> {
        // Receivers first: the initial connection also emits a reconnect event.
        let mut reconnects = self.client.reconnect_rx();
        let messages = self.client.message_rx();
        self.client.init().await?;
        // After the first connection: its failed attempts, if any, are no news.
        let errors = self.client.error_rx();
        // Consume the initial connection's event, or it would count as a reconnect.
        let _ = tokio::time::timeout(Duration::from_secs(1), reconnects.recv()).await;
        Ok(Streams {
            messages,
            reconnects,
            errors,
        })
    }

    /// Whether shard subscriptions must follow the slot map (sharded pub/sub on a cluster).
    pub(crate) fn follows_shards(&self) -> bool {
        self.mode == PubSubMode::Sharded && self.client.is_clustered()
    }

    /// The cluster's slot map as last read, if clustered.
    pub(crate) fn slot_map(&self) -> Option<ClusterRouting> {
        self.client.cached_cluster_state()
    }

    /// Reads the cluster's slot map again.
    pub(crate) async fn refresh_slot_map(&self) -> Result<(), FredError> {
        self.client.sync_cluster().await
    }

    /// Closes the connection.
    pub(crate) async fn quit(&self) -> Result<(), FredError> {
        self.client.quit().await
    }

    /// Subscribes to `names` (SSUBSCRIBE, one at a time, in sharded mode).
    pub(crate) async fn subscribe(&self, names: Vec<String>) -> Result<(), FredError> {
        match self.mode {
            PubSubMode::Classic => self.client.subscribe(names).await,
            PubSubMode::Sharded => {
                // One at a time: a multi-channel SSUBSCRIBE must stay within one slot.
                for name in names {
                    let mut tries = 0;
                    loop {
                        tries += 1;
                        match self.client.ssubscribe(name.clone()).await {
                            // Redirected: the slot moved or is moving (fred, told to follow
                            // no redirection, answers either error, seen during migrations)
                            // and re-read the slot map. Subscribing twice does no harm: again,
                            // a few times while a migration settles, or waiters would wait for
                            // the lease.
                            Err(e)
                                if tries < SUBSCRIBE_TRIES
                                    && (crate::error::is_redirect(&e)
                                        || crate::error::is_rewrite(&e)) =>
                            {
                                tokio::time::sleep(Duration::from_millis(20 * tries)).await;
                            }
                            other => break other?,
                        }
                    }
                }
                Ok(())
            }
        }
    }

    /// Unsubscribes from `name`.
    pub(crate) async fn unsubscribe(&self, name: &str) -> Result<(), FredError> {
        match self.mode {
            PubSubMode::Classic => self.client.unsubscribe(name).await,
            PubSubMode::Sharded => self.client.sunsubscribe(name).await,
        }
    }

    /// Resolves once the server has processed everything sent on the subscriber before it.
    pub(crate) async fn barrier(&self) -> Result<(), FredError> {
        match self.mode {
            // SSUBSCRIBE already waits for the server's reply.
            PubSubMode::Sharded => Ok(()),
            PubSubMode::Classic if self.client.is_clustered() => {
                // fred sends a cluster client's SUBSCRIBEs to the node owning the slot of its
                // id; the PING must go there too, or it proves nothing.
                let slot = fred::util::redis_keyslot(self.client.id().as_bytes());
                let ping = CustomCommand::new_static("PING", ClusterHash::Custom(slot), false);
                self.client
                    .custom::<Value, Value>(ping, Vec::new())
                    .await
                    .map(drop)
            }
            PubSubMode::Classic => self.client.ping::<Value>(None).await.map(drop),
        }
    }
}
