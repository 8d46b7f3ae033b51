//! The fred client handed to the user ([`Client::redis`](crate::Client::redis)): its own
//! connections, no lock traffic (invariant 17).

use fred::interfaces::ClientLike;

use crate::conn::Conn;

/// The fred client handed to the user: built at connect from the library's settings less
/// its command timeout, connected on first use (a client whose user never asks for it opens
/// no connection), closed with the library's.
pub(crate) struct UserRedis {
    client: fred::clients::Client,
    /// Whether its connection was started (or will never be: closed first).
    started: parking_lot::Mutex<bool>,
}

impl UserRedis {
    pub(crate) fn new(client: fred::clients::Client) -> UserRedis {
        UserRedis {
            client,
            started: parking_lot::Mutex::new(false),
        }
    }

    /// The client, connecting it on the first call (in the background: a command sent
    /// meanwhile waits for the connection, as with any fred client).
    pub(crate) fn get(&self, conn: &Conn) -> &fred::clients::Client {
        let mut started = self.started.lock();
        if !*started {
            *started = true;
            let _entered = conn.runtime().enter();
            // The connection task runs until quit; its handle is not needed.
            drop(self.client.connect());
        }
        &self.client
    }

    /// Closes the client (the library's is shutting down): connected, it quits; never
    /// connected, it never will. Either way its commands from now on fail after `timeout`
    /// rather than wait for a connection that will not come.
    pub(crate) fn close(&self, runtime: &tokio::runtime::Handle, timeout: std::time::Duration) {
        let mut started = self.started.lock();
        let mut perf = self.client.perf_config();
        perf.default_command_timeout = timeout;
        self.client.update_perf_config(perf);
        if *started {
            let client = self.client.clone();
            runtime.spawn(async move {
                let _ = client.quit().await;
            });
        }
        *started = true;
    }
}
