//! The Lua scripts (in `lua/`), run by EVALSHA with a transparent reload on NOSCRIPT.
//!
//! Each script is one atomic step. Every user-supplied string travels as a KEYS or ARGV
//! entry; no script text is ever built from input. After a Redis restart, `SCRIPT FLUSH` or a
//! failover to a replica the server's script cache is empty: the first EVALSHA then answers
//! NOSCRIPT, and the script is loaded (on every primary of a cluster) and run again. A NOSCRIPT
//! reply means the script did not run, so that retry can never apply a step twice.

use fred::clients::Client;
use fred::error::Error as FredError;
use fred::interfaces::LuaInterface;
use fred::types::scripts::Script;
use fred::types::Value;

use crate::error::{is_noscript, is_spent_redirect};

/// The unlock message Redisson publishes when a lock is released (`UNLOCK_MESSAGE`).
pub(crate) const UNLOCK_MESSAGE: &str = "0";

/// Reply of the unlock script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UnlockReply {
    /// The caller held nothing (nil).
    NotHeld,
    /// One hold released, others remain (0).
    StillHeld,
    /// The last hold was released and waiters were told (1).
    Released,
}

pub(crate) struct Scripts {
    lock: Script,
    unlock: Script,
    force_unlock: Script,
    renew: Script,
    release_owner: Script,
    state: Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Scripts {
            lock: Script::from_lua(include_str!("../lua/lock.lua")),
            unlock: Script::from_lua(include_str!("../lua/unlock.lua")),
            force_unlock: Script::from_lua(include_str!("../lua/force_unlock.lua")),
            renew: Script::from_lua(include_str!("../lua/renew.lua")),
            release_owner: Script::from_lua(include_str!("../lua/release_owner.lua")),
            state: Script::from_lua(include_str!("../lua/state.lua")),
        }
    }

    /// Loads every script (on every primary of a cluster), so first uses skip the NOSCRIPT
    /// round trip. Later cache losses are still handled by the reload fallback.
    pub(crate) async fn load_all(&self, client: &Client) -> Result<(), FredError> {
        for script in [
            &self.lock,
            &self.unlock,
            &self.force_unlock,
            &self.renew,
            &self.release_owner,
            &self.state,
        ] {
            script.load(client).await?;
        }
        Ok(())
    }

    /// Acquire or re-enter. `None` = acquired; `Some(pttl_ms)` = held by another owner.
    pub(crate) async fn lock(
        &self,
        client: &Client,
        key: &str,
        owner: &str,
        lease_ms: i64,
    ) -> Result<Option<i64>, FredError> {
        let args: Vec<Value> = vec![lease_ms.into(), owner.into()];
        run(&self.lock, client, key, args).await
    }

    /// Release one hold.
    pub(crate) async fn unlock(
        &self,
        client: &Client,
        key: &str,
        channel: &str,
        owner: &str,
        lease_ms: i64,
        publish: &'static str,
    ) -> Result<UnlockReply, FredError> {
        let args: Vec<Value> = vec![
            UNLOCK_MESSAGE.into(),
            lease_ms.into(),
            owner.into(),
            publish.into(),
        ];
        let reply: Option<i64> = run(&self.unlock, client, vec![key, channel], args).await?;
        Ok(match reply {
            None => UnlockReply::NotHeld,
            Some(0) => UnlockReply::StillHeld,
            Some(_) => UnlockReply::Released,
        })
    }

    /// Delete the lock whoever holds it. `true` when a lock was deleted.
    pub(crate) async fn force_unlock(
        &self,
        client: &Client,
        key: &str,
        channel: &str,
        publish: &'static str,
    ) -> Result<bool, FredError> {
        let args: Vec<Value> = vec![UNLOCK_MESSAGE.into(), publish.into()];
        let deleted: i64 = run(&self.force_unlock, client, vec![key, channel], args).await?;
        Ok(deleted == 1)
    }

    /// Drop every hold of `owner`. `true` when it held the lock.
    pub(crate) async fn release_owner(
        &self,
        client: &Client,
        key: &str,
        channel: &str,
        owner: &str,
        publish: &'static str,
    ) -> Result<bool, FredError> {
        let args: Vec<Value> = vec![UNLOCK_MESSAGE.into(), owner.into(), publish.into()];
        let held: i64 = run(&self.release_owner, client, vec![key, channel], args).await?;
        Ok(held == 1)
    }

    /// The lock's PTTL and its owner fields with counts, read atomically: `[-2]` when there
    /// is no such key, else `[pttl_ms, [field, count, ...]]`.
    pub(crate) async fn state(&self, client: &Client, key: &str) -> Result<Vec<Value>, FredError> {
        run(&self.state, client, key, Vec::new()).await
    }

    /// Renew (lease > 0) or check (lease 0) a batch of holds; `true` where still held.
    /// All keys must live on one node (one hash slot in a cluster).
    pub(crate) async fn renew(
        &self,
        client: &Client,
        holds: &[(&str, &str, i64)],
    ) -> Result<Vec<bool>, FredError> {
        let keys: Vec<&str> = holds.iter().map(|(key, _, _)| *key).collect();
        let mut args: Vec<Value> = holds.iter().map(|(_, owner, _)| (*owner).into()).collect();
        args.extend(holds.iter().map(|(_, _, lease)| Value::from(*lease)));
        let held: Vec<i64> = run(&self.renew, client, keys, args).await?;
        Ok(held.into_iter().map(|h| h == 1).collect())
    }
}

/// How often a script redirected by the cluster is re-sent.
const REDIRECT_RESENDS: u32 = 3;

/// EVALSHA, re-sent only when the server certainly did not run it:
/// - NOSCRIPT (the cache was emptied): load the script on every primary, then once more;
/// - a cluster redirection (MOVED/ASK): fred re-read the slot map before giving up, so the
///   re-send goes to the slot's new owner. While a failover settles the nodes may briefly
///   disagree about the owner: a few re-sends, spaced a little, ride that out.
///
/// Keys and arguments are cloned per attempt only (one clone on the usual single attempt).
async fn run<R, K>(
    script: &Script,
    client: &Client,
    keys: K,
    args: Vec<Value>,
) -> Result<R, FredError>
where
    R: fred::types::FromValue,
    K: Into<fred::types::MultipleKeys> + Clone + Send,
{
    let mut reloaded = false;
    let mut resends = 0;
    loop {
        match client
            .evalsha(script.sha1().clone(), keys.clone(), args.clone())
            .await
        {
            Err(e) if is_noscript(&e) && !reloaded => {
                reloaded = true;
                tracing::debug!("script cache lost; loading the script again");
                script.load(client).await?;
            }
            Err(e) if is_spent_redirect(&e) && resends < REDIRECT_RESENDS => {
                resends += 1;
                tracing::debug!(resends, "script redirected by the cluster; re-sending");
                if resends > 1 {
                    tokio::time::sleep(std::time::Duration::from_millis(50 * u64::from(resends)))
                        .await;
                }
            }
            other => return other,
        }
    }
}
