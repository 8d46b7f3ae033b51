//! A loopback TCP proxy that can stall or cut the connections it carries, to put a network
//! fault between one client and a real `redis-server`.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does with traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forwards bytes both ways.
    Open,
    /// Holds every byte (nothing read, nothing written) until the mode changes: a stalled
    /// network. Connections stay open.
    Stalled,
    /// Closes every connection and accepts new ones only to close them at once.
    Cut,
    /// Forwards requests to the server but throws its replies away: a command runs, and its
    /// caller never hears back.
    RepliesLost,
    /// Forwards both ways, but holds each chunk of the server's replies for this long first:
    /// a slow network on the way back.
    RepliesDelayed(std::time::Duration),
    /// Holds the server's replies on every connection but the pub/sub ones (those that sent a
    /// `SUBSCRIBE`), until the mode changes: a command has run, and its caller hears back only
    /// after messages published meanwhile have arrived.
    CommandRepliesHeld,
}

/// A proxy on `127.0.0.1:<port>` in front of `127.0.0.1:<target>`; stops on drop.
pub struct Proxy {
    pub port: u16,
    mode: Arc<watch::Sender<Mode>>,
    /// Bytes written to clients on pub/sub connections: a message has reached the client's
    /// socket once this moves.
    pubsub_delivered: Arc<AtomicU64>,
    accept_task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Starts a proxy to the loopback port `target`.
    pub async fn start(target: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let mode = Arc::new(watch::channel(Mode::Open).0);
        let accept_mode = mode.clone();
        let pubsub_delivered = Arc::new(AtomicU64::new(0));
        let delivered = pubsub_delivered.clone();
        let accept_task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                if *accept_mode.borrow() == Mode::Cut {
                    drop(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)).await else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                let pubsub = Arc::new(AtomicBool::new(false));
                tokio::spawn(pump(
                    client_read,
                    server_write,
                    accept_mode.subscribe(),
                    Way::Requests(pubsub.clone()),
                ));
                tokio::spawn(pump(
                    server_read,
                    client_write,
                    accept_mode.subscribe(),
                    Way::Replies(pubsub, delivered.clone()),
                ));
            }
        });
        Proxy {
            port,
            mode,
            pubsub_delivered,
            accept_task,
        }
    }

    /// `redis://127.0.0.1:<proxy port>`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Bytes written so far to clients on pub/sub connections.
    pub fn pubsub_bytes(&self) -> u64 {
        self.pubsub_delivered.load(Ordering::Acquire)
    }

    /// Switches the proxy's behaviour for current and new connections.
    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.set(Mode::Cut);
        self.accept_task.abort();
    }
}

/// One direction of a connection; both know whether the connection is a pub/sub one (it
/// sent a `SUBSCRIBE`).
enum Way {
    Requests(Arc<AtomicBool>),
    /// Also counts the bytes written to the client while the connection is a pub/sub one.
    Replies(Arc<AtomicBool>, Arc<AtomicU64>),
}

impl Way {
    fn replies(&self) -> bool {
        matches!(self, Way::Replies(..))
    }

    /// Whether `mode` holds this direction's bytes.
    fn held(&self, mode: Mode) -> bool {
        match (mode, self) {
            (Mode::Stalled, _) => true,
            (Mode::CommandRepliesHeld, Way::Replies(pubsub, _)) => !pubsub.load(Ordering::Acquire),
            _ => false,
        }
    }
}

/// Waits while this direction is held; `false` once cut.
async fn wait_open(mode: &mut watch::Receiver<Mode>, way: &Way) -> bool {
    loop {
        let now = *mode.borrow_and_update();
        match now {
            Mode::Cut => return false,
            now if way.held(now) => {
                if mode.changed().await.is_err() {
                    return false;
                }
            }
            _ => return true,
        }
    }
}

/// Copies one direction until EOF, an error, or a cut. `Mode::RepliesLost` drops the
/// server-to-client direction.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
    way: Way,
) {
    let replies = way.replies();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if !wait_open(&mut mode, &way).await {
            return;
        }
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            changed = mode.changed() => {
                if changed.is_err() {
                    return;
                }
                // Re-evaluate the mode before reading on.
                continue;
            }
        };
        if let Way::Requests(pubsub) = &way {
            // The command's name as RESP sends it: a script's text that mentions subscribing
            // (SCRIPT LOAD) does not make a connection a pub/sub one.
            let chunk = &buf[..n];
            let sent = |name: &[u8]| chunk.windows(name.len()).any(|w| w == name);
            if sent(b"$9\r\nSUBSCRIBE\r\n") || sent(b"$10\r\nSSUBSCRIBE\r\n") {
                pubsub.store(true, Ordering::Release);
            }
        }
        // Bytes read just before a stall are held until it ends (or dropped on a cut).
        if !wait_open(&mut mode, &way).await {
            return;
        }
        if replies && *mode.borrow() == Mode::RepliesLost {
            continue;
        }
        let delay = match *mode.borrow() {
            Mode::RepliesDelayed(delay) if replies => Some(delay),
            _ => None,
        };
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
        if let Way::Replies(pubsub, delivered) = &way {
            if pubsub.load(Ordering::Acquire) {
                delivered.fetch_add(n as u64, Ordering::Release);
            }
        }
    }
}
