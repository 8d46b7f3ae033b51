//! [`ClientInner`]: what every handle of one client shares — its id, connection, hub, holds
//! registry, watchdog and settings. It sits below the kinds, which keep it, and the facade
//! ([`Client`](crate::Client)), which makes it: neither has to know the other.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures::future::BoxFuture;

use crate::config::Config;
use crate::conn::{Conn, UserRedis};
use crate::engine::holds::Holds;
use crate::engine::hub::Hub;
use crate::engine::scope::OwnerNumbers;
use crate::engine::watchdog::Watchdog;
use crate::Error;

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
    /// The permits of live permit guards, for shutdown to give back.
    pub(crate) outstanding_permits: Outstanding,
    /// The user's own fred client ([`Client::redis`](crate::Client::redis)): connections of
    /// its own, no lock traffic (invariant 17).
    pub(crate) user: UserRedis,
    /// What the server said it is at connect (`None`: it would not say).
    pub(crate) server: Option<crate::conn::server::ServerVersion>,
}

/// What shutdown runs to give back the permits of a permit guard still alive: the error, if
/// the permits could not be given back.
pub(crate) type GiveBack = Box<dyn FnOnce(u32) -> BoxFuture<'static, Option<Error>> + Send>;

/// The permits of a client's live permit guards, given back by its shutdown (the kinds that
/// hand out such guards register them; this registry knows none of them).
pub(crate) struct Outstanding {
    next: AtomicU64,
    held: parking_lot::Mutex<HashMap<u64, (u32, GiveBack)>>,
    /// How many give-backs of dropped guards are under way in the background. Shutdown waits
    /// for them before it closes the connection: one it outran would fail, or be cancelled
    /// with the runtime the caller drops next, and its permits would be lost for good.
    returning: Arc<tokio::sync::watch::Sender<usize>>,
}

impl Default for Outstanding {
    fn default() -> Outstanding {
        Outstanding {
            next: AtomicU64::default(),
            held: Default::default(),
            returning: Arc::new(tokio::sync::watch::Sender::new(0)),
        }
    }
}

/// One give-back of a dropped guard under way, counted until this is dropped.
pub(crate) struct Returning(Arc<tokio::sync::watch::Sender<usize>>);

impl Drop for Returning {
    fn drop(&mut self) {
        self.0.send_modify(|under_way| *under_way -= 1);
    }
}

impl Outstanding {
    /// Registers `permits` that `give_back` returns at shutdown: the ticket to settle them by.
    pub(crate) fn insert(&self, permits: u32, give_back: GiveBack) -> u64 {
        let ticket = self.next.fetch_add(1, Ordering::Relaxed);
        self.held.lock().insert(ticket, (permits, give_back));
        ticket
    }

    /// Settles `ticket`'s permits: how many, unless shutdown gave them back already.
    pub(crate) fn remove(&self, ticket: u64) -> Option<u32> {
        self.held.lock().remove(&ticket).map(|(permits, _)| permits)
    }

    /// Counts a dropped guard's give-back as under way, for shutdown to wait for. Taken
    /// before the guard [settles](Self::remove) its ticket: then either shutdown's drain
    /// comes first and the guard has nothing to give back, or shutdown sees this count.
    pub(crate) fn returning(&self) -> Returning {
        self.returning.send_modify(|under_way| *under_way += 1);
        Returning(self.returning.clone())
    }

    /// Gives back the permits of every live permit guard (the client is shutting down), and
    /// waits for the give-backs of dropped ones under way (each a bounded call): the first
    /// error, if any.
    pub(crate) async fn give_all_back(&self) -> Option<Error> {
        let held: Vec<_> = self.held.lock().drain().map(|(_, taken)| taken).collect();
        let returns = held
            .into_iter()
            .map(|(permits, give_back)| give_back(permits));
        // Subscribed after the drain: a guard that settled before it counted itself first.
        let mut under_way = self.returning.subscribe();
        let none_under_way = async move {
            // The borrow it returns is dropped at once: held, it would block every count.
            let _ = under_way.wait_for(|&n| n == 0).await.map(drop);
        };
        let (errors, ()) =
            futures::future::join(futures::future::join_all(returns), none_under_way).await;
        errors.into_iter().flatten().next()
    }
}

impl Drop for ClientInner {
    fn drop(&mut self) {
        // Dropped without shutdown(): stop the background tasks and connections.
        self.watchdog.stop();
        if self.conn.close() {
            self.user
                .close(self.conn.runtime(), self.conn.command_timeout());
            let conn = self.conn.clone();
            let hub = self.hub.clone();
            self.conn.runtime().spawn(async move {
                hub.shutdown().await;
                let _ = conn.quit().await;
            });
        }
    }
}
