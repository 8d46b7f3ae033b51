//! The Lua scripts (in `lua/`), run by EVALSHA with a transparent reload on NOSCRIPT.
//!
//! Each script is one atomic step. Every user-supplied string travels as a KEYS or ARGV
//! entry; no script text is ever built from input. After a Redis restart, `SCRIPT FLUSH` or a
//! failover to a replica the server's script cache is empty: the first EVALSHA then answers
//! NOSCRIPT, and the script is loaded (on every primary of a cluster) and run again. A NOSCRIPT
//! reply means the script did not run, so that retry can never apply a step twice.

use fred::clients::Client;
use fred::error::Error as FredError;
use fred::types::scripts::Script;
use fred::types::Value;

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
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Scripts {
            lock: Script::from_lua(include_str!("../lua/lock.lua")),
            unlock: Script::from_lua(include_str!("../lua/unlock.lua")),
            force_unlock: Script::from_lua(include_str!("../lua/force_unlock.lua")),
            renew: Script::from_lua(include_str!("../lua/renew.lua")),
            release_owner: Script::from_lua(include_str!("../lua/release_owner.lua")),
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
        self.lock.evalsha_with_reload(client, key, args).await
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
        let reply: Option<i64> = self
            .unlock
            .evalsha_with_reload(client, vec![key, channel], args)
            .await?;
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
        let deleted: i64 = self
            .force_unlock
            .evalsha_with_reload(client, vec![key, channel], args)
            .await?;
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
        let held: i64 = self
            .release_owner
            .evalsha_with_reload(client, vec![key, channel], args)
            .await?;
        Ok(held == 1)
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
        let held: Vec<i64> = self.renew.evalsha_with_reload(client, keys, args).await?;
        Ok(held.into_iter().map(|h| h == 1).collect())
    }
}
