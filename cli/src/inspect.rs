//! `redbaton status` and `redbaton unlock --force`.

use std::time::Duration;

use redbaton::LockState;

use crate::args::{StatusArgs, UnlockArgs};
use crate::exit::Failure;

/// Exit status of `status` for a held lock and of `unlock --force` when it deleted one.
const YES: u8 = 0;
/// Exit status of `status` for a free lock and of `unlock --force` when there was none.
const NO: u8 = 1;

pub async fn status(url: &str, lease: Duration, args: StatusArgs) -> Result<u8, Failure> {
    crate::check_name(&args.name)?;
    let client = crate::connect(url, lease).await?;
    let state = client.lock(&args.name).state().await;
    let _ = client.shutdown().await;
    let state = state?;
    if args.json {
        println!("{}", json(&args.name, &state));
    } else {
        print!("{}", text(&args.name, &state));
    }
    Ok(if state.is_locked() { YES } else { NO })
}

pub async fn unlock(url: &str, lease: Duration, args: UnlockArgs) -> Result<u8, Failure> {
    debug_assert!(args.force, "clap requires --force");
    crate::check_name(&args.name)?;
    let client = crate::connect(url, lease).await?;
    let deleted = client.lock(&args.name).force_unlock().await;
    let _ = client.shutdown().await;
    if deleted? {
        eprintln!(
            "redbaton: lock {:?} deleted; its waiters were woken",
            args.name
        );
        Ok(YES)
    } else {
        eprintln!("redbaton: lock {:?} was not held", args.name);
        Ok(NO)
    }
}

fn text(name: &str, state: &LockState) -> String {
    let mut out = String::new();
    match state.ttl {
        Some(ttl) => {
            let ttl = Duration::from_millis(ttl.as_millis() as u64);
            out += &format!(
                "{name:?}: locked, lease {} left, hold count {}\n",
                humantime::format_duration(ttl),
                state.hold_count()
            );
            for (owner, count) in &state.owners {
                out += &format!("  owner {owner} count {count}\n");
            }
        }
        None => out += &format!("{name:?}: free\n"),
    }
    out += &format!("  waiting subscriber connections: {}\n", state.subscribers);
    out
}

fn json(name: &str, state: &LockState) -> serde_json::Value {
    let owners: Vec<_> = state
        .owners
        .iter()
        .map(|(owner, count)| serde_json::json!({ "owner": owner, "count": count }))
        .collect();
    serde_json::json!({
        "name": name,
        "locked": state.is_locked(),
        "owners": owners,
        "hold_count": state.hold_count(),
        "ttl_ms": state.ttl.map(|t| t.as_millis() as u64),
        "subscribers": state.subscribers,
    })
}
