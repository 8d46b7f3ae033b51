//! What Redis and the OS count while a scenario runs: commands per acquisition, pub/sub
//! connections, resident memory.

use std::collections::HashMap;
use std::time::Duration;

use fred::interfaces::ClientLike;
use fred::types::CustomCommand;

use crate::contenders::Kind;
use crate::harness::now_ns;

/// Commands the bench itself sends while measuring; never charged to a contender.
fn is_bench_command(name: &str) -> bool {
    name == "info" || name.starts_with("client") || name.starts_with("pubsub")
}

fn is_network_command(kind: Kind, name: &str) -> bool {
    const NET: &[&str] = &[
        "eval",
        "evalsha",
        "eval_ro",
        "evalsha_ro",
        "fcall",
        "ping",
        "subscribe",
        "unsubscribe",
        "ssubscribe",
        "sunsubscribe",
        "psubscribe",
        "punsubscribe",
        "hello",
        "select",
        "auth",
        "quit",
    ];
    NET.contains(&name) || name.starts_with("script") || kind.direct_commands().contains(&name)
}

/// Commands per acquisition between two `INFO commandstats` snapshots: (network, in scripts).
pub(crate) fn commands_per_acq(
    kind: Kind,
    before: &HashMap<String, u64>,
    after: &HashMap<String, u64>,
    acquisitions: usize,
) -> (f64, f64) {
    let (mut net, mut scripted) = (0u64, 0u64);
    for (name, &calls) in after {
        if is_bench_command(name) {
            continue;
        }
        let delta = calls - before.get(name).copied().unwrap_or(0);
        if is_network_command(kind, name) {
            net += delta;
        } else {
            scripted += delta;
        }
    }
    let n = acquisitions.max(1) as f64;
    (net as f64 / n, scripted as f64 / n)
}

/// The network commands of [`commands_per_acq`] one by one, per acquisition, busiest first
/// (`evalsha 0.12, ping 0.01`): where a contender's round trips go.
pub(crate) fn network_breakdown(
    kind: Kind,
    before: &HashMap<String, u64>,
    after: &HashMap<String, u64>,
    acquisitions: usize,
) -> String {
    let n = acquisitions.max(1) as f64;
    let mut per: Vec<(String, f64)> = after
        .iter()
        .filter(|(name, _)| !is_bench_command(name) && is_network_command(kind, name))
        .map(|(name, &calls)| {
            let delta = calls - before.get(name).copied().unwrap_or(0);
            (name.clone(), delta as f64 / n)
        })
        .filter(|(_, per)| *per > 0.0)
        .collect();
    per.sort_by(|a, b| b.1.total_cmp(&a.1));
    let parts: Vec<String> = per.iter().map(|(c, x)| format!("{c} {x:.3}")).collect();
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    }
}

/// Connections in pub/sub mode right now (`CLIENT LIST TYPE pubsub`).
pub(crate) async fn pubsub_connections(raw: &fred::clients::Client) -> usize {
    let list: String = raw
        .custom(
            CustomCommand::new_static("CLIENT", None, false),
            vec!["LIST", "TYPE", "pubsub"],
        )
        .await
        .expect("client list");
    list.lines().filter(|l| !l.trim().is_empty()).count()
}

/// Samples the pub/sub connection count until `end_ns`; returns the maximum seen.
pub(crate) fn sample_pubsub(
    raw: fred::clients::Client,
    end_ns: u64,
) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let mut max = 0;
        while now_ns() < end_ns {
            tokio::time::sleep(Duration::from_millis(200)).await;
            max = max.max(pubsub_connections(&raw).await);
        }
        max
    })
}

/// Resident memory after returning freed heap pages to the OS, so that buffers of commands
/// that already finished do not count as memory of the waiters still parked.
pub(crate) fn rss_bytes() -> u64 {
    // SAFETY: malloc_trim only releases free memory; it has no preconditions.
    unsafe { libc::malloc_trim(0) };
    let statm = std::fs::read_to_string("/proc/self/statm").expect("statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("statm rss");
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    pages * page
}
