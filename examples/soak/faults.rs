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
    /// A failover topology's primary SIGKILLed and its replica promoted.
    Failover,
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
            FaultKind::Failover => "primary killed and replica promoted",
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

/// Injects faults until `stop` turns true; leaves the proxy open and the server up.
pub(crate) async fn inject_faults(
    server: Arc<Mutex<Server>>,
    proxy: Arc<Proxy>,
    raw: fred::clients::Client,
    mut stop: watch::Receiver<bool>,
    seed: u64,
    every: Duration,
    lease: Duration,
) -> Vec<Fault> {
    let mut rng = fastrand::Rng::with_seed(seed ^ 0xFA17);
    let mut faults = Vec::new();
    loop {
        let pause = every.mul_f64(0.5 + rng.f64());
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.changed() => {}
        }
        if *stop.borrow() {
            break;
        }
        let kind = FaultKind::pick(&mut rng);
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
            // Never picked: failovers have their own schedule.
            FaultKind::Failover => false,
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
        tokio::time::sleep(every).await;
        let at_ns = mono_ns();
        let topology = topology.clone();
        let outcome = tokio::task::spawn_blocking(move || topology.lock().fail_over()).await;
        match outcome {
            Ok(Ok(took)) => {
                eprintln!("soak: failover {} done; promoted after {took:.1?}", n + 1);
                faults.push(Fault {
                    at_ns,
                    kind: FaultKind::Failover,
                    length: took,
                    ok: true,
                });
                done.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            }
            Ok(Err(e)) => return (faults, Some(e)),
            Err(e) => return (faults, Some(e.to_string())),
        }
    }
    (faults, None)
}
