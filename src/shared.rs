//! [`ClientInner`]: what every handle of one client shares — its id, connection, hub, holds
//! registry, watchdog and settings. It sits below the kinds, which keep it, and the facade
//! ([`Client`](crate::Client)), which makes it: neither has to know the other.

use std::sync::Arc;

use fred::interfaces::ClientLike;

use crate::config::Config;
use crate::conn::Conn;
use crate::holds::Holds;
use crate::hub::Hub;
use crate::scope::OwnerNumbers;
use crate::watchdog::Watchdog;

/// The parts of a [`Client`](crate::Client), kept by every handle it made.
pub(crate) struct ClientInner {
    pub(crate) id: Arc<str>,
    pub(crate) conn: Arc<Conn>,
    pub(crate) hub: Arc<Hub>,
    pub(crate) holds: Arc<Holds>,
    pub(crate) watchdog: Arc<Watchdog>,
    pub(crate) config: Config,
    /// The server refused the baton pass script (an ACL without `PUBSUB NUMSUB`): this
    /// client releases the ordinary way from then on.
    pub(crate) passes_refused: std::sync::atomic::AtomicBool,
    /// Where the owner numbers of acquisitions outside a hold's scope come from.
    pub(crate) owners: OwnerNumbers,
}

impl Drop for ClientInner {
    fn drop(&mut self) {
        // Dropped without shutdown(): stop the background tasks and connections.
        self.watchdog.stop();
        if self.conn.close() {
            let conn = self.conn.clone();
            let hub = self.hub.clone();
            self.conn.runtime().spawn(async move {
                hub.shutdown().await;
                let _ = conn.redis().quit().await;
            });
        }
    }
}
