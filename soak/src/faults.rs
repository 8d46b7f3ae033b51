//! The faults the parent injects (server pauses, flushes, cuts, stalls, kills, failovers), and
//! the raw client it sends them with.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::interfaces::ClientLike;
use fred::prelude::{Builder as FredBuilder, Config as FredConfig, ReconnectPolicy};
use fred::types::CustomCommand;
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::failover::Topology;
use crate::proxy::{Mode, Proxy};
use crate::record::mono_ns;
use crate::server::Server;

/// The kinds of fault, in the summary's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum FaultKind {
    PubsubKill,
    ScriptFlush,
    ClientPause,
    ProxyStall,
    ProxyCut,
    Restart,
    /// `CLIENT PAUSE … WRITE` longer than four command timeouts: every call in flight is given
    /// up past its bound (and finished when the server answers).
    LongPause,
    /// A failover topology's primary SIGKILLed and its replica promoted.
    Failover,
    /// A Sentinel replica made to resync in full (`REPLICAOF NO ONE`, then back).
    Resync,
}

impl FaultKind {
    const ALL: [(FaultKind, u32); 6] = [
        (FaultKind::PubsubKill, 20),
        (FaultKind::ScriptFlush, 15),
        (FaultKind::ClientPause, 20),
        (FaultKind::ProxyStall, 17),
        (FaultKind::ProxyCut, 15),
        (FaultKind::Restart, 13),
    ];

    pub(crate) fn label(self) -> &'static str {
        match self {
            FaultKind::PubsubKill => "subscribers killed",
            FaultKind::ScriptFlush => "script flush",
            FaultKind::ClientPause => "client pause",
            FaultKind::ProxyStall => "proxy stall",
            FaultKind::ProxyCut => "proxy cut",
            FaultKind::Restart => "server restart",
            FaultKind::LongPause => "client pause past the call bound",
            FaultKind::Failover => "primary killed and replica promoted",
            FaultKind::Resync => "replica full resync",
        }
    }

    pub(crate) fn pick(rng: &mut fastrand::Rng) -> FaultKind {
        let total: u32 = Self::ALL.iter().map(|(_, w)| w).sum();
        let mut x = rng.u32(0..total);
        for (kind, w) in Self::ALL {
            if x < w {
                return kind;
            }
            x -= w;
        }
        unreachable!()
    }
}

/// One injected fault.
#[derive(Clone, Debug)]
pub(crate) struct Fault {
    pub(crate) at_ns: u64,
    pub(crate) kind: FaultKind,
    /// How long it lasted (pause, stall, cut, restart downtime).
    pub(crate) length: Duration,
    pub(crate) ok: bool,
    /// A replica's full resync that went with it: from when the primary listed the replica
    /// not yet online to when it listed it online (`mono_ns`).
    pub(crate) resync: Option<(u64, u64)>,
}

pub(crate) async fn raw_client(url: &str) -> Result<fred::clients::Client, String> {
    let config = FredConfig::from_url(url).map_err(|e| e.to_string())?;
    let client = FredBuilder::from_config(config)
        .with_connection_config(|c| {
            c.connection_timeout = Duration::from_secs(2);
            c.internal_command_timeout = Duration::from_secs(2);
        })
        .with_performance_config(|p| p.default_command_timeout = Duration::from_secs(5))
        .set_policy(ReconnectPolicy::new_constant(0, 100))
        .build()
        .map_err(|e| e.to_string())?;
    client.init().await.map_err(|e| e.to_string())?;
    Ok(client)
}

pub(crate) async fn command(
    raw: &fred::clients::Client,
    name: &'static str,
    args: &[&str],
) -> bool {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    raw.custom::<fred::types::Value, _>(CustomCommand::new_static(name, None, false), args)
        .await
        .is_ok()
}

/// The fault schedule's durations: the mean time between faults, the clients' watchdog lease
/// and the shortest command timeout of a worker (which set how long stalls last).
pub(crate) struct Timing {
    pub(crate) every: Duration,
    pub(crate) lease: Duration,
    pub(crate) command_timeout: Duration,
}

/// Injects faults until `stop` turns true; leaves the proxy open and the server up.
pub(crate) async fn inject_faults(
    server: Arc<Mutex<Server>>,
    proxy: Arc<Proxy>,
    raw: fred::clients::Client,
    mut stop: watch::Receiver<bool>,
    seed: u64,
    timing: Timing,
) -> Vec<Fault> {
    let Timing {
        every,
        lease,
        command_timeout,
    } = timing;
    let mut rng = fastrand::Rng::with_seed(seed ^ 0xFA17);
    let mut faults = Vec::new();
    // Past the call bound (four command timeouts) of every call of the worker with the
    // shortest command timeout.
    let long_pause = command_timeout * 4 + Duration::from_millis(500);
    loop {
        let pause = every.mul_f64(0.5 + rng.f64());
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.changed() => {}
        }
        if *stop.borrow() {
            break;
        }
        // The third fault, then every 100th, is a pause past the call bound: long, so rare.
        let kind = if faults.len() % 100 == 2 {
            FaultKind::LongPause
        } else {
            FaultKind::pick(&mut rng)
        };
        let at_ns = mono_ns();
        let started = Instant::now();
        let ok = match kind {
            FaultKind::PubsubKill => command(&raw, "CLIENT", &["KILL", "TYPE", "pubsub"]).await,
            FaultKind::ScriptFlush => command(&raw, "SCRIPT", &["FLUSH"]).await,
            FaultKind::ClientPause => {
                let ms = rng.u64(200..=800).to_string();
                let ok = command(&raw, "CLIENT", &["PAUSE", &ms, "ALL"]).await;
                tokio::time::sleep(Duration::from_millis(ms.parse().unwrap_or(0))).await;
                ok
            }
            FaultKind::LongPause => {
                let ms = long_pause.as_millis().to_string();
                let ok = command(&raw, "CLIENT", &["PAUSE", &ms, "WRITE"]).await;
                tokio::time::sleep(long_pause).await;
                ok
            }
            FaultKind::ProxyStall => {
                // Up to 1.6 leases: long enough, sometimes, for a lease to run out.
                let ms = rng.u64(200..=(lease.as_millis() as u64 * 8 / 5).max(300));
                proxy.set(Mode::Stalled);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                proxy.set(Mode::Open);
                true
            }
            FaultKind::ProxyCut => {
                proxy.set(Mode::Cut);
                tokio::time::sleep(Duration::from_millis(rng.u64(20..=300))).await;
                proxy.set(Mode::Open);
                true
            }
            // Never picked: failovers and resyncs have their own schedule.
            FaultKind::Failover | FaultKind::Resync => false,
            FaultKind::Restart => {
                let server = server.clone();
                match tokio::task::spawn_blocking(move || server.lock().restart()).await {
                    Ok(Ok(())) => true,
                    Ok(Err(e)) => {
                        eprintln!("soak: {e}");
                        false
                    }
                    Err(e) => {
                        eprintln!("soak: restart task: {e}");
                        false
                    }
                }
            }
        };
        faults.push(Fault {
            at_ns,
            kind,
            length: started.elapsed(),
            ok,
            resync: None,
        });
    }
    proxy.set(Mode::Open);
    faults
}

/// Kills primaries until `count` failovers were done (or one failed): each returns once the
/// topology is whole again, then the next waits `every`.
pub(crate) async fn fail_over_repeatedly(
    topology: Arc<Mutex<Topology>>,
    count: usize,
    every: Duration,
    done: Arc<std::sync::atomic::AtomicUsize>,
) -> (Vec<Fault>, Option<String>) {
    let mut faults = Vec::new();
    for n in 0..count {
        let waited = Instant::now();
        if n == 0 {
            // The first wait begins with a replica's full resync (Sentinel only), while the
            // clients lock with `ReplicaSync::Auto`: it must not refuse them meanwhile (each
            // failover ends with another, the killed server's as a replica).
            let at_ns = mono_ns();
            let t = topology.clone();
            match tokio::task::spawn_blocking(move || t.lock().resync()).await {
                Ok(Ok(Some(window))) => {
                    eprintln!(
                        "soak: replica resynced in full ({:.1?} not online)",
                        Duration::from_nanos(window.1 - window.0)
                    );
                    faults.push(Fault {
                        at_ns,
                        kind: FaultKind::Resync,
                        length: waited.elapsed(),
                        ok: true,
                        resync: Some(window),
                    });
                }
                Ok(Ok(None)) => {}
                Ok(Err(e)) => return (faults, Some(format!("replica resync: {e}"))),
                Err(e) => return (faults, Some(e.to_string())),
            }
        }
        tokio::time::sleep(every.saturating_sub(waited.elapsed())).await;
        let at_ns = mono_ns();
        let topology = topology.clone();
        let outcome = tokio::task::spawn_blocking(move || topology.lock().fail_over()).await;
        match outcome {
            Ok(Ok((took, resync))) => {
                eprintln!("soak: failover {} done; promoted after {took:.1?}", n + 1);
                faults.push(Fault {
                    at_ns,
                    kind: FaultKind::Failover,
                    length: took,
                    ok: true,
                    resync,
                });
                done.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            }
            Ok(Err(e)) => return (faults, Some(e)),
            Err(e) => return (faults, Some(e.to_string())),
        }
    }
    (faults, None)
}
